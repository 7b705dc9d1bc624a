//! Property test: any tree, built with any options, reads back equal to what went in.
//!
//! Trees are generated as models, written as a PAX tar layer with the `tar` crate, built
//! with the builder and read back through the reader alone (bootstrap + local blobs).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rafs_format::builder::{BuildOptions, Builder};
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use rafs_format::reader::{Bootstrap, FileKind, LocalBlobs};

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    Fifo,
    Char(u32, u32),
}

#[derive(Debug, Clone)]
struct Entry {
    kind: Kind,
    perm: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), 0..3000),
        // Repetitive data that compresses and dedups.
        (any::<u8>(), 1usize..40_000).prop_map(|(b, n)| vec![b; n]),
        (proptest::collection::vec(any::<u8>(), 1..64), 1usize..300)
            .prop_map(|(unit, n)| unit.repeat(n)),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    let kind = prop_oneof![
        3 => content().prop_map(Kind::File),
        1 => Just(Kind::Dir),
        1 => "[a-z/.]{1,40}".prop_map(Kind::Symlink),
        1 => Just(Kind::Fifo),
        1 => (0u32..4000, 0u32..4000).prop_map(|(a, b)| Kind::Char(a, b)),
    ];
    (
        kind,
        0u32..0o7777,
        any::<u32>(),
        any::<u32>(),
        (0i64..4_000_000_000, 0u32..1_000_000_000),
        proptest::collection::btree_map(
            "user\\.[a-z]{1,8}",
            proptest::collection::vec(any::<u8>(), 0..20),
            0..3,
        ),
    )
        .prop_map(|(kind, perm, uid, gid, mtime, xattrs)| Entry {
            kind,
            perm,
            uid,
            gid,
            mtime,
            xattrs,
        })
}

/// A tree: unique paths of up to three components from a small alphabet (so that
/// directories get several entries), every parent a directory.
fn tree() -> impl Strategy<Value = BTreeMap<String, Entry>> {
    proptest::collection::btree_map("[a-dé]{1,3}(/[a-d]{1,2}){0,2}", entry(), 1..25).prop_map(
        |mut m| {
            let paths: Vec<String> = m.keys().cloned().collect();
            for p in paths {
                let mut parent = p.as_str();
                while let Some((head, _)) = parent.rsplit_once('/') {
                    let e = m.entry(head.to_string()).or_insert_with(|| Entry {
                        kind: Kind::Dir,
                        perm: 0o755,
                        uid: 0,
                        gid: 0,
                        mtime: (0, 0),
                        xattrs: BTreeMap::new(),
                    });
                    e.kind = Kind::Dir;
                    parent = head;
                }
            }
            m
        },
    )
}

fn options() -> impl Strategy<Value = BuildOptions> {
    let chunking = prop_oneof![
        Just(Chunking::Fixed { size: 4096 }),
        Just(Chunking::Fixed { size: 1 << 20 }),
        Just(Chunking::Cdc {
            min: 1024,
            avg: 4096,
            max: 16384
        }),
    ];
    let compression = prop_oneof![
        Just((Compression::Zstd, 3)),
        Just((Compression::Gzip, 6)),
        Just((Compression::None, 0)),
    ];
    let digest = prop_oneof![Just(DigestAlgo::Sha256), Just(DigestAlgo::Blake3)];
    (chunking, compression, digest).prop_map(|(chunking, (compression, level), digest)| {
        BuildOptions {
            chunking,
            compression,
            compression_level: level,
            digest,
            ..BuildOptions::default()
        }
    })
}

fn to_tar(tree: &BTreeMap<String, Entry>) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, e) in tree {
        let mut pax = vec![(
            "mtime".to_string(),
            format!("{}.{:09}", e.mtime.0, e.mtime.1).into_bytes(),
        )];
        pax.push(("uid".into(), e.uid.to_string().into_bytes()));
        pax.push(("gid".into(), e.gid.to_string().into_bytes()));
        if let Kind::Symlink(t) = &e.kind {
            // Exact bytes: the tar crate's link-name setter would normalise `./.`.
            pax.push(("linkpath".into(), t.clone().into_bytes()));
        }
        for (k, v) in &e.xattrs {
            pax.push((format!("SCHILY.xattr.{k}"), v.clone()));
        }
        b.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_mode(e.perm);
        h.set_mtime(e.mtime.0 as u64);
        h.set_size(0);
        match &e.kind {
            Kind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Kind::File(data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice()).unwrap();
            }
            Kind::Symlink(t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_link_name_literal(t).unwrap();
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Kind::Fifo => {
                h.set_entry_type(tar::EntryType::Fifo);
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Kind::Char(ma, mi) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_device_major(*ma).unwrap();
                h.set_device_minor(*mi).unwrap();
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn read_file(b: &Bootstrap, blobs: &LocalBlobs, ino: u32) -> Vec<u8> {
    let inode = b.inode(ino).unwrap();
    let mut out = Vec::new();
    for piece in b.file_chunks(&inode).unwrap() {
        match piece.chunk {
            None => out.resize(out.len() + piece.len as usize, 0),
            Some(c) => out.extend(blobs.read_chunk(b, &b.chunk(c).unwrap()).unwrap()),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn build_then_read_back_equals_input(tree in tree(), opts in options()) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("img");
        let mut builder = Builder::new(&out, opts.clone()).unwrap();
        builder.add_layer(to_tar(&tree).as_slice()).unwrap();
        let summary = builder.finish().unwrap();

        let b = Bootstrap::open(&out.join("bootstrap")).unwrap();
        b.validate_all().unwrap();
        prop_assert_eq!(b.digest_algo(), opts.digest);
        let blobs = LocalBlobs::new(&out);
        // Every path in the model is in the image with its metadata and content...
        for (path, e) in &tree {
            let inode = b.resolve(path.as_bytes()).unwrap().unwrap();
            prop_assert_eq!(inode.perm, e.perm, "{}", path);
            prop_assert_eq!((inode.uid, inode.gid), (e.uid, e.gid), "{}", path);
            prop_assert_eq!((inode.mtime_sec, inode.mtime_nsec), e.mtime, "{}", path);
            let xattrs: BTreeMap<String, Vec<u8>> = b.xattrs(&inode).unwrap().into_iter()
                .map(|(k, v)| (String::from_utf8(k.to_vec()).unwrap(), v.to_vec())).collect();
            prop_assert_eq!(&xattrs, &e.xattrs, "{}", path);
            match &e.kind {
                Kind::Dir => prop_assert_eq!(inode.kind, FileKind::Directory),
                Kind::File(data) => {
                    prop_assert_eq!(inode.kind, FileKind::Regular);
                    prop_assert_eq!(inode.size, data.len() as u64);
                    prop_assert!(read_file(&b, &blobs, inode.ino) == *data, "content of {}", path);
                }
                Kind::Symlink(t) => prop_assert_eq!(b.symlink_target(&inode).unwrap(), t.as_bytes()),
                Kind::Fifo => prop_assert_eq!(inode.kind, FileKind::Fifo),
                Kind::Char(ma, mi) => {
                    prop_assert_eq!(inode.kind, FileKind::CharDevice);
                    prop_assert_eq!((inode.rdev_major, inode.rdev_minor), (*ma, *mi));
                }
            }
        }
        // ...and nothing else is (the root is not an entry).
        prop_assert_eq!(u64::from(b.inode_count()), tree.len() as u64 + 1);
        // Identical chunks are stored once.
        let digests: std::collections::HashSet<[u8; 32]> =
            (0..b.chunk_count()).map(|c| b.chunk(c).unwrap().digest).collect();
        prop_assert_eq!(digests.len() as u32, b.chunk_count());
        prop_assert_eq!(summary.unique_chunks, u64::from(b.chunk_count()));
    }
}
