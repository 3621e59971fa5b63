# Allocates on "go", then exits without waiting. Line numbers matter.
class Leaver; end
$stdout.sync = true
n = Integer(ARGV[0] || 1000)
puts "ready"
STDIN.gets
n.times { Leaver.new }
puts "done"
sleep 0.5
