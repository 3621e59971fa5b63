# A puma-shaped process in miniature: one thread busy 160 frames deep
# (its block, 158 calls of deep, busy spinning without calling anything),
# beside idle threads blocked outside the GVL: a sleeper, a Queue#pop, an
# IO.select on an empty pipe, a ConditionVariable#wait, and the main
# thread joining the busy one. Prints "depth N", N the busy thread's
# frames as Ruby counts them (caller_locations), then "ready" once every
# idle thread, the main one included, is asleep: the busy thread prints
# it before it starts to spin (the main thread printing it would then
# wait up to a timer slice, 100 ms, for the GVL the spinner holds before
# it reached its join: 9 of its samples not idle in a CI run).
DEPTH = 157

def deep(n, out)
  return busy(out) if n.zero?

  deep(n - 1, out)
end

def busy(out)
  out << caller_locations(0).size
  sleep 0.01 until $joining && Thread.main.status == "sleep" && IDLE.all? { |t| t.status == "sleep" }
  puts "ready"
  $stdout.flush
  i = 0
  i += 1 while true
end

IDLE = []
depth = Queue.new
worker = Thread.new { deep(DEPTH, depth) }
worker.name = "busy"
IDLE << Thread.new { sleep }
q = Queue.new
IDLE << Thread.new { q.pop }
rd, _wr = IO.pipe
IDLE << Thread.new { IO.select([rd]) }
m = Mutex.new
cv = ConditionVariable.new
IDLE << Thread.new { m.synchronize { cv.wait(m) } }
IDLE.each_with_index { |t, i| t.name = "idle-#{i}" }
puts "depth #{depth.pop}"
$stdout.flush
$joining = true
worker.join
