# Hooks for rbscope's tests (cmd/rbscope/rails_test.go), inert unless
# RBSCOPE_FIXTURE_DIR names a directory:
#
# - Rbscope.truth(action, caller_locations(0)), called by each action,
#   writes Ruby's own view of the action's stack the first time it runs:
#   DIR/truth-ACTION.json {"thread", "frames": [{"label", "path", "line"}]}.
# - SIGWINCH opens a measurement window: StackProf starts (mode :cpu, 1 ms
#   of CPU time), and GC.stat(:time), the process's CPU clock and the
#   wall clock are read. The next SIGWINCH closes it: StackProf stops and
#   DIR/window.json gets its self and total samples per frame, the
#   clocks' readings at both ends and the names of the Ruby threads.
#   While DIR/window-clocks exists, a window only reads the clocks:
#   StackProf's CPU timer (ITIMER_PROF) makes Linux read the process's
#   CPU clock from per-process sums that advance at ticks and context
#   switches only, so GC.stat(:time), which reads that clock at each GC
#   step's ends, misses or gains whole ticks under it.
require "json"

module Rbscope
  DIR = ENV["RBSCOPE_FIXTURE_DIR"]

  @recorded = {}

  def self.truth(action, locations)
    return if DIR.nil? || @recorded[action]
    @recorded[action] = true
    frames = locations.map { |l| { label: l.label, path: l.absolute_path || l.path, line: l.lineno } }
    write("truth-#{action}.json", { thread: Thread.current.name, frames: frames })
  end

  def self.write(name, obj)
    tmp = File.join(DIR, "#{name}.tmp")
    File.write(tmp, JSON.generate(obj))
    File.rename(tmp, File.join(DIR, name))
  end

  def self.clocks
    { realtime_ns: Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond),
      cpu_ms: Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond),
      gc_time_ms: GC.stat(:time), gc_count: GC.count }
  end

  # toggle runs in the trap handler: no locks there, so the results are
  # written by a thread of their own once StackProf has stopped.
  def self.toggle
    if @start.nil?
      @start = clocks
      @stackprof = !File.exist?(File.join(DIR, "window-clocks"))
      StackProf.start(mode: :cpu, interval: 1000) if @stackprof
      return
    end
    StackProf.stop if @stackprof
    stop = clocks
    start, @start = @start, nil
    threads = Thread.list.map { |th| th.name.to_s }
    stackprof = @stackprof
    Thread.new do
      res = stackprof ? StackProf.results : { frames: {} }
      frames = res[:frames].values.map do |f|
        { name: f[:name], file: f[:file], line: f[:line], samples: f[:samples], total_samples: f[:total_samples] }
      end
      write("window.json", { start: start, stop: stop, threads: threads, samples: res[:samples], gc_samples: res[:gc_samples],
                             missed_samples: res[:missed_samples], interval_us: res[:interval], frames: frames })
    end
  end
end

if Rbscope::DIR
  require "stackprof"
  Signal.trap("WINCH") { Rbscope.toggle }
end
