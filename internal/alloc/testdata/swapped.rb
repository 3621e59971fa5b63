# Runs work.rb's workload once the file ARGV[1] exists, then creates
# ARGV[2] (a process whose stdout nobody reads after "ready").
require_relative "work"
$stdout.sync = true
n = Integer(ARGV[0])
go, done = ARGV[1], ARGV[2]
puts "ready"
sleep 0.01 until File.exist?(go)
work(n)
File.write(done, "")
sleep
