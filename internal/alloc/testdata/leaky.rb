# A leak from one call chain, A#outer -> B#middle -> C#leak, at a known
# line: LEAK_RATE Leaky::Node a second, each holding a 1 KiB string, kept
# in an array; and a churn ten times larger of short-lived Leaky::Node
# from another chain (Churn#spin -> Churn#make). Prints "ready" (with the
# leak's file:line), waits for a line on stdin, runs for SECONDS, then
# runs a GC (so that what is garbage is gone, here and in the profiler's
# view) and prints "stopped"; it waits for a line (the profiler's window
# has ended: the truth's own allocations are outside it), prints its own
# truth as JSON and waits for another line. With EXIT=1 it prints the
# truth at once and exits: a target that exits mid-window.
#
# Truth: the nodes it keeps, and what ObjectSpace.trace_object_allocations
# says about every live Leaky::Node created while it ran.
require "objspace"
require "json"

module Leaky
  class Node
    def initialize(payload)
      @payload = payload
    end
  end
end

KEPT = []
LEAK_LINE = __LINE__ + 5
LEAK_FILE = __FILE__

class C
  def leak
    KEPT << Leaky::Node.new("x" * 1024)
  end
end

class B
  def middle(c)
    c.leak
  end
end

class A
  def outer(b, c)
    b.middle(c)
  end
end

class Churn
  def make
    Leaky::Node.new(nil)
  end

  def spin(n)
    i = 0
    while i < n
      make
      i += 1
    end
  end
end

$stdout.sync = true
seconds = Float(ARGV[0] || 10)
rate = Integer(ENV["LEAK_RATE"] || 1000)
a, b, c, churn = A.new, B.new, C.new, Churn.new
GC.start
puts "ready #{LEAK_FILE}:#{LEAK_LINE}"
STDIN.gets
ObjectSpace.trace_object_allocations_start
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
# 10 ms steps: 1/100 of the second's leak, ten times as many churned.
step = 0
per = rate / 100
loop do
  target = t0 + step * 0.01
  now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  break if now - t0 >= seconds
  sleep(target - now) if target > now
  per.times { a.outer(b, c) }
  churn.spin(per * 10)
  step += 1
end
ObjectSpace.trace_object_allocations_stop
GC.start
puts "stopped"
STDIN.gets unless ENV["EXIT"] == "1"
leak_traced = 0
churn_traced = 0
ObjectSpace.each_object(Leaky::Node) do |o|
  f = ObjectSpace.allocation_sourcefile(o)
  l = ObjectSpace.allocation_sourceline(o)
  next if f.nil?
  if f == LEAK_FILE && l == LEAK_LINE
    leak_traced += 1
  else
    churn_traced += 1
  end
end
puts JSON.generate(kept: KEPT.size, leak_traced: leak_traced, other_traced: churn_traced,
                   leak_file: LEAK_FILE, leak_line: LEAK_LINE,
                   node_memsize: ObjectSpace.memsize_of(KEPT[0]),
                   payload_memsize: ObjectSpace.memsize_of(KEPT[0].instance_variable_get(:@payload)))
exit 0 if ENV["EXIT"] == "1"
STDIN.gets
