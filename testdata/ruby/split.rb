# Spends about 70% of its time in Object#heavy and 30% in Object#light,
# on the main thread, until killed.
def busy(seconds)
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  x = 0
  x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < seconds
  x
end

def heavy = busy(0.007)
def light = busy(0.003)

puts "ready"
$stdout.flush
loop do
  heavy
  light
end
