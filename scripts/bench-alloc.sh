#!/usr/bin/env bash
# Measures what `rbscope alloc` costs the process it traces, against the
# same loop untraced and under bcc's uobjnew, in one run:
#   - 5M Object.new, 5M array literals, 500k Object.new paced at 100 per
#     millisecond ("paced": allocation rate set by input, not CPU), and 2M
#     Object.new in bursts of 20,000 every 50 ms ("bursty")
#     (internal/alloc/testdata/bench.rb)
#   - modes: none (untraced), default (rbscope alloc: counting windows
#     scaled by Ruby's own allocation counter), exact (rbscope alloc
#     --exact), retained (rbscope alloc --retained: objects tracked from
#     their creation to their death, in windows), retained_exact
#     (--retained --exact: every object tracked), bcc (uobjnew, if it can
#     run here); the retained modes have no count error (the loops keep
#     nothing)
#   - "prog ns": what the tracer's BPF program itself cost per run (the
#     kernel's run-time statistics, kernel.bpf_stats_enabled on for the
#     run, tools/bpfprogs), apart from the uprobe trap every tracer pays
#   - best of RUNS runs per mode (the machine may be shared): the loop's
#     CPU time (user+system of the Ruby process: the probes' traps run in
#     its context; far less disturbed by other load than wall time) and
#     wall time, slowdowns as ratios to "none" in the same run, per-event
#     cost in CPU ns, and each tracer's count error against the known
#     number of allocations; "median x" is the ratio of the median CPU
#     times (the default mode's cost depends on where its random windows
#     fall, which the best run hides).
# Needs root. Not part of CI. Usage: scripts/bench-alloc.sh [RUNS]
# Environment: N_OBJ, N_ARY, N_PACED, N_BURSTY (sizes), KINDS ("objects
# arrays paced bursty"), MODES ("none default exact retained retained_exact bcc"; also exact_nostacks,
# exact_persite, exact_nosites), BASELINE_REV (a git revision, e.g. the
# commit before a change: its rbscope is built too, and every rbscope mode
# also runs with it as MODE-before, in the same run), RUBY (the Ruby to
# run, default ruby). bcc needs EXTRA_PACKAGES="bpfcc-tools linux-headers-amd64"
# scripts/install-deps.sh; without headers for the running kernel, the
# nearest Debian headers are merged into one tree for it.
source "$(dirname "$0")/lib/bench.sh"
RUNS=${1:-${RUNS:-3}}
N_OBJ=${N_OBJ:-5000000}
N_ARY=${N_ARY:-5000000}
N_PACED=${N_PACED:-500000}
N_BURSTY=${N_BURSTY:-2000000}
RUBY=${RUBY:-ruby}
BENCH=$PWD/internal/alloc/testdata/bench.rb

[ "$(id -u)" -eq 0 ] || { echo "bench-alloc: needs root" >&2; exit 1; }
go build -o "$work/rbscope" ./cmd/rbscope
if [ -n "${BASELINE_REV:-}" ]; then
  build_baseline "$work/rbscope-before"
fi
go build -o "$work/bpfprogs" ./tools/bpfprogs
# The kernel times BPF programs only while asked to; restored on exit.
stats_was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$stats_was; bench_cleanup' EXIT

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
      mkdir -p "$work/kernel"
      cp -rs "${hdr%-amd64}-common/." "$work/kernel/"
      cp -rs --remove-destination "$hdr/." "$work/kernel/"
      export BCC_KERNEL_SOURCE=$work/kernel
      echo "bcc: kernel $(uname -r) has no headers; using $(basename "$hdr")'s" >&2
    fi
  fi
fi

# run_one MODE KIND N: prints "wall cpu counted prog" (counted:
# allocations of the loop's class the tracer reported, "-" if none; prog:
# its BPF programs' mean run time in ns, "-" if none ran).
run_one() {
  local mode=$1 kind=$2 n=$3 class rbscope=$work/rbscope
  if [[ $mode == *-before ]]; then
    mode=${mode%-before} rbscope=$work/rbscope-before
  fi
  [ "$kind" = arrays ] && class=Array || class=Object
  local in="$work/in" out="$work/out" rep="$work/rep.json" log="$work/tracer.log"
  rm -f "$in" "$out" "$rep" "$log"
  mkfifo "$in"
  "$RUBY" "$BENCH" "$kind" "$n" <"$in" >"$out" &
  local rpid=$!
  exec 7>"$in"
  until grep -q ready "$out" 2>/dev/null; do sleep 0.05; done
  local tpid=""
  case $mode in
    none) ;;
    default) "$rbscope" alloc --pid $rpid --format json --interval 1h -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    exact) "$rbscope" alloc --pid $rpid --format json --interval 1h --exact -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    retained) "$rbscope" alloc --pid $rpid --format json --interval 1h --retained -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    retained_exact) "$rbscope" alloc --pid $rpid --format json --interval 1h --retained --exact -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    # Where --exact's cost goes: without stack copies, with one perf-event
    # uprobe per site instead of one uprobe_multi link.
    exact_nostacks) "$rbscope" alloc --pid $rpid --format json --interval 1h --exact --no-stacks -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    exact_persite) "$rbscope" alloc --pid $rpid --format json --interval 1h --exact --no-stacks --per-site -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    # What bcc's uobjnew collects (classes, no file:line): the site's line
    # is a user-memory read in the probe.
    exact_nosites) "$rbscope" alloc --pid $rpid --format json --interval 1h --exact --no-stacks --no-sites -o "$rep" >"$log" 2>&1 & tpid=$! ;;
    # Job control on: a background job of a script otherwise ignores
    # SIGINT, and uobjnew prints its counts only on Ctrl-C.
    bcc) set -m; PYTHONUNBUFFERED=1 "$BCC" -l ruby $rpid >"$log" 2>&1 & tpid=$!; set +m ;;
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
  local elapsed counted="-" prog="-"
  elapsed=$(awk '/elapsed/ {print $2, $3}' "$out")
  if [ -n "$tpid" ]; then
    prog=$("$work/bpfprogs" | awk '$1 > 0 { printf "%.0f", $2 / $1; exit } { print "-" }')
    kill -INT $tpid
    wait $tpid 2>/dev/null || true
    if [ "$mode" = bcc ]; then
      # uobjnew prints names as Python bytes (b'Object'), builtins in
      # lower case (array).
      counted=$(awk -v c="$class" '{ k = $1; gsub(/^b\x27|\x27$/, "", k) } tolower(k) == tolower(c) { n = $2 } END { print n + 0 }' "$log")
    elif [[ $mode == retained* ]]; then
      counted="-"
    elif [ -s "$rep" ]; then
      counted=$(ruby -rjson -e 'r = JSON.parse(File.read(ARGV[0])); c = r["by_class"].find { |e| e["class"] == ARGV[1] }; puts("#{c ? c["count"] : 0}:#{r["scaling"]}")' "$rep" "$class")
    fi
  fi
  echo >&7; exec 7>&-
  wait $rpid 2>/dev/null || true
  echo "$elapsed $counted $prog"
}

# median V...: the middle value (the mean of the two middle ones).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

modes=(${MODES:-none default exact retained retained_exact})
[ -n "$BCC" ] && [ -z "${MODES:-}" ] && modes+=(bcc)
if [ -n "${BASELINE_REV:-}" ]; then
  for m in "${modes[@]}"; do
    case $m in none | bcc) ;; *) modes+=("$m-before") ;; esac
  done
fi
[ -z "$BCC" ] && [[ " ${modes[*]} " == *" bcc "* ]] && { echo "bench-alloc: uobjnew not installed" >&2; exit 1; }

echo "load before: $(uptime)"
for kind in ${KINDS:-objects arrays paced bursty}; do
  case $kind in objects) n=$N_OBJ ;; arrays) n=$N_ARY ;; paced) n=$N_PACED ;; bursty) n=$N_BURSTY ;; esac
  declare -A best=() cnt=() wall=() prg=() all=()
  for ((r = 1; r <= RUNS; r++)); do
    for m in "${modes[@]}"; do
      res=$(run_one "$m" "$kind" "$n")
      if [[ $res == ERROR* ]]; then
        echo "$kind/$m: ${res#ERROR }" >&2
        best[$m]=ERROR
        continue
      fi
      read -r w e c pr <<<"$res"
      all[$m]+="$e "
      if [ "${best[$m]:-}" != ERROR ] && { [ -z "${best[$m]:-}" ] || awk -v a="$e" -v b="${best[$m]}" 'BEGIN{exit !(a<b)}'; }; then
        best[$m]=$e; wall[$m]=$w; cnt[$m]=$c; prg[$m]=$pr
      fi
    done
  done
  echo "== $kind: $n allocations, best of $RUNS runs by CPU time ($(uptime | sed 's/.*load/load/'))"
  printf "%-21s %8s %8s %9s %9s %9s %10s %8s %20s\n" mode "cpu s" "wall s" "cpu x" "wall x" "median x" "ns/event" "prog ns" "count error"
  for m in "${modes[@]}"; do
    if [ "${best[$m]}" = ERROR ]; then printf "%-21s %8s\n" "$m" "failed"; continue; fi
    awk -v m="$m" -v e="${best[$m]}" -v b="${best[none]}" -v w="${wall[$m]}" -v bw="${wall[none]}" -v n="$n" -v c="${cnt[$m]:--}" -v pr="${prg[$m]:--}" -v md="$(median ${all[$m]})" -v bmd="$(median ${all[none]})" 'BEGIN {
      err = "-"
      if (c != "-") { split(c, p, ":"); err = sprintf("%+.2f%%", 100 * (p[1] - n) / n); if (p[2] != "" && p[2] != "exact") err = err " (" p[2] ")" }
      printf "%-21s %8.3f %8.3f %8.2fx %8.2fx %8.2fx %10.0f %8s %20s\n", m, e, w, e / b, w / bw, md / bmd, 1e9 * (e - b) / n, pr, err }'
  done
  unset best cnt wall prg all
done
echo "load after: $(uptime)"
