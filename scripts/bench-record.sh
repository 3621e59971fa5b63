#!/usr/bin/env bash
# Measures what sampling costs, every figure from this one run (the load of
# the machine shifts absolute numbers, so each is also a ratio to two
# baselines measured alongside on the same target: ONE 8-byte
# process_vm_readv, and the FLOOR, one batched read of every Ruby thread's
# control-frame region, the least a sample of every stack must read):
#   1. a rate sweep, 100 Hz .. 20 kHz, blocking and nonblocking, on a target
#      of 4 spinning threads x 50 frames: rbscope's CPU, its cost per tick
#      and late/missed ticks -> table + PNG chart (bench-record.png);
#   2. rbscope's CPU at 100 Hz on examples/shop.rb (2 threads);
#   3. system calls per tick at 100 Hz (strace -c -f);
#   4. the target's slowdown at 1 kHz (a fixed CPU-bound Ruby workload,
#      timed inside Ruby, each run paired with an unprofiled one);
#   5. the error rate (torn or otherwise inconsistent stacks) beside the
#      rate, and the pause cost per thread (blocking minus nonblocking).
# With BASELINE_REV=<git revision> (e.g. the commit before a change), the
# rbscope of that revision is built too and measured in the same run: every
# table then has a "before" and an "after" row.
#
# Needs root (ptrace), ruby, strace and chromium (for the PNG). About
# 3 minutes (6 with BASELINE_REV). Output directory: $OUT (default
# ./bench-record-out).
source "$(dirname "$0")/lib/bench.sh"
root=$PWD
out=${OUT:-$root/bench-record-out}
mkdir -p "$out"

builds=(after)
go build -o "$work/after" ./cmd/rbscope
if [ -n "${BASELINE_REV:-}" ]; then
  mkdir "$work/src-before"
  git archive "$BASELINE_REV" | tar -x -C "$work/src-before"
  (cd "$work/src-before" && go build -o "$work/before" ./cmd/rbscope)
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
cat >"$work/workload.rb" <<'EOF'
def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
10.times { fib(27) }
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t}"
EOF

echo "load before: $(uptime)"
ruby "$work/deep.rb" &
deep=$!
pids+=("$deep")
sleep 1
read -r base < <("$work/readfloor" "$deep" 5000)
one_ns=$(grep -o 'one_read_ns=[0-9]*' <<<"$base" | cut -d= -f2)
floor_ns=$(grep -o 'floor_ns=[0-9]*' <<<"$base" | cut -d= -f2)
echo "baselines on the 4 x 50 target: $base"

# record_stats BUILD PID RATE DURATION FLAGS...: prints
# "ticks late missed errors cpu%" ("- - - - -" when the build refuses).
record_stats() {
  local build=$1 pid=$2 rate=$3 dur=$4
  shift 4
  local o
  if ! o=$("$work/$build" record --pid "$pid" --rate "$rate" --duration "$dur" --format summary \
    -o "$work/s.txt" --raw "$work/r.raw.gz" "$@" 2>&1); then
    echo "- - - - -"
    return
  fi
  local line cpu
  line=$(grep -o '([0-9]* ticks, [0-9]* late, [0-9]* missed); errors: .*' <<<"$o" || true)
  cpu=$(grep -o '([0-9.]*% of one core)' <<<"$o" | tr -d '(%' | awk '{print $1}')
  if [ -z "$line" ]; then
    echo "- - - - -"
    return
  fi
  local ticks late missed errs
  ticks=$(awk '{print substr($1,2)}' <<<"$line")
  late=$(awk '{print $3}' <<<"$line")
  missed=$(awk '{print $5}' <<<"$line")
  errs=$(sed 's/.*errors: //' <<<"$line" | grep -o '[0-9]*' | paste -sd+ | bc 2>/dev/null || true)
  echo "$ticks $late $missed ${errs:-0} ${cpu:-0}"
}

flags_for() { [ "$1" = nonblocking ] && echo --nonblocking || true; }

echo
echo "== 1. rate sweep on 4 threads x 50 frames (3 s per point)"
printf "%-7s %-11s %6s %7s %6s %7s %8s %7s %10s %9s %8s\n" build mode rate ticks late% errors% "cpu%" "us/tick" "x floor" "x 1 read" "reads*"
: >"$work/sweep.tsv"
declare -A best cost100
for build in "${builds[@]}"; do
  for mode in nonblocking blocking; do
    best[$build.$mode]=0
    for rate in 100 200 500 1000 2000 5000 10000 20000; do
      read -r ticks late missed errs cpu < <(record_stats "$build" "$deep" "$rate" 3s $(flags_for "$mode"))
      if [ "$ticks" = - ]; then
        printf "%-7s %-11s %6d %7s\n" "$build" "$mode" "$rate" "refused"
        echo "$build $mode $rate - -" >>"$work/sweep.tsv"
        continue
      fi
      latep=$(awk -v t="$ticks" -v l="$late" -v m="$missed" 'BEGIN{printf "%.2f", 100*(l+m)/(t+m)}')
      errp=$(awk -v t="$ticks" -v e="$errs" 'BEGIN{printf "%.2f", t ? 100*e/t : 0}')
      # CPU per tick: the share of a core over 3 s, divided by the ticks.
      us=$(awk -v c="$cpu" -v t="$ticks" 'BEGIN{printf "%.1f", t ? c/100*3e6/t : 0}')
      xf=$(awk -v u="$us" -v f="$floor_ns" 'BEGIN{printf "%.1f", u*1000/f}')
      xo=$(awk -v u="$us" -v o="$one_ns" 'BEGIN{printf "%.1f", u*1000/o}')
      printf "%-7s %-11s %6d %7d %6s %7s %8s %7s %10s %9s\n" "$build" "$mode" "$rate" "$ticks" "$latep" "$errp" "$cpu" "$us" "$xf" "$xo"
      echo "$build $mode $rate $cpu $latep" >>"$work/sweep.tsv"
      if awk -v l="$latep" 'BEGIN{exit !(l < 1)}'; then best[$build.$mode]=$rate; fi
      [ "$rate" = 100 ] && cost100[$build.$mode]=$us
    done
  done
done
echo "   (us/tick = rbscope CPU per tick; x floor / x 1 read = that cost over the floor / one read)"
for build in "${builds[@]}"; do
  for mode in nonblocking blocking; do
    echo "   $build $mode: highest rate with <1% late or missed ticks: ${best[$build.$mode]} Hz"
  done
done
"$work/benchchart" "rbscope record on 4 threads x 50 frames ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))" \
  <"$work/sweep.tsv" >"$out/bench-record.svg"
cp "$work/sweep.tsv" "$out/bench-record-sweep.tsv"
if command -v chromium >/dev/null; then
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$out/bench-record.png" \
    --window-size=1120,$((470 + 20 * ${#builds[@]} * 2)) "file://$out/bench-record.svg" >/dev/null 2>&1 || true
fi
echo "   chart: $out/bench-record.png (data $out/bench-record-sweep.tsv)"

echo
echo "== 3. system calls per tick at 100 Hz, 3 s (strace -c -f)"
if command -v strace >/dev/null; then
  for build in "${builds[@]}"; do
    for mode in nonblocking blocking; do
      strace -c -f -o "$work/strace.txt" "$work/$build" record --pid "$deep" --rate 100 --duration 3s \
        --format summary -o "$work/s.txt" --raw "$work/r.raw.gz" $(flags_for "$mode") >/dev/null 2>&1 || true
      awk -v b="$build" -v m="$mode" '
        $NF ~ /^(process_vm_readv|nanosleep|clock_nanosleep|pread64|futex|ptrace|wait4|openat|getdents64|read|total)$/ {
          calls = ($NF == "total") ? $3 : $4; c[$NF] = calls }
        END { printf "   %-7s %-11s per tick:", b, m
          n = split("process_vm_readv clock_nanosleep nanosleep pread64 futex ptrace wait4 read", k, " ")
          for (i = 1; i <= n; i++) if (c[k[i]] > 0) printf " %s %.1f", k[i], c[k[i]] / 300
          printf "\n" }' "$work/strace.txt"
    done
  done
else
  echo "   strace not installed"
fi
kill -9 "$deep" 2>/dev/null || true
wait "$deep" 2>/dev/null || true

echo
echo "== 2. rbscope CPU at 100 Hz on examples/shop.rb, 5 s"
ruby examples/shop.rb >/dev/null 2>&1 &
shop=$!
pids+=("$shop")
sleep 1
for build in "${builds[@]}"; do
  for mode in nonblocking blocking; do
    read -r ticks late missed errs cpu < <(record_stats "$build" "$shop" 100 5s $(flags_for "$mode"))
    printf "   %-7s %-11s rbscope CPU %s%% of one core (%s ticks, %s errors)\n" "$build" "$mode" "$cpu" "$ticks" "$errs"
  done
done
kill -9 "$shop" 2>/dev/null || true

echo
echo "== 4. target slowdown at 1 kHz (10 x fib(27) timed inside Ruby, paired with an unprofiled run)"
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }
for build in "${builds[@]}"; do
  for mode in nonblocking blocking; do
    b=$(ruby "$work/workload.rb" | field elapsed)
    v=$("$work/$build" record --rate 1000 --format summary -o "$work/s.txt" --raw "$work/r.raw.gz" \
      --silent $(flags_for "$mode") -- ruby "$work/workload.rb" | field elapsed)
    printf "   %-7s %-11s %.3fs vs %.3fs unprofiled: x%.3f\n" "$build" "$mode" "$v" "$b" \
      "$(awk -v v="$v" -v b="$b" 'BEGIN{print v/b}')"
  done
done

echo
echo "== 5. pause cost per thread at 100 Hz (blocking minus nonblocking CPU per tick, 4 threads)"
for build in "${builds[@]}"; do
  nb=${cost100[$build.nonblocking]:-}
  bl=${cost100[$build.blocking]:-}
  if [ -n "$nb" ] && [ -n "$bl" ]; then
    awk -v b="$build" -v nb="$nb" -v bl="$bl" -v o="$one_ns" 'BEGIN {
      d = (bl - nb) / 4; printf "   %-7s %.1f us per thread (%.1f x one read)\n", b, d, d * 1000 / o }'
  fi
done
echo
echo "load after: $(uptime)"
