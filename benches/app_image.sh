#!/usr/bin/env bash
# The restore benchmark's app image: benches/image.sh's image (tags v1 and v2, which
# differ in pandas) with one more layer holding /app/serve.py (benches/app/serve.py), a
# service that imports the stack, builds an in-memory index and serves its checksum
# over HTTP, as the image's command (`python3 /app/serve.py 8080 full`, or `small` for
# the smoke-size image, whose stack is a generated package).
#
#   benches/app_image.sh [OUT_DIR]     prints the directory (layout/, description, …)
#
# Built once per recipe (this script, serve.py and the base image's own directory) into
# OUT_DIR (default target/bench-cache/app-<recipe hash>) in seconds: the base image's
# blobs are hard-linked (copied if they cannot be), not rebuilt. The base image is
# benches/image.sh's (TESSERA_BENCH_IMAGE_DIR names another build of it;
# TESSERA_BENCH_IMAGE_SMALL=1 the smoke size). Needs root (image.sh) and umoci.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVE=$ROOT/benches/app/serve.py
PORT=8080
MODE=full
[ "${TESSERA_BENCH_IMAGE_SMALL:-0}" = 1 ] && MODE=small

base=$(bash "$ROOT/benches/image.sh" ${TESSERA_BENCH_IMAGE_DIR:+"$TESSERA_BENCH_IMAGE_DIR"})
base=$(cd "$base" && pwd -P)
recipe=$( (cat "$0" "$SERVE"; echo "$base $MODE") | sha256sum | cut -c1-12)
OUT=${1:-$ROOT/target/bench-cache/app-$recipe}
if [ -f "$OUT/done" ]; then
    echo "$OUT"
    exit 0
fi
command -v umoci >/dev/null || { echo "missing umoci: apt-get install umoci" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT/layout"
cp "$base/layout/index.json" "$base/layout/oci-layout" "$OUT/layout/"
# Blobs never change (they are named by their digest): links share the base's bytes.
cp -al "$base/layout/blobs" "$OUT/layout/" 2>/dev/null || cp -a "$base/layout/blobs" "$OUT/layout/"
# The layer is written here, not by `umoci insert`: umoci 0.4.7's (bookworm) ends its
# tar without padding or end-of-archive blocks, which a strict reader rejects.
python3 - "$OUT/layout" "$SERVE" "$PORT" "$MODE" <<'PY'
import gzip, hashlib, io, json, sys, tarfile
layout, serve, port, mode = sys.argv[1:]

def blob(data):
    digest = hashlib.sha256(data).hexdigest()
    with open(f"{layout}/blobs/sha256/{digest}", "wb") as f:
        f.write(data)
    return f"sha256:{digest}"

def read(digest):
    return json.load(open(f"{layout}/blobs/sha256/{digest[7:]}"))

raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for name, data in (("app/", None), ("app/serve.py", open(serve, "rb").read())):
        info = tarfile.TarInfo(name.rstrip("/"))
        info.mtime = 1700000000
        if data is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        else:
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
raw = raw.getvalue()
layer = gzip.compress(raw, mtime=0)
index = json.load(open(f"{layout}/index.json"))
for entry in index["manifests"]:
    if entry["annotations"]["org.opencontainers.image.ref.name"] not in ("v1", "v2"):
        continue
    manifest = read(entry["digest"])
    config = read(manifest["config"]["digest"])
    config["rootfs"]["diff_ids"].append(f"sha256:{hashlib.sha256(raw).hexdigest()}")
    config["history"].append({"created_by": "benches/app_image.sh: /app/serve.py"})
    config["config"]["Cmd"] = ["python3", "/app/serve.py", port, mode]
    config["config"]["Env"] = ["HOME=/tmp", "MPLCONFIGDIR=/tmp/matplotlib", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    data = json.dumps(config).encode()
    manifest["config"] = {**manifest["config"], "digest": blob(data), "size": len(data)}
    manifest["layers"].append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "digest": blob(layer), "size": len(layer)})
    data = json.dumps(manifest).encode()
    entry["digest"], entry["size"] = blob(data), len(data)
json.dump(index, open(f"{layout}/index.json", "w"))
PY
umoci gc --layout "$OUT/layout" >"$OUT/build.log" 2>&1
echo "$(cat "$base/description"), with /app/serve.py ($MODE index)" >"$OUT/description"
cp "$base/unpacked-bytes" "$OUT/unpacked-bytes"
echo "$PORT" >"$OUT/port"
touch "$OUT/done"
echo "$OUT"
