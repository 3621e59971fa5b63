#!/usr/bin/env bash
# Builds and runs a real Grafana Pyroscope server for rbscope's upload tests
# and for trying `rbscope record --upload` by hand.
#
#   scripts/pyroscope.sh build     build (once) and print the binary's path
#   scripts/pyroscope.sh path      print the binary's path (build if missing)
#   scripts/pyroscope.sh run [--http-port N] [--grpc-port N]
#                            [--memberlist-port N] [--data DIR]
#                                  run it in the foreground (exec), single
#                                  process, local storage, 127.0.0.1 only
#   scripts/pyroscope.sh args ...  print the server arguments `run` would use
#
# The binary is built from tools/pyroscope (a separate Go module) into
# ${XDG_CACHE_HOME:-~/.cache}/rbscope/pyroscope/<version>/pyroscope and
# rebuilt only when that module's go.mod/go.sum change. Cold: about 4
# minutes on 2 cores; warm: seconds.
#
# Every listener and every advertised address is 127.0.0.1, memberlist joins
# nobody, usage reporting and self-profiling are off: the server sends no
# traffic to any other address.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/pyroscope"
version=$(awk '$1 == "require" && $2 == "github.com/grafana/pyroscope" {print $3}' "$mod/go.mod")
[ -n "$version" ] || { echo "pyroscope.sh: no pyroscope version in $mod/go.mod" >&2; exit 1; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rbscope/pyroscope/$version"
bin="$cache/pyroscope"

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi

stamp() { cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1; }

build() {
  local want
  want=$(stamp)
  if [ -x "$bin" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  mkdir -p "$cache"
  # Locked in a subshell (the lock goes with it), so parallel test packages
  # do not build it twice at once and a server started by `run` does not
  # inherit the lock.
  (
    flock 9
    if [ -x "$bin" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$want" ]; then
      exit 0
    fi
    echo "pyroscope.sh: building pyroscope $version into $cache (a few minutes when cold)" >&2
    tmp="$bin.tmp.$$"
    (cd "$mod" && GOFLAGS=-mod=readonly go build -trimpath -o "$tmp" github.com/grafana/pyroscope/cmd/pyroscope)
    mv -f "$tmp" "$bin"
    echo "$want" >"$cache/stamp"
  ) 9>"$cache/build.lock"
}

port_free() { ! ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    if port_free "$p"; then echo "$p"; return 0; fi
  done
  echo "pyroscope.sh: no free port found" >&2
  return 1
}

server_args() {
  local http="" grpc="" ml="" data=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --http-port) http=$2; shift 2 ;;
      --grpc-port) grpc=$2; shift 2 ;;
      --memberlist-port) ml=$2; shift 2 ;;
      --data) data=$2; shift 2 ;;
      *) echo "pyroscope.sh: unknown option $1" >&2; return 2 ;;
    esac
  done
  [ -n "$http" ] || http=$(free_port)
  [ -n "$grpc" ] || grpc=$(free_port)
  [ -n "$ml" ] || ml=$(free_port)
  [ -n "$data" ] || data=$(mktemp -d "${TMPDIR:-/tmp}/rbscope-pyroscope.XXXXXX")
  local a=127.0.0.1
  local args=(
    -target=all
    -server.http-listen-address=$a -server.http-listen-port="$http"
    -server.grpc-listen-address=$a -server.grpc-listen-port="$grpc"
    -memberlist.bind-addr=$a -memberlist.bind-port="$ml"
    -memberlist.advertise-addr=$a -memberlist.advertise-port="$ml"
    -memberlist.leave-timeout=1s
    -ingester.lifecycler.addr=$a
    -ingester.min-ready-duration=0s
    -usage-stats.enabled=false
    -self-profiling.disable-push=true
    -storage.backend=filesystem
    -storage.filesystem.dir="$data/shared"
    -pyroscopedb.data-path="$data/pyroscopedb"
    -compactor.data-dir="$data/compactor"
    -log.level=warn
  )
  local ring
  for ring in compactor.ring distributor.ring overrides-exporter.ring \
    query-scheduler.ring store-gateway.sharding-ring; do
    args+=(-$ring.instance-addr=$a)
  done
  args+=(-query-frontend.instance-addr=$a)
  printf '%s\n' "${args[@]}"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build; echo "$bin" ;;
  path) build; echo "$bin" ;;
  args) server_args "$@" ;;
  run)
    build
    mapfile -t args < <(server_args "$@")
    port="" data=""
    for a in "${args[@]}"; do
      case "$a" in
        -server.http-listen-port=*) port=${a#*=} ;;
        -pyroscopedb.data-path=*) data=$(dirname "${a#*=}") ;;
      esac
    done
    echo "pyroscope.sh: Pyroscope at http://127.0.0.1:$port (data in $data); Ctrl-C stops it" >&2
    exec "$bin" "${args[@]}"
    ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
