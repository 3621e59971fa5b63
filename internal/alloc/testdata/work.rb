# The allocation workload shared by alloc.rb (traced from outside by
# rbscope alloc) and memprof.rb (measured in-process by memory_profiler).
# Line numbers matter: the tests expect allocations at these lines.
class Widget; end
class Gadget; def initialize(x); @x = x; end; end
module Outer; class Inner; end; end

def work(n)
  n.times { Widget.new }
  (2 * n).times { |i| Gadget.new(i) }
  (n / 2).times { Outer::Inner.new }
  n.times { |i| [i, i] }
  n.times { "literal" }
  (n / 4).times { {a: 1} }
  n.times { |i| "s#{i}" }
  (n / 10).times { |i| Array.new(3) }
end
