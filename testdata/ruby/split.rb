# Spends about 70% of its time in Object#heavy and 30% in Object#light,
# on the main thread, until killed. The durations are random so that the
# loop's period never locks in step with a sampling rate (aliasing).
def busy(seconds)
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  x = 0
  x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < seconds
  x
end

def heavy = busy(rand * 0.014)
def light = busy(rand * 0.006)

puts "ready"
$stdout.flush
loop do
  heavy
  light
end
