# A GC-heavy loop that measures its own GC share: ARGV = result file,
# seconds, "nogc" to run with GC disabled, and optionally the path of the
# gcclock extension (testdata/ruby/gcclock, built by the test). It prints
# "ready", waits for the file ARGV[4] to exist when given (the test creates
# it once it samples), runs the loop, writes to the result file the deltas over the
# loop of GC.stat(:time) ("gc_ms", the process's CPU time in GC), the
# process's CPU time ("cpu_ms"), the monotonic clock ("wall_ms") and, with
# gcclock, the wall-clock time between gc_enter and gc_exit
# ("gc_wall_ms"), then sleeps.
#
# With ARGV[5] == "nomeasure", GC.measure_total_time is off (GC.stat(:time)
# stays 0): Ruby then makes no system call inside GC. Its GC clock
# (CLOCK_PROCESS_CPUTIME_ID at every marking and sweeping step) is a system
# call, and on a busy machine a kernel that preempts lazily switches to a
# waiting sampler at the next return from one: samples then land on those
# calls, inside GC, more often than time alone would put them there.
require "json"

out = ARGV[0]
secs = Float(ARGV[1] || "4")
GC.disable if ARGV[2] == "nogc"
GC.measure_total_time = false if ARGV[5] == "nomeasure"
if ARGV[3]
  require ARGV[3]
  GCClock.start # enabling the hooks walks the heap: not inside the loop
end

def churn(keep)
  a = Array.new(40) { |i| "item #{i}" }
  keep << a
  keep.shift(keep.size / 2) if keep.size > 10_000
end

keep = []
puts "ready"
$stdout.flush
sleep 0.01 until File.exist?(ARGV[4]) if ARGV[4]
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond)
g0 = GC.stat(:time)
GCClock.reset if defined?(GCClock)
c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :millisecond)
churn(keep) while Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond) - t0 < secs * 1000
wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond) - t0
cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :millisecond) - c0
res = { gc_ms: GC.stat(:time) - g0, wall_ms: wall, cpu_ms: cpu }
res[:gc_wall_ms] = GCClock.wall_ns / 1e6 if defined?(GCClock)
File.write(out + ".tmp", JSON.generate(res))
File.rename(out + ".tmp", out)
sleep
