#!/usr/bin/env bash
# Builds the Debian root filesystem of the container tests: Debian 12
# (bookworm), debootstrap's minimal variant (minbase) from Debian's
# packages, with the `ruby` package inside. Tests run a Ruby in it in its
# own PID and mount namespaces and cgroup (internal/testutil's
# StartContainerRuby) and profile it from the host.
#
#   scripts/rootfs.sh build   build (if not cached), print the rootfs's directory
#   scripts/rootfs.sh dir     print the rootfs's directory if it is built (exit 1 if not)
#
# Cached under ${XDG_CACHE_HOME:-~/.cache}/rbscope/rootfs/KEY, KEY a hash of
# the recipe (this script, the suite, the variant, the packages, the
# mirror): a change to any of them builds a new rootfs beside the old.
# Idempotent, concurrent callers wait on a lock, and atomic: debootstrap
# works in a temporary directory beside the cache entry, which is renamed
# into place only once complete, so an interrupted build leaves nothing a
# test could take for a rootfs.
#
# The container's Ruby must not be at a path the host has (the host has
# Debian's Ruby at the same paths): a profiler that read the host's file
# for the container's process would then read the same bytes and go
# unnoticed. So the recipe moves the interpreter and its library out of
# the package's paths, to /opt/ct/bin/ruby3.1 and /opt/ct/lib/libruby-3.1.so.*,
# leaving symlinks at the package's paths: the kernel names the mapped files
# by their real paths (/proc/PID/exe, /proc/PID/maps), which do not exist on
# the host. /app is an empty directory where tests mount their scripts.
#
# Needs root (debootstrap; apt for debootstrap itself the first time).
# RBSCOPE_ROOTFS_DIR overrides the cache directory, RBSCOPE_DEBIAN_MIRROR the
# mirror (default http://deb.debian.org/debian).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RBSCOPE_ROOTFS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rbscope/rootfs}
suite=bookworm
variant=minbase
include=ruby
mirror=${RBSCOPE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "rootfs.sh: $*" >&2; }
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

key() {
  {
    cat "$root/scripts/rootfs.sh"
    echo "$suite $variant $include $mirror"
  } | sha256sum | cut -c1-16
}

rootfs_dir() { echo "$cache/$(key)"; }

# remove_tree DIR removes a build's directory: first what an interrupted
# debootstrap left mounted in it (it mounts /proc and /sys in the target
# and unmounts them only on a clean exit), deepest first, then the files,
# never crossing into another file system.
remove_tree() {
  local d=$1 m
  [ -e "$d" ] || return 0
  awk -v p="$d/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
    $SUDO umount -l "$m" || true
  done
  $SUDO rm -rf --one-file-system "$d"
}

build() {
  local dir
  dir=$(rootfs_dir)
  [ -e "$dir/.rbscope-built" ] && return 0
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local start=$SECONDS tmp
  # A directory left by an interrupted build is removed first.
  for f in "$dir" "$cache"/.tmp-*; do remove_tree "$f"; done
  tmp=$(mktemp -d "$cache/.tmp-$(key).XXXXXX")
  chmod 755 "$tmp"
  log "building a $suite $variant rootfs with $include into $dir (about a minute or two when cold)"
  if ! $SUDO debootstrap --variant="$variant" --include="$include" "$suite" "$tmp" "$mirror" >"$tmp.log" 2>&1; then
    tail -n 30 "$tmp.log" >&2
    remove_tree "$tmp"
    rm -f "$tmp.log"
    exit 1
  fi
  # The container's Ruby at paths the host does not have (see above).
  local lib=usr/lib/x86_64-linux-gnu f
  $SUDO mkdir -p "$tmp/opt/ct/bin" "$tmp/opt/ct/lib" "$tmp/app"
  [ -f "$tmp/usr/bin/ruby3.1" ] || { log "no usr/bin/ruby3.1 in the rootfs"; exit 1; }
  $SUDO mv "$tmp/usr/bin/ruby3.1" "$tmp/opt/ct/bin/ruby3.1"
  $SUDO ln -s /opt/ct/bin/ruby3.1 "$tmp/usr/bin/ruby3.1"
  for f in "$tmp/$lib"/libruby-3.1.so.*; do
    [ -L "$f" ] && continue
    $SUDO mv "$f" "$tmp/opt/ct/lib/"
    $SUDO ln -s "/opt/ct/lib/$(basename "$f")" "$f"
  done
  # Shrink it: the package caches are not needed to run Ruby.
  $SUDO rm -rf "$tmp/var/cache/apt/archives"/*.deb "$tmp/var/lib/apt/lists"/*
  $SUDO chroot "$tmp" /opt/ct/bin/ruby3.1 -e 'print RUBY_VERSION' >"$tmp.version" ||
    { log "the rootfs's ruby does not run"; exit 1; }
  $SUDO touch "$tmp/.rbscope-built"
  rm -f "$tmp.log"
  mv "$tmp" "$dir"
  log "built $dir (Ruby $(cat "$tmp.version")) in $((SECONDS - start)) s"
  rm -f "$tmp.version"
}

locked() {
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  "$@"
}

cmd=${1:-build}
case "$cmd" in
  build)
    locked build
    rootfs_dir
    ;;
  dir)
    d=$(rootfs_dir)
    [ -e "$d/.rbscope-built" ] || { log "not built: run scripts/rootfs.sh build"; exit 1; }
    echo "$d"
    ;;
  *) log "usage: $0 build | dir"; exit 2 ;;
esac
