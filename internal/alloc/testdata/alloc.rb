# Runs work.rb's workload between two handshakes on stdin, so that a
# tracer attached before "go" sees exactly the workload.
require_relative "work"
$stdout.sync = true
n = Integer(ARGV[0] || 1000)
puts "ready"
STDIN.gets
work(n)
puts "done"
STDIN.gets
