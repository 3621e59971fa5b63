# Churns until Ruby 3.4's GC holds pages in its global empty pool (swept
# pages with no live object, kept for reuse), then prints, before "ready",
# "pool EMPTY ALLOCATED AVAILABLE": GC.stat's heap_empty_pages,
# heap_allocated_pages and heap_available_slots, read again after the line
# was made and found unchanged, and sleeps. From that second reading on it
# allocates no object (GC.stat of one key returns an Integer, syswrite of a
# frozen string writes it as it is), so no GC step runs and the heap stays
# as the line says. Without such a moment within 20 s it prints "no empty
# pool" instead.
READY = "ready\n".freeze
def churn(n)
  Thread.new { Array.new(n) { Object.new }.size }.join
end
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
found = nil
while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  churn(300_000)
  200.times do
    Array.new(2000) { "s" }
    e = GC.stat(:heap_empty_pages)
    next if e == 0
    a, s = GC.stat(:heap_allocated_pages), GC.stat(:heap_available_slots)
    line = "pool #{e} #{a} #{s}\n"
    if e == GC.stat(:heap_empty_pages) && a == GC.stat(:heap_allocated_pages) && s == GC.stat(:heap_available_slots)
      found = line.freeze
      break
    end
  end
  break if found
end
STDOUT.syswrite(found || "no empty pool\n")
STDOUT.syswrite(READY)
sleep
