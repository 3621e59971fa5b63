# Leaks RATE Leaky::Node a second (ARGV[0], default 1000), paced by its own
# clock. With a log path (ARGV[1]) it appends "TIME_NS COUNT" after each
# 10 ms tick: at CLOCK_REALTIME TIME_NS it held COUNT nodes (the truth the
# growth tests compare with: a loaded machine may slow the script down).
module Leaky
  class Node
    def initialize(value, nxt)
      @value = value
      @next = nxt
    end
  end
end

RATE = Float(ARGV[0] || 1000)
log = ARGV[1] && File.open(ARGV[1], "a")
log&.sync = true
$leak = []
start = Process.clock_gettime(Process::CLOCK_REALTIME)
puts "ready"
$stdout.flush
loop do
  want = ((Process.clock_gettime(Process::CLOCK_REALTIME) - start) * RATE).floor
  $leak << Leaky::Node.new($leak.size, $leak.last) while $leak.size < want
  log&.write("#{Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)} #{$leak.size}\n")
  sleep 0.01
end
