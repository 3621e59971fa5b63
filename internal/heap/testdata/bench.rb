# A process with many live objects for scripts/bench-heap.sh: SCALE * 100,000
# Leaky::Node, SCALE * 20,000 strings of 200 bytes, SCALE * 2,000 arrays and
# hashes. Before it says ready it times an in-process census of the same
# heap (count_objects, and each_object tallying class and memsize_of: what
# a Ruby-side heap report costs) and prints "inproc_ns=N".
require "objspace"

module Leaky
  class Node
    def initialize(value, nxt)
      @value = value
      @next = nxt
    end
  end
end

scale = Integer(ARGV[0] || 10)
$nodes = Array.new(scale * 100_000) { |i| Leaky::Node.new(i, nil) }
$strings = Array.new(scale * 20_000) { |i| ("y" * 200) << i.to_s }
$arrays = Array.new(scale * 2_000) { Array.new(20, 1) }
$hashes = Array.new(scale * 2_000) { |i| { a: i, b: i, c: i } }
GC.start

best = nil
3.times do
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  ObjectSpace.count_objects
  tally = Hash.new { |h, k| h[k] = [0, 0] }
  ObjectSpace.each_object do |o|
    e = tally[o.class]
    e[0] += 1
    e[1] += ObjectSpace.memsize_of(o)
  end
  d = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - t0
  best = d if best.nil? || d < best
end
puts "inproc_ns=#{best}"
puts "ready"
$stdout.flush
sleep
