# A job that exits on its own: prints "ready", waits for a line, then
# allocates a steady mix (Widget objects, two-element arrays, strings) for
# SECS seconds (wall) and prints "stat BEFORE AFTER GC_BEFORE GC_AFTER N"
# (GC.stat(:total_allocated_objects) and GC.count around the loop: Ruby's
# own counts; N Widgets made) as its last words, then exits: with exit!,
# skipping Ruby's teardown, when the second argument is "exit!"; after
# making 1000 Leavers at line 34 (a site first seen as it exits) when it
# is "leave".
class Widget; end
class Leaver; end
$stdout.sync = true
secs = Float(ARGV[0] || 0.3)
puts "ready"
STDIN.gets
before = GC.stat(:total_allocated_objects)
gc_before = GC.count
n = 0
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < secs
  k = 0
  while k < 1000
    Widget.new
    x = [k, k]
    s = "literal"
    k += 1
  end
  n += 1000
end
after = GC.stat(:total_allocated_objects)
gc_after = GC.count
puts "stat #{before} #{after} #{gc_before} #{gc_after} #{n}"
exit! if ARGV[1] == "exit!"
exit unless ARGV[1] == "leave"
1000.times { Leaver.new }
