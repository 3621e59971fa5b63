#!/usr/bin/env bash
# The GC share of a real multi-file Ruby program, seen from outside by
# rbscope and from inside by stackprof, in the same run: RuboCop (Debian's
# rubocop package) lints standard-library files under StackProf.run
# (wall mode, 1 ms), while rbscope records the same process. Prints
# stackprof's share of samples in (garbage collection) / (marking) /
# (sweeping) beside rbscope's gc share of the main thread's on-GVL samples
# (running or gc), and GC.stat(:time) for reference, with the load.
# Debian's Ruby only (stackprof and rubocop are Debian packages).
# Usage: scripts/bench-gc-share.sh [files=47] [rate=250]
source "$(dirname "$0")/lib/bench.sh"
nfiles=${1:-47}
rate=${2:-250}

command -v rubocop >/dev/null || { echo "needs Debian's rubocop package (apt-get install rubocop)" >&2; exit 1; }
ruby -rstackprof -e1 || { echo "needs ruby-stackprof" >&2; exit 1; }
go build -o "$work/rbscope" ./cmd/rbscope

libdir=$(ruby -e 'print RbConfig::CONFIG["rubylibdir"]')
mapfile -t files < <(ls "$libdir"/*.rb | head -n "$nfiles")

cat >"$work/lint.rb" <<'RUBY'
require "stackprof"
require "rubocop"
require "json"
out = ARGV.shift
puts "ready"
$stdout.flush
$stdout.reopen(File::NULL) # RuboCop's report must not fill the pipe
sleep 1 # rbscope attaches
g0 = GC.stat(:time)
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond)
prof = StackProf.run(mode: :wall, interval: 1000, raw: true) do
  RuboCop::CLI.new.run(["--cache", "false", "--format", "quiet", "--only",
                        "Layout,Lint,Style", *ARGV])
end
wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond) - t0
fake = ->(name) { prof[:frames].values.select { |f| f[:name] == name }.sum { |f| f[:total_samples] } }
File.write(out, JSON.generate({ samples: prof[:samples], gc_samples: fake.("(garbage collection)"),
  marking: fake.("(marking)"), sweeping: fake.("(sweeping)"),
  gc_stat_ms: GC.stat(:time) - g0, wall_ms: wall }))
RUBY

coproc RUBYP { exec ruby "$work/lint.rb" "$work/stackprof.json" "${files[@]}"; }
pid=$RUBYP_PID
pids+=("$pid")
main_tid=$pid
read -r line <&"${RUBYP[0]}"
[ "$line" = ready ] || { echo "lint.rb did not start: $line" >&2; exit 1; }
"$work/rbscope" record --pid "$pid" --rate "$rate" --format summary -o "$work/summary.txt" --silent
wait "$pid" 2>/dev/null || true
pids=()

echo "load: $(uptime)"
echo "RuboCop on ${#files[@]} files of $libdir, Ruby $(ruby -e 'print RUBY_VERSION')"
ruby -rjson -e '
  s = JSON.parse(File.read(ARGV[0]))
  total = s["samples"] # GC samples included
  printf("stackprof (wall, 1 ms): %d samples, GC %.1f%% (marking %.1f%%, sweeping %.1f%%); GC.stat(:time) %d ms of %d ms wall (%.1f%%)\n",
    total, 100.0 * s["gc_samples"] / total, 100.0 * s["marking"] / total, 100.0 * s["sweeping"] / total,
    s["gc_stat_ms"], s["wall_ms"], 100.0 * s["gc_stat_ms"] / s["wall_ms"])' "$work/stackprof.json"
grep -A3 "^thread activity" "$work/summary.txt" | sed "s/^/rbscope ($rate Hz): /"
ruby -e '
  rows = File.readlines(ARGV[0])
  tot = rows.find { |l| l =~ /\(pid \d+ tid (\d+)\)/ && $1 == ARGV[1] } or abort "no main thread row"
  f = tot.split
  run, gc = f[1].to_f, f[4].to_f
  g = rows.select { |l| l =~ /\((garbage collection|marking|sweeping)\)/ }
  printf("rbscope: GC %.1f%% of the main thread'"'"'s on-GVL samples (running %.1f%%, gc %.1f%% of all its samples)\n", 100 * gc / (run + gc), run, gc)
  puts g.map { |l| "  " + l.strip }' "$work/summary.txt" "$main_tid"
