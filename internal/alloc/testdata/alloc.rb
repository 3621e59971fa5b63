# Allocates known numbers of objects from known lines between two
# handshakes on stdin. Used by rbscope alloc's tests; line numbers matter.
class Widget; end
class Gadget; def initialize(x); @x = x; end; end
module Outer; class Inner; end; end
$stdout.sync = true
n = Integer(ARGV[0] || 1000)
puts "ready"
STDIN.gets
n.times { Widget.new }
(2 * n).times { |i| Gadget.new(i) }
(n / 2).times { Outer::Inner.new }
n.times { |i| [i, i] }
n.times { "literal" }
(n / 4).times { {a: 1} }
puts "done"
STDIN.gets
