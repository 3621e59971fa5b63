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
# Usage: scripts/bench-layout.sh [benchtime, default 5x]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
benchtime=${1:-5x}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
