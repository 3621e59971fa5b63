# Allocation-heavy loops for scripts/bench-alloc.sh. Prints "ready", waits
# for a line on stdin, runs the loop, prints "elapsed WALL CPU", waits for
# another line (so a tracer can read its counts), exits.
kind = ARGV[0] || "objects"
n = Integer(ARGV[1] || 5_000_000)
$stdout.sync = true
GC.start
puts "ready"
STDIN.gets
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
i = 0
case kind
when "objects"
  while i < n
    Object.new
    i += 1
  end
when "arrays"
  while i < n
    x = [i, i]
    i += 1
  end
when "paced"
  # 100 allocations every millisecond: a program whose allocation rate is
  # set by its input (like a server below saturation), not by its CPU.
  while i < n
    k = 0
    while k < 100
      Object.new
      k += 1
    end
    i += 100
    sleep 0.001
  end
when "bursty"
  # Bursts of 20,000 allocations at full speed, 50 ms apart: a load whose
  # rate swings between zero and the maximum.
  while i < n
    k = 0
    while k < 20_000
      Object.new
      k += 1
    end
    i += 20_000
    sleep 0.05
  end
else
  abort "unknown kind #{kind}"
end
t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c1 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
# Wall seconds, then the CPU seconds the process used (user and system:
# the probes' traps run in its context), which a loaded machine disturbs
# far less.
puts "elapsed #{t1 - t0} #{c1 - c0}"
STDIN.gets
