# Long runs of allocations from one site, then from another, for a
# number of seconds (ARGV[0]): every switch moves a run's count from the
# probe's per-CPU last-site slot to the site map (TestSiteReadsConsistent).
$stdout.sync = true
secs = Float(ARGV[0] || 3)
puts "ready"
STDIN.gets
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + secs
while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  20_000.times { Object.new }
  20_000.times { Object.new }
end
puts "done"
STDIN.gets
