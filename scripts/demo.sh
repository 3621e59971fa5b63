#!/usr/bin/env bash
# Installs what rbscope needs, builds it, starts the bundled example Ruby
# program (examples/shop.rb) and profiles it: a snapshot of every thread,
# then a 5-second recording rendered as a flame graph.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH=$PATH:/usr/local/go/bin
export CGO_ENABLED=0 # a static rbscope (see the README)
mkdir -p bin out
go build -o bin/rbscope ./cmd/rbscope
echo "built bin/rbscope"

ruby examples/shop.rb > /dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 1

echo
echo "== rbscope snapshot --pid $pid"
./bin/rbscope snapshot --pid "$pid"
echo
echo "== rbscope inspect --pid $pid"
./bin/rbscope inspect --pid "$pid"
if ./bin/rbscope record --help >/dev/null 2>&1; then
  echo
  echo "== rbscope record --pid $pid --duration 5s"
  ./bin/rbscope record --pid "$pid" --duration 5s --format flamegraph --output out/shop-flamegraph.html
  # Into a file, then its head: head exiting early would kill rbscope
  # by SIGPIPE mid-write, and pipefail would fail the demo.
  ./bin/rbscope record --pid "$pid" --duration 3s --format summary --output out/shop-summary.txt
  head -n 20 out/shop-summary.txt
  echo
  echo "flame graph: out/shop-flamegraph.html (open it in a browser)"
fi
