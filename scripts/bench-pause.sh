#!/usr/bin/env bash
# Measures how long blocking mode holds the target's threads stopped, from
# the kernel's scheduler events (perf's sched tracepoints): each span runs
# from a thread of the target switching out in state "t" (traced, stopped
# by rbscope) to its wake-up (rbscope's detach). Target: 4 threads
# spinning in Ruby (x 50 frames) on this machine's CPUs, sampled at 100 Hz
# for 5 s, three rounds. A pause should last tens of microseconds; on a
# kernel that preempts ordinary threads lazily (at its tick), a sampler
# that loses its CPU mid-pause holds the target stopped for a tick (4 ms
# at HZ=250): the share of spans over 1 ms counts those.
# With BASELINE_REV=<git revision> that build is measured too, in turns.
#
# Needs root, ruby and perf (linux-perf). About 1 minute (2 with BASELINE_REV).
source "$(dirname "$0")/lib/bench.sh"
command -v perf >/dev/null || { echo "bench-pause: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
builds=(after)
go build -o "$work/after" ./cmd/rbscope
if [ -n "${BASELINE_REV:-}" ]; then
  build_baseline "$work/before"
  builds=(before after)
fi
cat >"$work/deep.rb" <<'RB'
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
3.times { |i| Thread.new { deep(47) { spin } }.name = "t#{i}" }
deep(47) { spin }
RB
ruby "$work/deep.rb" &
deep=$!
pids+=("$deep")
sleep 1
# spans PERF_SCRIPT_OUTPUT: "n p50_us p99_us max_us over_1ms"
spans() {
  awk '
    / sched:sched_switch: / {
      t = $4; sub(/:$/, "", t)
      if (match($0, /prev_pid=[0-9]+/)) pid = substr($0, RSTART + 9, RLENGTH - 9)
      if ($0 ~ /prev_state=t /) stopped[pid] = t
      next
    }
    / sched:sched_wak(ing|eup): / {
      t = $4; sub(/:$/, "", t)
      if (match($0, / pid=[0-9]+/)) { pid = substr($0, RSTART + 5, RLENGTH - 5)
        if (pid in stopped) { printf "%.1f\n", (t - stopped[pid]) * 1e6; delete stopped[pid] } }
    }' "$1" | sort -n | awk '{ v[NR] = $1; if ($1 > 1000) over++ }
      END { if (NR == 0) { print "0 - - - -"; exit }
            i = int(NR * 0.99) + 1; if (i > NR) i = NR
            printf "%d %.0f %.0f %.0f %d\n", NR, v[int(NR / 2) + 1], v[i], v[NR], over + 0 }'
}
echo "load before: $(uptime)"
echo "build   round  stops  p50_us  p99_us   max_us  over_1ms  share_over_1ms"
for round in 1 2 3; do
  for b in "${builds[@]}"; do
    perf record -q -a -e sched:sched_switch,sched:sched_wakeup,sched:sched_waking -o "$work/p.data" -- \
      "$work/$b" record --pid "$deep" --rate 100 --duration 5s --format summary -o "$work/s.txt" \
      --raw "$work/r.raw.gz" >/dev/null 2>&1
    perf script -i "$work/p.data" 2>/dev/null >"$work/p.txt"
    read -r n p50 p99 mx over < <(spans "$work/p.txt")
    printf "%-7s %5d %6s %7s %7s %8s %9s %14s\n" "$b" "$round" "$n" "$p50" "$p99" "$mx" "$over" \
      "$(awk -v o="$over" -v n="$n" 'BEGIN{ if (n > 0) printf "%.2f%%", 100 * o / n; else print "-" }')"
  done
done
echo "load after:  $(uptime)"
