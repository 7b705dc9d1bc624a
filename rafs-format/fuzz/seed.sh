#!/usr/bin/env bash
# Generates the seed corpora of the fuzz targets:
#   corpus/bootstrap/  bootstraps of a few small images built by `tessera build`
#   corpus/layer/      small layer tarballs: GNU tar (hardlink, symlink, long name,
#                      whiteout, opaque marker), PAX with xattrs, gzip, zstd, and
#                      tars concatenated (applied as two or three layers)
# corpus/layer_roundtrip/ gets the layer seeds too. Run from anywhere; needs GNU tar,
# gzip, zstd and setfattr. The corpora are not checked in (see .gitignore); a few small
# seeds are, under seeds/, for tests/fuzz_regressions.rs.
set -euo pipefail

fuzz_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$fuzz_dir/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --quiet --manifest-path "$repo/Cargo.toml" -p tessera-agent
tessera=$repo/target/debug/tessera
mkdir -p "$fuzz_dir/corpus/bootstrap" "$fuzz_dir/corpus/layer" "$fuzz_dir/corpus/layer_roundtrip"

# A tree with every kind of inode the format stores.
tree=$work/tree
mkdir -p "$tree/etc/conf.d" "$tree/bin" "$tree/usr/lib/deep/er/still" "$tree/empty"
echo 'root:x:0:0:root:/root:/bin/sh' > "$tree/etc/passwd"
printf 'a=1\nb=2\n' > "$tree/etc/conf.d/app.conf"
head -c 20000 /dev/urandom > "$tree/bin/tool"
ln "$tree/bin/tool" "$tree/bin/tool-hardlink"
ln -s tool "$tree/bin/sh"
ln -s ../../etc/passwd "$tree/usr/lib/passwd-link"
: > "$tree/usr/lib/empty-file"
printf 'repetitive line of text\n%.0s' {1..500} > "$tree/usr/lib/deep/er/still/text"
truncate -s 16384 "$tree/usr/lib/sparse" # all zeros: stored as holes
printf 'tail' >> "$tree/usr/lib/sparse"
mkfifo "$tree/usr/lib/fifo"
touch "$tree/usr/lib/$(printf 'n%.0s' {1..200})"
setfattr -n user.mime -v text/plain "$tree/etc/passwd"
setfattr -n user.a -v 1 "$tree/etc/passwd"
printf '/etc/passwd\n/bin\n/missing\n' > "$work/prefetch"

build() { # name, then build flags
    local name=$1
    shift
    "$tessera" build --out "$work/img-$name" "$@" > /dev/null
    cp "$work/img-$name/bootstrap" "$fuzz_dir/corpus/bootstrap/$name"
}
build default --dir "$tree" --chunk-size 4K
build cdc-blake3-gzip --dir "$tree" --chunking cdc --chunk-size 4K --digest blake3 --compression gzip
build prefetch-none --dir "$tree" --chunk-size 4K --compression none --prefetch-list "$work/prefetch"
build dict --dir "$tree" --chunk-size 4K --chunk-dict "$work/img-default"
mkdir "$work/only-root"
build only-root --dir "$work/only-root"

# Layer tarballs, all with fixed mtimes and owners so they are reproducible.
gnu() { tar --format=gnu --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner "$@"; }
layers=$fuzz_dir/corpus/layer
l=$work/layer
mkdir -p "$l/dir/sub" "$l/opaque"
echo hello > "$l/dir/file"
ln "$l/dir/file" "$l/dir/hardlink"
ln -s file "$l/dir/symlink"
long=$(printf 'long-name-%.0s' {1..12})
echo long > "$l/dir/sub/$long"
: > "$l/dir/.wh.deleted"
: > "$l/opaque/.wh..wh..opq"
echo after-opaque > "$l/opaque/kept"
gnu -C "$l" -cf "$layers/gnu.tar" .
gnu -C "$l" -cf "$layers/gnu-noprefix.tar" dir opaque
setfattr -n user.checksum -v abc "$l/dir/file"
setfattr -n user.empty "$l/dir/sub"
tar --format=pax --xattrs --xattrs-include='*' --sort=name --mtime=@1700000000.123456789 \
    --owner=0 --group=0 --numeric-owner -C "$l" -cf "$layers/pax-xattrs.tar" .
gzip -9n < "$layers/gnu.tar" > "$layers/gnu.tar.gz"
zstd -q -19 < "$layers/pax-xattrs.tar" > "$layers/pax-xattrs.tar.zst"
# A second layer's worth of changes on its own: whiteouts of paths it does not have.
mkdir -p "$work/l2/dir"
: > "$work/l2/dir/.wh.file"
: > "$work/l2/.wh..wh..opq"
gnu -C "$work/l2" -cf "$layers/whiteouts-only.tar" .
# Tars concatenated after the end-of-archive blocks are applied as further layers by the
# fuzz targets: a lower layer, then whiteouts and an opaque marker meeting it.
mkdir -p "$work/l3/opaque/new"
: > "$work/l3/opaque/.wh..wh..opq"
echo upper > "$work/l3/opaque/new/file"
mkdir -p "$work/l3/dir"
: > "$work/l3/dir/.wh.symlink"
gnu -C "$work/l3" -cf "$work/upper.tar" .
cat "$layers/gnu.tar" "$work/upper.tar" > "$layers/two-layers.tar"
cat "$layers/two-layers.tar" "$layers/whiteouts-only.tar" > "$layers/three-layers.tar"
cp "$layers"/* "$fuzz_dir/corpus/layer_roundtrip/"

ls -l "$fuzz_dir/corpus/bootstrap" "$layers"
