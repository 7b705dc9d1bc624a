//! Byte-identical output across builder changes: fixed inputs built with each kind of
//! option give the bootstrap and blob digests recorded here. A change to how the
//! builder reads, hashes, compresses or writes must not change what it writes; a change
//! to the format itself updates these digests on purpose, in the same commit.
//!
//! The digests were recorded with the builder of 2026-11-27 (before the pipelined chunk
//! store), so a build today is byte-identical to a build then.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod common;

use common::{content, gzip, header};
use rafs_format::builder::{BuildOptions, BuildSummary, Builder, ChunkDict};
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};

/// The files of the test tree: (path, size, seed). Some repeat others' bytes (seed
/// reuse: whole-file and chunk dedup), one is all zeros past its first MiB (holes), and
/// names are spread so a depth-first walk and a listing order differ.
const FILES: &[(&str, usize, u64)] = &[
    ("zeta/big", 5 << 20, 1),
    ("zeta/copy-of-big", 5 << 20, 1),
    ("alpha/small", 700, 2),
    ("alpha/inner/mid", 1_500_000, 3),
    ("alpha/inner/tiny", 3, 4),
    ("beta", 2 << 20, 5),
    ("mid/z", 64 << 10, 6),
    ("mid/a/deep/file", 3 << 20, 7),
    ("empty", 0, 8),
];

fn file_bytes(size: usize, seed: u64) -> Vec<u8> {
    let mut data = content(size, seed);
    if seed == 5 {
        // All zeros after the first MiB: a hole.
        data[1 << 20..].fill(0);
    }
    data
}

/// The tree as two tar layers: the lower holds everything, the upper replaces one file
/// and deletes another, so the lower's chunks of both are dead in the final tree.
fn layers() -> Vec<Vec<u8>> {
    let mut lower = tar::Builder::new(Vec::new());
    for dir in ["zeta", "alpha", "alpha/inner", "mid", "mid/a", "mid/a/deep"] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        lower.append_data(&mut h, dir, std::io::empty()).unwrap();
    }
    for &(path, size, seed) in FILES {
        let data = file_bytes(size, seed);
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        lower.append_data(&mut h, path, &data[..]).unwrap();
    }
    let mut h = header(tar::EntryType::Link, 0o644, 0);
    lower.append_link(&mut h, "alpha/link", "beta").unwrap();
    let mut upper = tar::Builder::new(Vec::new());
    let replaced = content(1 << 20, 50);
    let mut h = header(tar::EntryType::Regular, 0o755, replaced.len() as u64);
    upper
        .append_data(&mut h, "mid/a/deep/file", &replaced[..])
        .unwrap();
    let mut h = header(tar::EntryType::Regular, 0o644, 0);
    upper
        .append_data(&mut h, "alpha/.wh.small", std::io::empty())
        .unwrap();
    vec![lower.into_inner().unwrap(), upper.into_inner().unwrap()]
}

/// The tree on disk, every file's mode and mtime fixed (uid and gid are the test's own,
/// which the recorded digests assume is root's).
fn write_dir(root: &Path) {
    for &(path, size, seed) in FILES {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, file_bytes(size, seed)).unwrap();
    }
    std::fs::hard_link(root.join("beta"), root.join("alpha/link")).unwrap();
    let mut paths = vec![root.to_path_buf()];
    let mut i = 0;
    while i < paths.len() {
        let p = paths[i].clone();
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                paths.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    // Children before parents, so setting a file's times does not touch its directory's.
    for p in paths.iter().rev() {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        let t = rustix::fs::Timespec {
            tv_sec: 1_700_000_000,
            tv_nsec: 0,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            p,
            &rustix::fs::Timestamps {
                last_access: t,
                last_modification: t,
            },
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
}

/// The bootstrap's digest and every blob's, as the summary reports them.
fn digests(s: &BuildSummary) -> Vec<String> {
    let mut out = vec![s.bootstrap_digest.clone()];
    out.extend(s.blobs.iter().map(|b| format!("{}:{}", b.digest, b.size)));
    out
}

/// A build's digests, checking whether its blob was copied out of the spool: a build
/// whose input arrives in blob order (one directory, one layer in tree order) keeps
/// the spool as the blob, written once.
fn checked(name: &str, s: &BuildSummary, rewritten: bool) -> Vec<String> {
    assert_eq!(
        s.blob_rewritten, rewritten,
        "{name}: blob rewritten {} (expected {rewritten})",
        s.blob_rewritten
    );
    digests(s)
}

fn build_layers(out: &Path, opts: BuildOptions) -> BuildSummary {
    let mut b = Builder::new(out, opts).unwrap();
    for l in layers() {
        b.add_layer(&l[..]).unwrap();
    }
    b.finish().unwrap()
}

fn show(name: &str, got: &[String]) -> String {
    format!("{name}: {got:#?}")
}

#[test]
fn layer_builds_are_byte_identical_to_the_recorded_ones() {
    let t = tempfile::tempdir().unwrap();
    let cdc = BuildOptions {
        chunking: Chunking::Cdc {
            min: 64 << 10,
            avg: 256 << 10,
            max: 1 << 20,
        },
        ..BuildOptions::default()
    };
    let gzip_blake3 = BuildOptions {
        compression: Compression::Gzip,
        compression_level: 6,
        digest: DigestAlgo::Blake3,
        ..BuildOptions::default()
    };
    let prefetch = BuildOptions {
        prefetch: vec!["/mid".into(), "zeta/copy-of-big".into(), "/nowhere".into()],
        ..BuildOptions::default()
    };
    let cases: Vec<(&str, BuildOptions)> = vec![
        ("default", BuildOptions::default()),
        ("cdc", cdc),
        ("gzip-blake3", gzip_blake3),
        ("prefetch", prefetch),
    ];
    let mut all = Vec::new();
    for (name, opts) in cases {
        // Two layers, the upper replacing a file: the spool holds dead chunks.
        let s = build_layers(&t.path().join(name), opts);
        all.push(show(name, &checked(name, &s, true)));
    }
    // A second build against the first as its chunk dictionary: a new layer only.
    let mut opts = BuildOptions {
        chunk_dict: Some(ChunkDict {
            image_dir: t.path().join("default"),
            link_blobs: true,
        }),
        ..BuildOptions::default()
    };
    opts.prefetch = vec!["/beta".into()];
    let mut b = Builder::new(&t.path().join("dict"), opts).unwrap();
    for l in layers() {
        b.add_layer(&l[..]).unwrap();
    }
    let extra = {
        let mut x = tar::Builder::new(Vec::new());
        let data = content(3 << 20, 77);
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        x.append_data(&mut h, "alpha/new", &data[..]).unwrap();
        x.into_inner().unwrap()
    };
    b.add_layer(&gzip(&extra)[..]).unwrap();
    all.push(show("dict", &digests(&b.finish().unwrap())));
    // An index of the gzip layers (format.md §17): spans and checkpoint windows.
    let mut b = Builder::new(&t.path().join("index"), BuildOptions::default()).unwrap();
    for l in layers() {
        b.index_gzip_layer(&gzip(&l)[..]).unwrap();
    }
    all.push(show("index", &digests(&b.finish().unwrap())));
    let got = all.join("\n");
    assert_eq!(got, RECORDED_LAYERS, "\ngot:\n{got}");
}

#[test]
fn a_directory_build_is_byte_identical_to_the_recorded_one() {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("tree");
    write_dir(&tree);
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(tree.join("beta")).unwrap()),
        0,
        "this test records root-owned files: run it as root (make test does)"
    );
    let mut cases = Vec::new();
    for (name, prefetch) in [
        ("dir", vec![]),
        ("dir-prefetch", vec!["/mid/a".to_string()]),
    ] {
        let opts = BuildOptions {
            prefetch,
            ..BuildOptions::default()
        };
        let mut b = Builder::new(&t.path().join(name), opts).unwrap();
        b.add_dir(&tree).unwrap();
        cases.push(show(name, &checked(name, &b.finish().unwrap(), false)));
    }
    let got = cases.join("\n");
    assert_eq!(got, RECORDED_DIR, "\ngot:\n{got}");
}

const RECORDED_LAYERS: &str = r#"default: [
    "sha256:4f85831d841b6fdeead824f432d2f816798dba59fae5e80b187705a6a3e886a9",
    "sha256:b0660ffc3bec19671c57dedc3afd25fe42054c4c63ec8ff6feec9ce22d23e58d:5057738",
]
cdc: [
    "sha256:39d20172630e0522c3264bffafbe650a4488532f42bf3b7d455488f4c20a3c84",
    "sha256:e5933e5c9ad2af1d3c0a81b15bf3ba1a972524cd8493148f9c6325e2966d2ac7:5063271",
]
gzip-blake3: [
    "sha256:cbfb462d207d2dd06dc0566443b38c5e25412b9ef615e74a58f984ce6de06a7f",
    "sha256:b1d7308aa47b143f7f4f52dfdb42b8c88943752abf33ff80a168a3398db02e65:5096396",
]
prefetch: [
    "sha256:523e84215d0e3ad0bb1b643cea4cf52af56a534ebc5cd2b10f57e15c2682ce8a",
    "sha256:a5aaad9328103ee7e7e3abb65bc57e8ff1c63fb98e0a8c62fc1d217797a4990d:5057738",
]
dict: [
    "sha256:bd21422e00bb2c10b6eca659876f34d29ffc114643e7a18a19db717ed3438a70",
    "sha256:62be0709bfe3e90c36974c7597ed1f3f619ab599b13df157dff17ba0e5ec2f0a:2116116",
    "sha256:b0660ffc3bec19671c57dedc3afd25fe42054c4c63ec8ff6feec9ce22d23e58d:5057738",
]
index: [
    "sha256:c7c2337bfbfdab348523b09aacaf33c839dee96b7a950bcd29438ee80c68fc45",
    "sha256:334f590c98cb9369de2f71d41b94442d0c5450ed4466d52eec555775e2ae6f4f:815",
    "sha256:d74caf44ed347f3f7bbf5a8c35098d969276aa38e47c303828a45103aa146566:9786327",
    "sha256:edc376109dae4a3b405f8bd82200a85de93c837e41c2e16b26670d92d12e1063:457557",
]"#;
const RECORDED_DIR: &str = r#"dir: [
    "sha256:a7590730fccaefe2042739b2ad1fc5c686c070ba3ebcf9f22d84a84a0aba666a",
    "sha256:246ba7fb9c10f4631bc38d5c513df70851978d4111195bb89fde717d60bbf18b:6537323",
]
dir-prefetch: [
    "sha256:c3a9b1efa46228b3ed5146a6a0dfdf4928f032fe7abd4ea7242e06a7f3d224fe",
    "sha256:ea571e53aaf4bcd37eea8804bc91eec2af9b7f977908ac051de3a5fb89beac36:6537323",
]"#;

/// One layer of the lower tree, its entries in the given order of `FILES` (directories
/// first, then the files, then a hardlink named after its target in tree order).
fn one_layer(file_order: &[usize]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["alpha", "alpha/inner", "mid", "mid/a", "mid/a/deep", "zeta"] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, dir, std::io::empty()).unwrap();
    }
    for &i in file_order {
        let (path, size, seed) = FILES[i];
        let data = file_bytes(size, seed);
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        b.append_data(&mut h, path, &data[..]).unwrap();
    }
    let mut h = header(tar::EntryType::Link, 0o644, 0);
    b.append_link(&mut h, "zeta/link", "beta").unwrap();
    b.into_inner().unwrap()
}

#[test]
fn a_layer_in_tree_order_keeps_its_spool_and_any_order_gives_the_same_bytes() {
    let t = tempfile::tempdir().unwrap();
    // Depth-first, names in byte order: the blob's order.
    let mut tree_order: Vec<usize> = (0..FILES.len()).collect();
    tree_order.sort_by_key(|&i| FILES[i].0.split('/').collect::<Vec<_>>());
    let shuffled: Vec<usize> = (0..FILES.len()).rev().collect();
    let mut built = Vec::new();
    for (name, order, rewritten) in [
        ("sorted", &tree_order, false),
        ("shuffled", &shuffled, true),
    ] {
        let mut b = Builder::new(&t.path().join(name), BuildOptions::default()).unwrap();
        b.add_layer(&gzip(&one_layer(order))[..]).unwrap();
        built.push(checked(name, &b.finish().unwrap(), rewritten));
    }
    assert_eq!(
        built[0], built[1],
        "the order of a layer's entries changed the image"
    );
}
