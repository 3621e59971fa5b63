# Threads in every activity: two CPU spinners contending for the GVL, a
# reader blocked in IO#read on an empty pipe, a sleeper; the main thread
# sleeps too.
def spin
  x = 0
  loop { x += 1 }
end

rd, wr = IO.pipe
spinners = 2.times.map do |i|
  t = Thread.new { spin }
  t.name = "spin-#{i}"
  t
end
reader = Thread.new { rd.read }
reader.name = "reader"
sleeper = Thread.new { sleep }
sleeper.name = "sleeper"
sleep 0.3
puts "ready"
$stdout.flush
sleep
wr.close
spinners.each(&:join)
