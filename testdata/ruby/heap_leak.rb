# Leaks 1,000 Leaky::Node a second, paced by its own clock: at any moment
# it holds (now - start) * 1000 nodes, give or take one 10 ms tick.
module Leaky
  class Node
    def initialize(value, nxt)
      @value = value
      @next = nxt
    end
  end
end

RATE = Float(ARGV[0] || 1000)
$leak = []
start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
puts "rate #{RATE}"
puts "ready"
$stdout.flush
loop do
  want = ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - start) * RATE).floor
  $leak << Leaky::Node.new($leak.size, $leak.last) while $leak.size < want
  sleep 0.01
end
