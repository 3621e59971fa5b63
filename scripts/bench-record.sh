#!/usr/bin/env bash
# Measures rbscope record's costs, every number in one run so that they
# can be compared (the machine's load shifts absolute numbers):
#   1. per-sample cost (Go benchmark, real walker, 4 threads x 50 frames),
#      against one 8-byte process_vm_readv measured alongside;
#   2. the highest rate sustained with <1% late/missed ticks;
#   3. rbscope's own CPU at 100 Hz over 10 s (blocking and nonblocking);
#   4. the target's slowdown: a fixed CPU-bound Ruby workload timed without
#      and with rbscope (100 and 1000 Hz, blocking and nonblocking);
#   5. the error rate of blocking vs nonblocking on a busy 4-thread target.
# Needs root (ptrace) and ruby. Takes about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/rbscope" ./cmd/rbscope
rbscope=$work/rbscope

cat >"$work/deep.rb" <<'EOF'
def deep(n, &blk); n > 0 ? deep(n - 1, &blk) : blk.call; end
def spin; x = 0; loop { x += 1 }; end
3.times { |i| Thread.new { deep(47) { spin } }.name = "t#{i}" }
deep(47) { spin }
EOF
cat >"$work/workload.rb" <<'EOF'
def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
10.times { fib(30) }
puts "elapsed=#{Process.clock_gettime(Process::CLOCK_MONOTONIC) - t} cpu=#{Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c}"
EOF

echo "== 1. per-sample cost (go test -bench 'Sample|RunOverhead' ./internal/sampler/)"
go test -run XXX -bench 'Sample|RunOverhead' -benchtime 2s ./internal/sampler/ | grep '^Benchmark' |
  awk '{ns[$1]=$3; print} END {
    for (k in ns) { if (k ~ /ReadBaseline/) base = ns[k] }
    for (k in ns) { if (k !~ /ReadBaseline/ && base > 0) printf "   %-40s %8.0f x one 8-byte read\n", k, ns[k] / base }
  }'

ruby "$work/deep.rb" &
deep=$!
pids+=("$deep")
sleep 1

# record_stats RATE DURATION MODE-FLAGS...: prints "ticks late missed errors cpu%"
record_stats() {
  local rate=$1 dur=$2
  shift 2
  local out
  out=$("$rbscope" record --pid "$deep" --rate "$rate" --duration "$dur" --format summary \
    -o "$work/s.txt" --raw "$work/r.raw.gz" "$@" 2>&1)
  local line cpu
  line=$(grep -o '([0-9]* ticks, [0-9]* late, [0-9]* missed); errors: .*' <<<"$out")
  cpu=$(grep -o '([0-9.]*% of one core)' <<<"$out" | tr -d '(%' | awk '{print $1}')
  local ticks late missed errs
  ticks=$(awk '{print substr($1,2)}' <<<"$line")
  late=$(awk '{print $3}' <<<"$line")
  missed=$(awk '{print $5}' <<<"$line")
  errs=$(sed 's/.*errors: //' <<<"$line" | grep -o '[0-9]*' | paste -sd+ | bc 2>/dev/null || echo 0)
  echo "$ticks $late $missed ${errs:-0} ${cpu:-?}"
}

echo
echo "== 2. highest rate with <1% late or missed ticks (3 s each, 4 threads x 50 frames)"
for mode in blocking nonblocking; do
  flags=()
  [ "$mode" = nonblocking ] && flags=(--nonblocking)
  best=0
  for rate in 100 200 500 1000 2000 5000 10000; do
    read -r ticks late missed errs cpu < <(record_stats "$rate" 3s "${flags[@]}")
    frac=$(awk -v t="$ticks" -v l="$late" -v m="$missed" 'BEGIN { printf "%.4f", (l + m) / (t + m) }')
    printf "   %-11s %6d Hz: %6d ticks, %5d late, %6d missed (%.2f%%), rbscope CPU %s%%\n" \
      "$mode" "$rate" "$ticks" "$late" "$missed" "$(awk -v f="$frac" 'BEGIN{print f*100}')" "$cpu"
    if awk -v f="$frac" 'BEGIN { exit !(f < 0.01) }'; then best=$rate; fi
  done
  echo "   $mode: highest rate with <1% late: ${best} Hz"
done

echo
echo "== 3 and 5. 10 s at 100 Hz on the busy 4-thread target: rbscope CPU and error rate"
for mode in blocking nonblocking; do
  flags=()
  [ "$mode" = nonblocking ] && flags=(--nonblocking)
  read -r ticks late missed errs cpu < <(record_stats 100 10s "${flags[@]}")
  printf "   %-11s rbscope CPU %s%% of one core; errors %d of %d ticks (%.2f%%)\n" \
    "$mode" "$cpu" "$errs" "$ticks" "$(awk -v e="$errs" -v t="$ticks" 'BEGIN{print 100*e/t}')"
done
kill -9 "$deep" 2>/dev/null || true
wait "$deep" 2>/dev/null || true

echo
echo "== 4. target slowdown (workload: 10 x fib(30), elapsed measured inside Ruby;"
echo "   each run is paired with a baseline run just before it: load drifts)"
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }
for rate in 100 1000; do
  for mode in blocking nonblocking; do
    flags=()
    [ "$mode" = nonblocking ] && flags=(--nonblocking)
    b=$(ruby "$work/workload.rb")
    v=$("$rbscope" record --rate "$rate" --format summary -o "$work/s.txt" --raw "$work/r.raw.gz" \
      --silent "${flags[@]}" -- ruby "$work/workload.rb")
    bw=$(field elapsed <<<"$b"); bc_=$(field cpu <<<"$b")
    vw=$(field elapsed <<<"$v"); vc=$(field cpu <<<"$v")
    printf "   %5d Hz %-11s wall %.3fs vs %.3fs: x%.3f   target CPU %.3fs vs %.3fs: x%.3f\n" \
      "$rate" "$mode" "$vw" "$bw" "$(awk -v v="$vw" -v b="$bw" 'BEGIN{print v/b}')" \
      "$vc" "$bc_" "$(awk -v v="$vc" -v b="$bc_" 'BEGIN{print v/b}')"
  done
done
