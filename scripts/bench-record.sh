#!/usr/bin/env bash
# Measures what sampling costs, every figure from this one run (the load of
# the machine shifts absolute numbers, so each is also a ratio to two
# baselines measured alongside on the same target: ONE 8-byte
# process_vm_readv, and the FLOOR, one batched read of every Ruby thread's
# control-frame region, the least a sample of every stack must read):
#   1. a rate sweep, 100 Hz .. 20 kHz, blocking and nonblocking, on a target
#      of 4 spinning threads x 50 frames: rbscope's CPU, its cost per tick
#      and late/missed ticks -> table + PNG chart (bench-record.png). The
#      CPU is the steady state of a long recording: each point is recorded
#      for 0.5 s and for 3 s (1500 ticks at low rates), and the difference of the two runs' CPU over
#      the difference of their ticks is the cost per tick (opening the
#      target and rendering cancel out, for every build alike). A third
#      baseline, the PACED FLOOR, is what a process costs that only wakes
#      up at 100 Hz and makes the floor read (readfloor, with rbscope's own
#      timer): on a VM most of a 100 Hz tick is the wake-up itself;
#   2. rbscope's CPU at 100 Hz on examples/shop.rb (2 threads);
#   3. system calls per tick at 100 Hz (strace -c -f);
#   4. the target's slowdown at 1 kHz (a fixed CPU-bound Ruby workload,
#      timed inside Ruby, each run paired with an unprofiled one);
#   5. the error rate (torn or otherwise inconsistent stacks) beside the
#      rate, and the pause cost per thread (blocking minus nonblocking);
#   1b. the same on a single-thread target at 5, 10 and 20 kHz (nonblocking,
#      and with --realtime);
#   6. the TIMER FLOOR beside the sweep: the floor read alone at each rate
#      by the sampler's own clock and counting (readfloor -paced), whose
#      late ticks are the machine's, not rbscope's;
#   7. the puma-shaped target (testdata/ruby/pumashape.rb: 12 threads, 5
#      busy 150 frames deep sharing the GVL, 7 idle): cost per tick and
#      share of a core at 100 Hz and 1 kHz, against its own floors;
#   8. a real Rails app (scripts/rails-app.sh: Rails 6.1 from Debian's
#      packages, puma in production with 5 threads, 12 Ruby threads): cost
#      per tick and share of a core at 100 Hz idle and under `ab -c 8`
#      load (/posts and /page, 4 connections each), and the requests per
#      second lost while rbscope records (ab alone, then ab beside a
#      blocking and a nonblocking recording, 3 rounds, medians), each
#      against the app's paced floor.
# The sweep and the timer floor are also run at real-time priority
# (--realtime; chrt -f 1 for the floor): on a kernel that preempts ordinary
# threads lazily that, not rbscope's cost, decides the late ticks.
# With BASELINE_REV=<git revision> (e.g. the commit before a change), the
# rbscope of that revision is built too and measured in the same run: every
# table then has a "before" and an "after" row.
#
# Needs root (ptrace, real-time priority), ruby, strace, ab (apache2-utils)
# and chromium (for the PNG); section 8 builds the Rails app once (about a
# minute, cached). About 14 minutes (21 with BASELINE_REV).
# BENCH_ONLY=targets runs sections 7 and 8 alone. Output directory: $OUT
# (default ./bench-record-out).
source "$(dirname "$0")/lib/bench.sh"
root=$PWD
out=${OUT:-$root/bench-record-out}
mkdir -p "$out"

builds=(after)
go build -o "$work/after" ./cmd/rbscope
if [ -n "${BASELINE_REV:-}" ]; then
  build_baseline "$work/before"
  builds=(before after)
fi
go build -o "$work/readfloor" ./tools/readfloor
go build -o "$work/benchchart" ./tools/benchchart

cat >"$work/deep.rb" <<'EOF'
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
3.times { |i| Thread.new { deep(47) { spin } }.name = "t#{i}" }
deep(47) { spin }
EOF
cat >"$work/single.rb" <<'EOF'
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
deep(47) { spin }
EOF
cat >"$work/workload.rb" <<'EOF'
def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
sleep 1 # rbscope attaches meanwhile: the whole timed part is profiled
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
40.times { fib(27) }
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t}"
EOF

echo "load before: $(uptime)"
ruby "$work/deep.rb" &
deep=$!
pids+=("$deep")
sleep 1
read -r base < <("$work/readfloor" "$deep" 5000)
one_ns=$(grep -o 'one_read_ns=[0-9]*' <<<"$base" | cut -d= -f2)
floor_ns=$(grep -o ' floor_ns=[0-9]*' <<<"$base" | cut -d= -f2)
paced_ns=$(grep -o 'paced_floor_ns=[0-9]*' <<<"$base" | cut -d= -f2)
echo "baselines on the 4 x 50 target: $base"

# record_stats BUILD PID RATE DURATION FLAGS...: prints
# "ticks late missed errors cpu% cpu_seconds" ("- - - - - -" when the
# build refuses).
record_stats() {
  local build=$1 pid=$2 rate=$3 dur=$4
  shift 4
  local o
  if ! o=$("$work/$build" record --pid "$pid" --rate "$rate" --duration "$dur" --format summary \
    -o "$work/s.txt" --raw "$work/r.raw.gz" "$@" 2>&1); then
    echo "- - - - - -"
    return
  fi
  local line cpu secs
  line=$(grep -o '([0-9]* ticks, [0-9]* late, [0-9]* missed); errors: .*' <<<"$o" || true)
  cpu=$(grep -o '([0-9.]*% of one core)' <<<"$o" | tr -d '(%' | awk '{print $1}')
  secs=$(grep -o 'own CPU use: [0-9.]*s' <<<"$o" | grep -o '[0-9.]*' | head -1)
  if [ -z "$line" ]; then
    echo "- - - - - -"
    return
  fi
  local ticks late missed errs
  ticks=$(awk '{print substr($1,2)}' <<<"$line")
  late=$(awk '{print $3}' <<<"$line")
  missed=$(awk '{print $5}' <<<"$line")
  errs=$(sed 's/.*errors: //' <<<"$line" | grep -o '[0-9]*' | paste -sd+ | bc 2>/dev/null || true)
  echo "$ticks $late $missed ${errs:-0} ${cpu:-0} ${secs:-0}"
}

# steady BUILD PID RATE FLAGS...: records for 0.5 s and for a long run
# (3 s, or 1500 ticks at low rates: the two runs' start-up costs differ by
# some milliseconds, which over the 250 ticks between 0.5 and 3 s at 100
# Hz moved the figure by tens of percent from run to run: 112 to 168 us
# per tick for one build) and prints "ticks late missed errors cpu%
# us_per_tick" for the steady state: the long run's ticks, late, missed
# and errors; the CPU difference of the two runs over their tick
# difference (per tick, and as a share of a core at that rate of ticks).
steady() {
  local build=$1 pid=$2 rate=$3
  shift 3
  local long
  long=$(awk -v r="$rate" 'BEGIN { d = 1500 / r; if (d < 3) d = 3; printf "%d", d + 0.999 }')
  local t0 l0 m0 e0 c0 s0 t1 l1 m1 e1 c1 s1
  read -r t0 l0 m0 e0 c0 s0 < <(record_stats "$build" "$pid" "$rate" 500ms "$@")
  read -r t1 l1 m1 e1 c1 s1 < <(record_stats "$build" "$pid" "$rate" "${long}s" "$@")
  if [ "$t0" = - ] || [ "$t1" = - ]; then
    echo "- - - - - -"
    return
  fi
  awk -v t0="$t0" -v s0="$s0" -v t1="$t1" -v s1="$s1" -v l="$l1" -v m="$m1" -v e="$e1" -v d="$long" 'BEGIN {
    dt = t1 - t0; ds = s1 - s0; if (ds < 0) ds = 0
    us = dt > 0 ? ds * 1e6 / dt : 0
    # the share of a core: CPU per tick times ticks per second (long run)
    printf "%d %d %d %d %.2f %.1f\n", t1, l, m, e, us * t1 / d / 1e6 * 100, us }'
}

# late_pct TICKS LATE MISSED: the share of ticks late or missed, in %.
late_pct() { awk -v t="$1" -v l="$2" -v m="$3" 'BEGIN{printf "%.2f", 100*(l+m)/(t+m)}'; }

# flags_for MODE: the record flags of a sweep mode (-rt: --realtime).
flags_for() {
  case $1 in
  nonblocking) echo --nonblocking ;;
  nonblocking-rt) echo --nonblocking --realtime ;;
  blocking-rt) echo --realtime ;;
  esac
}
modes=(nonblocking blocking nonblocking-rt blocking-rt)

if [ "${BENCH_ONLY:-}" != targets ]; then
echo
echo "== 1. rate sweep on 4 threads x 50 frames (3 s per point, 1500 ticks below 500 Hz)"
printf "%-7s %-14s %6s %7s %6s %7s %8s %8s %8s %8s %9s\n" build mode rate ticks late% errors% "cpu%" "us/tick" "x paced" "x floor" "x 1 read"
: >"$work/sweep.tsv"
declare -A best cost100 row
# Each point is measured for every build in turn, so that the builds of a
# row pair see the same machine (its load drifts over minutes); the table
# is printed afterwards, by build.
rates=(100 200 500 1000 2000 5000 10000 20000)
for mode in "${modes[@]}"; do
  for rate in "${rates[@]}"; do
    for build in "${builds[@]}"; do
      read -r ticks late missed errs cpu us < <(steady "$build" "$deep" "$rate" $(flags_for "$mode"))
      if [ "$ticks" = - ]; then
        row[$build.$mode.$rate]="refused"
        continue
      fi
      row[$build.$mode.$rate]="$ticks $late $missed $errs $cpu $us"
    done
  done
done
for build in "${builds[@]}"; do
  for mode in "${modes[@]}"; do
    best[$build.$mode]=0
    for rate in "${rates[@]}"; do
      if [ "${row[$build.$mode.$rate]}" = refused ]; then
        printf "%-7s %-14s %6d %7s\n" "$build" "$mode" "$rate" "refused"
        echo "$build $mode $rate - -" >>"$work/sweep.tsv"
        continue
      fi
      read -r ticks late missed errs cpu us <<<"${row[$build.$mode.$rate]}"
      latep=$(late_pct "$ticks" "$late" "$missed")
      errp=$(awk -v t="$ticks" -v e="$errs" 'BEGIN{printf "%.2f", t ? 100*e/t : 0}')
      xp=$(awk -v u="$us" -v f="$paced_ns" 'BEGIN{printf "%.1f", u*1000/f}')
      xf=$(awk -v u="$us" -v f="$floor_ns" 'BEGIN{printf "%.1f", u*1000/f}')
      xo=$(awk -v u="$us" -v o="$one_ns" 'BEGIN{printf "%.1f", u*1000/o}')
      printf "%-7s %-14s %6d %7d %6s %7s %8s %8s %8s %8s %9s\n" "$build" "$mode" "$rate" "$ticks" "$latep" "$errp" "$cpu" "$us" "$xp" "$xf" "$xo"
      echo "$build $mode $rate $cpu $latep" >>"$work/sweep.tsv"
      if awk -v l="$latep" 'BEGIN{exit !(l < 1)}'; then best[$build.$mode]=$rate; fi
      [ "$rate" = 100 ] && cost100[$build.$mode]=$us
    done
  done
done
# The timer floor: the floor read alone, once per tick by the sampler's
# own clock and tick counting, at each rate: the late or missed ticks no
# sampler avoids on this machine (a VM's stalls, the wake-up latency).
# Both modes sleep on the same clock (a timerfd in Go's poller).
declare -A floorbest paused
for mode in both both-rt; do
  floorbest[$mode]=0
  rt=()
  [ "$mode" = both-rt ] && rt=(chrt -f 1)
  for rate in 100 200 500 1000 2000 5000 10000 20000; do
    o=$("${rt[@]}" "$work/readfloor" -paced "$rate" "$deep" 2>&1) || { echo "   readfloor -paced $rate: $o"; continue; }
    ticks=$(grep -o 'ticks=[0-9]*' <<<"$o" | cut -d= -f2)
    late=$(grep -o 'late=[0-9]*' <<<"$o" | cut -d= -f2)
    missed=$(grep -o 'missed=[0-9]*' <<<"$o" | cut -d= -f2)
    ns=$(grep -o 'cpu_ns_per_tick=[0-9]*' <<<"$o" | cut -d= -f2)
    latep=$(late_pct "$ticks" "$late" "$missed")
    cpu=$(awk -v n="$ns" -v t="$ticks" 'BEGIN{printf "%.2f", n*t/3e9*100}')
    printf "%-7s %-14s %6d %7d %6s %7s %8s %8s\n" floor "$mode" "$rate" "$ticks" "$latep" - "$cpu" "$(awk -v n="$ns" 'BEGIN{printf "%.1f", n/1000}')"
    echo "floor $mode $rate $cpu $latep" >>"$work/sweep.tsv"
    if awk -v l="$latep" 'BEGIN{exit !(l < 1)}'; then floorbest[$mode]=$rate; fi
  done
done
echo "   (floor: the timer floor, the floor read alone once per tick by the sampler's own clock, a timerfd in"
echo "    Go's poller for both modes: the late ticks this machine imposes on any sampler at that rate)"
echo "   (both-rt, nonblocking-rt, blocking-rt: at real-time priority, chrt -f 1 / --realtime)"
echo "   floor: highest rate with <1% late or missed ticks: ${floorbest[both]} Hz (at real-time priority: ${floorbest[both-rt]} Hz)"
echo "   (cpu% and us/tick: rbscope's steady-state CPU, share of a core and per tick; x paced / x floor /"
echo "    x 1 read: that cost over the paced floor ($((paced_ns / 1000)) us), the hot floor ($((floor_ns / 1000)) us) and one read ($((one_ns / 1000)) us))"
for build in "${builds[@]}"; do
  for mode in "${modes[@]}"; do
    echo "   $build $mode: highest rate with <1% late or missed ticks: ${best[$build.$mode]} Hz"
  done
done
"$work/benchchart" "rbscope record on 4 threads x 50 frames ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))" \
  <"$work/sweep.tsv" >"$out/bench-record.svg"
cp "$work/sweep.tsv" "$out/bench-record-sweep.tsv"
if command -v chromium >/dev/null; then
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$out/bench-record.png" \
    --window-size=1120,"$(grep -o 'height="[0-9]*"' "$out/bench-record.svg" | head -1 | tr -dc 0-9)" \
    "file://$out/bench-record.svg" >/dev/null 2>&1 || true
fi
echo "   chart: $out/bench-record.png (data $out/bench-record-sweep.tsv)"

echo
echo "== 3. system calls per steady-state tick at 100 Hz (strace -c -f of a 0.5 s and a 3 s recording:"
echo "   the difference of their counts over the 250 ticks between them; opening the target cancels out)"
if command -v strace >/dev/null; then
  # strace_counts BUILD DURATION FLAGS...: "name count" lines.
  strace_counts() {
    local build=$1 dur=$2
    shift 2
    strace -c -f -o "$work/strace.txt" "$work/$build" record --pid "$deep" --rate 100 --duration "$dur" \
      --format summary -o "$work/s.txt" --raw "$work/r.raw.gz" "$@" >/dev/null 2>&1 || true
    awk '$NF ~ /^[a-z_0-9]+$/ && $NF != "syscall" { print $NF, $4 }' "$work/strace.txt"
  }
  for build in "${builds[@]}"; do
    for mode in nonblocking blocking; do
      strace_counts "$build" 500ms $(flags_for "$mode") >"$work/sc0.txt"
      strace_counts "$build" 3s $(flags_for "$mode") >"$work/sc1.txt"
      if [ "$mode" = blocking ]; then
        # Each thread paused costs three ptrace calls (SEIZE, INTERRUPT,
        # DETACH): the threads a blocking tick stops, for section 5.
        paused[$build]=$(awk 'NR == FNR { c0[$1] = $2; next } { c1[$1] = $2 }
          END { printf "%.2f", (c1["ptrace"] - c0["ptrace"]) / 250 / 3 }' "$work/sc0.txt" "$work/sc1.txt")
      fi
      awk -v b="$build" -v m="$mode" '
        NR == FNR { c0[$1] = $2; next } { c1[$1] = $2 }
        END { printf "   %-7s %-11s per tick:", b, m
          n = split("process_vm_readv clock_nanosleep nanosleep pread64 futex ptrace wait4 waitid read epoll_pwait timerfd_settime total", k, " ")
          for (i = 1; i <= n; i++) { d = (c1[k[i]] - c0[k[i]]) / 250; if (d > 0.05) printf " %s %.1f", k[i], d }
          printf "\n" }' "$work/sc0.txt" "$work/sc1.txt"
    done
  done
else
  echo "   strace not installed"
fi
kill -9 "$deep" 2>/dev/null || true
wait "$deep" 2>/dev/null || true

echo
echo "== 1b. a single-thread target (1 thread x 50 frames, the 4-thread target stopped), nonblocking"
ruby "$work/single.rb" &
single=$!
pids+=("$single")
sleep 1
for rate in 5000 10000 20000; do
  for build in "${builds[@]}"; do
    for rt in "" --realtime; do
      read -r ticks late missed errs cpu us < <(steady "$build" "$single" "$rate" --nonblocking $rt)
      if [ "$ticks" = - ]; then
        printf "   %-7s %-10s %6d Hz refused\n" "$build" "$rt" "$rate"
        continue
      fi
      printf "   %-7s %-10s %6d Hz: %s%% late or missed, %s%% errors, %s us per tick, %s%% of a core\n" "$build" "$rt" "$rate" \
        "$(late_pct "$ticks" "$late" "$missed")" "$(awk -v t="$ticks" -v e="$errs" 'BEGIN{printf "%.2f", t ? 100*e/t : 0}')" "$us" "$cpu"
    done
  done
done
kill -9 "$single" 2>/dev/null || true
wait "$single" 2>/dev/null || true

echo
echo "== 2. rbscope steady-state CPU at 100 Hz on examples/shop.rb"
ruby examples/shop.rb >/dev/null 2>&1 &
shop=$!
pids+=("$shop")
sleep 1
for mode in nonblocking blocking; do
  for build in "${builds[@]}"; do
    read -r ticks late missed errs cpu us < <(steady "$build" "$shop" 100 $(flags_for "$mode"))
    printf "   %-7s %-11s rbscope CPU %s%% of one core, %s us per tick = %s x paced floor (%s ticks, %s errors)\n" "$build" "$mode" "$cpu" "$us" \
      "$(awk -v u="$us" -v f="$paced_ns" 'BEGIN{printf "%.1f", u*1000/f}')" "$ticks" "$errs"
  done
done
kill -9 "$shop" 2>/dev/null || true

echo
echo "== 4. target slowdown at 1 kHz (40 x fib(27) timed inside Ruby; 5 pairs, each profiled run next to an"
echo "   unprofiled one; the median of the 5 ratios, and their range)"
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }
for build in "${builds[@]}"; do
  for mode in nonblocking blocking; do
    ratios=()
    for i in 1 2 3 4 5; do
      b=$(ruby "$work/workload.rb" | field elapsed)
      v=$("$work/$build" record --rate 1000 --format summary -o "$work/s.txt" --raw "$work/r.raw.gz" \
        --silent $(flags_for "$mode") -- ruby "$work/workload.rb" | field elapsed)
      ratios+=("$(awk -v v="$v" -v b="$b" 'BEGIN{printf "%.4f", v/b}')")
    done
    printf '%s\n' "${ratios[@]}" | sort -n | awk -v b="$build" -v m="$mode" '
      { r[NR] = $1 } END { printf "   %-7s %-11s x%.3f (range x%.3f .. x%.3f)\n", b, m, r[3], r[1], r[5] }'
  done
done

echo
echo "== 5. pause cost at 100 Hz (blocking minus nonblocking CPU per tick; per thread stopped, counted from"
echo "   section 3's ptrace calls: three per thread)"
for build in "${builds[@]}"; do
  nb=${cost100[$build.nonblocking]:-}
  bl=${cost100[$build.blocking]:-}
  if [ -n "$nb" ] && [ -n "$bl" ]; then
    awk -v b="$build" -v nb="$nb" -v bl="$bl" -v o="$one_ns" -v n="${paused[$build]:-}" 'BEGIN {
      d = bl - nb; printf "   %-7s %.1f us per tick (%.1f x one read)", b, d, d * 1000 / o
      if (n > 0) printf "; %.2f threads stopped per tick, %.1f us per thread", n, d / n
      printf "\n" }'
  fi
done
fi # BENCH_ONLY
kill -9 "$deep" 2>/dev/null || true
wait "$deep" 2>/dev/null || true

# floors PID: sets one_ns, floor_ns and paced_ns to the baselines measured
# on the target PID (readfloor).
floors() {
  local b
  read -r b < <("$work/readfloor" "$1" 5000)
  one_ns=$(grep -o 'one_read_ns=[0-9]*' <<<"$b" | cut -d= -f2)
  floor_ns=$(grep -o ' floor_ns=[0-9]*' <<<"$b" | cut -d= -f2)
  paced_ns=$(grep -o 'paced_floor_ns=[0-9]*' <<<"$b" | cut -d= -f2)
  echo "   baselines: $b"
}

# cost_row LABEL BUILD PID RATE FLAGS...: one steady-state row, against
# the floors of the last floors call.
cost_row() {
  local label=$1 build=$2 pid=$3 rate=$4
  shift 4
  local ticks late missed errs cpu us
  read -r ticks late missed errs cpu us < <(steady "$build" "$pid" "$rate" "$@")
  if [ "$ticks" = - ]; then
    printf "   %-7s %-26s %6d Hz refused\n" "$build" "$label" "$rate"
    return
  fi
  printf "   %-7s %-26s %6d Hz %8s us/tick %7s%% of a core  x%5s paced  x%5s floor  late %s%%  errors %s\n" "$build" "$label" "$rate" "$us" "$cpu" \
    "$(awk -v u="$us" -v f="$paced_ns" 'BEGIN{printf "%.1f", u*1000/f}')" \
    "$(awk -v u="$us" -v f="$floor_ns" 'BEGIN{printf "%.1f", u*1000/f}')" \
    "$(late_pct "$ticks" "$late" "$missed")" "$errs"
}

echo
echo "== 7. the puma-shaped target (testdata/ruby/pumashape.rb: 12 threads, 5 busy x 150 frames, 7 idle)"
ruby testdata/ruby/pumashape.rb >"$work/pumashape.out" &
puma_shaped=$!
pids+=("$puma_shaped")
for _ in $(seq 100); do grep -q '^ready' "$work/pumashape.out" 2>/dev/null && break; sleep 0.1; done
floors "$puma_shaped"
for rate in 100 1000; do
  for mode in nonblocking blocking; do
    for build in "${builds[@]}"; do
      cost_row "$mode" "$build" "$puma_shaped" "$rate" $(flags_for "$mode")
    done
  done
done
kill -9 "$puma_shaped" 2>/dev/null || true
wait "$puma_shaped" 2>/dev/null || true

echo
echo "== 8. a real Rails app (scripts/rails-app.sh: Rails 6.1, puma production, 5 threads, 12 Ruby threads)"
if ! command -v ab >/dev/null; then
  echo "   ab not installed (apache2-utils): skipped"
else
  app=$(scripts/rails-app.sh build 2>/dev/null)
  (cd "$app" && RAILS_LOG_TO_STDOUT=1 PORT=0 exec puma -C config/puma.rb >"$work/puma.log" 2>&1) &
  rails=$!
  pids+=("$rails")
  port=
  for _ in $(seq 600); do
    port=$(grep -o 'Listening on http://127.0.0.1:[0-9]*' "$work/puma.log" 2>/dev/null | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && break
    sleep 0.2
  done
  [ -n "$port" ] || { echo "   puma did not start:"; tail -n 20 "$work/puma.log"; exit 1; }
  url=http://127.0.0.1:$port
  # load SECONDS: ab -c 4 on each action at once for SECONDS; prints the
  # requests per second of both together, and the failures.
  load() {
    ab -q -c 4 -t "$1" -n 1000000 "$url/posts" >"$work/ab1.txt" 2>&1 &
    local a1=$!
    ab -q -c 4 -t "$1" -n 1000000 "$url/page" >"$work/ab2.txt" 2>&1 &
    local a2=$!
    wait "$a1" "$a2" || true
    awk '/^Requests per second/ { r += $4 } /^Failed requests/ { f += $3 } /^Non-2xx/ { f += $3 }
      END { printf "%.2f %d\n", r, f }' "$work/ab1.txt" "$work/ab2.txt"
  }
  read -r warm _ < <(load 5) # compiles the templates, fills the caches
  echo "   puma pid $rails on $url; warm-up: $warm req/s"
  floors "$rails"
  for mode in nonblocking blocking; do
    for build in "${builds[@]}"; do
      cost_row "idle $mode" "$build" "$rails" 100 $(flags_for "$mode")
    done
  done
  for mode in nonblocking blocking; do
    for build in "${builds[@]}"; do
      # ab runs through both of steady's recordings (0.5 s and 15 s).
      load 22 >"$work/abload.txt" &
      l=$!
      sleep 1
      cost_row "ab load $mode" "$build" "$rails" 100 $(flags_for "$mode")
      wait "$l" || true
      read -r rps fails <"$work/abload.txt"
      echo "      (ab meanwhile: $rps req/s, $fails failed)"
    done
  done
  # Requests per second lost: ab for 10 s alone, then beside a recording
  # at 100 Hz that spans it, in turn, 3 rounds; medians.
  declare -A rps
  for round in 1 2 3; do
    for kind in none nonblocking blocking; do
      for build in "${builds[@]}"; do
        [ "$kind" = none ] && [ "$build" != "${builds[0]}" ] && continue
        key=$kind
        [ "$kind" != none ] && key=$build.$kind
        if [ "$kind" = none ]; then
          read -r r f < <(load 10)
        else
          "$work/$build" record --pid "$rails" --rate 100 --duration 13s --format summary -o "$work/s.txt" \
            --raw "$work/r.raw.gz" $(flags_for "$kind") >/dev/null 2>&1 &
          rec=$!
          sleep 1.5
          read -r r f < <(load 10)
          wait "$rec" || true
        fi
        rps[$key]="${rps[$key]:-} $r"
        [ "$f" = 0 ] || echo "   ($key round $round: $f failed requests)"
      done
    done
  done
  med() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  base=$(med <<<"${rps[none]}")
  echo "   ab -c 8 (4 on /posts, 4 on /page) for 10 s, 3 rounds each: alone ${rps[none]# } req/s, median $base"
  for build in "${builds[@]}"; do
    for kind in nonblocking blocking; do
      m=$(med <<<"${rps[$build.$kind]}")
      printf "   %-7s %-11s recording at 100 Hz: %s req/s (median %s), %s%% lost\n" "$build" "$kind" "${rps[$build.$kind]# }" "$m" \
        "$(awk -v b="$base" -v m="$m" 'BEGIN{printf "%.1f", (b > 0 ? 100*(b-m)/b : 0)}')"
    done
  done
  kill "$rails" 2>/dev/null || true
  wait "$rails" 2>/dev/null || true
fi

echo
echo "load after: $(uptime)"
