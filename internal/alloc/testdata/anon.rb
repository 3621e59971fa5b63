# Allocates objects of anonymous classes (whose names Ruby builds as
# temporary strings) between handshakes. Line numbers matter.
$stdout.sync = true
anon = Class.new
named = Class.new
Named = named
puts "ready"
STDIN.gets
1500.times { anon.new; "x" * 10 }
700.times { named.new }
puts "done"
STDIN.gets
