#!/usr/bin/env bash
# Builds the Rails fixture: a real Rails 6.1 app made offline from Debian's
# packages (ruby-rails, ruby-sqlite3, puma, ruby-stackprof), as a
# production user would make it, and caches it under
# ~/.cache/rbscope/rails-app/KEY, KEY a hash of this recipe (this script,
# testdata/rails/ and the Debian packages' versions): a change to any of
# them builds a new app beside the old.
#
#   scripts/rails-app.sh build   build (if not cached), print the app's directory
#   scripts/rails-app.sh dir     print the app's directory if it is built (exit 1 if not)
#   scripts/rails-app.sh run     build if needed, then run puma in the foreground
#
# The recipe: `rails new app --skip-bundle --minimal` (and the --skip-*
# flags that leave out what Debian does not package: sass, webpacker,
# listen, spring, bootsnap), the project's Gemfile, models, migration,
# seeds, controller, views, routes, puma config and initializer from
# testdata/rails/ copied over it, `bundle install --local` (Debian's gems
# only: no network), then `rails db:migrate db:seed` into sqlite. Two
# actions: GET /posts (JSON over sqlite, `includes`) and GET /page (ERB with
# partials). config/puma.rb: production, 5 threads, 127.0.0.1 only, on the
# port PORT (default 0: the kernel picks a free one, and puma prints it as
# "Listening on http://127.0.0.1:PORT"). With 5 puma threads the process has
# 12 Ruby threads.
#
# Runs on Debian's Ruby (3.1), the one Debian's gems are built for; see
# cmd/rbscope/rails_test.go for why not on the 3.3.8 family.
# Idempotent, concurrent callers wait on a lock. Needs root (apt) the
# first time. RBSCOPE_RAILS_DIR overrides the cache directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RBSCOPE_RAILS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rbscope/rails-app}
packages=(ruby ruby-rails ruby-sqlite3 puma ruby-stackprof)

log() { echo "rails-app.sh: $*" >&2; }
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

install_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# key hashes the recipe: this script, the fixture's files (names and
# contents) and the versions of the packages it is built from.
key() {
  {
    cat "$root/scripts/rails-app.sh"
    (cd "$root/testdata/rails" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done)
    dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}" 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

app_dir() { echo "$cache/$(key)/app"; }

build() {
  install_packages
  local dir
  dir=$(app_dir)
  [ -e "$dir/.rbscope-built" ] && return 0
  local base
  base=$(dirname "$dir")
  rm -rf "$base"
  mkdir -p "$base"
  log "building the Rails app in $dir"
  export BUNDLE_SILENCE_ROOT_WARNING=1 BUNDLE_IGNORE_CONFIG=1
  (
    cd "$base"
    rails new app --skip-bundle --minimal --skip-git --skip-keeps --skip-test --skip-bootsnap \
      --skip-sprockets --skip-javascript --skip-listen --skip-spring >"$base/new.log" 2>&1 ||
      { tail -n 30 "$base/new.log" >&2; exit 1; }
    cp -r "$root/testdata/rails/." app/
    cd app
    bundle install --local >"$base/bundle.log" 2>&1 || { tail -n 30 "$base/bundle.log" >&2; exit 1; }
    RAILS_ENV=production bin/rails db:migrate db:seed >"$base/db.log" 2>&1 ||
      { tail -n 30 "$base/db.log" >&2; exit 1; }
  )
  touch "$dir/.rbscope-built"
  log "built $dir"
}

locked() {
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  "$@"
}

usage() {
  cat >&2 <<EOF
To serve it (production, 5 threads, 127.0.0.1, a free port that puma prints):
  cd $(app_dir) && puma -C config/puma.rb
and load it, e.g.:  ab -c 8 -t 10 http://127.0.0.1:PORT/posts   (or /page)
EOF
}

cmd=${1:-build}
case "$cmd" in
  build)
    locked build
    app_dir
    usage
    ;;
  dir)
    d=$(app_dir)
    [ -e "$d/.rbscope-built" ] || { log "not built: run scripts/rails-app.sh build"; exit 1; }
    echo "$d"
    ;;
  run)
    locked build
    cd "$(app_dir)"
    exec puma -C config/puma.rb
    ;;
  *) log "usage: $0 build | dir | run"; exit 2 ;;
esac
