# A puma-shaped process in miniature: one thread busy 160 frames deep
# (its block, 158 calls of deep, busy spinning without calling anything),
# beside idle threads blocked outside the GVL: a sleeper, a Queue#pop, an
# IO.select on an empty pipe, a ConditionVariable#wait, and the main
# thread joining the busy one. Prints "depth N", N the busy thread's
# frames as Ruby counts them (caller_locations), then "ready".
DEPTH = 157

def deep(n, out)
  return busy(out) if n.zero?

  deep(n - 1, out)
end

def busy(out)
  out << caller_locations(0).size
  i = 0
  i += 1 while true
end

depth = Queue.new
worker = Thread.new { deep(DEPTH, depth) }
worker.name = "busy"
idle = []
idle << Thread.new { sleep }
q = Queue.new
idle << Thread.new { q.pop }
rd, _wr = IO.pipe
idle << Thread.new { IO.select([rd]) }
m = Mutex.new
cv = ConditionVariable.new
idle << Thread.new { m.synchronize { cv.wait(m) } }
idle.each_with_index { |t, i| t.name = "idle-#{i}" }
puts "depth #{depth.pop}"
sleep 0.1 until idle.all? { |t| t.status == "sleep" }
puts "ready"
$stdout.flush
worker.join
