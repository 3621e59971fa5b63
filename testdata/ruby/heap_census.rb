# Known populations for rbscope heap's census tests: the script measures
# them itself (ObjectSpace) and prints the truth, then "ready", then sleeps.
# ARGV[0], when given, is where to write ObjectSpace.dump_all first.
require "objspace"
require "json"

module Leaky
  class Node
    def initialize(value, nxt)
      @value = value
      @next = nxt
    end
  end

  # Made with one instance variable, then given 19 more: more than their
  # slot holds, so Ruby moves them to a malloc'd buffer (on 3.3 too, where
  # a class's later instances get slots wide enough).
  class Wide
    def initialize(i)
      @v0 = i
    end

    def widen
      (1...20).each { |k| instance_variable_set(:"@v#{k}", k) }
    end
  end
end

$nodes = Array.new(100_000) { |i| Leaky::Node.new(i, nil) }
$strings = Array.new(50_000) { |i| ("x" * 1024) << i.to_s }   # 1 KiB heap buffers
$arrays = Array.new(2_000) { Array.new(100, 1) }               # capacity 100
$big_hashes = Array.new(1_000) { |i| h = {}; 50.times { |j| h[j] = i }; h } # st tables
$small_hashes = Array.new(2_000) { |i| { a: i, b: i } }        # ar tables
$wide = Array.new(5_000) { |i| Leaky::Wide.new(i) }
$wide.each(&:widen)                                            # ivars out of the slot

GC.start
GC.start
# With a path, Ruby's own heap dump of the same heap, for the dump test.
File.open(ARGV[0], "w") { |f| ObjectSpace.dump_all(output: f) } if ARGV[0]

truth = { "classes" => {} }
[Leaky::Node, Leaky::Wide, String, Array, Hash].each do |k|
  n = 0
  bytes = 0
  ObjectSpace.each_object(k) do |o|
    next unless o.instance_of?(k)
    n += 1
    bytes += ObjectSpace.memsize_of(o)
  end
  truth["classes"][k.name] = { "count" => n, "memsize" => bytes }
end
truth["types"] = ObjectSpace.count_objects.transform_keys(&:to_s)
puts "truth " + JSON.generate(truth)
puts "ready"
$stdout.flush
sleep
