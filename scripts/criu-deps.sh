#!/usr/bin/env bash
# Builds CRIU 4.2.1 into target/tools/criu/criu once (`make criu-deps`, root; about 3
# minutes on 2 cores), for `tessera checkpoint` / `tessera restore` and their tests.
#
# Why a build: on kernel 6.18 Debian bookworm's criu 3.17 fails `criu check` (vdso) and
# trixie's 4.1.1 cannot dump a TCP listening socket (a socket-option probe returns
# EOPNOTSUPP); 4.2.1 works (issue 29, "Verified on this kind of machine").
#
# Where the source comes from: Debian unstable's upstream tarball (criu_4.2.1.orig.tar.xz),
# fetched by `apt-get source --download-only` through an apt configuration of our own
# (its own sources file, lists and caches under a temporary directory) that names sid as
# `deb-src` only. The system's sources and package lists are never touched, so no binary
# package can come from sid. The build dependencies are bookworm's own packages.
set -euo pipefail

VERSION=4.2.1
OUT=${1:-target/tools/criu}
BIN=$OUT/criu

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -qx "Version: $VERSION"; then
  exit 0
fi
echo "building CRIU $VERSION (Debian sid's upstream source) into $BIN"

BUILD_DEPS=(build-essential pkg-config libprotobuf-c-dev protobuf-c-compiler libnl-3-dev
  libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev libaio-dev uuid-dev protobuf-compiler
  libdrm-dev python3-protobuf xz-utils)
missing=()
for p in "${BUILD_DEPS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing CRIU build dependencies (bookworm):${missing[*]/#/ }"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

work=$(mktemp -d /tmp/tessera-criu-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
mkdir -p "$work/parts"
cat >"$work/parts/sid-src.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_private=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/parts"
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=")
apt-get "${apt_private[@]}" update -qq
# The .orig.tar.xz arrives even where the Debian diff does not (apt then exits non-zero),
# so the tarball, not the exit status, says whether this worked.
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only criu) || true
tarball=$(ls "$work"/src/criu_"$VERSION".orig.tar.* 2>/dev/null | head -1 || true)
if [ -z "$tarball" ]; then
  echo "criu-deps: Debian sid has no criu_$VERSION.orig.tar.* (got: $(ls "$work/src"))" >&2
  exit 1
fi
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -type d -name "criu-$VERSION*" | head -1)
make -C "$srcdir" -j"$(nproc)" criu >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  echo "criu-deps: make criu failed (log above)" >&2
  exit 1
}
mkdir -p "$OUT"
install -m 0755 "$srcdir/criu/criu" "$BIN"
"$BIN" --version
