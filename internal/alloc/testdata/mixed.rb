# A steady mix of allocations for the default (windowed) mode: every
# iteration allocates the same mix, so that any window sees the true
# shares. Prints "ready", waits for a line, runs N iterations, prints
# "stat BEFORE AFTER" (GC.stat(:total_allocated_objects) around the loop,
# Ruby's own count), then waits for a line to exit.
class Widget; end
class Gadget; def initialize(x); @x = x; end; end
$stdout.sync = true
n = Integer(ARGV[0] || 200_000)
puts "ready"
STDIN.gets
before = GC.stat(:total_allocated_objects)
i = 0
while i < n
  Widget.new
  Gadget.new(i)
  Gadget.new(i)
  x = [i, i]
  s = "literal"
  h = {a: i} if i % 4 == 0
  i += 1
end
after = GC.stat(:total_allocated_objects)
puts "stat #{before} #{after}"
STDIN.gets
