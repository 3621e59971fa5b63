# Several threads wait in known methods while the main thread raises a real
# SIGSEGV in itself (raise(3) through Fiddle).
require 'fiddle'

def wait_alpha(q)
  q << 1
  sleep 100
end

def wait_beta(q)
  q << 1
  sleep 100
end

def segv_here
  Fiddle::Function.new(Fiddle.dlopen(nil)['raise'], [Fiddle::TYPE_INT], Fiddle::TYPE_INT).call(11)
end

q = Queue.new
a = Thread.new { Thread.current.name = "alpha"; wait_alpha(q) }
b = Thread.new { Thread.current.name = "beta"; wait_beta(q) }
2.times { q.pop }
sleep 0.2 until [a, b].all? { |t| t.status == "sleep" }
segv_here
