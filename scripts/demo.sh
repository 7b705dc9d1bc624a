#!/usr/bin/env bash
# The main job, for now: build an image from a sample directory, inspect, check and
# unpack it, rebuild a changed version against the first as a chunk dictionary, and
# print what happened. Later issues grow this into the local demo cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${DEMO_OUT:-demo-out}
rm -rf "$out"
mkdir -p "$out"

echo "== building tessera"
cargo build --release -p tessera-agent --quiet
tessera=target/release/tessera

echo "== making a sample root filesystem in $out/rootfs"
rootfs=$out/rootfs
mkdir -p "$rootfs/usr/share" "$rootfs/etc" "$rootfs/usr/bin"
# Real content from this machine: documentation, config files and a few programs.
cp -a /usr/share/doc "$rootfs/usr/share/" 2>/dev/null || true
cp -a /etc/. "$rootfs/etc/" 2>/dev/null || true
for prog in bash ls cat tar; do cp -a "$(command -v $prog)" "$rootfs/usr/bin/" 2>/dev/null || true; done
ln -sf bash "$rootfs/usr/bin/sh"
printf '/usr/bin/bash\n/etc/passwd\n' > "$out/prefetch.txt"

echo "== tessera build (CDC chunking, zstd)"
"$tessera" build --dir "$rootfs" --out "$out/image-v1" --chunking cdc --chunk-size 256K \
  --prefetch-list "$out/prefetch.txt"

echo "== tessera inspect (first lines)"
"$tessera" inspect "$out/image-v1" | head -n 12

echo "== tessera check"
"$tessera" check "$out/image-v1"

echo "== tessera unpack, then compare with the source"
"$tessera" unpack "$out/image-v1" --to "$out/unpacked"
diff -r --no-dereference "$rootfs" "$out/unpacked" && echo "unpacked tree is identical to the source"

echo "== version 2: one new file, rebuilt against version 1 as a chunk dictionary"
head -c 2000000 /dev/urandom > "$rootfs/usr/share/new-data.bin"
"$tessera" build --dir "$rootfs" --out "$out/image-v2" --chunking cdc --chunk-size 256K \
  --chunk-dict "$out/image-v1" --json > "$out/v2.json"
python3 - "$out/v2.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
new = s["new_blob"]["size"] if s["new_blob"] else 0
print(f"image v2: {s['unique_chunks']} unique chunks, {s['dict_chunks']} reused from v1; "
      f"new blob {new/2**20:.1f} MiB of {s['stored_bytes']/2**20:.1f} MiB stored in all")
PY
"$tessera" check "$out/image-v2"

echo "== tessera convert: an OCI image in a local registry, converted and read back by Range requests"
if command -v docker-registry >/dev/null && command -v umoci >/dev/null && command -v skopeo >/dev/null; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$out/registry"
  printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: 127.0.0.1:%s}\n' \
    "$PWD/$out/registry" "$port" > "$out/registry.yml"
  docker-registry serve "$out/registry.yml" > "$out/registry.log" 2>&1 &
  registry_pid=$!
  trap 'kill $registry_pid 2>/dev/null || true' EXIT
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  umoci init --layout "$out/layout" >/dev/null
  umoci new --image "$out/layout:v1" >/dev/null
  # unpack + repack rather than `umoci insert`: umoci 0.4.7's insert can write a
  # truncated layer (GNU tar rejects it too).
  umoci unpack --image "$out/layout:v1" "$out/bundle" >/dev/null
  cp -a "$rootfs/." "$out/bundle/rootfs/"
  umoci repack --image "$out/layout:v1" "$out/bundle" >/dev/null
  skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$out/layout:v1" "docker://127.0.0.1:$port/demo/app:v1"
  "$tessera" convert "127.0.0.1:$port/demo/app:v1" "127.0.0.1:$port/demo/app:v1-tessera"
  "$tessera" check --ref "127.0.0.1:$port/demo/app:v1-tessera"
  "$tessera" unpack --ref "127.0.0.1:$port/demo/app:v1-tessera" --to "$out/unpacked-ref" 2>/dev/null
  diff -r --no-dereference "$rootfs" "$out/unpacked-ref" && echo "tree read back from the registry is identical to the source"
else
  echo "(skipped: needs docker-registry, umoci and skopeo — run make test-deps)"
fi
echo "== done: images in $out/image-v1 and $out/image-v2"
