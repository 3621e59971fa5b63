# Measures work.rb's workload in-process with memory_profiler (the ground
# truth for rbscope alloc's agreement test) and prints JSON:
# {"by_class": {"Widget": N, ...}, "by_location": {"/abs/work.rb:9": N, ...}}
require "memory_profiler"
require "json"
require_relative "work"
n = Integer(ARGV[0] || 1000)
report = MemoryProfiler.report(top: 100_000) { work(n) }
out = {
  by_class: report.allocated_objects_by_class.to_h { |e| [e[:data], e[:count]] },
  by_location: report.allocated_objects_by_location.to_h { |e| [e[:data], e[:count]] },
}
puts JSON.generate(out)
