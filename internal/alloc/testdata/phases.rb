# Allocations that move between Ruby's size pools: SECS seconds of small
# objects only (the first pool), then SECS of larger strings and arrays
# too (made by methods: no USDT probe reports them). Prints "ready", waits
# for a line, prints "stat BEFORE AFTER" (GC.stat(:total_allocated_objects)
# around both phases), then waits for a line to exit.
class Widget; end
$stdout.sync = true
secs = Float(ARGV[0] || 1)
puts "ready"
STDIN.gets
before = GC.stat(:total_allocated_objects)
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
Widget.new while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < secs
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < secs
  Widget.new
  "x" * 100
  Array.new(20)
  "y" * 300
end
after = GC.stat(:total_allocated_objects)
puts "stat #{before} #{after}"
STDIN.gets
