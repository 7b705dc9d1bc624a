#!/usr/bin/env bash
# Read throughput of a lazy mount, against baselines measured in the same run, on one
# TESSERA_BENCH_MOUNT_MB (default 1024) MiB file (half pseudo-random, half text, so its
# chunks compress like real data) in an image on a local docker-registry. The registry
# sits behind a link capped at TESSERA_BENCH_READ_CAP (default 1gbit; a network namespace
# and a veth with tc, so the cold figures compare against a link, as the mission's cold
# target does), or on loopback, uncapped, with TESSERA_BENCH_READ_CAP=none (what the
# agent's CPU allows):
#
# Sequential (`cat` of the whole file; median of TESSERA_BENCH_REPS, default 3):
#   cold: a fresh agent (empty chunk cache) and mount     vs  curl of the blob holding the
#                                                              file (the link's ceiling)
#   warm: the same mount again (kernel page cache), and   vs  the native file (page cache)
#         a fresh mount (the agent's chunk cache)
#   time to first byte: `tessera mount` + a 1-byte read
# Random 4K (fio: one reader, psync, queue depth 1, the same seed and offsets everywhere):
#   cold: a fresh agent and mount, TESSERA_BENCH_READ_COLD_IOS reads (default: one per
#         four chunks of the file, so most land on a chunk never fetched)
#                     vs  HTTP Range GETs of 4 KiB at random offsets of the blob, one at a
#                         time on a keep-alive connection (the origin's round-trip floor)
#                     and the native file with its pages dropped (the local disk)
#   warm: a quarter of the file's 4 KiB blocks, each once (so none is served twice from
#         the page cache a run fills), at most TESSERA_BENCH_READ_RUNTIME seconds (default
#         20), through the same mount (page cache) and a fresh mount (chunk cache)
#                     vs  the native file (page cache)
#
# Prints Markdown (benches/scenarios/read.py renders it); TESSERA_BENCH_JSON=FILE also
# writes the figures as JSON (scenario "read"). TESSERA_BIN picks the binary (default
# target/release/tessera). Needs docker-registry, skopeo, umoci, curl, python3, fuse3
# and fio (`make test-deps`); runs as root.
set -euo pipefail

SIZE_MB=${TESSERA_BENCH_MOUNT_MB:-1024}
REPS=${TESSERA_BENCH_REPS:-3}
CAP=${TESSERA_BENCH_READ_CAP:-1gbit}
RUNTIME=${TESSERA_BENCH_READ_RUNTIME:-20}
COLD_IOS=${TESSERA_BENCH_READ_COLD_IOS:-$(( SIZE_MB / 4 > 64 ? SIZE_MB / 4 : 64 ))}
WARM_IOS=$(( SIZE_MB * 64 ))   # a quarter of the file's 4 KiB blocks, each read once
JSON_OUT=${TESSERA_BENCH_JSON:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-read.XXXXXX")
MNT=$WORK/mnt
REG_PID=""
AGENT_PID=""
NS=""   # the registry's network namespace, when the link is capped
stop_agent() {
    [ -n "$AGENT_PID" ] || return 0
    kill "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=""
}
cleanup() {
    fusermount3 -u -z "$MNT" 2>/dev/null || true
    stop_agent
    if [ -n "$REG_PID" ]; then kill "$REG_PID" 2>/dev/null || true; wait "$REG_PID" 2>/dev/null || true; fi
    # Deleting the namespace deletes its end of the veth, and with it ours.
    if [ -n "$NS" ]; then ip netns del "$NS" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
for tool in docker-registry skopeo umoci curl python3 fusermount3; do
    command -v "$tool" >/dev/null || { echo "missing $tool: run make test-deps" >&2; exit 1; }
done
command -v fio >/dev/null || {
    echo "missing fio (the random-read runs): apt-get install fio, or run make test-deps" >&2; exit 1; }
[ -x "$TESSERA" ] || (cd "$ROOT" && cargo build --release -p tessera-agent --bin tessera)
step() { printf '[read] %s\n' "$*" >&2; }

mkdir -p "$WORK/registry"
if [ "$CAP" = none ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    REG_HOST=127.0.0.1
    IN_NS=()
else
    # The registry in a namespace of its own, reached over a veth whose egress (the
    # registry's sending side) tc caps; the agent, curl and fio stay on the host.
    NS=tsr$$
    net=10.251.$(( $$ % 250 + 1 ))
    ip netns add "$NS"
    ip link add "${NS}h" type veth peer name "${NS}r" netns "$NS"
    ip addr add "$net.1/30" dev "${NS}h"
    ip link set "${NS}h" up
    ip -n "$NS" addr add "$net.2/30" dev "${NS}r"
    ip -n "$NS" link set "${NS}r" up
    ip -n "$NS" link set lo up
    tc -n "$NS" qdisc replace dev "${NS}r" root tbf rate "$CAP" burst 256kb latency 100ms
    port=5000
    REG_HOST=$net.2
    IN_NS=(nsenter "--net=/run/netns/$NS")
fi
REG=$REG_HOST:$port
# Plain HTTP to a registry that is not on loopback must be allowed by name.
printf '[registry]\ninsecure = ["%s"]\n' "$REG" >"$WORK/tessera.toml"
export TESSERA_CONFIG=$WORK/tessera.toml
printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: %s}\n' \
    "$WORK/registry" "$REG" >"$WORK/registry.yml"
"${IN_NS[@]}" docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
REG_PID=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/$REG_HOST/$port") 2>/dev/null && break; sleep 0.1; done

step "generating a ${SIZE_MB} MiB file"
NATIVE=$WORK/rootfs/data/big.bin
mkdir -p "$WORK/rootfs/data"
python3 - "$NATIVE" "$SIZE_MB" <<'PY'
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
step "building, pushing and converting the image"
umoci init --layout "$WORK/layout" >/dev/null
umoci new --image "$WORK/layout:v1" >/dev/null
umoci unpack --image "$WORK/layout:v1" "$WORK/bundle" >/dev/null
cp -a "$WORK/rootfs/." "$WORK/bundle/rootfs/"
umoci repack --image "$WORK/layout:v1" "$WORK/bundle" >/dev/null
rm -rf "$WORK/bundle" "$WORK/layout"/blobs/sha256/*.tmp 2>/dev/null || true
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$WORK/layout:v1" "docker://$REG/src/big:v1"
rm -rf "$WORK/layout"
IMAGE=$REG/tessera/big:v1
DOCKER_CONFIG="$WORK" "$TESSERA" convert "$REG/src/big:v1" "$IMAGE" \
    --json >"$WORK/convert.json"
BLOB=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["images"][0]["build"]["new_blob"]["digest"])' "$WORK/convert.json")
BLOB_URL=http://$REG/v2/tessera/big/blobs/$BLOB
BLOB_BYTES=$(curl -sfI "$BLOB_URL" | tr -d '\r' | awk -F': ' 'tolower($1)=="content-length"{print $2}')
sync -f "$NATIVE"

now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.4f}')"; }
# Every sequential timing as "name seconds", one per line; medians taken at the end.
record() { echo "$1 $2" >>"$WORK/seq.txt"; }

start_agent() { # a fresh agent with an empty chunk cache
    stop_agent
    rm -rf "$WORK/cache" "$WORK/agent.sock"
    DOCKER_CONFIG="$WORK" "$TESSERA" agent --socket "$WORK/agent.sock" --cache-dir "$WORK/cache" \
        --prefetch none >>"$WORK/agent.log" 2>&1 &
    AGENT_PID=$!
    for _ in $(seq 200); do [ -S "$WORK/agent.sock" ] && return; sleep 0.05; done
    echo "the agent did not start; its log:" >&2; cat "$WORK/agent.log" >&2; exit 1
}
mount_image() { mkdir -p "$MNT"; "$TESSERA" mount --socket "$WORK/agent.sock" "$IMAGE" "$MNT" >/dev/null; }
umount_image() { "$TESSERA" umount --socket "$WORK/agent.sock" "$MNT" >/dev/null; }
status_json() { "$TESSERA" status --socket "$WORK/agent.sock" --json >"$1"; }

# One fio job: random 4 KiB reads of FILE by one reader at queue depth 1, always the same
# seed (so every cold run reads the same offsets). NAME names its JSON; the rest are fio
# options bounding the run.
fio_rand() {
    local name=$1 file=$2
    shift 2
    fio --name="$name" --filename="$file" --readonly --rw=randread --bs=4k --ioengine=psync \
        --iodepth=1 --randrepeat=1 --randseed=20261123 --output-format=json \
        --output="$WORK/fio-$name.json" "$@" >/dev/null
}

for rep in $(seq "$REPS"); do
    step "sequential, repetition $rep of $REPS"
    t0=$(now); curl -sf -o /dev/null "$BLOB_URL"; t1=$(now)
    record curl "$(elapsed "$t0" "$t1")"
    start_agent
    t0=$(now); mount_image; head -c 1 "$MNT/data/big.bin" >/dev/null; t1=$(now)
    record first_byte "$(elapsed "$t0" "$t1")"
    t0=$(now); cat "$MNT/data/big.bin" >/dev/null; t1=$(now)
    record cold "$(elapsed "$t0" "$t1")"
    # Warm, same mount: the kernel's page cache (FOPEN_KEEP_CACHE), what a running
    # container sees on its second read.
    t0=$(now); cat "$MNT/data/big.bin" >/dev/null; t1=$(now)
    record page_cache "$(elapsed "$t0" "$t1")"
    # Warm, a fresh mount of the same image: the page cache is empty, the chunks cached.
    umount_image; mount_image
    t0=$(now); cat "$MNT/data/big.bin" >/dev/null; t1=$(now)
    record chunk_cache "$(elapsed "$t0" "$t1")"
    umount_image
    cat "$NATIVE" >/dev/null   # into the page cache, as the warm mount's data is
    t0=$(now); cat "$NATIVE" >/dev/null; t1=$(now)
    record native "$(elapsed "$t0" "$t1")"
done

step "random 4K, cold: $COLD_IOS reads through a fresh mount"
start_agent
mount_image
fio_rand cold "$MNT/data/big.bin" --number_ios="$COLD_IOS" --runtime=120 --invalidate=1
status_json "$WORK/status-cold.json"
umount_image
step "random 4K, cold: the native file, its pages dropped (fadvise), the same offsets"
fio_rand native_cold "$NATIVE" --number_ios="$COLD_IOS" --runtime=120 --invalidate=1
step "random 4K, cold: $COLD_IOS HTTP Range GETs of the blob"
python3 - "$REG" "/v2/tessera/big/blobs/$BLOB" "$BLOB_BYTES" "$COLD_IOS" >"$WORK/http-rand.json" <<'PY'
import http.client, json, random, sys, time
host, path, size, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(20261123)
conn = http.client.HTTPConnection(host)
lat = []
start = time.perf_counter()
for _ in range(n):
    off = rng.randrange(size // 4096) * 4096
    t = time.perf_counter()
    conn.request("GET", path, headers={"Range": f"bytes={off}-{min(off + 4095, size - 1)}"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 206 or not body:
        sys.exit(f"Range GET at {off}: HTTP {resp.status}, {len(body)} bytes")
    lat.append(time.perf_counter() - t)
total = time.perf_counter() - start
json.dump({"seconds": total, "bytes": 4096 * n, "latencies": lat}, sys.stdout)
PY

step "random 4K, warm: $WARM_IOS reads (at most ${RUNTIME}s) each through the mount (page cache, chunk cache) and the native file"
mount_image
cat "$MNT/data/big.bin" >/dev/null
fio_rand page_cache "$MNT/data/big.bin" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0
umount_image
mount_image
fio_rand chunk_cache "$MNT/data/big.bin" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0
status_json "$WORK/status-chunk-cache.json"
umount_image
stop_agent
cat "$NATIVE" >/dev/null
fio_rand native "$NATIVE" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0

python3 - "$ROOT/benches" "$WORK" "$SIZE_MB" "$BLOB_BYTES" "$REPS" "$RUNTIME" "$COLD_IOS" "$WARM_IOS" "$JSON_OUT" "$CAP" <<'PY'
import json, os, statistics, sys
benches, work, size_mb, blob_bytes, reps, runtime, cold_ios, warm_ios, json_out, cap = sys.argv[1:]
sys.path.insert(0, benches)
from scenarios import read

file_bytes = int(size_mb) << 20
seq = {}
for line in open(os.path.join(work, "seq.txt")):
    name, seconds = line.split()
    seq.setdefault(name, []).append(float(seconds))
med = {name: statistics.median(v) for name, v in seq.items()}


def seq_row(method, name, state, baseline):
    s = med[name]
    return {"method": method, "pattern": "sequential", "state": state, "baseline": baseline,
            "seconds": s, "bytes": file_bytes, "mib_per_s": file_bytes / 2**20 / s,
            "spread": [min(seq[name]), max(seq[name])]}


def fio_row(method, name, state, baseline):
    job = json.load(open(os.path.join(work, f"fio-{name}.json")))["jobs"][0]["read"]
    pct = job["clat_ns"]["percentile"]
    return {"method": method, "pattern": "random 4K", "state": state, "baseline": baseline,
            "seconds": job["runtime"] / 1000, "bytes": job["io_bytes"],
            "mib_per_s": job["bw_bytes"] / 2**20, "iops": job["iops"],
            "lat_mean_us": job["clat_ns"]["mean"] / 1000,
            "lat_p50_us": pct["50.000000"] / 1000, "lat_p99_us": pct["99.000000"] / 1000}


def origin(status_file):
    """What the mount fetched from the registry during a run."""
    pull = json.load(open(os.path.join(work, status_file)))["mounts"][0]["pull"]
    return {"origin_wire_bytes": pull["origin_wire_bytes"], "chunks_fetched": pull["chunks_fetched"]}


http = json.load(open(os.path.join(work, "http-rand.json")))
lat = sorted(http["latencies"])
pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
http_row = {"method": "HTTP 4K Range GETs of the blob", "pattern": "random 4K", "state": "cold",
            "baseline": "HTTP 4K Range GETs of the blob", "seconds": http["seconds"],
            "bytes": http["bytes"], "mib_per_s": http["bytes"] / 2**20 / http["seconds"],
            "iops": len(lat) / http["seconds"], "lat_mean_us": statistics.mean(lat) * 1e6,
            "lat_p50_us": pick(0.5), "lat_p99_us": pick(0.99)}

CURL, NATIVE = "curl of the blob", "native file, page cache"
NATIVE_RAND = "native file, page cache"
rows = [
    seq_row(CURL, "curl", "cold", CURL),
    seq_row("tessera mount, cold (empty cache)", "cold", "cold", CURL),
    seq_row(NATIVE, "native", "warm", NATIVE),
    seq_row("tessera mount, warm: same mount (page cache)", "page_cache", "warm", NATIVE),
    seq_row("tessera mount, warm: fresh mount (chunk cache)", "chunk_cache", "warm", NATIVE),
    http_row,
    fio_row("native file, pages dropped (disk)", "native_cold", "cold",
            "native file, pages dropped (disk)"),
    dict(fio_row("tessera mount, cold (empty cache)", "cold", "cold", http_row["method"]),
         **origin("status-cold.json")),
    fio_row(NATIVE_RAND, "native", "warm", NATIVE_RAND),
    fio_row("tessera mount, warm: same mount (page cache)", "page_cache", "warm", NATIVE_RAND),
    dict(fio_row("tessera mount, warm: fresh mount (chunk cache)", "chunk_cache", "warm",
                 NATIVE_RAND), **origin("status-chunk-cache.json")),
]
by = {(r["pattern"], r["method"]): r for r in rows}
for r in rows:
    base = by[(r["pattern"], r["baseline"])]
    if r["pattern"] == "sequential":
        r["vs_baseline"] = base["seconds"] / r["seconds"]
    else:
        r["vs_baseline"] = r["iops"] / base["iops"]
result = {
    "scenario": "read",
    "registry_cap": cap,
    "file_bytes": file_bytes,
    "blob_bytes": int(blob_bytes),
    "repetitions": int(reps),
    "first_byte_seconds": med["first_byte"],
    "curl_wire_mib_per_s": int(blob_bytes) / 2**20 / med["curl"],
    "random_cold_reads": int(cold_ios),
    "random_warm_reads": int(warm_ios),
    "random_warm_max_seconds": int(runtime),
    "fio_version": os.popen("fio --version").read().strip(),
    "rows": rows,
}
if json_out:
    with open(json_out, "w") as f:
        json.dump(result, f, indent=2)
print("\n".join(read.render(result)))
PY
