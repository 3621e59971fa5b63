# jitlines.rb: a method whose three loops sit on lines 3, 5 and 7 (see jit_test.go).
def work(n)
  x = 0; n.times { |i| x += i }
  y = 0
  n.times { |i| y += i * 2 }
  z = 0
  n.times { |i| z += i * 3 }
  x + y + z
end
def spin
  loop { work(10000) }
end
$stdout.sync = true
Thread.new { spin }.name = "spinner"
sleep 0.5 # long enough for YJIT to compile everything
puts "ready"
sleep
