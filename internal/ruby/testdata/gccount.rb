# Runs GC a few times, prints GC.count, then waits (no allocation that
# could start another GC) until stdin closes. Prints it again on "again".
$stdout.sync = true
7.times { GC.start }
GC.disable
puts "count=#{GC.count}"
puts "ready"
while (l = $stdin.gets)
  GC.enable
  GC.start
  GC.disable
  puts "count=#{GC.count}"
end
