#!/usr/bin/env bash
# Runs rbscope's whole test suite (installing what it needs first).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# The Rubies under test besides Debian's (built once, then cached: ~16 min cold).
./scripts/rubies.sh build
export PATH=$PATH:/usr/local/go/bin
# The real Pyroscope server of the upload tests (built once, then cached: ~5 min cold).
./scripts/pyroscope.sh build >/dev/null
# The rbscope binaries the tests build are static, as the scripts ship them.
export CGO_ENABLED=0
go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
# One package at a time: many tests compare shares of CPU and wall time
# with the target's own clocks, which two packages loading both cores skew.
go test -p 1 -count=1 -timeout 60m ./... "$@"
