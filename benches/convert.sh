#!/usr/bin/env bash
# Conversion throughput and peak memory, against a baseline measured in the same run:
#
#   baseline  skopeo copy   registry A -> registry B   (moves the bytes, builds nothing)
#   tessera   tessera convert  registry A -> registry B   (pull, build, push)
#
# of one generated image of TESSERA_BENCH_CONVERT_MB megabytes (default 2048) in layers
# of 256 MB: half pseudo-random bytes (like compressed archives), half text (compresses
# ~4x). Two registries, so neither tool can mount blobs instead of moving them. Prints a
# Markdown table with wall time, MB/s of input, peak RSS (GNU time's max resident set),
# and the ratios. Needs docker-registry, skopeo, python3, GNU time (`make test-deps`).
set -euo pipefail

SIZE_MB=${TESSERA_BENCH_CONVERT_MB:-2048}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-convert.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

for tool in docker-registry skopeo python3 /usr/bin/time; do
    command -v "$tool" >/dev/null || { echo "missing $tool: run make test-deps" >&2; exit 1; }
done
[ -x "$TESSERA" ] || (cd "$ROOT" && cargo build --release -p tessera-agent --bin tessera)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_registry() { # NAME VAR: starts a registry, sets VAR to its host:port
    local dir="$WORK/$1" port
    port=$(free_port)
    mkdir -p "$dir/storage"
    cat >"$dir/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $dir/storage}}
http: {addr: 127.0.0.1:$port}
EOF
    # Not in a $(…) subshell: PIDS must reach the EXIT trap.
    docker-registry serve "$dir/config.yml" >"$dir/log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    printf -v "$2" '127.0.0.1:%s' "$port"
}
start_registry a A
start_registry b B

echo "generating a ${SIZE_MB} MB image..." >&2
python3 - "$WORK/layout" "$SIZE_MB" <<'PY'
import gzip, hashlib, io, json, os, random, sys, tarfile
layout, size_mb = sys.argv[1], int(sys.argv[2])
blobs = os.path.join(layout, "blobs", "sha256")
os.makedirs(blobs)
def put(data_path=None, data=None):
    h = hashlib.sha256()
    if data is None:
        with open(data_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        os.rename(data_path, os.path.join(blobs, h.hexdigest()))
        return "sha256:" + h.hexdigest(), os.path.getsize(os.path.join(blobs, h.hexdigest()))
    h.update(data)
    with open(os.path.join(blobs, h.hexdigest()), "wb") as f:
        f.write(data)
    return "sha256:" + h.hexdigest(), len(data)
rng = random.Random(42)
words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
def text(n):
    out = bytearray()
    while len(out) < n:
        out += b" ".join(rng.choices(words, k=4096)) + b"\n"
    return bytes(out[:n])
layers, diff_ids, left, i = [], [], size_mb << 20, 0
while left > 0:
    layer_bytes = min(256 << 20, left)
    left -= layer_bytes
    tmp = os.path.join(layout, f"layer{i}.tar.gz")
    diff = hashlib.sha256()
    class Tee(io.RawIOBase):
        def __init__(self, inner): self.inner = inner
        def writable(self): return True
        def write(self, b): diff.update(b); return self.inner.write(b)
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz:
        with tarfile.open(fileobj=Tee(gz), mode="w|", format=tarfile.PAX_FORMAT) as tar:
            done, n = 0, 0
            while done < layer_bytes:
                size = min(rng.choice([4 << 10, 64 << 10, 1 << 20, 16 << 20]), layer_bytes - done)
                data = rng.randbytes(size) if n % 2 else text(size)
                info = tarfile.TarInfo(f"layer{i}/dir{n % 50}/file{n}")
                info.size, info.mtime = size, 1700000000
                tar.addfile(info, io.BytesIO(data))
                done += size; n += 1
    layers.append(put(tmp)); diff_ids.append("sha256:" + diff.hexdigest()); i += 1
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/bin/sh"]},
                     "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
cd, cs = put(data=config)
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": s} for d, s in layers]}).encode()
md, ms = put(data=manifest)
json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": md, "size": ms, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]},
    open(os.path.join(layout, "index.json"), "w"))
open(os.path.join(layout, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
PY
LAYER_BYTES=$(du -sb "$WORK/layout/blobs" | cut -f1)
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$WORK/layout:v1" "docker://$A/src/app:v1"

measure() { # LABEL CMD... -> "seconds max_rss_kib"
    local out="$WORK/time.$1"
    shift
    /usr/bin/time -f "%e %M" -o "$out" "$@" >/dev/null
    cat "$out"
}
echo "baseline: skopeo copy..." >&2
read -r copy_s copy_kib < <(measure copy skopeo --insecure-policy copy -q \
    --src-tls-verify=false --dest-tls-verify=false "docker://$A/src/app:v1" "docker://$B/copy/app:v1")
echo "tessera convert..." >&2
read -r conv_s conv_kib < <(measure convert env DOCKER_CONFIG="$WORK" TESSERA_CONFIG=/dev/null \
    "$TESSERA" convert --work-dir "$WORK" "$A/src/app:v1" "$B/tessera/app:v1")

python3 - "$SIZE_MB" "$LAYER_BYTES" "$copy_s" "$copy_kib" "$conv_s" "$conv_kib" <<'PY'
import sys
size_mb, layer_bytes, copy_s, copy_kib, conv_s, conv_kib = sys.argv[1:]
mb = int(size_mb) * (1 << 20) / 1e6
copy_s, conv_s, copy_kib, conv_kib = float(copy_s), float(conv_s), int(copy_kib), int(conv_kib)
print(f"image: {int(size_mb)} MiB of files, {int(layer_bytes) / (1 << 20):.0f} MiB of gzip layers\n")
print("| | wall s | input MB/s | peak RSS MiB | RSS / image size |")
print("|---|---|---|---|---|")
print(f"| skopeo copy (baseline) | {copy_s:.1f} | {mb / copy_s:.0f} | {copy_kib / 1024:.0f} | {copy_kib * 1024 / (int(size_mb) << 20):.3f} |")
print(f"| tessera convert | {conv_s:.1f} | {mb / conv_s:.0f} | {conv_kib / 1024:.0f} | {conv_kib * 1024 / (int(size_mb) << 20):.3f} |")
print(f"| ratio convert / copy | {conv_s / copy_s:.2f}x | | {conv_kib / copy_kib:.2f}x | |")
PY
