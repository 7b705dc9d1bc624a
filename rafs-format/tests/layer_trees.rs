//! Each indexed layer's own tree (format.md §17.7): `bootstrap.layer-<k>` holds what
//! layer k changes, in overlayfs's convention (whiteouts as character devices 0/0,
//! opaque directories marked by `trusted.overlay.opaque`), so that stacking the layers'
//! own trees as overlay lower dirs gives the merged tree, entry for entry.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::collections::BTreeMap;
use std::path::Path;

mod common;

use common::{content, gzip, header};
use rafs_format::builder::{BuildOptions, BuildSummary, Builder};
use rafs_format::image::for_each_entry;
use rafs_format::reader::{Bootstrap, FileKind, Inode, LocalBlobs};

const OPAQUE: &[u8] = b"trusted.overlay.opaque";

fn dir(t: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, owner: Option<(u64, u64)>) {
    let mut h = header(tar::EntryType::Directory, mode, 0);
    if let Some((uid, gid)) = owner {
        h.set_uid(uid);
        h.set_gid(gid);
    }
    t.append_data(&mut h, path, std::io::empty()).unwrap();
}

fn file(t: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
    t.append_data(&mut h, path, data).unwrap();
}

fn link(t: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
    let mut h = header(kind, 0o777, 0);
    t.append_link(&mut h, path, target).unwrap();
}

/// A whiteout or opaque marker, with a mode of its own so its metadata can be told apart.
fn marker(t: &mut tar::Builder<Vec<u8>>, path: &str) {
    let mut h = header(tar::EntryType::Regular, 0o600, 0);
    h.set_mtime(1_600_000_000);
    t.append_data(&mut h, path, std::io::empty()).unwrap();
}

/// Three layers. The lower has directories with their own metadata, files big enough
/// for several checkpoints, a symlink, an xattr and a hardlink. The middle one replaces
/// a file, whites one out, makes `data` opaque (marker before `data/` is listed again;
/// a whiteout beneath it),
/// adds a file under implicit parents `etc/conf.d` the lower layer owns as uid 7,
/// hard-links to a lower file, and whites out `app/link` before adding it again. The
/// upper whites out the directory `app` and adds `app/fresh` (the directory is made
/// again), deletes a file of the middle layer and adds devices and a fifo.
fn layers() -> Vec<Vec<u8>> {
    let mut l0 = tar::Builder::new(Vec::new());
    dir(&mut l0, "./", 0o755, Some((0, 0)));
    dir(&mut l0, "app", 0o755, None);
    dir(&mut l0, "etc", 0o750, Some((7, 8)));
    dir(&mut l0, "etc/conf.d", 0o710, Some((7, 9)));
    dir(&mut l0, "data", 0o755, None);
    dir(&mut l0, "data/sub", 0o755, None);
    file(&mut l0, "app/bin", 0o755, &content(3 << 20, 1));
    file(&mut l0, "app/old", 0o644, &content(500_000, 2));
    file(&mut l0, "etc/conf.d/a.conf", 0o640, b"a = 1\n");
    file(&mut l0, "data/x", 0o644, &content(70_000, 3));
    file(&mut l0, "data/sub/y", 0o644, b"y");
    file(&mut l0, "gone", 0o644, &content(1 << 20, 4));
    link(&mut l0, tar::EntryType::Symlink, "app/link", "bin");
    l0.append_pax_extensions([("SCHILY.xattr.user.kind", &b"lib"[..])])
        .unwrap();
    file(&mut l0, "app/lib.so", 0o644, &content(200_000, 5));
    link(&mut l0, tar::EntryType::Link, "app/bin-same", "app/bin");

    let mut l1 = tar::Builder::new(Vec::new());
    file(&mut l1, "app/old", 0o600, &content(800_000, 12));
    marker(&mut l1, ".wh.gone");
    marker(&mut l1, "data/.wh..wh..opq");
    // Hides nothing the opaque directory does not: `data/sub` leads to no entry of the
    // layer, so neither tree has it.
    marker(&mut l1, "data/sub/.wh.y");
    // In a directory that does not exist: nothing.
    marker(&mut l1, "nowhere/.wh.x");
    dir(&mut l1, "data", 0o700, Some((5, 6)));
    file(&mut l1, "data/new", 0o644, &content(2 << 20, 13));
    file(&mut l1, "etc/conf.d/b.conf", 0o600, b"b = 2\n");
    link(&mut l1, tar::EntryType::Link, "app/bin2", "app/bin");
    link(&mut l1, tar::EntryType::Link, "bin3", "app/bin");
    marker(&mut l1, "app/.wh.link");
    link(&mut l1, tar::EntryType::Symlink, "app/link", "bin2");
    marker(&mut l1, ".wh..wh.plnk");

    let mut l2 = tar::Builder::new(Vec::new());
    marker(&mut l2, ".wh.app");
    file(&mut l2, "app/fresh", 0o644, &content(100_000, 21));
    marker(&mut l2, "etc/conf.d/.wh.a.conf");
    link(&mut l2, tar::EntryType::Link, "data/new-link", "data/new");
    let mut h = header(tar::EntryType::Char, 0o600, 0);
    h.set_device_major(1).unwrap();
    h.set_device_minor(3).unwrap();
    l2.append_data(&mut h, "dev-null", std::io::empty())
        .unwrap();
    let mut h = header(tar::EntryType::Fifo, 0o600, 0);
    l2.append_data(&mut h, "pipe", std::io::empty()).unwrap();

    [l0, l1, l2]
        .into_iter()
        .map(|t| gzip(&t.into_inner().unwrap()))
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// Builds the index of `layers` into `out`, with the layers as its blobs beside it.
fn build_index(layers: &[Vec<u8>], out: &Path) -> BuildSummary {
    let mut builder = Builder::new(out, BuildOptions::default()).unwrap();
    for l in layers {
        builder.index_gzip_layer(&l[..]).unwrap();
    }
    let summary = builder.finish().unwrap();
    for l in layers {
        std::fs::write(out.join("blobs").join(sha256_hex(l)), l).unwrap();
    }
    summary
}

/// A file's bytes, read chunk by chunk through the reader (span chunks inflated from
/// the layers in `blobs`).
fn file_data(b: &Bootstrap, blobs: &LocalBlobs, inode: &Inode) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in b.file_chunks(inode).unwrap() {
        match piece.chunk {
            Some(c) => {
                let data = blobs.read_chunk(b, &b.chunk(c).unwrap()).unwrap();
                out.extend_from_slice(&data[..piece.len as usize]);
            }
            None => out.resize(out.len() + piece.len as usize, 0),
        }
    }
    assert_eq!(out.len() as u64, inode.size);
    out
}

/// What an overlay shows of an entry (its link count aside, which a layer's copy of a
/// lower file does not share).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: FileKind,
    perm: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
    size: u64,
    rdev: (u32, u32),
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// sha256 of a file's data or a symlink's target.
    data: String,
}

impl Entry {
    fn is_whiteout(&self) -> bool {
        self.kind == FileKind::CharDevice && self.rdev == (0, 0)
    }

    fn is_opaque(&self) -> bool {
        self.kind == FileKind::Directory && self.xattrs.get(OPAQUE).is_some_and(|v| v == b"y")
    }
}

/// Every entry of a bootstrap by path (`""` the root), parents before children.
fn entries(path: &Path, blobs: &LocalBlobs) -> Vec<(String, Entry)> {
    let b = Bootstrap::open(path).unwrap();
    b.validate_all().unwrap();
    let entry = |inode: &Inode| Entry {
        kind: inode.kind,
        perm: inode.perm,
        uid: inode.uid,
        gid: inode.gid,
        mtime: (inode.mtime_sec, inode.mtime_nsec),
        size: inode.size,
        rdev: (inode.rdev_major, inode.rdev_minor),
        xattrs: b
            .xattrs(inode)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect(),
        data: match inode.kind {
            FileKind::Regular => sha256_hex(&file_data(&b, blobs, inode)),
            FileKind::Symlink => sha256_hex(b.symlink_target(inode).unwrap()),
            _ => String::new(),
        },
    };
    let root = b.resolve(b"").unwrap().unwrap();
    let mut out = vec![(String::new(), entry(&root))];
    for_each_entry(&b, |path, inode, _| {
        out.push((String::from_utf8(path.to_vec()).unwrap(), entry(inode)));
    })
    .unwrap();
    out
}

fn is_under(path: &str, dir: &str) -> bool {
    dir.is_empty() || path.starts_with(&format!("{dir}/"))
}

/// Stacks layers' own trees as overlayfs does, lowest first: a character device 0/0
/// deletes its path, an opaque directory hides what is below it in lower layers, a
/// directory over a directory merges with it (its own attributes shown), anything else
/// replaces the path and what was beneath it.
fn stack(layers: &[Vec<(String, Entry)>]) -> BTreeMap<String, Entry> {
    let mut merged: BTreeMap<String, Entry> = BTreeMap::new();
    for layer in layers {
        for (path, e) in layer {
            let was_dir = merged
                .get(path)
                .is_some_and(|m| m.kind == FileKind::Directory);
            let keep_below = e.kind == FileKind::Directory && was_dir && !e.is_opaque();
            if !keep_below {
                merged.retain(|p, _| !is_under(p, path));
            }
            if e.is_whiteout() {
                merged.remove(path);
                continue;
            }
            let mut shown = e.clone();
            shown.xattrs.remove(OPAQUE);
            merged.insert(path.clone(), shown);
        }
    }
    merged
}

fn paths(entries: &[(String, Entry)]) -> Vec<&str> {
    entries.iter().map(|(p, _)| p.as_str()).collect()
}

fn find<'a>(entries: &'a [(String, Entry)], path: &str) -> &'a Entry {
    &entries
        .iter()
        .find(|(p, _)| p == path)
        .unwrap_or_else(|| panic!("{path} is not in the layer's tree"))
        .1
}

#[test]
fn each_layer_tree_holds_exactly_its_layers_changes() {
    let layers = layers();
    let t = tempfile::tempdir().unwrap();
    let index = t.path().join("index");
    let summary = build_index(&layers, &index);
    let blobs = LocalBlobs::new(&index);
    let full = Bootstrap::open(&index.join("bootstrap")).unwrap();

    assert_eq!(summary.own_layer_bootstraps.len(), 3);
    let mut own = Vec::new();
    for (k, s) in summary.own_layer_bootstraps.iter().enumerate() {
        assert_eq!(s.layer, k as u32);
        assert_eq!(s.path, index.join(format!("bootstrap.layer-{k}")));
        // The layer's tar, decompressed: containers/storage's diff size.
        let mut tar = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&layers[k][..]), &mut tar)
            .unwrap();
        assert_eq!(s.diff_size, tar.len() as u64, "layer {k}'s diff size");
        let bytes = std::fs::read(&s.path).unwrap();
        assert_eq!(
            (s.bytes, &s.digest[7..]),
            (bytes.len() as u64, &*sha256_hex(&bytes))
        );
        let b = Bootstrap::open(&s.path).unwrap();
        // The index's chunk, blob and checkpoint tables, and no prefetch list.
        assert_eq!(b.chunk_count(), full.chunk_count());
        for c in 0..b.chunk_count() {
            assert_eq!(b.chunk(c).unwrap(), full.chunk(c).unwrap());
        }
        assert_eq!(b.blobs().unwrap(), full.blobs().unwrap());
        assert_eq!(b.checkpoint_count(), full.checkpoint_count());
        assert!(b.prefetch().unwrap().is_empty());
        own.push(entries(&s.path, &blobs));
    }

    // The lower layer: everything it has, as it has it.
    assert_eq!(
        paths(&own[0]),
        [
            "",
            "app",
            "app/bin",
            "app/bin-same",
            "app/lib.so",
            "app/link",
            "app/old",
            "data",
            "data/sub",
            "data/sub/y",
            "data/x",
            "etc",
            "etc/conf.d",
            "etc/conf.d/a.conf",
            "gone"
        ]
    );
    assert_eq!(
        find(&own[0], "app/lib.so").xattrs.get(&b"user.kind"[..]),
        Some(&b"lib".to_vec())
    );
    assert_eq!(
        find(&own[0], "app/bin").data,
        sha256_hex(&content(3 << 20, 1))
    );

    // The middle layer.
    assert_eq!(
        paths(&own[1]),
        [
            "",
            "app",
            "app/bin2",
            "app/link",
            "app/old",
            "bin3",
            "data",
            "data/new",
            "etc",
            "etc/conf.d",
            "etc/conf.d/b.conf",
            "gone"
        ]
    );
    let gone = find(&own[1], "gone");
    assert!(gone.is_whiteout(), "{gone:?}");
    assert_eq!(
        (gone.perm, gone.uid, gone.gid, gone.mtime.0),
        (0o600, 1000, 100, 1_600_000_000),
        "the whiteout's own metadata"
    );
    let link = find(&own[1], "app/link");
    assert_eq!(
        link.kind,
        FileKind::Symlink,
        "the real entry wins over its whiteout"
    );
    assert_eq!(link.data, sha256_hex(b"bin2"));
    let data = find(&own[1], "data");
    assert!(data.is_opaque(), "{data:?}");
    assert_eq!(
        (data.perm, data.uid, data.gid),
        (0o700, 5, 6),
        "the later data/ entry"
    );
    let etc = find(&own[1], "etc");
    assert_eq!((etc.perm, etc.uid, etc.gid), (0o750, 7, 8), "the lower etc");
    let conf_d = find(&own[1], "etc/conf.d");
    assert_eq!((conf_d.perm, conf_d.uid, conf_d.gid), (0o710, 7, 9));
    assert!(!etc.is_opaque() && !conf_d.is_opaque());
    let app = find(&own[1], "app");
    assert_eq!((app.perm, app.uid), (0o755, 1000), "the lower app");
    // Hard links to a lower file: one copy of it, with its data and metadata.
    let bin = find(&own[0], "app/bin");
    for copy in ["app/bin2", "bin3"] {
        let c = find(&own[1], copy);
        assert_eq!(c, bin, "{copy} is not a copy of the lower app/bin");
    }
    let b1 = Bootstrap::open(&index.join("bootstrap.layer-1")).unwrap();
    let (bin2, bin3) = (
        b1.resolve(b"app/bin2").unwrap().unwrap(),
        b1.resolve(b"bin3").unwrap().unwrap(),
    );
    assert_eq!(
        (bin2.ino, bin2.nlink),
        (bin3.ino, 2),
        "both links share the copy"
    );
    assert_eq!(
        file_data(&b1, &blobs, &bin2),
        content(3 << 20, 1),
        "the copy's data read through the index"
    );
    assert_eq!(
        find(&own[1], "app/old").data,
        sha256_hex(&content(800_000, 12))
    );
    assert_eq!(
        find(&own[1], "data/new").data,
        sha256_hex(&content(2 << 20, 13))
    );
    assert_eq!(
        find(&own[1], "etc/conf.d/b.conf").data,
        sha256_hex(b"b = 2\n")
    );

    // The upper layer: `app` whited out and made again hides the lower app's files.
    assert_eq!(
        paths(&own[2]),
        [
            "",
            "app",
            "app/fresh",
            "data",
            "data/new-link",
            "dev-null",
            "etc",
            "etc/conf.d",
            "etc/conf.d/a.conf",
            "pipe"
        ]
    );
    let app = find(&own[2], "app");
    assert!(app.is_opaque(), "{app:?}");
    assert_eq!(
        (app.perm, app.uid, app.gid),
        (0o755, 0, 0),
        "an implicit new directory"
    );
    assert!(find(&own[2], "etc/conf.d/a.conf").is_whiteout());
    assert_eq!(find(&own[2], "dev-null").rdev, (1, 3));
    assert!(!find(&own[2], "dev-null").is_whiteout());
    assert_eq!(find(&own[2], "pipe").kind, FileKind::Fifo);
    assert_eq!(
        find(&own[2], "data/new-link").data,
        sha256_hex(&content(2 << 20, 13)),
        "a copy of the middle layer's file"
    );
    let data = find(&own[2], "data");
    assert_eq!(
        (data.perm, data.uid),
        (0o700, 5),
        "the middle layer's data, shown"
    );
    assert!(!data.is_opaque(), "only the layer that marks it is opaque");

    // Stacked, the layers' own trees are the merged tree, and the first k are prefix k.
    let merged: BTreeMap<String, Entry> = entries(&index.join("bootstrap"), &blobs)
        .into_iter()
        .collect();
    assert_eq!(stack(&own), merged);
    for k in 1..3 {
        let prefix: BTreeMap<String, Entry> =
            entries(&index.join(format!("bootstrap.layers-{k}")), &blobs)
                .into_iter()
                .collect();
        assert_eq!(stack(&own[..k]), prefix, "layers 0..{k}");
    }
}

/// A single layer without whiteouts is its own tree: the same bytes as the bootstrap
/// (which has no prefetch list here).
#[test]
fn one_layer_has_a_layer_tree_equal_to_the_bootstrap() {
    let mut l = tar::Builder::new(Vec::new());
    dir(&mut l, "a", 0o750, Some((3, 4)));
    file(&mut l, "a/f", 0o644, &content(1 << 20, 7));
    link(&mut l, tar::EntryType::Link, "g", "a/f");
    let layer = gzip(&l.into_inner().unwrap());
    let t = tempfile::tempdir().unwrap();
    let index = t.path().join("index");
    let summary = build_index(&[layer], &index);
    assert!(summary.layer_bootstraps.is_empty());
    assert_eq!(summary.own_layer_bootstraps.len(), 1);
    assert_eq!(
        std::fs::read(index.join("bootstrap.layer-0")).unwrap(),
        std::fs::read(index.join("bootstrap")).unwrap()
    );
}

/// Builds that are not indexes have no layer trees.
#[test]
fn a_converted_image_has_no_layer_trees() {
    let t = tempfile::tempdir().unwrap();
    let mut l = tar::Builder::new(Vec::new());
    file(&mut l, "f", 0o644, b"f");
    let mut b = Builder::new(&t.path().join("image"), BuildOptions::default()).unwrap();
    b.add_layer(&l.into_inner().unwrap()[..]).unwrap();
    let summary = b.finish().unwrap();
    assert!(summary.own_layer_bootstraps.is_empty());
    assert!(!t.path().join("image/bootstrap.layer-0").exists());
}
