# A target for rbscope's live tests. Each scenario brings threads to a known
# point, prints Ruby's own view of their stacks (caller_locations) as JSON,
# prints "ready" and then stays there (sleeping) until killed.
#
#   ruby stacks.rb nested|internal|mn|threads|deep|bench|benchgc|unicode|require|fibers
require 'json'

$reports = Queue.new

# checkpoint records the caller's stack as Ruby sees it and sleeps on the
# same line, so the stack a profiler reads matches the recorded one.
def checkpoint(name = Thread.current.name) = ($reports << report(name, caller_locations(0)); sleep)

def report(name, locs)
  { "thread" => name || "main", "frames" => locs.map { |l|
    { "label" => l.label, "path" => l.absolute_path || l.path, "line" => l.lineno } } }
end

module Outer
  class Inner
    def level3
      [1].each { |_| checkpoint }
    end

    def level2
      2.times { level3 }
    end
  end

  def self.helper
    Inner.new.level2
  end
end

class Deep
  def recurse(n)
    return checkpoint if n.zero?
    recurse(n - 1)
  end
end

# nap records the caller's stack the first time and sleeps 0.2 s on the
# same line every time.
def nap(name, first) = (first && $reports << report(name, caller_locations(0)); sleep 0.2)

module Fibers
  def self.a(first) = nap("fiber-a", first)
  def self.b(first) = nap("fiber-b", first)

  # run naps in fiber a or b, then hands the thread back, forever.
  def self.run(which)
    first = true
    while true
      which == :a ? a(first) : b(first)
      first = false
      Fiber.yield
    end
  end
end

def wait_reports(n)
  n.times { puts JSON.generate($reports.pop) }
  puts "ready"
  $stdout.flush
end

case ARGV[0]
when "nested"
  Thread.new { Outer.helper }
  wait_reports(1)
when "internal"
  # Methods Ruby defines in Ruby (<internal:kernel>, <internal:numeric>):
  # Kernel#then on 3.1 and 3.3, Kernel#loop and Integer#times on 3.3.
  Thread.new { loop { 1.then { Outer.helper } } }
  wait_reports(1)
when "mn"
  # Run with RUBY_MN_THREADS=1 (Ruby 3.3+): more Ruby threads than native
  # ones. Three sleep at a checkpoint (a sleeping M:N thread gives its
  # native thread away), four spin, passing their native threads around.
  3.times { |i| Thread.new { Thread.current.name = "sleeper-#{i}"; Outer.helper } }
  4.times { |i| Thread.new { Thread.current.name = "spinner-#{i}"; loop { x = 0; 1000.times { x += 1 }; Thread.pass } } }
  wait_reports(3)
when "threads"
  Thread.new { Thread.current.name = "alpha-worker"; Outer.helper }
  Thread.new { Thread.current.name = "beta-worker"; Deep.new.recurse(3) }
  Thread.new { Thread.current.name = "gamma-spinner"; loop { 1 + 1 } }
  wait_reports(2)
when "deep"
  Thread.new { Deep.new.recurse(520) }
  wait_reports(1)
when "bench"
  # 50 frames: 48 recursive calls, checkpoint and the thread's block.
  Thread.new { Deep.new.recurse(47) }
  wait_reports(1)
when "benchgc"
  # 50 frames of 50 methods (each its own iseq and method entry, every
  # tenth through a block and Array#each) while another thread collects
  # garbage all the time: what names cost when every cache is a GC old.
  class Chain; end
  50.times do |i|
    callee = i == 49 ? "checkpoint" : "m#{i + 1}(n)"
    body = i % 10 == 5 ? "[n].each { |n| #{callee} }" : callee
    Chain.class_eval("def m#{i}(n) = #{body}", __FILE__, __LINE__)
  end
  Thread.new { Thread.current.name = "chain"; Chain.new.m0(0) }
  wait_reports(1)
  loop { GC.start(full_mark: false, immediate_sweep: false); sleep 0.0005 }
when "unicode"
  require_relative "lib/ユニコード"
  Thread.new { Ünïcödé.new.método_ñ }
  wait_reports(1)
when "require"
  Thread.new { require_relative "lib/required" }
  wait_reports(1)
when "fibers"
  # One thread that runs two fibers in turn, each napping 0.2 s: its
  # execution context changes at every switch.
  Thread.new do
    Thread.current.name = "switcher"
    fa = Fiber.new { Fibers.run(:a) }
    fb = Fiber.new { Fibers.run(:b) }
    while true
      fa.resume
      fb.resume
    end
  end
  wait_reports(2)
else
  abort "usage: stacks.rb nested|internal|mn|threads|deep|bench|benchgc|unicode|require|fibers"
end
sleep
