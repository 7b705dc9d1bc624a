//! Layer merge semantics (OCI image spec, "applying changesets"), checked on layers
//! written entry by entry so every ordering case is pinned down.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use rafs_format::builder::{BuildOptions, Builder};
use rafs_format::reader::{Bootstrap, FileKind, LocalBlobs};

/// One tar entry to write: path, kind, content or link target, PAX records.
enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    Hardlink(&'a str, &'a str),
    Pax(&'a str, &'a [u8], Vec<(&'a str, &'a [u8])>),
}

fn layer(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_mtime(1000);
        h.set_size(0);
        match e {
            E::Dir(p) => {
                h.set_mode(0o755);
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            E::File(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
            }
            E::Hardlink(p, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_link_name_literal(target).unwrap();
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            E::Pax(p, data, records) => {
                b.append_pax_extensions(records.iter().map(|(k, v)| (*k, *v)))
                    .unwrap();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

struct Built {
    _dir: tempfile::TempDir,
    out: std::path::PathBuf,
    b: Bootstrap,
}

fn build(layers: &[Vec<u8>]) -> Result<Built, rafs_format::Error> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("img");
    let mut builder = Builder::new(&out, BuildOptions::default())?;
    for l in layers {
        builder.add_layer(l.as_slice())?;
    }
    builder.finish()?;
    let b = Bootstrap::open(&out.join("bootstrap"))?;
    b.validate_all()?;
    Ok(Built { _dir: dir, out, b })
}

impl Built {
    fn exists(&self, path: &str) -> bool {
        self.b.resolve(path.as_bytes()).unwrap().is_some()
    }
    fn content(&self, path: &str) -> Vec<u8> {
        let inode = self.b.resolve(path.as_bytes()).unwrap().unwrap();
        let blobs = LocalBlobs::new(&self.out);
        let mut out = Vec::new();
        for p in self.b.file_chunks(&inode).unwrap() {
            match p.chunk {
                Some(c) => out.extend(
                    blobs
                        .read_chunk(&self.b, &self.b.chunk(c).unwrap())
                        .unwrap(),
                ),
                None => out.resize(out.len() + p.len as usize, 0),
            }
        }
        out
    }
}

fn lower() -> Vec<u8> {
    layer(&[
        E::Dir("d"),
        E::Dir("d/x"),
        E::File("d/x/old", b"lower"),
        E::File("d/lower.txt", b"lower"),
        E::File("keep.txt", b"keep"),
        E::File("gone.txt", b"gone"),
    ])
}

#[test]
fn opaque_marker_hides_lower_entries_wherever_it_comes() {
    // Marker after this layer's entries, and before them: same result.
    let after = layer(&[E::File("d/x/new", b"upper"), E::File("d/.wh..wh..opq", b"")]);
    let before = layer(&[E::File("d/.wh..wh..opq", b""), E::File("d/x/new", b"upper")]);
    for upper in [after, before] {
        let img = build(&[lower(), upper]).unwrap();
        assert!(img.exists("d/x/new"));
        assert_eq!(img.content("d/x/new"), b"upper");
        assert!(
            !img.exists("d/x/old"),
            "a lower file under an opaque dir survived"
        );
        assert!(!img.exists("d/lower.txt"));
        assert!(
            !img.exists("d/.wh..wh..opq"),
            "the marker itself is not a file"
        );
        assert!(img.exists("keep.txt"));
    }
}

#[test]
fn whiteouts_delete_lower_entries_only() {
    let upper = layer(&[
        E::File(".wh.gone.txt", b""),
        E::File(".wh.d", b""),
        // A whiteout in a directory that does not exist creates nothing.
        E::File("nowhere/.wh.foo", b""),
    ]);
    let img = build(&[lower(), upper]).unwrap();
    assert!(!img.exists("gone.txt"));
    assert!(!img.exists("d"));
    assert!(!img.exists("nowhere"));
    assert!(img.exists("keep.txt"));
    // A name deleted in one layer can come back in the next, as another type.
    let again = layer(&[E::Dir("gone.txt"), E::File("gone.txt/inside", b"x")]);
    let img = build(&[lower(), layer(&[E::File(".wh.gone.txt", b"")]), again]).unwrap();
    let inode = img.b.resolve(b"gone.txt").unwrap().unwrap();
    assert_eq!(inode.kind, FileKind::Directory);
}

#[test]
fn a_directory_listed_again_keeps_its_contents() {
    let upper = layer(&[E::Dir("d"), E::File("d/added", b"new")]);
    let img = build(&[lower(), upper]).unwrap();
    assert!(img.exists("d/lower.txt") && img.exists("d/x/old") && img.exists("d/added"));
}

#[test]
fn hardlinks_resolve_across_layers_and_survive_replacement() {
    let upper = layer(&[E::Hardlink("link", "keep.txt")]);
    let top = layer(&[E::File("keep.txt", b"replaced")]);
    let img = build(&[lower(), upper, top]).unwrap();
    // The link still names the original inode; the path now names a new file.
    assert_eq!(img.content("link"), b"keep");
    assert_eq!(img.content("keep.txt"), b"replaced");
    let link = img.b.resolve(b"link").unwrap().unwrap();
    assert_eq!(link.nlink, 1);
    let missing = layer(&[E::Hardlink("bad", "no/such/file")]);
    let err = build(&[missing]).err().unwrap().to_string();
    assert!(
        err.contains("hardlink target") && err.contains("bad"),
        "{err}"
    );
}

#[test]
fn pax_records_carry_binary_xattrs_times_and_long_names() {
    let long = format!("{}/{}", "p".repeat(120), "n".repeat(200));
    let cap: &[u8] = b"\x01\x00\x00\x02\n\x00=\x00\xff";
    let l = layer(&[E::Pax(
        &long,
        b"data",
        vec![
            ("SCHILY.xattr.security.capability", cap),
            ("mtime", b"1700000000.987654321"),
            ("uid", b"123456"),
        ],
    )]);
    let img = build(&[l]).unwrap();
    let inode = img.b.resolve(long.as_bytes()).unwrap().unwrap();
    assert_eq!(
        (inode.mtime_sec, inode.mtime_nsec),
        (1_700_000_000, 987_654_321)
    );
    assert_eq!(inode.uid, 123456);
    let xattrs = img.b.xattrs(&inode).unwrap();
    assert_eq!(xattrs, vec![(&b"security.capability"[..], cap)]);
}

#[test]
fn bad_layers_are_refused_naming_the_entry() {
    let escape = layer(&[E::File("ok", b"1")]);
    // Patch the name to contain `..` (the tar crate refuses to write it).
    let mut bytes = escape.clone();
    bytes[..6].copy_from_slice(b"../x\0\0");
    let sum: u32 = bytes[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    bytes[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let err = build(&[bytes]).err().unwrap().to_string();
    assert!(err.contains("'..'"), "{err}");
    let long_name = layer(&[E::Pax("x", b"", vec![("path", "n".repeat(300).as_bytes())])]);
    let err = build(&[long_name]).err().unwrap().to_string();
    assert!(err.contains("1..=255"), "{err}");
    let huge_xattr = vec![b'v'; 70_000];
    let l = layer(&[E::Pax(
        "x",
        b"",
        vec![("SCHILY.xattr.user.big", &huge_xattr)],
    )]);
    let err = build(&[l]).err().unwrap().to_string();
    assert!(err.contains("64 KiB"), "{err}");
    let truncated = &escape[..700];
    let err = build(&[truncated.to_vec()]).err().unwrap().to_string();
    assert!(err.contains("ends inside"), "{err}");
}

/// Paths longer than PATH_MAX (which also bounds depth) are refused at build time.
#[test]
fn paths_longer_than_path_max_are_refused() {
    let deep = vec!["d"; 2100].join("/");
    let l = layer(&[E::Pax("x", b"", vec![("path", deep.as_bytes())])]);
    let err = build(&[l]).err().unwrap().to_string();
    assert!(err.contains("PATH_MAX"), "{err}");
    let ok = vec!["d"; 2000].join("/");
    let l = layer(&[E::Pax("x", b"", vec![("path", ok.as_bytes())])]);
    let img = build(&[l]).unwrap();
    assert!(img.exists(&ok));
}
