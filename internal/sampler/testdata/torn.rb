# torn.rb: two threads call mid -> leaf -> Integer#times in a tight loop,
# so that their stacks change all the time. Line numbers matter (torn_test.go).
def leaf
  3.times { }
end
def mid
  leaf
end
def run
  loop { mid }
end
$stdout.sync = true
2.times { |i| Thread.new { run }.name = "torn-#{i}" }
puts "ready"
sleep
