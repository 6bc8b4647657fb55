#!/usr/bin/env bash
# deploy/image.sh OUT.tar: build the estuary image as an OCI image layout in
# a tarball, without a Docker daemon (what `make image` runs).
#
# The image is what deploy/Dockerfile describes, assembled with crane
# (pinned in deploy/tools/go.mod) instead of a daemon:
#   - one layer on an empty base: the static estuary binary (CGO_ENABLED=0),
#     /etc/passwd and /etc/group naming the non-root user 65532 (distroless'
#     "nonroot"), a world-writable /tmp for go-plugin's sockets, and the
#     build machine's CA bundle when it has one (Debian's ca-certificates,
#     as in distroless), for registries reached over HTTPS;
#   - entrypoint /usr/local/bin/estuary, cmd `run -config
#     /etc/estuary/plugins.hcl`, user 65532:65532: no shell, no package
#     manager, nothing to log in as.
# The four bundled plugins are inside the one binary, which re-executes
# itself (/proc/self/exe) to run them.
#
# crane edits images in registries, so the config is set through a
# throwaway `crane registry serve` on 127.0.0.1 (in memory, stopped on
# exit), and the result is pulled from it as an OCI layout, with a Docker
# manifest.json beside it: `crane push`, `docker load`, `podman load` and
# `skopeo copy oci-archive:` take the tarball.
#
# Env: VERSION (estuary's version and the image tag; default from git),
#      GOARCH (default the machine's), ESTUARY_CACHE (where crane is kept).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 OUT.tar" >&2; exit 2; }
OUT=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${VERSION:-$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)}
ARCH=${GOARCH:-$(go env GOARCH)}
UIDGID=65532:65532
BIN=/usr/local/bin/estuary

CRANE=$(bash "$ROOT/deploy/tools/build.sh" crane)
WORK=$(mktemp -d)
REG_PID=
cleanup() {
  if [ -n "$REG_PID" ]; then kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The root filesystem, owned by root so the non-root user can change none of it.
FS=$WORK/rootfs
mkdir -p "$FS/usr/local/bin" "$FS/etc/ssl/certs" "$FS/etc/estuary" "$FS/tmp"
(cd "$ROOT" && CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH GOFLAGS=-buildvcs=false \
  go build -trimpath -ldflags "-s -w -X main.Version=$VERSION" -o "$FS$BIN" ./host/cmd/estuary)
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$FS/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$FS/etc/group"
printf 'hosts: files dns\n' >"$FS/etc/nsswitch.conf"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$FS/etc/ssl/certs/ca-certificates.crt"
fi
chmod 0755 "$FS$BIN" "$FS" "$FS/usr" "$FS/usr/local" "$FS/usr/local/bin" "$FS/etc" "$FS/etc/ssl" "$FS/etc/ssl/certs" "$FS/etc/estuary"
find "$FS/etc" -type f -exec chmod 0644 {} +
chmod 1777 "$FS/tmp"
# Reproducible: sorted names, one timestamp, numeric root ownership.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$FS" -cf "$WORK/layer.tar" .

# A registry on loopback for crane to edit the image in.
"$CRANE" registry serve --address 127.0.0.1:0 2>"$WORK/registry.log" &
REG_PID=$!
PORT=
for _ in $(seq 300); do
  PORT=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$WORK/registry.log")
  [ -n "$PORT" ] && break
  kill -0 "$REG_PID" 2>/dev/null || { cat "$WORK/registry.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "crane registry did not start:" >&2; cat "$WORK/registry.log" >&2; exit 1; }
REF=127.0.0.1:$PORT/estuary:$VERSION

"$CRANE" append --oci-empty-base -f "$WORK/layer.tar" -t "$REF" >/dev/null
"$CRANE" mutate "$REF" -t "$REF" \
  --set-platform "linux/$ARCH" \
  --entrypoint "$BIN" \
  --cmd run,-config,/etc/estuary/plugins.hcl \
  --user "$UIDGID" \
  --workdir / \
  --exposed-ports 15012/tcp,15014/tcp \
  -l org.opencontainers.image.title=estuary \
  -l org.opencontainers.image.version="$VERSION" \
  -l org.opencontainers.image.source=https://github.com/estuary-mesh/estuary >/dev/null
rm -rf "$WORK/layout"
"$CRANE" pull --format=oci "$REF" "$WORK/layout"
# A manifest.json beside the OCI layout, naming the same blobs (as `docker
# save` writes since Docker 25), so the one tarball is also what `crane
# push`, `docker load` and `podman load` read as a Docker archive, tagged
# estuary:VERSION.
digests=$("$CRANE" manifest "$REF" | grep -o '"digest":"sha256:[0-9a-f]*"' | sed 's/.*sha256:\([0-9a-f]*\)"/\1/')
[ "$(echo "$digests" | wc -l)" -eq 2 ] || { echo "unexpected manifest: $digests" >&2; exit 1; }
config=$(echo "$digests" | sed -n 1p)
layer=$(echo "$digests" | sed -n 2p)
printf '[{"Config":"blobs/sha256/%s","RepoTags":["estuary:%s"],"Layers":["blobs/sha256/%s"]}]\n' \
  "$config" "$VERSION" "$layer" >"$WORK/layout/manifest.json"

mkdir -p "$(dirname "$OUT")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$WORK/layout" -cf "$OUT.tmp" .
mv -f "$OUT.tmp" "$OUT"
echo "image: $OUT (estuary:$VERSION, linux/$ARCH, $(du -h "$OUT" | cut -f1))" >&2
