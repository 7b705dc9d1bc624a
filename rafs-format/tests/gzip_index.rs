//! An index of gzip layers (format.md §17) against the converted image of the same
//! layers: the same tree, byte for byte, read from spans of the original layers; a
//! damaged layer gives a bad chunk, never other bytes.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::path::Path;

mod common;

use common::{content, gzip, header};
use rafs_format::builder::{BuildOptions, Builder};
use rafs_format::chunk::Compression;
use rafs_format::image::{check, unpack_to_tar};
use rafs_format::reader::{read_chunk, Bootstrap, LocalBlobs};

/// A lower layer with big files (several checkpoints), small ones, a hardlink and an
/// xattr; an upper one with a whiteout, an opaque directory and a replaced file.
fn layers() -> Vec<Vec<u8>> {
    let mut lower = tar::Builder::new(Vec::new());
    for dir in ["app", "app/lib", "etc", "gone"] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        lower.append_data(&mut h, dir, std::io::empty()).unwrap();
    }
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            let size = [0, 10, 5000, 300_000, 3 << 20, 7 << 20][i % 6] + i;
            (format!("app/lib/f{i}"), content(size, i as u64))
        })
        .collect();
    for (path, data) in &files {
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        lower.append_data(&mut h, path, &data[..]).unwrap();
    }
    let mut h = header(tar::EntryType::Link, 0o644, 0);
    lower
        .append_link(&mut h, "app/hardlink", "app/lib/f4")
        .unwrap();
    lower
        .append_pax_extensions([("SCHILY.xattr.user.kind", &b"config"[..])])
        .unwrap();
    let conf = b"key = value\n".repeat(100);
    let mut h = header(tar::EntryType::Regular, 0o600, conf.len() as u64);
    lower
        .append_data(&mut h, "etc/app.conf", &conf[..])
        .unwrap();
    let mut h = header(tar::EntryType::Regular, 0o644, 5);
    lower
        .append_data(&mut h, "gone/file", &b"gone!"[..])
        .unwrap();

    let mut upper = tar::Builder::new(Vec::new());
    let mut h = header(tar::EntryType::Regular, 0o644, 0);
    upper
        .append_data(&mut h, "app/lib/.wh.f1", std::io::empty())
        .unwrap();
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    upper.append_data(&mut h, "gone", std::io::empty()).unwrap();
    let mut h = header(tar::EntryType::Regular, 0o644, 0);
    upper
        .append_data(&mut h, "gone/.wh..wh..opq", std::io::empty())
        .unwrap();
    let replaced = content(4 << 20, 99);
    let mut h = header(tar::EntryType::Regular, 0o755, replaced.len() as u64);
    upper
        .append_data(&mut h, "app/lib/f3", &replaced[..])
        .unwrap();

    vec![
        gzip(&lower.into_inner().unwrap()),
        gzip(&upper.into_inner().unwrap()),
    ]
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// Builds the index of `layers` into `out`, with the layers as its blobs beside it
/// (where a registry would serve them).
fn build_index(layers: &[Vec<u8>], out: &Path) {
    let mut builder = Builder::new(out, BuildOptions::default()).unwrap();
    for l in layers {
        let (digest, size) = builder.index_gzip_layer(&l[..]).unwrap();
        assert_eq!((hex::encode(digest), size), (sha256_hex(l), l.len() as u64));
    }
    builder.finish().unwrap();
    for l in layers {
        std::fs::write(out.join("blobs").join(sha256_hex(l)), l).unwrap();
    }
}

#[test]
fn an_index_reads_the_same_tree_as_the_converted_image() {
    let layers = layers();
    let t = tempfile::tempdir().unwrap();
    let (converted, index) = (t.path().join("converted"), t.path().join("index"));
    let mut builder = Builder::new(&converted, BuildOptions::default()).unwrap();
    for l in &layers {
        builder.add_layer(&l[..]).unwrap();
    }
    builder.finish().unwrap();
    build_index(&layers, &index);

    let b = Bootstrap::open(&index.join("bootstrap")).unwrap();
    b.validate_all().unwrap();
    assert!(
        b.checkpoint_count() >= 4,
        "{} checkpoints",
        b.checkpoint_count()
    );
    let spans = (0..b.chunk_count())
        .map(|c| b.chunk(c).unwrap())
        .filter(|c| c.compression == Compression::GzipSpan)
        .count();
    assert!(spans > 20, "{spans} span chunks");
    // The index's own blob holds only the windows: small beside the layers.
    let blobs = b.blobs().unwrap();
    let layer_bytes: u64 = layers.iter().map(|l| l.len() as u64).sum();
    let own: u64 = blobs.iter().map(|x| x.size).sum::<u64>() - layer_bytes;
    assert!(
        own * 20 < layer_bytes,
        "windows take {own} bytes for {layer_bytes} of layers"
    );
    assert_eq!(blobs.len(), layers.len() + 1);

    check(&index).unwrap();
    let (mut a, mut i) = (Vec::new(), Vec::new());
    unpack_to_tar(&converted, &mut a).unwrap();
    unpack_to_tar(&index, &mut i).unwrap();
    assert!(
        a == i,
        "the index unpacks to another tree than the converted image"
    );
}

/// Beside the bootstrap, an index of several layers holds the tree of each prefix of
/// them (format.md §17.5): the first layer's own tree, with the files the upper layer
/// deletes or replaces as the lower layer has them.
#[test]
fn an_index_holds_the_tree_of_each_prefix_of_its_layers() {
    let layers = layers();
    let t = tempfile::tempdir().unwrap();
    let (lower, index) = (t.path().join("lower"), t.path().join("index"));
    let mut builder = Builder::new(&lower, BuildOptions::default()).unwrap();
    builder.add_layer(&layers[0][..]).unwrap();
    builder.finish().unwrap();
    build_index(&layers, &index);
    let full = Bootstrap::open(&index.join("bootstrap")).unwrap();

    let prefix = t.path().join("prefix");
    std::fs::create_dir(&prefix).unwrap();
    std::fs::copy(index.join("bootstrap.layers-1"), prefix.join("bootstrap")).unwrap();
    std::os::unix::fs::symlink(index.join("blobs"), prefix.join("blobs")).unwrap();
    let b = Bootstrap::open(&prefix.join("bootstrap")).unwrap();
    b.validate_all().unwrap();
    // The same chunk, blob and checkpoint tables as the whole index.
    assert_eq!(b.chunk_count(), full.chunk_count());
    assert_eq!(b.blobs().unwrap(), full.blobs().unwrap());
    assert_eq!(b.checkpoint_count(), full.checkpoint_count());
    assert!(
        b.resolve(b"gone").unwrap().is_some(),
        "the lower layer's directory"
    );
    check(&prefix).unwrap();
    let (mut a, mut p) = (Vec::new(), Vec::new());
    unpack_to_tar(&lower, &mut a).unwrap();
    unpack_to_tar(&prefix, &mut p).unwrap();
    assert!(a == p, "the first layer's prefix is not its own tree");
    // The whole index's tree is the bootstrap itself: no prefix file of all layers.
    assert!(!index
        .join(format!("bootstrap.layers-{}", layers.len()))
        .exists());
}

#[test]
fn a_damaged_layer_gives_bad_chunks_not_other_bytes() {
    let layers = layers();
    let t = tempfile::tempdir().unwrap();
    let index = t.path().join("index");
    build_index(&layers, &index);
    let b = Bootstrap::open(&index.join("bootstrap")).unwrap();
    // Flip a byte in the middle of the lower layer as stored.
    let path = index.join("blobs").join(sha256_hex(&layers[0]));
    let mut damaged = layers[0].clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x20;
    std::fs::write(&path, damaged).unwrap();

    let lower = b
        .blobs()
        .unwrap()
        .iter()
        .find(|x| x.hex() == sha256_hex(&layers[0]))
        .unwrap()
        .index;
    let blobs = LocalBlobs::new(&index);
    let (mut good, mut bad) = (0, 0);
    for c in 0..b.chunk_count() {
        let chunk = b.chunk(c).unwrap();
        if chunk.compression != Compression::GzipSpan || chunk.blob_index != lower {
            continue;
        }
        let covers = chunk.compressed_offset <= middle as u64
            && (middle as u64) < chunk.compressed_offset + u64::from(chunk.compressed_size);
        // A span may run past the bytes its chunk needs, so one that covers the damage
        // can still read well; what it returns has passed the digest either way.
        match read_chunk(&blobs, &b, &chunk) {
            Ok(_) => good += 1,
            Err(e) => {
                assert!(covers, "chunk {c} failed away from the damage: {e}");
                assert!(e.to_string().contains(&format!("chunk {c}")), "{e}");
                bad += 1;
            }
        }
    }
    assert!(good > 0 && bad > 0, "{good} good, {bad} bad");
    assert!(check(&index).is_err());
}
