#!/usr/bin/env bash
# Builds the Rubies rbscope is tested against (besides Debian's own), from
# Debian's source package, and caches them under ~/.cache/rbscope/rubies.
#
#   scripts/rubies.sh list            names of the suite's Rubies (built by default)
#   scripts/rubies.sh build [NAME...] build (if not cached) the named, or all
#   scripts/rubies.sh prefix NAME     build NAME if needed, print its prefix
#   scripts/rubies.sh debugroot NAME  print NAME's debug-file root ("" if none)
#
# Rubies:
#   3.3.8         --enable-shared --enable-yjit; libruby keeps the DWARF that
#                 Ruby's default -ggdb3 gives it.
#   3.3.8-static  --enable-yjit, VM inside the executable, which is stripped;
#                 its DWARF is in a separate file found by build id under
#                 "$(scripts/rubies.sh debugroot 3.3.8-static)" (give that as
#                 RBSCOPE_DEBUG_ROOT), and reachable by .gnu_debuglink.
#   3.4.5         as 3.3.8, from Debian's ruby3.4 source package
#                 (experimental: 3.4.5 is the newest whose Debian part is there).
#   3.4.5-stripped  a copy of 3.4.5 whose libruby is stripped the way Debian
#                 ships it (--strip-unneeded, no .comment; .dynsym kept), with
#                 no debug file anywhere; its ruby's RUNPATH is its own lib.
#
# Idempotent: a finished build leaves PREFIX/.rbscope-built and is never
# redone; concurrent callers wait on a lock. Needs root (apt) the first time.
# RBSCOPE_RUBIES_DIR overrides the cache directory.
set -euo pipefail

# The suite's Rubies (what `build` makes by default): 3.3 (security fixes
# only in 2026) as the static build, with and without its debug file; 3.4
# (in normal maintenance) shared with DWARF, run with and without YJIT, and
# its copy stripped as distributions ship it. 3.3.8 shared (and run with
# --yjit) joins the tests when named (RBSCOPE_TEST_RUBIES, outside CI; see
# the README's "Supported Rubies").
names=(3.3.8-static 3.4.5 3.4.5-stripped)
known=("${names[@]}" 3.3.8)
cache=${RBSCOPE_RUBIES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rbscope/rubies}
src_cache=$cache/src

# version_of NAME prints the Ruby version a build name holds; suite_of
# the Debian suite whose ruby3.x source package has it.
version_of() { echo "${1%%-*}"; }
suite_of() {
  case "$1" in
    3.3.*) echo trixie ;;
    3.4.*) echo experimental ;;
    *) log "no Debian source suite known for Ruby $1"; exit 2 ;;
  esac
}

log() { echo "rubies.sh: $*" >&2; }
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

build_deps=(build-essential pkg-config libssl-dev libyaml-dev zlib1g-dev libffi-dev
  libgmp-dev libreadline-dev libncurses-dev systemtap-sdt-dev binutils xz-utils
  dpkg-dev rustc patchelf)

install_build_deps() {
  local missing=()
  for p in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # rustc may come from rustup rather than Debian: any rustc on PATH will do.
  if command -v rustc >/dev/null; then
    local m2=()
    for p in "${missing[@]}"; do [ "$p" = rustc ] || m2+=("$p"); done
    missing=("${m2[@]}")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing build dependencies: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# fetch_source VERSION downloads Debian's ruby3.x source package for
# VERSION once (from trixie for 3.3, experimental for 3.4) and prints the
# cached upstream tarball's path.
fetch_source() {
  local version=$1 suite pkg tarball
  suite=$(suite_of "$version")
  pkg=ruby${version%.*}
  tarball=$src_cache/${pkg}_${version}.orig.tar.xz
  if [ -s "$tarball" ]; then echo "$tarball"; return 0; fi
  mkdir -p "$src_cache"
  # A deb-src entry for the suite on the mirror this machine already uses.
  local list=/etc/apt/sources.list.d/rbscope-$suite-src.sources
  if [ ! -e "$list" ]; then
    local uri
    uri=$(grep -hoE '^(URIs:|deb) +[^ ]*debian/?' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
      awk '{print $2}' | grep -v security | head -n1 || true)
    [ -n "$uri" ] || { log "no Debian mirror found in /etc/apt/sources.list*; add a deb-src entry for $suite by hand"; exit 1; }
    printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" "$suite" |
      $SUDO tee "$list" >/dev/null
    $SUDO apt-get update -qq
  fi
  local tmp srcver
  tmp=$(mktemp -d "$src_cache/dl.XXXXXX")
  srcver=$(apt-cache showsrc "$pkg" | awk '/^Version:/ {print $2}' | grep "^$version-" | head -n1 || true)
  if [ -z "$srcver" ]; then
    $SUDO apt-get update -qq
    srcver=$(apt-cache showsrc "$pkg" | awk '/^Version:/ {print $2}' | grep "^$version-" | head -n1 || true)
  fi
  [ -n "$srcver" ] || { log "Debian's $suite has no $pkg source for $version (has: $(apt-cache showsrc "$pkg" | awk '/^Version:/ {printf "%s ", $2}'))"; exit 1; }
  (cd "$tmp" && apt-get source --download-only "$pkg=$srcver" >/dev/null 2>&1) ||
    { log "apt-get source $pkg=$srcver failed"; exit 1; }
  local got
  got=$(ls "$tmp"/"${pkg}_${version}"*.orig.tar.xz 2>/dev/null | head -n1 || true)
  [ -n "$got" ] || { log "apt-get source $pkg gave no ${pkg}_${version} tarball (found: $(ls "$tmp"))"; exit 1; }
  mv "$got" "$tarball"
  rm -rf "$tmp"
  echo "$tarball"
}

prefix_of() { echo "$cache/$1"; }
debugroot_of() {
  case "$1" in
    *-static) echo "$cache/$1-debug" ;;
    *) echo "" ;;
  esac
}

build_one() {
  local name=$1 prefix
  prefix=$(prefix_of "$name")
  [ -e "$prefix/.rbscope-built" ] && return 0
  local conf=(--enable-yjit --disable-install-doc --disable-install-rdoc)
  case "$name" in
    3.3.8 | 3.4.5) conf+=(--enable-shared) ;;
    3.3.8-static) conf+=(--disable-shared) ;;
    3.4.5-stripped) strip_copy "$name" 3.4.5; return ;;
    *) log "unknown Ruby '$name' (known: ${known[*]})"; exit 2 ;;
  esac
  local version tarball
  version=$(version_of "$name")
  install_build_deps
  tarball=$(fetch_source "$version")
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/rbscope-ruby-$name.XXXXXX")
  log "building Ruby $name in $work (about 8 minutes on 2 cores)"
  tar -C "$work" -xJf "$tarball"
  local dir
  dir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -print -quit)
  rm -rf "$prefix"
  (
    cd "$dir"
    ./configure --prefix="$prefix" "${conf[@]}" >"$work/configure.log" 2>&1 ||
      { tail -n 30 "$work/configure.log" >&2; exit 1; }
    make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -n 40 "$work/make.log" >&2; exit 1; }
    # `make install` would fetch bundled gems from the network and retry.
    make install-local install-ext >"$work/install.log" 2>&1 || { tail -n 40 "$work/install.log" >&2; exit 1; }
  )
  if [ "$name" = 3.3.8-static ]; then
    # A stripped executable whose DWARF lives in a separate file under a
    # build-id tree, as distributions ship debug info.
    local exe=$prefix/bin/ruby droot bid
    droot=$(debugroot_of "$name")
    # awk reads all of readelf's notes (USDT probes: ~11 KB): exiting at
    # the first match would kill readelf by SIGPIPE, which pipefail and
    # set -e made a silent failure of the whole build under load.
    bid=$(readelf -n "$exe" | awk '/Build ID:/ && id == "" {id = $3} END {print id}')
    [ -n "$bid" ] || { log "$exe has no build id"; exit 1; }
    mkdir -p "$droot/.build-id/${bid:0:2}"
    objcopy --only-keep-debug "$exe" "$droot/.build-id/${bid:0:2}/${bid:2}.debug"
    strip --strip-all "$exe"
    objcopy --add-gnu-debuglink="$droot/.build-id/${bid:0:2}/${bid:2}.debug" "$exe"
  fi
  "$prefix/bin/ruby" -e 'exit(RUBY_VERSION == ARGV[0] ? 0 : 1)' "$version" ||
    { log "$prefix/bin/ruby does not run as Ruby $version"; exit 1; }
  touch "$prefix/.rbscope-built"
  rm -rf "$work"
  log "Ruby $name installed in $prefix"
}

# strip_copy NAME FROM makes NAME a copy of the built Ruby FROM whose
# libruby is stripped as Debian's dh_strip strips shared libraries.
strip_copy() {
  local name=$1 from=$2 prefix src tmp lib
  prefix=$(prefix_of "$name")
  build_one "$from"
  install_build_deps
  src=$(prefix_of "$from")
  tmp=$(mktemp -d "$cache/.copy-$name.XXXXXX")
  cp -a "$src/." "$tmp/"
  rm -f "$tmp/.rbscope-built"
  lib=$(ls "$tmp"/lib/libruby.so.*.*.* | head -n1)
  [ -n "$lib" ] || { log "$src has no libruby.so"; exit 1; }
  strip --remove-section=.comment --remove-section=.note --strip-unneeded "$lib"
  patchelf --set-rpath "$prefix/lib" "$tmp/bin/ruby"
  rm -rf "$prefix"
  mv "$tmp" "$prefix"
  "$prefix/bin/ruby" -e 'exit(RUBY_VERSION == ARGV[0] ? 0 : 1)' "$(version_of "$name")" ||
    { log "$prefix/bin/ruby does not run as Ruby $(version_of "$name")"; exit 1; }
  touch "$prefix/.rbscope-built"
  log "Ruby $name installed in $prefix"
}

locked() {
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  "$@"
}

cmd=${1:-build}
shift || true
case "$cmd" in
  list) printf '%s\n' "${names[@]}" ;;
  build)
    [ $# -gt 0 ] || set -- "${names[@]}"
    for n in "$@"; do locked build_one "$n"; done
    ;;
  prefix)
    [ $# -eq 1 ] || { log "usage: $0 prefix NAME"; exit 2; }
    [ -e "$(prefix_of "$1")/.rbscope-built" ] || locked build_one "$1"
    prefix_of "$1"
    ;;
  debugroot)
    [ $# -eq 1 ] || { log "usage: $0 debugroot NAME"; exit 2; }
    debugroot_of "$1"
    ;;
  *) log "usage: $0 list | build [NAME...] | prefix NAME | debugroot NAME"; exit 2 ;;
esac
