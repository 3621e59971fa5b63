#!/usr/bin/env bash
# Measures how much it costs to get a Ruby struct layout from DWARF:
#  1. in-process time and allocations (go test -bench BenchmarkExtract):
#     rbscope's extractor against a plain debug/elf + debug/dwarf read of
#     the same file, plain / zlib / zstd DWARF, stopping halfway ("table":
#     every struct found in the middle unit) or walking all ("wanted":
#     some structs absent);
#  2. one fresh process per run (BenchmarkProcess): peak RSS and CPU time,
#     rbscope cold, rbscope with a warm build-id cache, and the stdlib
#     baseline, next to the process floor;
#  3. the real CLI, `rbscope layout`, under /usr/bin/time.
# The DWARF-rich input is generated: a shared library of 60 units built with
# -O2 -g (about 8 MiB of .debug_info), with Ruby 3.4.1's VM structs in the
# middle unit. Ratios are against the baseline measured in the same run.
#
# 4. the same CLI on a real -ggdb3 libruby (Ruby 3.3.8 from
#    scripts/rubies.sh), before and after the stop-early change, in one run.
#
# Usage: scripts/bench-layout.sh [benchtime, default 5x] [runs for medians, default 5]
source "$(dirname "$0")/lib/bench.sh"
benchtime=${1:-5x}
runs=${2:-5}
export RBSCOPE_BENCH_DIR=$work/libs

echo "== in-process (go test -bench BenchmarkExtract, -benchtime $benchtime)"
go test -run '^$' -bench 'BenchmarkExtract' -benchtime "$benchtime" ./internal/layout/ | tee "$work/extract.txt" | grep '^Benchmark' || true
printf "%-16s %12s %12s %10s %12s %12s %10s\n" variant "ns rbscope" "ns stdlib" "time x" "B rbscope" "B stdlib" "bytes x"
awk '/^BenchmarkExtract/ {
  split($1, p, "/"); key = p[2] "/" p[3]; who = p[4]; sub(/-[0-9]+$/, "", who)
  ns[key, who] = $3; by[key, who] = $5; keys[key] = 1 }
  END { for (k in keys) printf "%-16s %12d %12d %10.2f %12d %12d %10.2f\n", k, ns[k,"rbscope"], ns[k,"stdlib"], ns[k,"rbscope"]/ns[k,"stdlib"], by[k,"rbscope"], by[k,"stdlib"], by[k,"rbscope"]/by[k,"stdlib"] }' "$work/extract.txt" | sort

echo
echo "== one process per run (BenchmarkProcess): peak RSS and CPU"
go test -run '^$' -bench 'BenchmarkProcess' -benchtime "$benchtime" ./internal/layout/ | tee "$work/process.txt" | grep '^Benchmark' || true
printf "%-22s %10s %12s %14s %14s\n" mode cpu-ms peak-RSS-KB "cpu / stdlib" "RSS / stdlib"
awk '/^BenchmarkProcess/ { name = $1; sub(/^BenchmarkProcess\//, "", name); sub(/-[0-9]+$/, "", name)
    for (i = 3; i < NF; i++) { if ($(i+1) == "cpu-ms") cpu[name] = $i; if ($(i+1) == "peak-RSS-KB") rss[name] = $i } }
  END { for (n in cpu) { split(n, p, "/"); base = p[1] "/stdlib"
      if (base in cpu) printf "%-22s %10.1f %12d %14.2f %14.2f\n", n, cpu[n], rss[n], cpu[n]/cpu[base], rss[n]/rss[base]
      else printf "%-22s %10.1f %12d\n", n, cpu[n], rss[n] } }' "$work/process.txt" | sort

echo
echo "== rbscope layout under /usr/bin/time (elapsed s, user s, sys s, max RSS KB)"
go build -o "$work/rbscope" ./cmd/rbscope
printf "%-28s %s\n" "rbscope --version (floor)" "$(/usr/bin/time -f '%e %U %S %M' "$work/rbscope" --version 2>&1 >/dev/null)"
for lib in "$RBSCOPE_BENCH_DIR"/libbig*.so; do
  printf "%-28s %s\n" "layout $(basename "$lib")" "$(/usr/bin/time -f '%e %U %S %M' "$work/rbscope" layout "$lib" 2>&1 >/dev/null)"
done

# 4. A real -ggdb3 libruby: Ruby 3.3.8's from scripts/rubies.sh (built if
#    needed, ~8 min the first time), its DWARF zlib-compressed as the
#    toolchain leaves it. "before" is rbscope built from $before (the last
#    commit that sought every struct it knows, walking to the last unit
#    when some are absent), "after" is this tree; both run here, in turn.
echo
echo "== real libruby (Ruby 3.3.8, -ggdb3), rbscope layout under /usr/bin/time, median of $runs runs"
before=${RBSCOPE_BENCH_BEFORE:-e589ee5}
real_lib=$(scripts/rubies.sh prefix 3.3.8)/lib/libruby.so.3.3.8
echo "library: $real_lib; load: $(uptime | sed 's/.*load average: //')"
have_before=""
if git cat-file -e "$before^{commit}" 2>/dev/null; then
  mkdir -p "$work/before"
  git archive "$before" | tar -x -C "$work/before"
  (cd "$work/before" && go build -o "$work/rbscope-before" ./cmd/rbscope) && have_before=1
else
  echo "(no commit $before here: set RBSCOPE_BENCH_BEFORE to compare with an older rbscope)"
fi
# median CMD...: runs CMD $runs times (each with a fresh layout cache unless
# RBSCOPE_CACHE_DIR is set) and prints the median "cpu-s max-RSS-KB".
median() {
  for _ in $(seq "$runs"); do
    RBSCOPE_CACHE_DIR=${RBSCOPE_CACHE_DIR:-$(mktemp -d -p "$work")} /usr/bin/time -f '%U %S %M' "$@" 2>&1 >/dev/null | tail -n1
  done | awk '{ print $1 + $2, $3 }' | sort -n | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }'
}
printf "%-30s %10s %12s\n" run cpu-s peak-RSS-KB
declare -A res
for who in before after; do
  bin=$work/rbscope
  if [ "$who" = before ]; then
    [ -n "$have_before" ] || continue
    bin=$work/rbscope-before
  fi
  res[$who-floor]=$(median "$bin" --version)
  res[$who-cold]=$(median "$bin" layout "$real_lib")
  printf "%-30s %10s %12s\n" "$who: rbscope --version" ${res[$who-floor]}
  printf "%-30s %10s %12s\n" "$who: layout, cold" ${res[$who-cold]}
done
# The profiler's path, cold and with the build-id cache warm (in-process
# Resolve in a fresh process, as BenchmarkProcess measures it).
RBSCOPE_BENCH_REAL_LIB=$real_lib go test -run '^$' -bench 'BenchmarkProcess/real' -benchtime "$benchtime" ./internal/layout/ |
  awk '/^BenchmarkProcess/ { name = $1; sub(/^BenchmarkProcess\//, "", name); sub(/-[0-9]+$/, "", name)
    for (i = 3; i < NF; i++) { if ($(i+1) == "cpu-ms") cpu = $i; if ($(i+1) == "peak-RSS-KB") rss = $i }
    printf "%-30s %10.3f %12d\n", "in-process: " name, cpu / 1000, rss }' | tee "$work/real.txt"
# The extraction alone: the cold in-process run less the floor process
# (the same test binary doing nothing), so that process start-up is not
# counted as extraction.
awk '$2 == "real/rbscope-cold" { c = $3 } $2 == "real/floor" { f = $3 }
  END { if (c != "" && f != "") printf "extraction alone (in-process cold - floor): %.3f s CPU\n", c - f }' "$work/real.txt"
if [ -n "$have_before" ]; then
  read -r bc br <<<"${res[before-cold]}"
  read -r ac ar <<<"${res[after-cold]}"
  awk -v bc="$bc" -v br="$br" -v ac="$ac" -v ar="$ar" 'BEGIN {
    printf "layout, cold: CPU after/before %.2f, peak RSS after/before %.2f\n", (bc > 0 ? ac / bc : 0), ar / br }'
fi
echo "goal (issue 14): cold extraction <= 0.1 s CPU, peak < 16 MB (the CLI run above: after: layout, cold)"
