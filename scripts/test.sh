#!/usr/bin/env bash
# Runs rbscope's whole test suite (installing what it needs first).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/install-deps.sh
export PATH=$PATH:/usr/local/go/bin
# The Rubies under test besides Debian's (scripts/rubies.sh) and the real
# Pyroscope server of the upload tests (scripts/pyroscope.sh) are built once
# and cached. Cold, they build side by side: the Rubies' configure and
# install steps and Pyroscope's module downloads each leave a core idle.
logs=$(mktemp -d "${TMPDIR:-/tmp}/rbscope-test-setup.XXXXXX")
trap 'rm -rf "$logs"' EXIT
./scripts/rubies.sh build >"$logs/rubies.log" 2>&1 &
rubies=$!
./scripts/pyroscope.sh build >"$logs/pyroscope.log" 2>&1 &
pyroscope=$!
# The Rails fixture (scripts/rails-app.sh: about 40 s cold, cached by a
# hash of its recipe) alongside.
./scripts/rails-app.sh build >"$logs/rails.log" 2>&1 &
rails=$!
# The Debian rootfs of the container tests (scripts/rootfs.sh: debootstrap,
# about 2 minutes cold, cached by a hash of its recipe) alongside.
./scripts/rootfs.sh build >"$logs/rootfs.log" 2>&1 &
rootfs=$!
failed=0
wait "$rootfs" || { echo "scripts/rootfs.sh build failed:" >&2; tail -n 40 "$logs/rootfs.log" >&2; failed=1; }
wait "$rails" || { echo "scripts/rails-app.sh build failed:" >&2; tail -n 40 "$logs/rails.log" >&2; failed=1; }
wait "$rubies" || { echo "scripts/rubies.sh build failed:" >&2; tail -n 40 "$logs/rubies.log" >&2; failed=1; }
wait "$pyroscope" || { echo "scripts/pyroscope.sh build failed:" >&2; tail -n 40 "$logs/pyroscope.log" >&2; failed=1; }
[ "$failed" = 0 ] || exit 1
grep -h '^rubies.sh: Ruby .* installed\|^pyroscope.sh: building\|^rails-app.sh: built\|^rootfs.sh: built' "$logs"/*.log >&2 || true
echo "test.sh: set-up took $((SECONDS - start)) s" >&2
# The rbscope binaries the tests build are static, as the scripts ship them.
export CGO_ENABLED=0
go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted" >&2; exit 1; fi
# One package at a time: many tests compare shares of CPU and wall time
# with the target's own clocks, which two packages loading both cores skew.
status=0
go test -p 1 -count=1 -timeout 60m ./... "$@" || status=$?
echo "test.sh: everything took $((SECONDS - start)) s" >&2
exit $status
