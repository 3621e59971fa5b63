#!/usr/bin/env bash
# Measures `rbscope heap` on a process with many live objects
# (internal/heap/testdata/bench.rb at SCALE, default 10: 1M Leaky::Node,
# 200k strings, 20k arrays and hashes), in one run:
#   - rbscope heap, running (default: each batch read twice) and --stop:
#     wall time, rbscope's CPU (user+system) and peak RSS (/usr/bin/time),
#     bytes read and read rate (from its JSON), and with --stop how long
#     the process was paused;
#   - the floor: one plain process_vm_readv copy of the same page spans,
#     in the same 2 MiB batches, nothing decoded (tools/heapfloor);
#   - the in-process census: count_objects plus each_object tallying
#     class and memsize_of, timed inside the Ruby process itself.
# Best of RUNS runs each (the machine may be shared); ratios to the floor.
# Needs root. Not part of CI. Usage: scripts/bench-heap.sh [RUNS]
# Environment: SCALE, RUBY (default ruby).
source "$(dirname "$0")/lib/bench.sh"
RUNS=${1:-${RUNS:-3}}
SCALE=${SCALE:-10}
RUBY=${RUBY:-ruby}
[ "$(id -u)" -eq 0 ] || { echo "bench-heap: needs root" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench-heap: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
go build -o "$work/rbscope" ./cmd/rbscope
go build -o "$work/heapfloor" ./tools/heapfloor

mkfifo "$work/out"
"$RUBY" internal/heap/testdata/bench.rb "$SCALE" >"$work/out" &
pid=$!
pids+=("$pid")
inproc=""
while read -r line; do
  case "$line" in
    inproc_ns=*) inproc=${line#inproc_ns=} ;;
    ready) break ;;
  esac
done <"$work/out"
cat "$work/out" >/dev/null &
rss_target=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")

floor=$("$work/heapfloor" "$pid" 5)
eval "$floor" # floor_ns cpu_ns bytes pages

# run MODE ARGS...: best wall of RUNS; sets best_* from /usr/bin/time and the JSON.
measure() {
  local mode=$1; shift
  local best_wall="" i
  for ((i = 0; i < RUNS; i++)); do
    /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$work/rbscope" heap --pid "$pid" --format json "$@" >"$work/json"
    read -r wall user sys maxrss <"$work/time"
    local dur read_b pause changed cpu
    dur=$(sed -n 's/^  "duration_ns": \([0-9]*\),/\1/p' "$work/json")
    read_b=$(sed -n 's/^  "bytes_read": \([0-9]*\),/\1/p' "$work/json")
    pause=$(sed -n 's/^  "pause_ns": \([0-9]*\),/\1/p' "$work/json")
    changed=$(sed -n 's/^  "changed_slots": \([0-9]*\),/\1/p' "$work/json")
    cpu=$(sed -n 's/^  "cpu_ns": \([0-9]*\),/\1/p' "$work/json")
    if [ -z "$best_wall" ] || awk "BEGIN{exit !($wall < $best_wall)}"; then
      best_wall=$wall
      eval "${mode}_wall=$wall ${mode}_cpu=$(awk "BEGIN{print $user+$sys}") ${mode}_rss=$maxrss ${mode}_dur=$dur ${mode}_read=$read_b ${mode}_pause=${pause:-0} ${mode}_changed=${changed:-0} ${mode}_ccpu=$cpu"
    fi
  done
}
measure running
measure stop --stop

mib() { awk "BEGIN{printf \"%.1f\", $1/1048576}"; }
ms() { awk "BEGIN{printf \"%.1f\", $1/1e6}"; }
echo "bench-heap: $RUBY $("$RUBY" -e 'print RUBY_VERSION'), SCALE=$SCALE, $pages pages, $(mib "$bytes") MiB of page spans, target RSS $((rss_target / 1024)) MiB, best of $RUNS"
echo "floor (one process_vm_readv copy of the spans): $(ms "$floor_ns") ms wall, $(ms "$cpu_ns") ms CPU, $(awk "BEGIN{printf \"%.0f\", $bytes/$floor_ns*1e3}") MB/s"
echo "in-process census (count_objects + each_object class/memsize_of): $(ms "$inproc") ms"
for mode in running stop; do
  eval "w=\$${mode}_wall c=\$${mode}_cpu r=\$${mode}_rss d=\$${mode}_dur b=\$${mode}_read p=\$${mode}_pause ch=\$${mode}_changed cc=\$${mode}_ccpu"
  printf '%-8s census %s ms wall (x%.1f floor, x%.2f in-process), %s ms CPU (x%.1f floor CPU); whole rbscope run %s s wall, %s s CPU, peak RSS %s MiB; read %s MiB (x%.2f the floor'"'"'s bytes) at %.0f MB/s; pause %s ms; changed slots %s\n' \
    "$mode" "$(ms "$d")" "$(awk "BEGIN{print $d/$floor_ns}")" "$(awk "BEGIN{print $d/$inproc}")" "$(ms "$cc")" "$(awk "BEGIN{print $cc/$cpu_ns}")" \
    "$w" "$c" "$((r / 1024))" "$(mib "$b")" "$(awk "BEGIN{print $b/$bytes}")" "$(awk "BEGIN{print $b/$d*1e3}")" "$(ms "$p")" "$ch"
done
