#!/usr/bin/env bash
# Builds the chart's two container images from binaries already built on this machine,
# without Docker: `tessera` (the agent, with fusermount3 and the CA bundle) and
# `tessera-scheduler`, each its binary plus the shared libraries `ldd` names, made
# with umoci and written as docker-archive tarballs that `ctr images import` (or
# `docker load`) names `tessera:TAG` and `tessera-scheduler:TAG`.
#
#   scripts/images.sh OUT_DIR [BIN_DIR [TAG]]
#     BIN_DIR: where tessera and tessera-scheduler are (default target/release)
#     TAG:     the images' tag (default: the chart's appVersion)
#
# Then, on each node (no registry involved; the chart's pullPolicy IfNotPresent finds
# them):
#   ctr -n k8s.io images import OUT_DIR/tessera.tar
#   ctr -n k8s.io images import OUT_DIR/tessera-scheduler.tar
#
# The Dockerfiles in deploy/docker build the same images from source with Docker;
# this is for machines without it (the tests' Kubernetes nodes) and for air-gapped
# nodes. The libraries come from this machine, so the images run on nodes with the
# same architecture; glibc's loader is the only thing the binaries need beyond them.
set -euo pipefail

OUT=${1:?usage: scripts/images.sh OUT_DIR [BIN_DIR [TAG]]}
BIN_DIR=${2:-target/release}
TAG=${3:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$(dirname "$0")/../deploy/helm/tessera/Chart.yaml")}

for tool in umoci skopeo ldd strip; do
  command -v "$tool" >/dev/null || { echo "images.sh: $tool is missing (apt-get install umoci skopeo binutils)" >&2; exit 1; }
done
for bin in tessera tessera-scheduler; do
  [ -x "$BIN_DIR/$bin" ] || { echo "images.sh: $BIN_DIR/$bin is missing: cargo build --release -p tessera-agent -p tessera-scheduler" >&2; exit 1; }
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d /tmp/tessera-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The shared libraries SRC loads (`ldd` lines "libc.so.6 => /lib/…/libc.so.6 (0x…)" or
# "/lib64/ld-linux….so.2 (0x…)"), copied into ROOT at the same paths.
copy_libs() {
  local root=$1 src=$2 lib
  for lib in $(ldd "$src" | awk '/=>/ { print $3; next } /^[[:space:]]*\// { print $1 }'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

# Image NAME: /usr/local/bin/NAME from BIN_DIR run as USER, then `umoci config` flags.
build() {
  local name=$1 user=$2; shift 2
  local layout=$work/$name-layout bundle=$work/$name-bundle
  umoci init --layout "$layout"
  umoci new --image "$layout:$TAG"
  umoci unpack --image "$layout:$TAG" "$bundle" >/dev/null
  local root=$bundle/rootfs
  install -D -m 0755 "$BIN_DIR/$name" "$root/usr/local/bin/$name"
  # Debug info off (a test build's is hundreds of MB); symbols stay for backtraces.
  strip --strip-debug "$root/usr/local/bin/$name"
  copy_libs "$root" "$BIN_DIR/$name"
  mkdir -p "$root/tmp" "$root/etc" && chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  "extra_$name" "$root"
  umoci repack --image "$layout:$TAG" "$bundle" >/dev/null
  umoci config --image "$layout:$TAG" --config.user "$user" \
    --config.entrypoint "/usr/local/bin/$name" "$@"
  rm -f "$OUT/$name.tar"
  skopeo copy --quiet "oci:$layout:$TAG" "docker-archive:$OUT/$name.tar:$name:$TAG"
  echo "$OUT/$name.tar: $name:$TAG ($(du -h "$OUT/$name.tar" | cut -f1))"
}

# The agent: fusermount3 (FUSE unmounts) and the CA bundle (TLS registries).
extra_tessera() {
  local fusermount
  fusermount=$(command -v fusermount3) || { echo "images.sh: fusermount3 is missing (apt-get install fuse3)" >&2; exit 1; }
  install -D -m 0755 "$fusermount" "$1/usr/bin/fusermount3"
  copy_libs "$1" "$fusermount"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"
  fi
}
extra_tessera-scheduler() { :; }

build tessera 0:0 --config.cmd agent --config.env TESSERA_CACHE_DIR=/var/lib/tessera/cache
build tessera-scheduler 65532:65532
