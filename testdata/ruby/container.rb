# container.rb: a target the container tests run inside the test rootfs
# (testutil.StartContainerRuby). Two threads stop at known points; for
# each, one JSON line with Ruby's own view of it: its name, its tid and
# the process's pid in the container's PID namespace, and its stack
# (caller_locations). Then a third thread prints "ready" from Shop.spin,
# where it spins until the process is killed.
require "json"
$stdout.sync = true

Reports = Queue.new

def tid = File.readlink("/proc/thread-self").split("/").last.to_i

# checkpoint reports the caller's stack and sleeps on the same line.
def checkpoint = (Reports << report; sleep)

def report
  { "thread" => Thread.current.name || "main", "tid" => tid, "pid" => Process.pid,
    "frames" => caller_locations(1).map { |l| { "label" => l.label, "path" => l.absolute_path || l.path, "line" => l.lineno } } }
end

module Shop
  class Cart
    def total(n)
      return checkpoint if n.zero?
      total(n - 1)
    end
  end

  def self.checkout = [1].each { Cart.new.total(3) }

  # spin says "ready" from inside itself: a profiler that reads the
  # process after that line finds this thread here.
  def self.spin
    x = 0
    puts "ready"
    loop { x += 1 }
  end
end

Thread.new { Thread.current.name = "cart-worker"; Shop.checkout }
Thread.new do
  2.times { puts JSON.generate(Reports.pop) }
  Thread.current.name = "spinner"
  Shop.spin
end
Shop::Cart.new.total(1)
