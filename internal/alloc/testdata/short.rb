# A short burst of array literals at full speed: SECS seconds (wall) of
# [k, k], the tightest allocation loop there is, as a CLI or a test suite
# makes them. Prints "ready", waits for a line, prints "stat BEFORE AFTER"
# (GC.stat(:total_allocated_objects) around the loop), then waits for a
# line to exit.
$stdout.sync = true
secs = Float(ARGV[0] || 0.3)
puts "ready"
STDIN.gets
before = GC.stat(:total_allocated_objects)
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < secs
  k = 0
  while k < 1000
    x = [k, k]
    k += 1
  end
end
after = GC.stat(:total_allocated_objects)
puts "stat #{before} #{after}"
STDIN.gets
