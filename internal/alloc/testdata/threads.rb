# Runs for a while, then on "go" allocates from four threads at once.
# Used by rbscope alloc's tests; line numbers matter.
class Alpha; end
class Beta; end
class Gamma; end
class Delta; end
$stdout.sync = true
n = Integer(ARGV[0] || 1000)
# Some history before the tracer attaches.
50_000.times { Object.new }
puts "ready"
STDIN.gets
threads = [
  Thread.new { n.times { Alpha.new } },
  Thread.new { n.times { Beta.new } },
  Thread.new { n.times { Gamma.new } },
  Thread.new { n.times { Delta.new } },
]
threads.each(&:join)
puts "done"
STDIN.gets
