# Threads in every activity: two CPU spinners contending for the GVL, a
# reader blocked in IO#read on an empty pipe, a sleeper; the main thread
# sleeps too. With ARGV = result file and seconds, the spinners measure a
# window of that many seconds (starting 0.5 s after "ready") themselves:
# wall time, their CPU time (CLOCK_THREAD_CPUTIME_ID) and the time the
# kernel kept them runnable off a CPU (run_delay in
# /proc/thread-self/schedstat). A spinner does nothing but run or wait for
# the GVL, so wall - CPU - run delay is its GVL wait. The window's bounds
# are written in CLOCK_REALTIME nanoseconds.
require "json"

def now_ns(clock = Process::CLOCK_MONOTONIC) = Process.clock_gettime(clock, :nanosecond)

def run_delay_ns = File.read("/proc/thread-self/schedstat").split[1].to_i

$phase = 0

def spin(marks)
  x = 0
  seen = 0
  loop do
    x += 1
    next if $phase == seen

    seen = $phase
    marks << [now_ns, now_ns(Process::CLOCK_THREAD_CPUTIME_ID), run_delay_ns]
  end
end

out = ARGV[0]
secs = Float(ARGV[1] || "5")
rd, wr = IO.pipe
marks = [[], []]
spinners = 2.times.map do |i|
  t = Thread.new { spin(marks[i]) }
  t.name = "spin-#{i}"
  t
end
reader = Thread.new { rd.read }
reader.name = "reader"
sleeper = Thread.new { sleep }
sleeper.name = "sleeper"
sleep 0.3
puts "ready"
$stdout.flush
sleep unless out

sleep 0.5
start_real = now_ns(Process::CLOCK_REALTIME)
$phase = 1
sleep secs
$phase = 2
stop_real = now_ns(Process::CLOCK_REALTIME)
sleep 0.5 until marks.all? { |m| m.size >= 2 }
res = marks.each_with_index.map do |(a, b), i|
  { "name" => "spin-#{i}", "wall_ns" => b[0] - a[0], "cpu_ns" => b[1] - a[1], "delay_ns" => b[2] - a[2] }
end
File.write(out + ".tmp", JSON.generate({ "start_real_ns" => start_real, "stop_real_ns" => stop_real, "spinners" => res }))
File.rename(out + ".tmp", out)
sleep
wr.close
spinners.each(&:join)
