# A worker pool like Puma's: each worker waits on its ConditionVariable
# for a job, each job a CPU section; jobs come in bursts, one per worker,
# so the workers contend for the GVL. ARGV = result file, seconds, workers.
#
# Each worker measures itself over the window (from the first job pushed
# to the moment every worker is idle after the last one):
# - wall time inside its CPU sections, its CPU time in them
#   (CLOCK_THREAD_CPUTIME_ID), and the time the kernel kept it runnable but
#   off a CPU in them (run_delay in /proc/thread-self/schedstat: a thread
#   that holds the GVL while the kernel runs something else is still the
#   GVL's owner);
# - the wake-up time: from the moment the producer signalled it to the
#   moment ConditionVariable#wait returned, which a woken thread spends
#   waiting for the GVL (it cannot run Ruby code, not even to look at a
#   clock, before it has the GVL back; it includes the kernel's latency in
#   waking the thread up, which Ruby still sees as a sleeping thread).
# The window's bounds are written in CLOCK_REALTIME nanoseconds so that
# samples can be matched.
require "json"

out = ARGV[0]
secs = Float(ARGV[1] || "5")
nworkers = Integer(ARGV[2] || "3")

def now_ns(clock = Process::CLOCK_MONOTONIC) = Process.clock_gettime(clock, :nanosecond)

def run_delay_ns = File.read("/proc/thread-self/schedstat").split[1].to_i

def work(ms)
  t0 = now_ns(Process::CLOCK_THREAD_CPUTIME_ID)
  x = 0
  x += 1 while now_ns(Process::CLOCK_THREAD_CPUTIME_ID) - t0 < ms * 1_000_000
  x
end

Slot = Struct.new(:mutex, :cv, :jobs, :busy)
slots = Array.new(nworkers) { Slot.new(Mutex.new, ConditionVariable.new, [], false) }
stop = false
stats = Array.new(nworkers) do |i|
  { "name" => "worker-#{i}", "section_wall_ns" => 0, "section_cpu_ns" => 0, "section_delay_ns" => 0,
    "wake_ns" => 0, "jobs" => 0 }
end

workers = nworkers.times.map do |i|
  Thread.new do
    Thread.current.name = "worker-#{i}"
    st = stats[i]
    slot = slots[i]
    loop do
      job = slot.mutex.synchronize do
        waited_from = now_ns
        slot.cv.wait(slot.mutex) while slot.jobs.empty? && !stop
        resumed = now_ns
        j = slot.jobs.shift
        st["wake_ns"] += resumed - j[1] if j && j[1] > waited_from
        slot.busy = !j.nil?
        j
      end
      break if job.nil?
      w0 = now_ns
      c0 = now_ns(Process::CLOCK_THREAD_CPUTIME_ID)
      d0 = run_delay_ns
      work(job[0])
      d1 = run_delay_ns
      c1 = now_ns(Process::CLOCK_THREAD_CPUTIME_ID)
      w1 = now_ns
      st["section_wall_ns"] += w1 - w0
      st["section_cpu_ns"] += c1 - c0
      st["section_delay_ns"] += d1 - d0
      st["jobs"] += 1
      slot.mutex.synchronize { slot.busy = false }
    end
  end
end

puts "ready"
$stdout.flush
sleep 0.5 # time for the profiler to attach

rng = Random.new
start_real = now_ns(Process::CLOCK_REALTIME)
start = now_ns
while now_ns - start < secs * 1e9
  slots.each do |slot|
    slot.mutex.synchronize do
      slot.jobs << [rng.rand(5..20), now_ns]
      slot.cv.signal
    end
  end
  sleep rng.rand(0.04..0.08)
end
sleep 0.005 until slots.all? { |s| s.mutex.synchronize { s.jobs.empty? && !s.busy } }
stop_ns = now_ns
stop_real = now_ns(Process::CLOCK_REALTIME)
File.write(out + ".tmp", JSON.generate({ "start_real_ns" => start_real, "stop_real_ns" => stop_real,
                                        "window_ns" => stop_ns - start, "workers" => stats }))
File.rename(out + ".tmp", out)
slots.each { |s| s.mutex.synchronize { stop = true; s.cv.signal } }
sleep
