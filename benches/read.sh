#!/usr/bin/env bash
# Read throughput of a lazy mount, against nydusd and baselines measured in the same run,
# on one TESSERA_BENCH_MOUNT_MB (default 1024) MiB file (half pseudo-random, half text, so its
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
# Nydus side by side: every mount run above is also made through nydusd (FUSE), on the
# same tree, registry and link, interleaved with Tessera's in the same repetitions: a
# RAFS v6 image built by `nydus-image create` (zstd, 1 MiB chunks) from the same native
# tree, its blob pushed to the same registry, nydusd's registry backend with a blobcache
# (a fresh work dir for every cold run; the fresh-mount runs restart nydusd over the full
# one). Each Tessera mount row gets a "vs nydusd" ratio. nydusd and nydus-image 2.2.0
# come from `make nydus-deps` (target/tools/nydus/bin, or TESSERA_NYDUS_BIN_DIR); without
# them the script stops. TESSERA_BENCH_NYDUS=off measures Tessera alone and says so in
# its output (bench-smoke: CI does not build nydus).
#
# Prints Markdown (benches/scenarios/read.py renders it); TESSERA_BENCH_JSON=FILE also
# writes the figures as JSON (scenario "read"). TESSERA_BIN picks the binary (default
# target/release/tessera). Needs docker-registry, skopeo, umoci, curl, python3, fuse3
# and fio (`make test-deps`) and nydus (`make nydus-deps`); runs as root.
set -euo pipefail

SIZE_MB=${TESSERA_BENCH_MOUNT_MB:-1024}
REPS=${TESSERA_BENCH_REPS:-3}
CAP=${TESSERA_BENCH_READ_CAP:-1gbit}
RUNTIME=${TESSERA_BENCH_READ_RUNTIME:-20}
COLD_IOS=${TESSERA_BENCH_READ_COLD_IOS:-$(( SIZE_MB / 4 > 64 ? SIZE_MB / 4 : 64 ))}
WARM_IOS=$(( SIZE_MB * 64 ))   # a quarter of the file's 4 KiB blocks, each read once
JSON_OUT=${TESSERA_BENCH_JSON:-}
NYDUS=${TESSERA_BENCH_NYDUS:-on}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
NYDUS_BIN=${TESSERA_NYDUS_BIN_DIR:-$ROOT/target/tools/nydus/bin}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-read.XXXXXX")
MNT=$WORK/mnt
NMNT=$WORK/nydus-mnt
REG_PID=""
AGENT_PID=""
NYDUSD_PID=""
NS=""   # the registry's network namespace, when the link is capped
stop_agent() {
    [ -n "$AGENT_PID" ] || return 0
    kill "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=""
}
# Unmounts first (a read in flight then fails rather than hangs), then ends the daemon:
# SIGTERM, and SIGKILL if it is still there after 5 s.
stop_nydusd() {
    [ -n "$NYDUSD_PID" ] || return 0
    umount "$NMNT" 2>/dev/null || umount -l "$NMNT" 2>/dev/null || true
    kill "$NYDUSD_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$NYDUSD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NYDUSD_PID" 2>/dev/null || true
    wait "$NYDUSD_PID" 2>/dev/null || true
    NYDUSD_PID=""
}
cleanup() {
    fusermount3 -u -z "$MNT" 2>/dev/null || true
    stop_nydusd
    # A nydusd that died on its own leaves its mount behind ("transport endpoint is not
    # connected"), which rm -rf could not remove.
    if grep -qs " $NMNT " /proc/mounts; then umount -l "$NMNT" 2>/dev/null || true; fi
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
case $NYDUS in
on)
    for tool in nydusd nydus-image; do
        [ -x "$NYDUS_BIN/$tool" ] || {
            echo "missing $NYDUS_BIN/$tool (nydus 2.2.0, the side-by-side rows): run make nydus-deps" \
                "(or set TESSERA_NYDUS_BIN_DIR; TESSERA_BENCH_NYDUS=off measures Tessera alone)" >&2
            exit 1
        }
    done ;;
off) ;;
*) echo "TESSERA_BENCH_NYDUS=$NYDUS: on or off" >&2; exit 1 ;;
esac
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

# Pushes FILE as blob sha256:HEX of REPO: the distribution API's monolithic upload (POST
# opens an upload, PUT ?digest= sends every byte and closes it).
push_blob() {
    local repo=$1 file=$2 hex=$3 loc
    loc=$(curl -sf -X POST -D - -o /dev/null "http://$REG/v2/$repo/blobs/uploads/" |
        tr -d '\r' | awk -F': ' 'tolower($1)=="location"{print $2}')
    [ -n "$loc" ] || { echo "the registry opened no upload for $repo" >&2; exit 1; }
    case $loc in /*) loc=http://$REG$loc ;; esac
    case $loc in *\?*) loc="$loc&digest=sha256:$hex" ;; *) loc="$loc?digest=sha256:$hex" ;; esac
    curl -sf -X PUT -H 'Content-Type: application/octet-stream' -T "$file" "$loc" >/dev/null
}
NYDUS_BLOB_BYTES=0
if [ "$NYDUS" = on ]; then
    step "building the Nydus image from the same tree (RAFS v6, zstd, 1 MiB chunks), pushing its blob"
    # --chunk-size is read as hexadecimal. With --blob-dir the blob is named by its sha256,
    # which the bootstrap records as its blob id and nydusd's registry backend fetches as
    # /v2/<repo>/blobs/sha256:<blob id>.
    mkdir -p "$WORK/nydus-blobs"
    "$NYDUS_BIN/nydus-image" create --log-level warn --type dir-rafs --fs-version 6 \
        --compressor zstd --chunk-size 0x100000 --bootstrap "$WORK/nydus-bootstrap" \
        --blob-dir "$WORK/nydus-blobs" --output-json "$WORK/nydus-build.json" "$WORK/rootfs" \
        >"$WORK/nydus-image.log" 2>&1 || {
        echo "nydus-image create failed; its output:" >&2; cat "$WORK/nydus-image.log" >&2; exit 1; }
    NYDUS_BLOB=$(python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["blobs"]; assert len(b)==1, b; print(b[0])' "$WORK/nydus-build.json")
    [ "$(sha256sum <"$WORK/nydus-blobs/$NYDUS_BLOB" | cut -d' ' -f1)" = "$NYDUS_BLOB" ] || {
        echo "nydus-image: blob $NYDUS_BLOB is not named by the sha256 of its bytes" >&2; exit 1; }
    push_blob nydus/big "$WORK/nydus-blobs/$NYDUS_BLOB" "$NYDUS_BLOB"
    NYDUS_BLOB_BYTES=$(curl -sfI "http://$REG/v2/nydus/big/blobs/sha256:$NYDUS_BLOB" |
        tr -d '\r' | awk -F': ' 'tolower($1)=="content-length"{print $2}')
    [ "$NYDUS_BLOB_BYTES" = "$(stat -c %s "$WORK/nydus-blobs/$NYDUS_BLOB")" ] || {
        echo "the registry does not serve the Nydus blob it was sent" >&2; exit 1; }
    rm -rf "$WORK/nydus-blobs"
fi
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

# nydusd as a FUSE server on $NMNT, its blobcache in CACHE_DIR (the caller empties it for a
# cold run and keeps it for a warm one). Nydus's defaults otherwise: no prefetch, reads
# amplified to 128 KiB, chunk digests not validated, 4 FUSE threads. --rlimit-nofile 0
# keeps the open-files limit as it is: nydusd's default raises it to 1,000,000, which
# fails (EPERM) where the hard limit is lower and cannot be raised, as in a container.
start_nydusd() {
    local cache=$1
    stop_nydusd
    mkdir -p "$cache" "$NMNT"
    rm -f "$WORK/nydusd.sock"
    cat >"$WORK/nydusd.json" <<JSON
{
  "device": {
    "backend": {"type": "registry",
                "config": {"scheme": "http", "host": "$REG", "repo": "nydus/big", "skip_verify": true}},
    "cache": {"type": "blobcache", "config": {"work_dir": "$cache"}}
  },
  "mode": "direct",
  "fs_prefetch": {"enable": false}
}
JSON
    "$NYDUS_BIN/nydusd" --config "$WORK/nydusd.json" --bootstrap "$WORK/nydus-bootstrap" \
        --mountpoint "$NMNT" --apisock "$WORK/nydusd.sock" --log-level warn --rlimit-nofile 0 \
        >>"$WORK/nydusd.log" 2>&1 &
    NYDUSD_PID=$!
    # Polled finely: nydusd's first-byte figure includes this wait. Its API socket
    # appears once the mount is served.
    for _ in $(seq 1000); do
        grep -qs " $NMNT " /proc/mounts && [ -S "$WORK/nydusd.sock" ] && return
        kill -0 "$NYDUSD_PID" 2>/dev/null || break
        sleep 0.01
    done
    echo "nydusd did not mount $NMNT; its log:" >&2; cat "$WORK/nydusd.log" >&2; exit 1
}
# What nydusd's registry backend fetched since it started (bytes on the wire, requests).
nydus_metrics() {
    curl -sf --unix-socket "$WORK/nydusd.sock" http://localhost/api/v1/metrics/backend >"$1"
}

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
    if [ "$NYDUS" = on ]; then
        # The same reads through nydusd: an empty blobcache, the same mount again, then a
        # new nydusd over the blobcache the first one filled.
        rm -rf "$WORK/nydus-cache"
        t0=$(now); start_nydusd "$WORK/nydus-cache"; head -c 1 "$NMNT/data/big.bin" >/dev/null; t1=$(now)
        record nydus_first_byte "$(elapsed "$t0" "$t1")"
        t0=$(now); cat "$NMNT/data/big.bin" >/dev/null; t1=$(now)
        record nydus_cold "$(elapsed "$t0" "$t1")"
        t0=$(now); cat "$NMNT/data/big.bin" >/dev/null; t1=$(now)
        record nydus_page_cache "$(elapsed "$t0" "$t1")"
        start_nydusd "$WORK/nydus-cache"
        t0=$(now); cat "$NMNT/data/big.bin" >/dev/null; t1=$(now)
        record nydus_blobcache "$(elapsed "$t0" "$t1")"
        stop_nydusd
    fi
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
if [ "$NYDUS" = on ]; then
    step "random 4K, cold: $COLD_IOS reads through a fresh nydusd, an empty blobcache"
    rm -rf "$WORK/nydus-cache"
    start_nydusd "$WORK/nydus-cache"
    fio_rand nydus_cold "$NMNT/data/big.bin" --number_ios="$COLD_IOS" --runtime=120 --invalidate=1
    nydus_metrics "$WORK/nydus-backend-cold.json"
    stop_nydusd
fi
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
if [ "$NYDUS" = on ]; then
    # Over the blobcache the cold random run began, as the agent's chunk cache above.
    start_nydusd "$WORK/nydus-cache"
    cat "$NMNT/data/big.bin" >/dev/null
    fio_rand nydus_page_cache "$NMNT/data/big.bin" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0
    start_nydusd "$WORK/nydus-cache"
    fio_rand nydus_blobcache "$NMNT/data/big.bin" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0
    nydus_metrics "$WORK/nydus-backend-blobcache.json"
    stop_nydusd
fi
cat "$NATIVE" >/dev/null
fio_rand native "$NATIVE" --number_ios="$WARM_IOS" --runtime="$RUNTIME" --invalidate=0

# The version cargo installed (the binaries themselves print "unknown": their build
# script asks git, and a crates.io source is no git checkout).
NYDUS_VERSION=$(grep -o 'nydus-rs [0-9][0-9.]*' "$NYDUS_BIN/../.crates.toml" 2>/dev/null | cut -d' ' -f2 || true)
python3 - "$ROOT/benches" "$WORK" "$SIZE_MB" "$BLOB_BYTES" "$REPS" "$RUNTIME" "$COLD_IOS" "$WARM_IOS" "$JSON_OUT" "$CAP" \
    "$NYDUS" "${NYDUS_VERSION:-unknown}" "$NYDUS_BLOB_BYTES" <<'PY'
import json, os, statistics, sys
(benches, work, size_mb, blob_bytes, reps, runtime, cold_ios, warm_ios, json_out, cap,
 nydus, nydus_version, nydus_blob_bytes) = sys.argv[1:]
nydus_on = nydus == "on"
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


def nydus_origin(metrics_file):
    """What nydusd's registry backend fetched during a run (its /api/v1/metrics/backend)."""
    m = json.load(open(os.path.join(work, metrics_file)))
    return {"origin_wire_bytes": m["read_amount_total"], "origin_requests": m["read_count"]}


def both(tessera_row, nydus_row):
    """The Tessera row, then nydusd's measured the same way when nydusd ran."""
    return [tessera_row] + ([nydus_row()] if nydus_on else [])


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
HTTP, DISK = http_row["method"], "native file, pages dropped (disk)"
T_COLD, N_COLD = "tessera mount, cold (empty cache)", "nydusd mount, cold (empty blobcache)"
T_PAGE, N_PAGE = ("tessera mount, warm: same mount (page cache)",
                  "nydusd mount, warm: same mount (page cache)")
T_CHUNK, N_BLOB = ("tessera mount, warm: fresh mount (chunk cache)",
                   "nydusd mount, warm: fresh mount (blobcache)")
# Each Tessera mount row and the nydusd row measured the same way, for "vs nydusd".
PAIRS = {T_COLD: N_COLD, T_PAGE: N_PAGE, T_CHUNK: N_BLOB}
rows = [
    seq_row(CURL, "curl", "cold", CURL),
    *both(seq_row(T_COLD, "cold", "cold", CURL), lambda: seq_row(N_COLD, "nydus_cold", "cold", CURL)),
    seq_row(NATIVE, "native", "warm", NATIVE),
    *both(seq_row(T_PAGE, "page_cache", "warm", NATIVE),
          lambda: seq_row(N_PAGE, "nydus_page_cache", "warm", NATIVE)),
    *both(seq_row(T_CHUNK, "chunk_cache", "warm", NATIVE),
          lambda: seq_row(N_BLOB, "nydus_blobcache", "warm", NATIVE)),
    http_row,
    fio_row(DISK, "native_cold", "cold", DISK),
    *both(dict(fio_row(T_COLD, "cold", "cold", HTTP), **origin("status-cold.json")),
          lambda: dict(fio_row(N_COLD, "nydus_cold", "cold", HTTP),
                       **nydus_origin("nydus-backend-cold.json"))),
    fio_row(NATIVE_RAND, "native", "warm", NATIVE_RAND),
    *both(fio_row(T_PAGE, "page_cache", "warm", NATIVE_RAND),
          lambda: fio_row(N_PAGE, "nydus_page_cache", "warm", NATIVE_RAND)),
    *both(dict(fio_row(T_CHUNK, "chunk_cache", "warm", NATIVE_RAND), **origin("status-chunk-cache.json")),
          lambda: dict(fio_row(N_BLOB, "nydus_blobcache", "warm", NATIVE_RAND),
                       **nydus_origin("nydus-backend-blobcache.json"))),
]
by = {(r["pattern"], r["method"]): r for r in rows}
for r in rows:
    base = by[(r["pattern"], r["baseline"])]
    nyd = by.get((r["pattern"], PAIRS.get(r["method"])))
    # Both ratios above 1 when this row is the faster: time for sequential, IOPS for random.
    if r["pattern"] == "sequential":
        r["vs_baseline"] = base["seconds"] / r["seconds"]
        if nyd:
            r["vs_nydusd"] = nyd["seconds"] / r["seconds"]
    else:
        r["vs_baseline"] = r["iops"] / base["iops"]
        if nyd:
            r["vs_nydusd"] = r["iops"] / nyd["iops"]
if nydus_on:
    nydusd = {"version": nydus_version, "blob_bytes": int(nydus_blob_bytes),
              "first_byte_seconds": med["nydus_first_byte"],
              "image": "nydus-image create --type dir-rafs --fs-version 6 --compressor zstd "
                       "--chunk-size 0x100000",
              "config": json.load(open(os.path.join(work, "nydusd.json")))}
else:
    nydusd = {"skipped": "TESSERA_BENCH_NYDUS=off"}
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
    "nydusd": nydusd,
    "rows": rows,
}
if json_out:
    with open(json_out, "w") as f:
        json.dump(result, f, indent=2)
print("\n".join(read.render(result)))
PY
