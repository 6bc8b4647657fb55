#!/usr/bin/env bash
# deploy/tools/build.sh NAME...: build the deployment tools pinned in deploy/tools/go.mod
# (helm, crane) from the Go module proxy and print the path of each binary,
# one a line.
#
# The tools live in their own module so that neither the root module nor
# the SDK's graph holds helm's or crane's dependencies. Binaries are cached
# outside the clone, keyed by the pinned version:
#   ${ESTUARY_CACHE:-$HOME/.cache/estuary}/tools/<name>-<version>/<name>
# so a second call prints the path at once; bumping a version in
# deploy/tools/go.mod builds the new one. Safe to run concurrently (a lock
# serialises builds). Progress goes to stderr, paths to stdout.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${ESTUARY_CACHE:-$HOME/.cache/estuary}/tools
mkdir -p "$CACHE"

# Static binaries, isolated from the caller's Go settings.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
unset GOOS GOARCH

log() { printf 'tools: %s\n' "$*" >&2; }

# pkg NAME: the tool's main package, as tools/go.mod's tool directive names it.
pkg() {
  case "$1" in
    helm) echo helm.sh/helm/v4/cmd/helm ;;
    crane) echo github.com/google/go-containerregistry/cmd/crane ;;
    *) log "unknown tool $1 (helm, crane)"; return 1 ;;
  esac
}

for name in "$@"; do
  p=$(pkg "$name")
  mod=$(cd "$HERE" && go list -f '{{.Module.Path}}@{{.Module.Version}}' "$p")
  ver=${mod##*@}
  bin=$CACHE/$name-$ver/$name
  if [ ! -x "$bin" ]; then
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [ ! -x "$bin" ]; then
      start=$(date +%s)
      log "building $name $ver ($mod)"
      mkdir -p "$(dirname "$bin")"
      # helm reports its version from these variables, set by its own Makefile.
      ldflags="-s -w"
      if [ "$name" = helm ]; then
        ldflags="$ldflags -X helm.sh/helm/v4/internal/version.version=$ver"
      fi
      (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$bin.tmp" "$p")
      mv -f "$bin.tmp" "$bin"
      log "built $bin in $(($(date +%s) - start))s"
    fi
    exec 9>&-
  fi
  echo "$bin"
done
