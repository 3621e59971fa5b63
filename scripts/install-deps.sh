#!/usr/bin/env bash
# Installs everything rbscope's build, demo and tests need on Debian 12.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  ruby                 # the Ruby the tests profile first (Debian 12: 3.1.x); scripts/rubies.sh builds 3.3
  ruby-stackprof       # in-process CPU profiler: ground truth for proportions
  ruby-memory-profiler # in-process allocation profiler: ground truth for alloc
  gcc binutils         # C fixtures for DWARF tests, objcopy
  pahole               # reference struct layouts for DWARF tests
  valgrind             # callgrind_annotate reads our callgrind output
  gdb                  # gcore: core dumps of live rubies for the core-file target tests
  zstd bzip2 xz-utils lz4 # compressed cores (systemd-coredump stores zstd) in the core-file target tests
  clang llvm           # regenerates the eBPF objects (bpf2go)
  elfutils             # eu-readelf for note checks
  procps psmisc        # ps, pkill in tests and scripts
  time                 # /usr/bin/time: peak RSS in scripts/bench-layout.sh
  dwz                  # DWARF as distributions ship it (layout tests)
  ruby-dev             # Ruby's headers: real DWARF for the layout tests
  iproute2             # ss: scripts/pyroscope.sh picks free ports
  chromium fonts-liberation # headless browser and a font: flame graph HTML renders (output tests)
  systemtap-sdt-dev    # sys/sdt.h for the usdt test fixture
  tmux                 # rbscope top is tested in a detached tmux session
  rubocop              # a real multi-file Ruby program: scripts/bench-gc-share.sh
  strace linux-perf    # system calls and scheduler events: scripts/bench-record.sh, scripts/bench-pause.sh
  ruby-rails ruby-sqlite3 puma # the Rails fixture (scripts/rails-app.sh), built offline from these
  apache2-utils        # ab: the load on the Rails fixture in scripts/bench-record.sh
  debootstrap          # the Debian rootfs of the container tests (scripts/rootfs.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the speedscope app (npm package) that the speedscope
# output is loaded into. Any node/npm on PATH will do (machines may carry
# NodeSource's nodejs, which bundles npm and conflicts with Debian's npm).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  for p in nodejs npm; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ -n "${EXTRA_PACKAGES:-}" ]; then
  for p in $EXTRA_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || { echo "Go 1.26+ is needed (https://go.dev/dl)" >&2; exit 1; }

# npm packages the output tests use, pinned, kept in the user cache: the
# real speedscope app (rbscope's speedscope files are loaded into it) and
# puppeteer-core (drives the system Chromium to drag across the flame
# graph's timeline; it downloads no browser).
npm_dir=${RBSCOPE_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rbscope/npm}
if [ ! -f "$npm_dir/node_modules/speedscope/package.json" ] || [ ! -f "$npm_dir/node_modules/puppeteer-core/package.json" ]; then
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --silent speedscope@1.20.0 puppeteer-core@22.15.0 >/dev/null
fi
