# A thread that holds the GVL while the kernel keeps it off a CPU, for
# --mode cpu. The main thread goes round three methods: compute (Ruby
# code) and gettime (Process.clock_gettime(CLOCK_THREAD_CPUTIME_ID) in a
# loop, a system call each time), each until it has had 40 ms of CPU time
# (CLOCK_THREAD_CPUTIME_ID), and yield_gvl, sched_yield(2) holding the GVL
# (libc's, called through Fiddle with need_gvl: true, as a C extension
# that never releases the lock would), for as long as the other two took
# together (wall time): beside a CPU hog the kernel hands the CPU to it
# at each call, so the thread owns the GVL, in a C function, for about
# half of the time while hardly running. With ARGV = result file and
# seconds, after "ready" and a 0.5 s lead, it measures a window of whole
# rounds lasting at least that many seconds: its wall time
# (CLOCK_MONOTONIC) and CPU time, the same for each method, and the
# window's bounds in CLOCK_REALTIME nanoseconds.
require "fiddle"
require "json"

SCHED_YIELD = Fiddle::Function.new(Fiddle.dlopen(nil)["sched_yield"], [], Fiddle::TYPE_INT, need_gvl: true)

def now_ns(clock = Process::CLOCK_MONOTONIC) = Process.clock_gettime(clock, :nanosecond)
def cpu_ns = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)

def compute(cpu_budget)
  stop = cpu_ns + cpu_budget
  x = 0
  loop do
    i = 0
    while i < 2000
      x += i
      i += 1
    end
    break if cpu_ns >= stop
  end
  x
end

def gettime(cpu_budget)
  stop = cpu_ns + cpu_budget
  loop do
    break if Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond) >= stop
  end
end

def yield_gvl(wall_budget)
  stop = now_ns + wall_budget
  loop do
    SCHED_YIELD.call
    break if now_ns >= stop
  end
end

out = ARGV[0]
secs = Float(ARGV[1] || "5")
rounds = [:compute, :gettime, :yield_gvl]
puts "ready"
$stdout.flush
sleep 0.5

acc = rounds.to_h { |name| [name, { "wall_ns" => 0, "cpu_ns" => 0 }] }
start_real = now_ns(Process::CLOCK_REALTIME)
wall0, cpu0 = now_ns, cpu_ns
stop_at = wall0 + (secs * 1e9).to_i
while now_ns < stop_at
  took = 0
  rounds.each do |name|
    w, c = now_ns, cpu_ns
    send(name, name == :yield_gvl ? took : 40_000_000)
    took += now_ns - w
    acc[name]["wall_ns"] += now_ns - w
    acc[name]["cpu_ns"] += cpu_ns - c
  end
end
wall, cpu = now_ns - wall0, cpu_ns - cpu0
stop_real = now_ns(Process::CLOCK_REALTIME)
File.write(out + ".tmp", JSON.generate({ "start_real_ns" => start_real, "stop_real_ns" => stop_real,
                                         "wall_ns" => wall, "cpu_ns" => cpu, "methods" => acc }))
File.rename(out + ".tmp", out)
sleep
