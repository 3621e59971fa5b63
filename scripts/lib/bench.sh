# Sourced by the scripts/bench-*.sh benchmarks: strict mode, the
# repository root as working directory, Go on PATH, a scratch directory
# $work (removed on exit) and, on exit, the processes listed in $pids and
# the script's background jobs killed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH=$PATH:/usr/local/go/bin
# rbscope as shipped: static, no libc (see the README).
export CGO_ENABLED=0
work=$(mktemp -d)
pids=()
bench_cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  jobs -p | xargs -r kill 2>/dev/null || true
  rm -rf "$work"
}
trap bench_cleanup EXIT
