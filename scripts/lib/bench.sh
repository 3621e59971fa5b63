# Sourced by the scripts/bench-*.sh benchmarks: strict mode, the
# repository root as working directory, Go on PATH, a scratch directory
# $work (removed on exit), on exit the processes listed in $pids and the
# script's background jobs killed, and build_baseline.
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

# build_baseline OUT: builds the rbscope of git revision $BASELINE_REV (from
# git archive, in $work) into OUT, for a same-run before/after comparison.
build_baseline() {
  mkdir -p "$work/src-before"
  git archive "$BASELINE_REV" | tar -x -C "$work/src-before"
  (cd "$work/src-before" && go build -o "$1" ./cmd/rbscope)
}
