#!/usr/bin/env bash
# Builds containerd 2.x (containerd, ctr, containerd-shim-runc-v2) and the runc it is
# released with into target/tools/containerd-VERSION/bin once (`make containerd-deps`,
# root), from the Go module proxy: Debian bookworm ships only containerd 1.6, and the
# tests run every containerd-facing feature on both lines (issue 46).
#
# Cost on 2 cores: about 4 minutes with a cold Go cache, seconds with a warm one.
#
# containerd is built without cgo and without the btrfs, devmapper and zfs snapshotters
# (each needs C headers or host tools, and the tests disable them anyway), as its
# release's shim is. runc needs cgo (its nsenter is C) and is built with seccomp, as
# distributions ship it, so a pod's RuntimeDefault profile applies; that takes Debian's
# libseccomp-dev.
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
# The runc containerd 2.2's releases bundle (its script/setup/runc-version).
RUNC_VERSION=${RUNC_VERSION:-v1.3.7}
OUT=${1:-target/tools/containerd-$CONTAINERD_VERSION}
BIN=$(mkdir -p "$OUT/bin" && cd "$OUT/bin" && pwd)

GO=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$GO" ] || { echo "containerd-deps: Go is needed (go on PATH or /usr/local/go/bin/go)" >&2; exit 1; }

# The versions the binaries report, read whole (not piped into `grep -q`, which exits
# at its first match: the writer's SIGPIPE would fail the pipeline under pipefail).
have() {
  [ -x "$BIN/containerd" ] && [ -x "$BIN/ctr" ] && [ -x "$BIN/containerd-shim-runc-v2" ] &&
    [ -x "$BIN/runc" ] || return 1
  local containerd runc
  containerd=$("$BIN/containerd" --version 2>/dev/null) || return 1
  runc=$("$BIN/runc" --version 2>/dev/null) || return 1
  [[ "$containerd" == *" $CONTAINERD_VERSION "* ]] &&
    [[ $'\n'"$runc"$'\n' == *$'\n'"runc version ${RUNC_VERSION#v}"$'\n'* ]]
}
have && exit 0

for p in libseccomp-dev pkg-config gcc; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="${missing:-} $p"
done
if [ -n "${missing:-}" ]; then
  echo "installing runc's build dependencies:$missing"
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

echo "building containerd $CONTAINERD_VERSION and runc $RUNC_VERSION (Go module proxy) into $BIN"
module=github.com/containerd/containerd/v2
GOBIN=$BIN CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$GO" install -trimpath \
  -tags "no_btrfs no_devmapper no_zfs" \
  -ldflags "-s -w -X $module/version.Version=$CONTAINERD_VERSION -X $module/version.Revision=module-proxy" \
  "$module/cmd/containerd@$CONTAINERD_VERSION" \
  "$module/cmd/ctr@$CONTAINERD_VERSION" \
  "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
GOBIN=$BIN CGO_ENABLED=1 GOFLAGS=-buildvcs=false "$GO" install -trimpath -tags seccomp \
  -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
  "github.com/opencontainers/runc@$RUNC_VERSION"

have || { echo "containerd-deps: the built binaries do not report $CONTAINERD_VERSION / runc ${RUNC_VERSION#v}" >&2;
  "$BIN/containerd" --version >&2 || true; "$BIN/runc" --version >&2 || true; exit 1; }
