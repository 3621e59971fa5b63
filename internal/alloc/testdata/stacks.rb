# Allocation stacks: A#outer -> B#middle -> C#inner allocates Widgets.
# Prints "ready", waits for a line, allocates N Widgets, prints "done",
# waits for a line to exit.
class Widget; end
class C; def inner; Widget.new; end; end
class B; def initialize; @c = C.new; end; def middle; @c.inner; end; end
class A
  def initialize; @b = B.new; end
  def outer(n)
    i = 0
    while i < n
      @b.middle
      i += 1
    end
  end
end
$stdout.sync = true
n = Integer(ARGV[0] || 200_000)
a = A.new
puts "ready"
STDIN.gets
a.outer(n)
puts "done"
STDIN.gets
