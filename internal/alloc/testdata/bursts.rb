# Bursts of allocations between idle pauses, as a server makes them
# between requests: every PERIOD seconds (default 0.02), N Head (default
# 1000) then N Tail, for SECS seconds (wall). Prints "ready", waits for a
# line, prints "stat BEFORE AFTER" (GC.stat(:total_allocated_objects)
# around the loop), then "made HEADS TAILS" (its own count of each), then
# waits for a line to exit.
class Head; end
class Tail; end
$stdout.sync = true
secs = Float(ARGV[0] || 3)
n = Integer(ENV["N"] || 1000)
period = Float(ENV["PERIOD"] || 0.02)
puts "ready"
STDIN.gets
before = GC.stat(:total_allocated_objects)
heads = tails = 0
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
step = 0
loop do
  now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  break if now - t0 >= secs
  target = t0 + step * period
  sleep(target - now) if target > now
  i = 0
  while i < n
    Head.new
    i += 1
  end
  heads += n
  i = 0
  while i < n
    Tail.new
    i += 1
  end
  tails += n
  step += 1
end
after = GC.stat(:total_allocated_objects)
puts "stat #{before} #{after}"
puts "made #{heads} #{tails}"
STDIN.gets
