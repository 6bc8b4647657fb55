#!/usr/bin/env bash
# Build the real components the estuary tests run against, from the Go module
# proxy only:
#   kube-apiserver  k8s.io/kubernetes  $K8S_VERSION
#   etcd            go.etcd.io/etcd    $ETCD_VERSION (the version kubernetes pins)
#   consul          hashicorp/consul   $CONSUL_VERSION
# Binaries are cached outside the clone, keyed by version:
#   ${ESTUARY_CACHE:-$HOME/.cache/estuary}/testbed/<name>-<version>/<binary>
# and a binary that is already there is not rebuilt, so a second run takes a
# second. Safe to run from make, and concurrently (a lock serialises runs).
#
# Why wrapper modules: k8s.io/kubernetes and hashicorp/consul replace their
# staging/sub modules with ./local directories, so `go install X@version`
# refuses them. Each wrapper is a throwaway module (generated here, under the
# cache dir, never in the repo) that requires the project and replaces every
# such local module with its published version.
#
# Env: ESTUARY_CACHE (cache root), K8S_VERSION / ETCD_VERSION / CONSUL_VERSION /
#      CONSUL_SUBMODULE_OVERRIDES (defaults in testbed/versions.env; the Go
#      package testbed looks for the versions in that file, so change them there).
set -euo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Defaults from versions.env; values already in the environment win.
while IFS='=' read -r k v; do
  case "$k" in ''|\#*) continue ;; esac
  if [ -z "${!k:-}" ]; then printf -v "$k" '%s' "$v"; fi
done <"$HERE/versions.env"

CACHE=${ESTUARY_CACHE:-$HOME/.cache/estuary}
TB=$CACHE/testbed
SRC=$TB/src
mkdir -p "$TB" "$SRC"

# Isolate the builds from the caller's Go settings (repo go.work, GOFLAGS, cross-compiling).
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
unset GOOS GOARCH

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
log() { printf 'testbed: %s\n' "$*"; }
T_ALL=$(now)

KUBE_APISERVER=$TB/kube-apiserver-$K8S_VERSION/kube-apiserver
ETCD=$TB/etcd-$ETCD_VERSION/etcd
CONSUL=$TB/consul-$CONSUL_VERSION/consul

if [ -x "$KUBE_APISERVER" ] && [ -x "$ETCD" ] && [ -x "$CONSUL" ]; then
  log "all binaries present in $TB (kube-apiserver $K8S_VERSION, etcd $ETCD_VERSION, consul $CONSUL_VERSION), nothing to do"
  exit 0
fi

command -v go >/dev/null || { log "go is not on PATH"; exit 1; }

# One build at a time (make -j, several test runs at once): wait for the lock,
# then re-check what is present.
if command -v flock >/dev/null; then
  exec 9>"$TB/.build.lock"
  if ! flock -n 9; then
    log "another build holds $TB/.build.lock, waiting"
    flock 9
  fi
fi

# install SRC DST: move a freshly built binary into place atomically.
install_bin() {
  mkdir -p "$(dirname "$2")"
  mv -f "$1" "$2"
}

# gomod_of MODULE@VERSION: path of the module's go.mod in the module cache.
gomod_of() {
  go mod download -json "$1" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p'
}

# ---------------------------------------------------------------- kubernetes
k8s_wrapper() {
  local dir=$SRC/k8s-wrap-$K8S_VERSION-etcd-$ETCD_VERSION
  if [ -f "$dir/.complete" ]; then echo "$dir"; return; fi
  local t; t=$(now)
  log "generating kubernetes wrapper module in $dir" >&2
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/cmd/etcd"
  (
    cd "$dir.tmp"
    go mod init example.local/estuary-testbed-k8s >/dev/null 2>&1 || exit 1
    local gomod; gomod=$(gomod_of "k8s.io/kubernetes@$K8S_VERSION") || exit 1
    [ -n "$gomod" ] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
    local pinned; pinned=$(awk '$1=="go.etcd.io/etcd/client/v3"{print $2; exit}' "$gomod")
    if [ "$pinned" != "$ETCD_VERSION" ]; then
      log "note: kubernetes $K8S_VERSION pins etcd $pinned, building etcd $ETCD_VERSION as asked" >&2
    fi
    local staging="v0.${K8S_VERSION#v1.}"   # v1.35.4 -> v0.35.4
    local args=(-require "k8s.io/kubernetes@$K8S_VERSION")
    local m
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
      args+=(-replace "$m=$m@$staging")
    done
    go mod edit "${args[@]}" || exit 1
    cat >cmd/etcd/main.go <<'GO' || exit 1
// Command etcd is etcd's own main, built inside the kubernetes wrapper module
// so that it resolves against the same dependency versions kubernetes uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    # No `go mod tidy`: it would drop k8s.io/kubernetes (main packages cannot be imported).
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "go.etcd.io/etcd/server/v3/etcdmain@$ETCD_VERSION" >&2 || exit 1
  ) || { rm -rf "$dir.tmp"; return 1; }
  touch "$dir.tmp/.complete" && rm -rf "$dir" && mv "$dir.tmp" "$dir" || return 1
  log "kubernetes wrapper ready after $(secs "$t")s" >&2
  echo "$dir"
}

build_kube() {
  local dir; dir=$(k8s_wrapper)
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldf="-s -w"
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
  ldf="$ldf -X k8s.io/component-base/version.gitTreeState=clean"
  if [ ! -x "$KUBE_APISERVER" ]; then
    local t; t=$(now)
    log "building kube-apiserver $K8S_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "$ldf" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
    install_bin "$dir/kube-apiserver.tmp" "$KUBE_APISERVER"
    log "built $KUBE_APISERVER in $(secs "$t")s"
  fi
  if [ ! -x "$ETCD" ]; then
    local t; t=$(now)
    log "building etcd $ETCD_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$dir/etcd.tmp" ./cmd/etcd)
    install_bin "$dir/etcd.tmp" "$ETCD"
    log "built $ETCD in $(secs "$t")s"
  fi
}

# -------------------------------------------------------------------- consul
consul_wrapper() {
  local dir=$SRC/consul-wrap-$CONSUL_VERSION
  if [ -f "$dir/.complete" ]; then echo "$dir"; return; fi
  local t; t=$(now)
  log "generating consul wrapper module in $dir (overrides: ${CONSUL_SUBMODULE_OVERRIDES:-none})" >&2
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  (
    cd "$dir.tmp"
    go mod init example.local/estuary-testbed-consul >/dev/null 2>&1 || exit 1
    local gomod; gomod=$(gomod_of "github.com/hashicorp/consul@$CONSUL_VERSION") || exit 1
    [ -n "$gomod" ] || { log "cannot download github.com/hashicorp/consul@$CONSUL_VERSION" >&2; exit 1; }
    local args=(-require "github.com/hashicorp/consul@$CONSUL_VERSION")
    local m v o
    # Each `replace X => ./dir` becomes `replace X => X@<version consul requires>`,
    # unless CONSUL_SUBMODULE_OVERRIDES names another version (see versions.env).
    for m in $(awk '$2=="=>" && $3 ~ /^\.\.?\// {print $1} $1=="replace" && $3=="=>" && $4 ~ /^\.\.?\// {print $2}' "$gomod"); do
      v=$(awk -v m="$m" '($1==m && $2 ~ /^v[0-9]/) {print $2; exit} ($1=="require" && $2==m && $3 ~ /^v[0-9]/) {print $3; exit}' "$gomod")
      for o in ${CONSUL_SUBMODULE_OVERRIDES:-}; do
        if [ "github.com/hashicorp/consul/${o%%=*}" = "$m" ]; then v=${o#*=}; fi
      done
      [ -n "$v" ] || { log "no version for $m in consul's go.mod" >&2; exit 1; }
      args+=(-replace "$m=$m@$v")
    done
    # excludes only apply in the main module, so copy them (block and single-line forms).
    for mv in $(awk '/^exclude \(/{b=1; next} b && /^\)/{b=0} b && $2 ~ /^v/ {print $1"@"$2} $1=="exclude" && $3 ~ /^v/ {print $2"@"$3}' "$gomod"); do
      args+=(-exclude "$mv")
    done
    go mod edit "${args[@]}" || exit 1
    go get "github.com/hashicorp/consul@$CONSUL_VERSION" >&2 || exit 1
  ) || { rm -rf "$dir.tmp"; return 1; }
  touch "$dir.tmp/.complete" && rm -rf "$dir" && mv "$dir.tmp" "$dir" || return 1
  log "consul wrapper ready after $(secs "$t")s" >&2
  echo "$dir"
}

build_consul() {
  [ -x "$CONSUL" ] && return 0
  local dir; dir=$(consul_wrapper)
  local t; t=$(now)
  log "building consul $CONSUL_VERSION"
  (cd "$dir" && go build -trimpath \
    -ldflags "-s -w -X github.com/hashicorp/consul/version.GitCommit=modproxy -X github.com/hashicorp/consul/version.Version=${CONSUL_VERSION#v} -X github.com/hashicorp/consul/version.VersionPrerelease=" \
    -o "$dir/consul.tmp" github.com/hashicorp/consul)
  install_bin "$dir/consul.tmp" "$CONSUL"
  log "built $CONSUL in $(secs "$t")s"
}

# One after the other: on 2 cores parallel builds are no faster and use twice the memory.
if [ -x "$KUBE_APISERVER" ] && [ -x "$ETCD" ]; then
  log "kube-apiserver $K8S_VERSION and etcd $ETCD_VERSION already built"
else
  build_kube
fi
if [ -x "$CONSUL" ]; then
  log "consul $CONSUL_VERSION already built"
else
  build_consul
fi

"$KUBE_APISERVER" --version | sed 's/^/testbed: /'
"$ETCD" --version | head -1 | sed 's/^/testbed: /'
"$CONSUL" version | head -1 | sed 's/^/testbed: /'
log "done in $(secs "$T_ALL")s; binaries in $TB"
