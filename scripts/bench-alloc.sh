#!/usr/bin/env bash
# Measures what `rbscope alloc` costs the process it traces, against the
# same loop untraced and under bcc's uobjnew, in one run:
#   - 5M Object.new, 1M array literals, and 500k Object.new paced at 100
#     per millisecond ("paced": allocation rate set by input, not CPU)
#     (internal/alloc/testdata/bench.rb)
#   - modes: none, rbscope (exact), rbscope --sample-period 10,
#     rbscope --duty-cycle 0.1, bcc uobjnew (if it can run here)
#   - best of RUNS runs per mode (the machine may be shared), slowdown as a
#     ratio to "none", per-event cost in ns, and the count error of each
#     rbscope mode against the known number of allocations.
# Needs root. Not part of CI. Usage: scripts/bench-alloc.sh [RUNS]
# Environment: N_OBJ, N_ARY, N_PACED (sizes), KINDS ("objects arrays paced"), MODES ("none rbscope sampled
# duty bcc"). bcc needs EXTRA_PACKAGES="bpfcc-tools linux-headers-amd64"
# scripts/install-deps.sh; without headers for the running kernel, the
# nearest Debian headers are merged into one tree for it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
RUNS=${1:-${RUNS:-3}}
N_OBJ=${N_OBJ:-5000000}
N_ARY=${N_ARY:-1000000}
N_PACED=${N_PACED:-500000}
BENCH=$PWD/internal/alloc/testdata/bench.rb
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; jobs -p | xargs -r kill 2>/dev/null || true' EXIT

[ "$(id -u)" -eq 0 ] || { echo "bench-alloc: needs root" >&2; exit 1; }
go build -o "$WORK/rbscope" ./cmd/rbscope

# bcc's uobjnew compiles its program against kernel headers. Use the
# running kernel's, or Debian's nearest linux-headers package.
BCC=""
if command -v uobjnew >/dev/null || [ -x /usr/sbin/uobjnew ]; then
  BCC=$(command -v uobjnew || echo /usr/sbin/uobjnew)
  if [ ! -d "/lib/modules/$(uname -r)/build" ] && [ -z "${BCC_KERNEL_SOURCE:-}" ]; then
    # Debian splits a header tree in -common (include/linux/...) and
    # -amd64 (generated headers, .config); bcc wants one tree: merge them
    # as a tree of symlinks. (apt-get install linux-headers-6.1.0-50-amd64)
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$hdr" ] && [ -d "${hdr%-amd64}-common" ]; then
      mkdir -p "$WORK/kernel"
      cp -rs "${hdr%-amd64}-common/." "$WORK/kernel/"
      cp -rs --remove-destination "$hdr/." "$WORK/kernel/"
      export BCC_KERNEL_SOURCE=$WORK/kernel
      echo "bcc: kernel $(uname -r) has no headers; using $(basename "$hdr")'s" >&2
    fi
  fi
fi

# run_one MODE KIND N: prints "elapsed counted" (counted: allocations of the
# loop's class the tracer reported, "-" if none).
run_one() {
  local mode=$1 kind=$2 n=$3 class
  [ "$kind" = arrays ] && class=Array || class=Object
  local in="$WORK/in" out="$WORK/out" rep="$WORK/rep.json" log="$WORK/tracer.log"
  rm -f "$in" "$out" "$rep" "$log"
  mkfifo "$in"
  ruby "$BENCH" "$kind" "$n" <"$in" >"$out" &
  local rpid=$!
  exec 7>"$in"
  until grep -q ready "$out" 2>/dev/null; do sleep 0.05; done
  local tpid=""
  case $mode in
    none) ;;
    rbscope) "$WORK/rbscope" alloc --pid $rpid --format json -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    sampled) "$WORK/rbscope" alloc --pid $rpid --format json --sample-period 10 -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    duty) "$WORK/rbscope" alloc --pid $rpid --format json --duty-cycle 0.1 -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    bcc) PYTHONUNBUFFERED=1 "$BCC" -l ruby $rpid 3600 >"$log" 2>&1 & tpid=$! ;;
  esac
  if [ -n "$tpid" ]; then
    # Attached: rbscope says so on stderr, uobjnew prints "Tracing".
    local waited=0
    until grep -qE "attached to|Tracing allocations" "$log" 2>/dev/null; do
      sleep 0.05; waited=$((waited + 1))
      if ! kill -0 $tpid 2>/dev/null || [ $waited -gt 1200 ]; then
        echo "ERROR $(head -c 300 "$log" | tr '\n' ' ')"; kill $rpid 2>/dev/null; exec 7>&-; wait 2>/dev/null || true; return
      fi
    done
  fi
  echo go >&7
  until grep -q elapsed "$out" 2>/dev/null; do sleep 0.05; done
  local elapsed counted="-"
  elapsed=$(awk '/elapsed/ {print $2}' "$out")
  if [ -n "$tpid" ]; then
    # Background jobs of a script ignore SIGINT: rbscope catches it anyway
    # (Go's signal.Notify), uobjnew (Python) would not, so it gets SIGTERM.
    if [ "$mode" = bcc ]; then kill -TERM $tpid; else kill -INT $tpid; fi
    wait $tpid 2>/dev/null || true
    if [ -s "$rep" ]; then
      counted=$(ruby -rjson -e 'r = JSON.parse(File.read(ARGV[0])); c = r["by_class"].find { |e| e["class"] == ARGV[1] }; puts(c ? c["count"] : 0)' "$rep" "$class")
    fi
  fi
  echo >&7; exec 7>&-
  wait $rpid 2>/dev/null || true
  echo "$elapsed $counted"
}

modes=(${MODES:-none rbscope sampled duty})
[ -n "$BCC" ] && [ -z "${MODES:-}" ] && modes+=(bcc)
[ -z "$BCC" ] && [[ " ${modes[*]} " == *" bcc "* ]] && { echo "bench-alloc: uobjnew not installed" >&2; exit 1; }

for kind in ${KINDS:-objects arrays paced}; do
  case $kind in objects) n=$N_OBJ ;; arrays) n=$N_ARY ;; paced) n=$N_PACED ;; esac
  declare -A best=() cnt=()
  for ((r = 1; r <= RUNS; r++)); do
    for m in "${modes[@]}"; do
      res=$(run_one "$m" "$kind" "$n")
      if [[ $res == ERROR* ]]; then
        echo "$kind/$m: ${res#ERROR }" >&2
        best[$m]=ERROR
        continue
      fi
      e=${res% *}; c=${res#* }
      if [ "${best[$m]:-}" != ERROR ] && { [ -z "${best[$m]:-}" ] || awk -v a="$e" -v b="${best[$m]}" 'BEGIN{exit !(a<b)}'; }; then
        best[$m]=$e; cnt[$m]=$c
      fi
    done
  done
  echo "== $kind: $n allocations, best of $RUNS runs"
  printf "%-9s %10s %9s %12s %14s\n" mode seconds slowdown "ns/event" "count error"
  for m in "${modes[@]}"; do
    if [ "${best[$m]}" = ERROR ]; then printf "%-9s %10s\n" "$m" "failed"; continue; fi
    awk -v m="$m" -v e="${best[$m]}" -v b="${best[none]}" -v n="$n" -v c="${cnt[$m]:--}" 'BEGIN {
      err = "-"
      if (c != "-") err = sprintf("%+.2f%%", 100 * (c - n) / n)
      printf "%-9s %10.3f %8.2fx %12.0f %14s\n", m, e, e / b, 1e9 * (e - b) / n, err }'
  done
  unset best cnt
done
