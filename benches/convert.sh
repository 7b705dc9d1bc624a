#!/usr/bin/env bash
# Conversion benchmark, against baselines measured in the same run.
#
# 1. Throughput and memory, registry A -> registry B (two registries, so neither tool
#    can mount blobs instead of moving them), median of TESSERA_BENCH_REPS (default 3),
#    interleaved, each repetition into a fresh registry B:
#      baseline  skopeo copy        (moves the compressed layers, builds nothing)
#      tessera   tessera convert    (pull, build, push)
#    Wall time, MB/s of input (the image's file bytes, MB = 10^6), peak RSS (GNU time's
#    maximum resident set size), and convert's own phases (pull, build, push).
# 2. Build from the unpacked tree (v1 unpacked once with umoci), the same REPS,
#    interleaved, alternating which goes first, the page cache dropped before every run
#    (sync; echo 3 > /proc/sys/vm/drop_caches: both tools read the tree from disk), each
#    writing bootstrap and blob into a fresh directory of the scratch dir:
#      baseline  nydus-image create (RAFS v6, zstd, 1 MiB chunks: nydus 2.2.0's defaults
#                otherwise, zstd level 3 as Tessera's)
#      tessera   tessera build --dir (its defaults: zstd 3, fixed 1 MiB chunks)
#    Wall time, MB/s of the tree's file bytes, CPU time (user + system: how much of the
#    cores each used), peak RSS, output size, and "tessera build vs nydus-image create"
#    (nydus's time / Tessera's) against the mission's >= 3x; and the same tree only read
#    (find | xargs -P 8 cat, page cache dropped too): the disk's floor under any builder,
#    with 8 reads in flight (one `cat` at a time leaves the disk idle between files).
#    nydus-image comes from `make nydus-deps` (target/tools/nydus/bin, or
#    TESSERA_NYDUS_BIN_DIR); without it the script stops. TESSERA_BENCH_NYDUS=off builds
#    with Tessera alone and says so (bench-smoke: CI does not build nydus).
# 3. Dedup across versions: v1 and then v2 (one package upgraded) into one registry,
#      baseline  skopeo copy of the plain OCI layers
#      tessera   tessera convert v1, then v2 with --chunk-dict v1, for each chunking in
#                TESSERA_BENCH_CONVERT_CHUNKING (default "fixed:1M cdc:1M cdc:256K")
#    and what v2 adds: the registry's storage growth (its blob files, summed around the v2
#    push, so nothing the tool reports is taken on trust) beside convert's own count of
#    pushed bytes, against the bytes of file contents v2 has that v1 lacks.
#
# The image is benches/image.sh's (Debian + a Python stack, ~850 MiB, tags v1 and v2;
# TESSERA_BENCH_IMAGE_SMALL=1 for its ~63 MiB smoke variant, TESSERA_BENCH_IMAGE_DIR for
# another build). TESSERA_BENCH_CONVERT_MB=N converts a generated image of N MiB instead
# (random and text files in 256 MB layers: the 5 GB memory bound; no v2, so no dedup).
# Prints Markdown; TESSERA_BENCH_JSON=FILE also writes the figures as JSON (scenario
# "convert", rendered by benches/scenarios/convert.py). TESSERA_BIN picks the binary
# (default target/release/tessera). Needs docker-registry, skopeo, umoci, python3, GNU
# time (`make test-deps`), nydus-image (`make nydus-deps`), and root for the image's first
# build and to drop the page cache (without it part 2 runs on a warm page cache, and says
# so).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
REPS=${TESSERA_BENCH_REPS:-3}
MODES=${TESSERA_BENCH_CONVERT_CHUNKING:-fixed:1M cdc:1M cdc:256K}
GENERATED_MB=${TESSERA_BENCH_CONVERT_MB:-}
JSON_OUT=${TESSERA_BENCH_JSON:-}
NYDUS=${TESSERA_BENCH_NYDUS:-on}
NYDUS_BIN=${TESSERA_NYDUS_BIN_DIR:-$ROOT/target/tools/nydus/bin}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-convert.XXXXXX")
declare -A REG_PID=()
cleanup() {
    for pid in "${REG_PID[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${REG_PID[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

for tool in docker-registry skopeo umoci python3 /usr/bin/time; do
    command -v "$tool" >/dev/null || { echo "missing $tool: run make test-deps" >&2; exit 1; }
done
case $NYDUS in
on)
    [ -x "$NYDUS_BIN/nydus-image" ] || {
        echo "missing $NYDUS_BIN/nydus-image (nydus 2.2.0, the side-by-side build row): run make nydus-deps" \
            "(or set TESSERA_NYDUS_BIN_DIR; TESSERA_BENCH_NYDUS=off builds with Tessera alone)" >&2
        exit 1
    } ;;
off) ;;
*) echo "TESSERA_BENCH_NYDUS=$NYDUS: on or off" >&2; exit 1 ;;
esac
[ -x "$TESSERA" ] || (cd "$ROOT" && cargo build --release -p tessera-agent --bin tessera)
step() { printf '[convert] %s\n' "$*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_registry() { # NAME VAR: starts a registry with empty storage, sets VAR to host:port
    local dir="$WORK/reg-$1" port
    port=$(free_port)
    rm -rf "$dir"
    mkdir -p "$dir/storage"
    cat >"$dir/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $dir/storage}}
http: {addr: 127.0.0.1:$port}
EOF
    # Not in a $(…) subshell: REG_PID must reach the EXIT trap.
    docker-registry serve "$dir/config.yml" >"$dir/log" 2>&1 &
    REG_PID[$1]=$!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    printf -v "$2" '127.0.0.1:%s' "$port"
}
stop_registry() { # NAME: stops it and frees its storage
    kill "${REG_PID[$1]}" 2>/dev/null || true
    wait "${REG_PID[$1]}" 2>/dev/null || true
    unset "REG_PID[$1]"
    rm -rf "$WORK/reg-$1"
}
# Bytes of the blobs the registry keeps (layers, configs, manifests; not its link files
# and directories, which do not travel).
stored() {
    find "$WORK/reg-$1/storage" -type f -name data -printf '%s\n' | awk '{n += $1} END {printf "%.0f\n", n}'
}

# --- the image ---------------------------------------------------------------------
if [ -n "$GENERATED_MB" ]; then
    step "generating a ${GENERATED_MB} MiB image"
    LAYOUT=$WORK/layout
    IMAGE_DESC="generated: ${GENERATED_MB} MiB of files in 256 MB layers, half random, half text"
    python3 - "$LAYOUT" "$GENERATED_MB" <<'PY'
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
    TAGS="v1"
else
    dir=$(bash "$ROOT/benches/image.sh" ${TESSERA_BENCH_IMAGE_DIR:+"$TESSERA_BENCH_IMAGE_DIR"})
    LAYOUT=$dir/layout
    IMAGE_DESC=$(cat "$dir/description" 2>/dev/null || echo "benches/image.sh")
    TAGS="v1 v2"
fi

start_registry a A
for tag in $TAGS; do
    step "pushing $tag to registry A"
    skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$A/src/app:$tag"
done

# OUT CMD...: runs CMD, stdout to OUT.out, "seconds max_rss_kib user_s sys_s" to OUT.time
measure() {
    local out=$1
    shift
    /usr/bin/time -f "%e %M %U %S" -o "$out.time" "$@" >"$out.out"
}
convert() { # OUT SRC DST [FLAGS...]
    local out=$1 src=$2 dst=$3
    shift 3
    measure "$out" env DOCKER_CONFIG="$WORK" TESSERA_CONFIG=/dev/null \
        "$TESSERA" convert --json --work-dir "$WORK" "$@" "$src" "$dst"
}

# --- 1. throughput and memory --------------------------------------------------------
mkdir -p "$WORK/runs"
for rep in $(seq "$REPS"); do
    start_registry "b$rep" B
    # Alternate which goes first, so neither always meets a colder machine.
    if [ $((rep % 2)) = 1 ]; then order="copy convert"; else order="convert copy"; fi
    for what in $order; do
        step "repetition $rep/$REPS: $what"
        case $what in
        copy) measure "$WORK/runs/copy-$rep" skopeo --insecure-policy copy -q \
                  --src-tls-verify=false --dest-tls-verify=false \
                  "docker://$A/src/app:v1" "docker://$B/copy/app:v1" ;;
        convert) convert "$WORK/runs/convert-$rep" "$A/src/app:v1" "$B/tessera/app:v1" ;;
        esac
    done
    stop_registry "b$rep"
done

# --- 2. build from the unpacked tree: tessera build --dir vs nydus-image create --------
mkdir -p "$WORK/build"
step "unpacking v1 into a directory (umoci)"
rootless=()
[ "$(id -u)" = 0 ] || rootless=(--rootless)
umoci unpack "${rootless[@]}" --image "$LAYOUT:v1" "$WORK/bundle" >/dev/null
TREE=$WORK/bundle/rootfs
# The input both builders read: regular files and their bytes, a hard-linked file once.
python3 - "$TREE" >"$WORK/build/tree" <<'PY'
import os, sys
seen, files, size = set(), 0, 0
for d, _, names in os.walk(sys.argv[1]):
    for n in names:
        st = os.lstat(os.path.join(d, n))
        if (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            files += 1
            size += st.st_size
print(files, size)
PY
# Every build reads the tree from disk: dirty pages are written back and the page cache
# dropped before it. Where that is not allowed (not root, a read-only /proc/sys) both
# builders read a warm page cache instead, and the report says which.
PAGE_CACHE=dropped
{ sync && echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || PAGE_CACHE=warm
if [ "$PAGE_CACHE" = warm ]; then
    step "cannot drop the page cache (root needed): building from a warm page cache"
    find "$TREE" -type f -exec cat {} + >/dev/null
fi
drop_page_cache() {
    sync
    [ "$PAGE_CACHE" = warm ] || echo 3 >/proc/sys/vm/drop_caches
}
# Bytes the build wrote into DIR (bootstrap and blob).
written() { find "$1" -type f -printf '%s\n' | awk '{n += $1} END {printf "%.0f\n", n}'; }
build() { # WHAT REP: one build of the tree into a fresh directory, measured
    local out=$WORK/build/out run=$WORK/build/$1-$2
    rm -rf "$out"
    mkdir -p "$out"
    drop_page_cache
    case $1 in
    read) measure "$run" sh -c 'find "$1" -type f -print0 | xargs -0 -P 8 -n 64 cat >/dev/null' read "$TREE" \
              2>"$run.log" ;;
    tessera) measure "$run" env TESSERA_CONFIG=/dev/null "$TESSERA" build --json \
                 --dir "$TREE" --out "$out" 2>"$run.log" ;;
    nydus) mkdir -p "$out/blobs"
           measure "$run" "$NYDUS_BIN/nydus-image" create --log-level warn --type dir-rafs \
               --fs-version 6 --compressor zstd --chunk-size 0x100000 \
               --bootstrap "$out/bootstrap" --blob-dir "$out/blobs" "$TREE" 2>"$run.log" ;;
    esac || { echo "$1 build of $TREE failed; its output:" >&2; cat "$run.log" "$run.out" >&2; exit 1; }
    written "$out" >"$run.size"
    rm -rf "$out"
}
# "read": every file of the tree read and thrown away by 8 readers at once, the disk's
# floor under any builder here.
if [ "$NYDUS" = on ]; then builders="read tessera nydus"; else
    builders="read tessera"
    step "nydus-image: not run (TESSERA_BENCH_NYDUS=off)"
fi
for rep in $(seq "$REPS"); do
    # Alternate which goes first, as in part 1.
    order=$builders
    [ $((rep % 2)) = 1 ] || order=$(echo "$builders" | tr ' ' '\n' | tac | tr '\n' ' ')
    for what in $order; do
        step "the unpacked tree, repetition $rep/$REPS: $what (page cache $PAGE_CACHE)"
        build "$what" "$rep"
    done
done
rm -rf "$WORK/bundle"

# --- 3. dedup across versions ----------------------------------------------------------
mkdir -p "$WORK/dedup"
if [[ " $TAGS " == *" v2 "* ]]; then
    start_registry d D
    step "dedup: plain OCI layers"
    skopeo --insecure-policy copy -q --src-tls-verify=false --dest-tls-verify=false \
        "docker://$A/src/app:v1" "docker://$D/oci/app:v1"
    s0=$(stored d)
    skopeo --insecure-policy copy -q --src-tls-verify=false --dest-tls-verify=false \
        "docker://$A/src/app:v2" "docker://$D/oci/app:v2"
    echo "oci - - $s0 $(($(stored d) - s0))" >"$WORK/dedup/growth"
    for mode in $MODES; do
        chunking=${mode%%:*} size=${mode#*:}
        name="$chunking-$(echo "$size" | tr A-Z a-z)"
        step "dedup: tessera convert v1, v2 with --chunking $chunking --chunk-size $size"
        s0=$(stored d)
        convert "$WORK/dedup/$name-v1" "$A/src/app:v1" "$D/$name/app:v1" \
            --chunking "$chunking" --chunk-size "$size"
        s1=$(stored d)
        convert "$WORK/dedup/$name-v2" "$A/src/app:v2" "$D/$name/app:v2" \
            --chunking "$chunking" --chunk-size "$size" --chunk-dict "$D/$name/app:v1"
        echo "$name $chunking $size $((s1 - s0)) $(($(stored d) - s1))" >>"$WORK/dedup/growth"
    done
    stop_registry d
fi

# --- report ---------------------------------------------------------------------------
step "summarising"
# The version cargo installed (the binaries themselves print "unknown": their build
# script asks git, and a crates.io source is no git checkout).
NYDUS_VERSION=$(grep -o 'nydus-rs [0-9][0-9.]*' "$NYDUS_BIN/../.crates.toml" 2>/dev/null | cut -d' ' -f2 || true)
python3 - "$ROOT" "$WORK" "$LAYOUT" "$IMAGE_DESC" "$REPS" "$JSON_OUT" "$TAGS" \
    "$NYDUS" "${NYDUS_VERSION:-unknown}" "$PAGE_CACHE" <<'PY'
import hashlib, json, os, statistics, sys, tarfile
(root, work, layout, image_desc, reps, json_out, tags,
 nydus, nydus_version, page_cache) = sys.argv[1:]
reps = int(reps)
blobs = os.path.join(layout, "blobs", "sha256")
def blob(digest):
    return os.path.join(blobs, digest.split(":", 1)[1])
def manifest(tag):
    for m in json.load(open(os.path.join(layout, "index.json")))["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return json.load(open(blob(m["digest"])))
    sys.exit(f"no tag {tag} in {layout}")
def timing(path):
    s, kib = open(path + ".time").read().split()[:2]
    return float(s), int(kib) * 1024
def cpu_seconds(path):
    """User + system CPU time of the process and its children."""
    user, system = open(path + ".time").read().split()[2:4]
    return float(user) + float(system)
def summary(path):
    return json.load(open(path + ".out"))
mib = lambda b: f"{b / 2**20:.1f} MiB"

v1 = manifest("v1")
layer_bytes = sum(l["size"] for l in v1["layers"])
# The input: file bytes the build read (the same in every repetition).
input_bytes = summary(f"{work}/runs/convert-1")["images"][0]["build"]["bytes_in"]
copies = [timing(f"{work}/runs/copy-{r}") for r in range(1, reps + 1)]
converts = [timing(f"{work}/runs/convert-{r}") for r in range(1, reps + 1)]
sums = [summary(f"{work}/runs/convert-{r}") for r in range(1, reps + 1)]
med = statistics.median
copy_s, copy_rss = med(s for s, _ in copies), med(m for _, m in copies)
conv_s, conv_rss = med(s for s, _ in converts), med(m for _, m in converts)
phases = {k: med(x[k] for x in sums) for k in ("pull_seconds", "build_seconds", "push_seconds")}
build_stored = sums[0]["images"][0]["build"]["stored_bytes"]
rows = [
    {"method": "skopeo copy (baseline)", "seconds": copy_s, "input_mb_per_s": input_bytes / 1e6 / copy_s,
     "peak_rss_bytes": copy_rss, "vs_baseline": 1.0, "output_bytes": layer_bytes},
    {"method": "tessera convert", "seconds": conv_s, "input_mb_per_s": input_bytes / 1e6 / conv_s,
     "peak_rss_bytes": conv_rss, "vs_baseline": copy_s / conv_s, "output_bytes": build_stored},
]
result = {
    "scenario": "convert",
    "image": image_desc,
    "input_bytes": input_bytes,
    "layer_bytes": layer_bytes,
    "repetitions": reps,
    "rows": rows,
    "convert_phases": phases,
    "build_mb_per_s": input_bytes / 1e6 / phases["build_seconds"],
    "spread": {"copy_seconds": [min(s for s, _ in copies), max(s for s, _ in copies)],
               "convert_seconds": [min(s for s, _ in converts), max(s for s, _ in converts)]},
}

# Part 2: both builders on the unpacked tree; the same numerator (the tree's file bytes).
tree_files, tree_bytes = map(int, open(f"{work}/build/tree").read().split())
def build_row(method, name):
    runs = [timing(f"{work}/build/{name}-{r}") for r in range(1, reps + 1)]
    written = [int(open(f"{work}/build/{name}-{r}.size").read()) for r in range(1, reps + 1)]
    s = med(t for t, _ in runs)
    cpu = med(cpu_seconds(f"{work}/build/{name}-{r}") for r in range(1, reps + 1))
    return {"method": method, "seconds": s, "input_mb_per_s": tree_bytes / 1e6 / s,
            "cpu_seconds": cpu, "peak_rss_bytes": med(m for _, m in runs),
            "output_bytes": int(med(written)),
            "spread": [min(t for t, _ in runs), max(t for t, _ in runs)]}
NYDUS_CMD = ("nydus-image create --type dir-rafs --fs-version 6 --compressor zstd "
             "--chunk-size 0x100000")
reads = [timing(f"{work}/build/read-{r}")[0] for r in range(1, reps + 1)]
build = {"tree_files": tree_files, "tree_bytes": tree_bytes, "repetitions": reps,
         "page_cache": "dropped before each run" if page_cache == "dropped" else
                       "warm (could not drop it: not root)",
         # Reading every file and nothing else, measured like the builds: what the disk
         # (or the page cache) allows any builder.
         "read_seconds": med(reads), "read_mb_per_s": tree_bytes / 1e6 / med(reads),
         "rows": [build_row("tessera build --dir", "tessera")]}
if nydus == "on":
    nydus_row = build_row("nydus-image create", "nydus")
    build["rows"].append(nydus_row)
    # Above 1: Tessera builds faster (nydus's time / Tessera's; the same input bytes).
    build["tessera_vs_nydus"] = nydus_row["seconds"] / build["rows"][0]["seconds"]
    build["nydus_image"] = {"version": nydus_version, "command": NYDUS_CMD}
else:
    build["nydus_image"] = {"skipped": "TESSERA_BENCH_NYDUS=off"}
result["build"] = build

if "v2" in tags.split():
    v2 = manifest("v2")
    shared = {l["digest"] for l in v1["layers"]} & {l["digest"] for l in v2["layers"]}
    def contents(m):
        """sha256 -> size of every regular file's content in the layers not shared."""
        out = {}
        for l in m["layers"]:
            if l["digest"] in shared:
                continue
            with tarfile.open(blob(l["digest"]), "r|*") as tar:
                for member in tar:
                    if member.isreg():
                        h = hashlib.sha256()
                        f = tar.extractfile(member)
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
                        out[h.hexdigest()] = member.size
        return out
    old, new = contents(v1), contents(v2)
    changed = {h: n for h, n in new.items() if h not in old}
    growth = {}
    for line in open(f"{work}/dedup/growth"):
        name, chunking, size, first, second = line.split()
        growth[name] = (chunking, size, int(first), int(second))
    _, _, oci_v1, oci_v2 = growth.pop("oci")
    dedup = [{"method": "plain OCI layers (skopeo copy)", "v1_bytes": oci_v1, "v2_upload_bytes": oci_v2,
              "v2_pushed_bytes": oci_v2, "total_bytes": oci_v1 + oci_v2, "vs_baseline": 1.0}]
    for name, (chunking, size, g1, g2) in growth.items():
        s1, s2 = summary(f"{work}/dedup/{name}-v1"), summary(f"{work}/dedup/{name}-v2")
        b2 = s2["images"][0]["build"]
        dedup.append({
            "method": f"tessera, {'fixed' if chunking == 'fixed' else 'CDC avg'} {size}",
            "v1_bytes": g1, "v2_upload_bytes": g2, "v2_pushed_bytes": s2["pushed_bytes"],
            "total_bytes": g1 + g2, "vs_baseline": oci_v2 / g2,
            "v1_chunks": s1["images"][0]["build"]["unique_chunks"],
            "v2_new_chunks": b2["unique_chunks"] - b2["dict_chunks"],
            "v2_dict_chunks": b2["dict_chunks"],
            "v2_new_blob_bytes": (b2.get("new_blob") or {}).get("size", 0),
            "v2_bootstrap_bytes": b2["bootstrap_bytes"],
            "compression_ratio": s1["images"][0]["build"]["compression_ratio"],
        })
    result["dedup"] = dedup
    result["v2_changed_files"] = len(changed)
    result["v2_changed_bytes"] = sum(changed.values())
    result["layers_shared"] = len(shared)

if json_out:
    os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
    json.dump(result, open(json_out, "w"), indent=2)
sys.path.insert(0, os.path.join(root, "benches"))
from scenarios import convert
print("\n".join(convert.render(result)))
PY
