# Allocation stacks: A#outer -> B#middle -> C#inner allocates Widgets.
# Prints "ready", waits for a line, allocates N Widgets (or, given
# SECONDS, batches of N for that long, then prints "widgets COUNT"),
# prints "done", waits for a line to exit.
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
secs = ARGV[1] && Float(ARGV[1])
a = A.new
puts "ready"
STDIN.gets
if secs
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  batches = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0 < secs
    a.outer(n)
    batches += 1
  end
  puts "widgets #{batches * n}"
else
  a.outer(n)
end
puts "done"
STDIN.gets
