# Allocation-heavy loops for scripts/bench-alloc.sh. Prints "ready", waits
# for a line on stdin, runs the loop, prints "elapsed SECONDS", waits for
# another line (so a tracer can read its counts), exits.
kind = ARGV[0] || "objects"
n = Integer(ARGV[1] || 5_000_000)
$stdout.sync = true
GC.start
puts "ready"
STDIN.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
i = 0
case kind
when "objects"
  while i < n
    Object.new
    i += 1
  end
when "arrays"
  while i < n
    x = [i, i]
    i += 1
  end
else
  abort "unknown kind #{kind}"
end
t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
puts "elapsed #{t1 - t0}"
STDIN.gets
