#!/usr/bin/env bash
# Lazy-mount read speed against baselines measured in the same run:
#
#   cold sequential read of a TESSERA_BENCH_MOUNT_MB (default 1024) MB file through a
#     fresh `tessera mount`            vs  downloading the blob holding it with a plain
#                                          HTTP client (curl) from the same registry
#   warm reads: again through the same mount (page cache), and through a fresh mount
#     (chunk cache)                    vs  reading the same file from the native filesystem
#   time to first byte: `tessera mount` + reading 1 byte of the file
#
# The file is half pseudo-random, half text, so chunks compress like real data. Prints
# a Markdown table. Needs docker-registry, skopeo, curl, python3, fuse3; runs as root.
set -euo pipefail

SIZE_MB=${TESSERA_BENCH_MOUNT_MB:-1024}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-mount.XXXXXX")
PIDS=()
cleanup() {
    fusermount3 -u -z "$WORK/mnt" 2>/dev/null || true
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    sleep 0.5
    rm -rf "$WORK"
}
trap cleanup EXIT
for tool in docker-registry skopeo curl python3 fusermount3; do
    command -v "$tool" >/dev/null || { echo "missing $tool: run make test-deps" >&2; exit 1; }
done
[ -x "$TESSERA" ] || (cd "$ROOT" && cargo build --release -p tessera-agent --bin tessera)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REG=127.0.0.1:$port
mkdir -p "$WORK/registry"
printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: %s}\n' \
    "$WORK/registry" "$REG" >"$WORK/registry.yml"
docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

echo "generating a ${SIZE_MB} MB file..." >&2
mkdir -p "$WORK/rootfs/data"
python3 - "$WORK/rootfs/data/big.bin" "$SIZE_MB" <<'PY'
import random, sys
path, mb = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(2000)]
with open(path, "wb") as f:
    for i in range(mb):
        if i % 2:
            f.write(rng.randbytes(1 << 20))
        else:
            block = b" ".join(rng.choices(words, k=250000))
            f.write((block * 2)[: 1 << 20])
PY
umoci init --layout "$WORK/layout" >/dev/null
umoci new --image "$WORK/layout:v1" >/dev/null
umoci unpack --image "$WORK/layout:v1" "$WORK/bundle" >/dev/null
cp -a "$WORK/rootfs/." "$WORK/bundle/rootfs/"
umoci repack --image "$WORK/layout:v1" "$WORK/bundle" >/dev/null
rm -rf "$WORK/bundle"
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$WORK/layout:v1" "docker://$REG/src/big:v1"
DOCKER_CONFIG="$WORK" TESSERA_CONFIG=/dev/null "$TESSERA" convert "$REG/src/big:v1" "$REG/tessera/big:v1" \
    --json >"$WORK/convert.json"
BLOB=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["images"][0]["build"]["new_blob"]["digest"])' "$WORK/convert.json")

now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.3f}')"; }

echo "baseline: curl of the blob..." >&2
t0=$(now); curl -sf -o /dev/null "http://$REG/v2/tessera/big/blobs/$BLOB"; t1=$(now)
curl_s=$(elapsed "$t0" "$t1")
BLOB_BYTES=$(curl -sfI "http://$REG/v2/tessera/big/blobs/$BLOB" | tr -d '\r' | awk -F': ' 'tolower($1)=="content-length"{print $2}')

start_agent() {
    DOCKER_CONFIG="$WORK" "$TESSERA" agent --socket "$WORK/agent.sock" --cache-dir "$WORK/cache" \
        --prefetch none >"$WORK/agent.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do [ -S "$WORK/agent.sock" ] && break; sleep 0.05; done
}
start_agent
mkdir -p "$WORK/mnt"
echo "cold read through the mount..." >&2
t0=$(now)
"$TESSERA" mount --socket "$WORK/agent.sock" "$REG/tessera/big:v1" "$WORK/mnt" >/dev/null
head -c 1 "$WORK/mnt/data/big.bin" >/dev/null
t1=$(now)
ttfb_s=$(elapsed "$t0" "$t1")
t0=$(now); cat "$WORK/mnt/data/big.bin" >/dev/null; t1=$(now)
cold_s=$(elapsed "$t0" "$t1")

echo "warm reads..." >&2
# Warm, same mount: the kernel's page cache (FOPEN_KEEP_CACHE), what a running
# container sees on its second read.
t0=$(now); cat "$WORK/mnt/data/big.bin" >/dev/null; t1=$(now)
page_s=$(elapsed "$t0" "$t1")
# Warm = cached chunks, a fresh mount (so the FUSE page cache is empty) of the same image.
"$TESSERA" umount --socket "$WORK/agent.sock" "$WORK/mnt" >/dev/null
"$TESSERA" mount --socket "$WORK/agent.sock" "$REG/tessera/big:v1" "$WORK/mnt" >/dev/null
t0=$(now); cat "$WORK/mnt/data/big.bin" >/dev/null; t1=$(now)
warm_s=$(elapsed "$t0" "$t1")
sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
cat "$WORK/rootfs/data/big.bin" >/dev/null   # into the page cache, as the warm mount's cache is
t0=$(now); cat "$WORK/rootfs/data/big.bin" >/dev/null; t1=$(now)
native_s=$(elapsed "$t0" "$t1")
"$TESSERA" umount --socket "$WORK/agent.sock" "$WORK/mnt" >/dev/null

python3 - "$SIZE_MB" "$BLOB_BYTES" "$curl_s" "$cold_s" "$warm_s" "$native_s" "$ttfb_s" "$page_s" <<'PY'
import sys
mb, blob, curl, cold, warm, native, ttfb, page = sys.argv[1:]
size = int(mb) * (1 << 20) / 1e6
blob = int(blob) / 1e6
curl, cold, warm, native, ttfb, page = map(float, (curl, cold, warm, native, ttfb, page))
print(f"file: {mb} MiB; blob {blob:.0f} MB compressed\n")
print("| | seconds | MB/s of file data | ratio |")
print("|---|---|---|---|")
print(f"| curl of the blob (baseline, compressed bytes) | {curl:.2f} | {size / curl:.0f} (wire {blob / curl:.0f}) | 1.00 |")
print(f"| cold read through the mount | {cold:.2f} | {size / cold:.0f} | {curl / cold:.2f} of curl's speed |")
print(f"| native filesystem read, page cache (baseline) | {native:.2f} | {size / native:.0f} | 1.00 |")
print(f"| warm read, same mount (kernel page cache) | {page:.2f} | {size / page:.0f} | {native / page:.2f} of native |")
print(f"| warm read through a fresh mount (chunk cache, re-verified) | {warm:.2f} | {size / warm:.0f} | {native / warm:.2f} of native |")
print(f"| time to first byte (mount + 1-byte read) | {ttfb:.3f} | | |")
PY
