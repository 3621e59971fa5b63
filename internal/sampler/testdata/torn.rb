# torn.rb: two threads call mid -> leaf or other -> Integer#times in a
# tight loop, so that their stacks change all the time, and mid calls two
# methods from two lines: a copy of the stack that mixes the frames of one
# call with the caller's line of the other is torn. Line numbers matter
# (torn_test.go).
def leaf
  3.times { }
end
def other
  2.times { }
end
def mid
  leaf
  other
end
def run
  loop { mid }
end
$stdout.sync = true
2.times { |i| Thread.new { run }.name = "torn-#{i}" }
puts "ready"
sleep
