//! Filesystem trees for round-trip tests: build a hostile one, then check that a copy
//! matches it exactly.
//!
//! An image format is only correct if `build → mount (or unpack) → read back` gives
//! the input again, down to the nanosecond of a symlink's mtime and the inode a
//! hardlink shares. [`generate_tree`] builds, from a seed, a tree with every kind of
//! entry and metadata that OCI layers carry (devices, sockets, sparse and multi-MiB
//! files, hardlink groups, setuid bits, foreign owners, binary xattrs, odd names);
//! [`compare_trees`] lists every way another tree differs from it.
//!
//! Both need root on Linux: generating uses `mknod`, `lchown` and `trusted.*` xattrs,
//! and comparing reads files whose mode is `0000`.

// Each integration test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{self, File, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{lchown, symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, Nsecs, Timespec, Timestamps, CWD};

const MIB: u64 = 1 << 20;

/// Levels in the fixed `deep/` chain; some formats and tools stop at 32 or fewer.
const DEEP_LEVELS: usize = 32;

/// How many differences [`compare_trees`] spells out before it only counts them.
const MAX_DIFFERENCES: usize = 50;

/// What [`generate_tree`] builds. The same spec always gives the same tree.
#[derive(Debug, Clone)]
pub struct TreeSpec {
    /// Seed for every random choice: names, sizes, contents, modes, owners, times.
    pub seed: u64,
    /// Number of entries (files, directories, links) in the randomly shaped `random/`
    /// subtree, on top of the fixed part that covers every edge case.
    pub files: usize,
    /// How deep `random/` may nest; the fixed `deep/` chain is always 32 levels.
    pub max_depth: usize,
    /// Size of `large.bin`, whose every other MiB is the same block so that
    /// deduplication has something to find.
    pub large_file_bytes: u64,
}

impl Default for TreeSpec {
    fn default() -> Self {
        TreeSpec {
            seed: 0x7E55_E7A0,
            files: 200,
            max_depth: 6,
            large_file_bytes: 8 * MIB + 1234,
        }
    }
}

/// What [`compare_trees`] may overlook.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Xattr names starting with any of these are ignored on both sides (for
    /// attributes the host adds by itself, such as `security.selinux`).
    pub ignore_xattr_prefixes: Vec<String>,
    /// Whether the roots' own mode, owner, mtime and xattrs must match; a mount
    /// point's root may legitimately differ from the directory it was built from.
    pub compare_root_metadata: bool,
    /// Whether to skip directory mtimes, for copies made by tools that do not
    /// restore them after filling a directory.
    pub ignore_mtime_for_dirs: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            ignore_xattr_prefixes: Vec::new(),
            compare_root_metadata: true,
            ignore_mtime_for_dirs: false,
        }
    }
}

// ---------------------------------------------------------------------------
// Generating
// ---------------------------------------------------------------------------

/// Builds the tree described by `spec` under `root` (created if missing; it should be
/// empty). Layout, each part covering one family of edge cases:
///
/// - `data/`: files of 0 B, 1 B, exactly 1 MiB and several MiB; `large.bin`.
/// - `sparse/`: a file with data islands between holes, and one that is all hole.
/// - `dup/`: files with identical content.
/// - `deep/`: 32 nested directories.
/// - `names/`: unicode (NFC and NFD twins), a 255-byte name, spaces, control and
///   punctuation characters.
/// - `links/`: relative, absolute, dangling, looping and long symlinks; `hard/original`
///   has two more names in `names/` and `deep/`.
/// - `special/`: character and block devices, a fifo, a socket.
/// - `modes/`, `owners/`, `xattrs/`: setuid/setgid/sticky and `0000`, uids and gids
///   up to 123456, empty and binary xattr values on files, directories and symlinks.
/// - `random/`: `spec.files` entries of every kind in a random shape.
///
/// Metadata is applied after everything exists, and mtimes last of all, so creating a
/// child never disturbs its directory's recorded mtime.
pub fn generate_tree(root: &Path, spec: &TreeSpec) -> io::Result<()> {
    let mut plan = Plan::new(spec.seed);
    plan.fixed_part(spec);
    plan.random_part(spec);
    let root_meta = Meta {
        mode: 0o750,
        uid: 1000,
        gid: 65534,
        mtime: plan.random_mtime(),
        xattrs: vec![("user.tessera.root".into(), b"root".to_vec())],
    };
    fs::create_dir_all(root)?;
    plan.materialize(root)?;
    apply_meta(root, &root_meta, false)?;
    set_mtime(root, root_meta.mtime)
}

/// One entry to create, relative to the root.
#[derive(Debug)]
struct Node {
    path: PathBuf,
    kind: Kind,
    /// Unused for hardlinks, which share the metadata of the inode they name.
    meta: Meta,
}

#[derive(Debug)]
enum Kind {
    Dir,
    File(Content),
    Symlink(PathBuf),
    /// Another name for an earlier regular file.
    HardLink(PathBuf),
    /// A device, fifo or socket made with `mknod`.
    Special(FileType, u32, u32),
}

#[derive(Debug, Clone)]
enum Content {
    /// `len` pseudo-random bytes.
    Random { seed: u64, len: u64 },
    /// 1 MiB segments alternating between one shared block and unique data.
    Repetitive { seed: u64, len: u64 },
    /// A file of `len` bytes that is a hole except for `(offset, len, seed)` islands.
    Sparse {
        len: u64,
        islands: Vec<(u64, u64, u64)>,
    },
}

#[derive(Debug, Clone)]
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
    xattrs: Vec<(String, Vec<u8>)>,
}

/// SplitMix64: tiny and good enough to make varied but reproducible trees.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    fn index(&mut self, len: usize) -> usize {
        self.range(0, len as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes()[..chunk.len()]);
        }
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        self.fill(&mut buf);
        buf
    }
}

/// Fragments that random names are made of: unicode, spaces, shell metacharacters.
const NAME_PARTS: &[&str] = &[
    "data",
    "file",
    "x",
    "Ünïcödé",
    "日本語",
    "🦀",
    "with space",
    "a.b",
    "-dash",
    "_",
    "#hash",
    "$HOME",
    "(paren)",
    "[br]",
    "{cb}",
    "'q'",
    "\"dq\"",
    "~",
    "%41",
    "\\back",
    "semi;colon",
    "tab\t",
    "é",
    "Ω",
    "...",
    "*",
    "?",
];

const OWNERS: &[u32] = &[0, 0, 1000, 65534, 123_456];

#[derive(Debug)]
struct Plan {
    rng: Rng,
    /// In creation order: every directory comes before its children.
    nodes: Vec<Node>,
}

impl Plan {
    fn new(seed: u64) -> Self {
        Plan {
            rng: Rng(seed),
            nodes: Vec::new(),
        }
    }

    /// Adds an entry with random metadata, returned so the caller can pin some of it.
    fn add(&mut self, path: impl Into<PathBuf>, kind: Kind) -> &mut Node {
        let meta = self.random_meta(&kind);
        self.nodes.push(Node {
            path: path.into(),
            kind,
            meta,
        });
        let last = self.nodes.len() - 1;
        &mut self.nodes[last]
    }

    fn dir(&mut self, path: impl Into<PathBuf>) -> &mut Node {
        self.add(path, Kind::Dir)
    }

    fn random_file(&mut self, path: impl Into<PathBuf>, len: u64) -> &mut Node {
        let seed = self.rng.next_u64();
        self.add(path, Kind::File(Content::Random { seed, len }))
    }

    fn random_mtime(&mut self) -> (i64, u32) {
        let secs = self.rng.range(1_000_000_000, 1_900_000_000) as i64;
        let nanos = match self.rng.range(0, 10) {
            0 | 1 => 0,
            2 => 999_999_999,
            _ => self.rng.range(0, 1_000_000_000) as u32,
        };
        (secs, nanos)
    }

    fn random_meta(&mut self, kind: &Kind) -> Meta {
        let modes: &[u32] = match kind {
            Kind::Dir => &[0o755, 0o755, 0o750, 0o700, 0o775, 0o555, 0o1777, 0o2775],
            Kind::File(_) => &[
                0o644, 0o644, 0o644, 0o600, 0o755, 0o640, 0o444, 0o4755, 0o2755, 0o000,
            ],
            Kind::Special(..) => &[0o660, 0o666, 0o600, 0o644],
            Kind::Symlink(_) | Kind::HardLink(_) => &[0o777],
        };
        let mode = self.rng.pick(modes);
        let uid = self.rng.pick(OWNERS);
        let gid = self.rng.pick(OWNERS);
        let mtime = self.random_mtime();
        // Linux allows user.* only on regular files and directories.
        let namespace = match kind {
            Kind::Dir | Kind::File(_) => "user",
            _ => "trusted",
        };
        let mut xattrs = Vec::new();
        if self.rng.chance(25) {
            for i in 0..self.rng.range(1, 4) {
                let len = self.rng.range(0, 48) as usize;
                xattrs.push((format!("{namespace}.tessera.r{i}"), self.rng.bytes(len)));
            }
        }
        Meta {
            mode,
            uid,
            gid,
            mtime,
            xattrs,
        }
    }

    fn fixed_part(&mut self, spec: &TreeSpec) {
        self.data_and_sparse(spec);
        let deep_dir = self.deep_chain();
        self.names_and_hardlinks(&deep_dir);
        self.links();
        self.specials();
        self.modes_and_owners();
        self.xattrs();
    }

    fn data_and_sparse(&mut self, spec: &TreeSpec) {
        self.dir("data");
        self.random_file("data/empty", 0);
        self.random_file("data/one-byte", 1);
        self.random_file("data/exactly-1mib", MIB);
        self.random_file("data/multi-mib-1", 3 * MIB + 17).meta.mode = 0o644;
        self.random_file("data/multi-mib-2", 5 * MIB - 1);
        let seed = self.rng.next_u64();
        let len = spec.large_file_bytes;
        self.add(
            "data/large.bin",
            Kind::File(Content::Repetitive { seed, len }),
        );

        self.dir("sparse");
        let islands = vec![
            (0, 4096, self.rng.next_u64()),
            (MIB + 123, 10_000, self.rng.next_u64()),
            (4 * MIB, 65_536, self.rng.next_u64()),
        ];
        let len = 6 * MIB + 100;
        self.add(
            "sparse/islands.img",
            Kind::File(Content::Sparse { len, islands }),
        );
        let all_hole = Content::Sparse {
            len: 2 * MIB,
            islands: Vec::new(),
        };
        self.add("sparse/all-hole.img", Kind::File(all_hole));

        self.dir("dup");
        self.dir("dup/nested");
        let shared = Content::Random {
            seed: self.rng.next_u64(),
            len: 300_000,
        };
        for path in ["dup/one", "dup/two", "dup/nested/three"] {
            self.add(path, Kind::File(shared.clone()));
        }
        self.random_file("dup/empty-1", 0);
        self.random_file("dup/empty-2", 0);
    }

    /// Builds `deep/level-00/…/level-31/bottom` and returns the level-10 directory.
    fn deep_chain(&mut self) -> PathBuf {
        let mut dir = PathBuf::from("deep");
        self.dir(&dir);
        let mut middle = dir.clone();
        for level in 0..DEEP_LEVELS {
            dir.push(format!("level-{level:02}"));
            self.dir(&dir);
            if level == 10 {
                middle = dir.clone();
            }
        }
        self.random_file(dir.join("bottom"), 100);
        middle
    }

    fn names_and_hardlinks(&mut self, deep_dir: &Path) {
        self.dir("hard");
        let original = PathBuf::from("hard/original");
        let node = self.random_file(&original, 5000);
        node.meta.mode = 0o644;
        node.meta.xattrs = vec![("user.tessera.hard".into(), b"shared by 3 names".to_vec())];

        self.dir("names");
        let long_name = format!("{}x", "é".repeat(127));
        assert_eq!(
            long_name.len(),
            255,
            "the long name must be exactly NAME_MAX bytes"
        );
        let names = [
            "Ünïcödé 日本語 🦀.txt",
            "family 👩‍👩‍👧‍👦",
            "nfc-\u{e9}",
            "nfd-e\u{301}",
            long_name.as_str(),
            "with space",
            " leading-space",
            "trailing-space ",
            "  ",
            "odd !\"#$%&'()*+,-.:;<=>?@[\\]^_`{|}~",
            "new\nline",
            "tab\tchar",
            "esc\u{1b}[31m",
            "-starts-with-dash",
            ".hidden",
            "..dots",
        ];
        for name in names {
            let len = self.rng.range(0, 2000);
            self.random_file(Path::new("names").join(name), len);
        }
        self.dir(Path::new("names").join("dir with ✓ space"));
        self.add(
            "names/hardlink second name",
            Kind::HardLink(original.clone()),
        );
        self.add(deep_dir.join("hardlink third"), Kind::HardLink(original));
    }

    fn links(&mut self) {
        let links: &[(&str, String)] = &[
            ("relative", "../data/one-byte".into()),
            ("absolute-host", "/etc/hostname".into()),
            ("absolute-in-image", "/data/one-byte".into()),
            ("dangling", "../no/such/target".into()),
            ("to-dir", "../deep/level-00".into()),
            ("self-loop", "self-loop".into()),
            ("chain", "relative".into()),
            ("unicode", "../names/Ünïcödé 日本語 🦀.txt".into()),
            ("long-target", format!("{}end", "long/".repeat(60))),
        ];
        self.dir("links");
        for (name, target) in links {
            self.add(Path::new("links").join(name), Kind::Symlink(target.into()));
        }
    }

    fn specials(&mut self) {
        self.dir("special");
        let specials = [
            ("null", FileType::CharacterDevice, 1, 3),
            ("loop0", FileType::BlockDevice, 7, 0),
            ("wide-numbers", FileType::BlockDevice, 259, 65_539),
            ("fifo", FileType::Fifo, 0, 0),
            ("socket", FileType::Socket, 0, 0),
        ];
        for (name, file_type, major, minor) in specials {
            let path = Path::new("special").join(name);
            self.add(path, Kind::Special(file_type, major, minor));
        }
    }

    fn modes_and_owners(&mut self) {
        self.dir("modes");
        let file_modes = [
            ("setuid", 0o4755),
            ("setuid-no-exec", 0o4644),
            ("setgid", 0o2755),
            ("setuid-setgid", 0o6755),
            ("sticky-file", 0o1644),
            ("no-permissions", 0o000),
            ("exec-only", 0o111),
            ("group-write", 0o664),
        ];
        for (name, mode) in file_modes {
            self.random_file(Path::new("modes").join(name), 10)
                .meta
                .mode = mode;
        }
        let dir_modes = [
            ("sticky-dir", 0o1777),
            ("setgid-dir", 0o2775),
            ("locked-dir", 0o000),
        ];
        for (name, mode) in dir_modes {
            self.dir(Path::new("modes").join(name)).meta.mode = mode;
        }
        self.random_file("modes/locked-dir/inside", 10);

        self.dir("owners");
        let owners = [
            (0, 0),
            (1000, 1000),
            (65534, 65534),
            (123_456, 123_456),
            (1000, 0),
            (0, 123_456),
        ];
        for (uid, gid) in owners {
            let node = self.random_file(format!("owners/{uid}-{gid}"), 10);
            (node.meta.uid, node.meta.gid) = (uid, gid);
        }
        let node = self.dir("owners/dir-123456");
        (node.meta.uid, node.meta.gid) = (123_456, 1000);
        let node = self.add("owners/symlink-1000", Kind::Symlink("0-0".into()));
        (node.meta.uid, node.meta.gid) = (1000, 65534);
    }

    fn xattrs(&mut self) {
        let all_bytes: Vec<u8> = (0..=255).collect();
        self.dir("xattrs").meta.xattrs = vec![
            ("user.tessera.dir".into(), b"on a directory".to_vec()),
            ("trusted.tessera.dir".into(), Vec::new()),
        ];
        self.random_file("xattrs/file", 100).meta.xattrs = vec![
            ("user.empty".into(), Vec::new()),
            ("user.binary".into(), all_bytes.clone()),
            ("user.text".into(), b"hello".to_vec()),
            ("user.big".into(), vec![b'z'; 1000]),
            ("trusted.tessera".into(), b"trusted".to_vec()),
        ];
        self.add("xattrs/link", Kind::Symlink("file".into()))
            .meta
            .xattrs = vec![("trusted.link".into(), vec![0, 1, 0xff, 0])];
        self.add("xattrs/fifo", Kind::Special(FileType::Fifo, 0, 0))
            .meta
            .xattrs = vec![("trusted.fifo".into(), all_bytes)];
        self.random_file("xattrs/none", 1).meta.xattrs = Vec::new();
    }

    /// `spec.files` entries of random kinds under `random/`, in random directories.
    fn random_part(&mut self, spec: &TreeSpec) {
        let mut dirs = vec![(PathBuf::from("random"), 0)];
        self.dir("random");
        let mut files: Vec<(PathBuf, Content)> = Vec::new();
        let mut all: Vec<PathBuf> = Vec::new();
        for i in 0..spec.files {
            let (parent, depth) = dirs[self.rng.index(dirs.len())].clone();
            let path = parent.join(self.random_name(i));
            match self.rng.range(0, 100) {
                0..=14 if depth < spec.max_depth => {
                    self.dir(&path);
                    dirs.push((path.clone(), depth + 1));
                }
                15..=22 => {
                    let target = self.symlink_target(&parent, &all);
                    self.add(&path, Kind::Symlink(target));
                }
                23..=26 if !files.is_empty() => {
                    let target = files[self.rng.index(files.len())].0.clone();
                    self.add(&path, Kind::HardLink(target));
                }
                27..=31 if !files.is_empty() => {
                    let content = files[self.rng.index(files.len())].1.clone();
                    self.add(&path, Kind::File(content.clone()));
                    files.push((path.clone(), content));
                }
                _ => {
                    let content = Content::Random {
                        seed: self.rng.next_u64(),
                        len: self.random_size(),
                    };
                    self.add(&path, Kind::File(content.clone()));
                    files.push((path.clone(), content));
                }
            }
            all.push(path);
        }
    }

    fn random_name(&mut self, index: usize) -> String {
        let mut name = String::new();
        for _ in 0..self.rng.range(1, 4) {
            name.push_str(self.rng.pick(NAME_PARTS));
        }
        // The index keeps names unique and so never "." or "..".
        format!("{name}-{index}")
    }

    fn random_size(&mut self) -> u64 {
        match self.rng.range(0, 100) {
            0..=9 => 0,
            10..=64 => self.rng.range(1, 4096),
            65..=89 => self.rng.range(4096, 256 * 1024),
            90..=97 => self.rng.range(256 * 1024, MIB),
            _ => self.rng.range(MIB, 3 * MIB),
        }
    }

    fn symlink_target(&mut self, link_dir: &Path, existing: &[PathBuf]) -> PathBuf {
        if existing.is_empty() || self.rng.chance(20) {
            return PathBuf::from(format!("missing-{}", self.rng.next_u64()));
        }
        let target = &existing[self.rng.index(existing.len())];
        if self.rng.chance(15) {
            // Absolute within the image, as a container would see it.
            return Path::new("/").join(target);
        }
        let mut relative: PathBuf = link_dir.components().map(|_| "..").collect();
        relative.push(target);
        relative
    }

    fn materialize(&self, root: &Path) -> io::Result<()> {
        for node in &self.nodes {
            create(root, node).map_err(|e| annotate(e, "create", &node.path))?;
        }
        for node in &self.nodes {
            if !matches!(node.kind, Kind::HardLink(_)) {
                let is_symlink = matches!(node.kind, Kind::Symlink(_));
                apply_meta(&root.join(&node.path), &node.meta, is_symlink)
                    .map_err(|e| annotate(e, "set metadata of", &node.path))?;
            }
        }
        // Children first, although by now nothing else will touch a directory's mtime.
        for node in self.nodes.iter().rev() {
            if !matches!(node.kind, Kind::HardLink(_)) {
                set_mtime(&root.join(&node.path), node.meta.mtime)
                    .map_err(|e| annotate(e, "set mtime of", &node.path))?;
            }
        }
        Ok(())
    }
}

fn annotate(err: io::Error, verb: &str, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{verb} {}: {err}", path.display()))
}

fn create(root: &Path, node: &Node) -> io::Result<()> {
    let path = root.join(&node.path);
    match &node.kind {
        Kind::Dir => fs::create_dir(&path),
        Kind::File(content) => write_content(&path, content),
        Kind::Symlink(target) => symlink(target, &path),
        Kind::HardLink(original) => fs::hard_link(root.join(original), &path),
        Kind::Special(file_type, major, minor) => {
            let dev = rustix::fs::makedev(*major, *minor);
            rustix::fs::mknodat(CWD, &path, *file_type, Mode::from_raw_mode(0o600), dev)?;
            Ok(())
        }
    }
}

/// Xattrs first and mode last: `chown` clears setuid and setgid bits.
fn apply_meta(path: &Path, meta: &Meta, is_symlink: bool) -> io::Result<()> {
    for (name, value) in &meta.xattrs {
        xattr::set(path, name, value)?;
    }
    lchown(path, Some(meta.uid), Some(meta.gid))?;
    if !is_symlink {
        fs::set_permissions(path, Permissions::from_mode(meta.mode))?;
    }
    Ok(())
}

/// Sets atime and mtime of `path` itself, not of what a symlink points to.
fn set_mtime(path: &Path, (secs, nanos): (i64, u32)) -> io::Result<()> {
    let time = Timespec {
        tv_sec: secs,
        tv_nsec: Nsecs::from(nanos),
    };
    let times = Timestamps {
        last_access: time,
        last_modification: time,
    };
    rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

fn write_content(path: &Path, content: &Content) -> io::Result<()> {
    let mut file = File::create(path)?;
    match content {
        Content::Random { seed, len } => write_random(&mut file, *seed, *len),
        Content::Repetitive { seed, len } => {
            let block = Rng(*seed).bytes(MIB as usize);
            let mut left = *len;
            for segment in 0u64.. {
                if left == 0 {
                    break;
                }
                let n = left.min(MIB);
                if segment % 2 == 0 {
                    file.write_all(&block[..n as usize])?;
                } else {
                    write_random(&mut file, seed ^ segment, n)?;
                }
                left -= n;
            }
            Ok(())
        }
        Content::Sparse { len, islands } => {
            for &(offset, size, seed) in islands {
                file.seek(SeekFrom::Start(offset))?;
                write_random(&mut file, seed, size)?;
            }
            file.set_len(*len)
        }
    }
}

fn write_random(out: &mut impl Write, seed: u64, len: u64) -> io::Result<()> {
    let mut rng = Rng(seed);
    let mut buf = vec![0; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------

/// Lists how `actual` differs from `expected`, one line per difference in the form
/// `"path: what <expected> != <actual>"`; empty means the trees are equal. Symlinks
/// are never followed, contents are compared by streaming, and hardlinks are compared
/// as a partition of names (which names share an inode), not by inode number.
/// After 50 differences the rest are only counted.
pub fn compare_trees(expected: &Path, actual: &Path, opts: &CompareOptions) -> Vec<String> {
    let mut diffs = Vec::new();
    let exp = scan(expected, "expected", opts, &mut diffs);
    let act = scan(actual, "actual", opts, &mut diffs);
    let exp_links = link_groups(&exp);
    let act_links = link_groups(&act);

    let all: BTreeSet<&PathBuf> = exp.keys().chain(act.keys()).collect();
    // A directory missing on one side is reported once, not once per descendant.
    let mut missing_dir: Option<&Path> = None;
    for rel in all {
        if missing_dir.is_some_and(|dir| rel.starts_with(dir)) {
            continue;
        }
        let (e, a) = match (exp.get(rel), act.get(rel)) {
            (Some(e), Some(a)) => (e, a),
            (Some(only), None) | (None, Some(only)) => {
                let side = if exp.contains_key(rel) {
                    "expected"
                } else {
                    "actual"
                };
                let tree = if exp.contains_key(rel) { &exp } else { &act };
                let mut line = format!("{}: only in {side}", show(rel));
                if only.kind == EntryKind::Dir {
                    let inside = tree.keys().filter(|k| k.starts_with(rel)).count() - 1;
                    line.push_str(&format!(
                        " (a directory; {inside} entries below it not listed)"
                    ));
                    missing_dir = Some(rel);
                }
                diffs.push(line);
                continue;
            }
            (None, None) => continue,
        };
        let paths = (expected.join(rel), actual.join(rel));
        compare_entry(rel, e, a, &paths, opts, &mut diffs);
        if e.kind == a.kind && e.kind != EntryKind::Dir {
            let empty = BTreeSet::new();
            let e_names = exp_links.get(rel.as_path()).unwrap_or(&empty);
            let a_names = act_links.get(rel.as_path()).unwrap_or(&empty);
            if e_names != a_names {
                diffs.push(format!(
                    "{}: hardlinked with {} != {}",
                    show(rel),
                    show_names(e_names),
                    show_names(a_names)
                ));
            }
        }
    }

    if diffs.len() > MAX_DIFFERENCES {
        let more = diffs.len() - MAX_DIFFERENCES;
        diffs.truncate(MAX_DIFFERENCES);
        diffs.push(format!("... and {more} more differences"));
    }
    diffs
}

/// Panics, listing every difference, unless `actual` equals `expected`.
pub fn assert_trees_equal(expected: &Path, actual: &Path, opts: &CompareOptions) {
    let diffs = compare_trees(expected, actual, opts);
    if !diffs.is_empty() {
        panic!(
            "trees differ (expected {} != actual {}):\n  {}",
            expected.display(),
            actual.display(),
            diffs.join("\n  ")
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
    Unknown,
}

/// What one side says about one path.
#[derive(Debug)]
struct Entry {
    kind: EntryKind,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    size: u64,
    rdev: u64,
    nlink: u64,
    /// `(st_dev, st_ino)`, only to group hardlinks within one side.
    inode: (u64, u64),
    link_target: Option<PathBuf>,
    xattrs: BTreeMap<OsString, Vec<u8>>,
}

/// Every entry under `root`, keyed by path relative to it (the root itself is "").
/// Unreadable entries become differences rather than panics, so that one bad file in
/// a mount does not hide the rest of the report.
fn scan(
    root: &Path,
    side: &str,
    opts: &CompareOptions,
    diffs: &mut Vec<String>,
) -> BTreeMap<PathBuf, Entry> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let abs = if rel.as_os_str().is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        let entry = match read_entry(&abs, opts) {
            Ok(entry) => entry,
            Err(err) => {
                diffs.push(format!("{}: cannot read {side} entry: {err}", show(&rel)));
                continue;
            }
        };
        if entry.kind == EntryKind::Dir {
            match fs::read_dir(&abs).and_then(|dir| dir.collect::<io::Result<Vec<_>>>()) {
                Ok(children) => pending.extend(children.iter().map(|c| rel.join(c.file_name()))),
                Err(err) => diffs.push(format!("{}: cannot list {side} dir: {err}", show(&rel))),
            }
        }
        entries.insert(rel, entry);
    }
    entries
}

fn read_entry(path: &Path, opts: &CompareOptions) -> io::Result<Entry> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        EntryKind::File
    } else if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_char_device() {
        EntryKind::CharDevice
    } else if ft.is_block_device() {
        EntryKind::BlockDevice
    } else if ft.is_fifo() {
        EntryKind::Fifo
    } else if ft.is_socket() {
        EntryKind::Socket
    } else {
        EntryKind::Unknown
    };
    let link_target = match kind {
        EntryKind::Symlink => Some(fs::read_link(path)?),
        _ => None,
    };
    Ok(Entry {
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        size: meta.size(),
        rdev: meta.rdev(),
        nlink: meta.nlink(),
        inode: (meta.dev(), meta.ino()),
        link_target,
        xattrs: read_xattrs(path, &opts.ignore_xattr_prefixes)?,
    })
}

/// The xattrs of `path` itself; a filesystem without xattr support has none.
fn read_xattrs(path: &Path, ignore: &[String]) -> io::Result<BTreeMap<OsString, Vec<u8>>> {
    let names = match xattr::list(path) {
        Ok(names) => names,
        Err(err) if err.raw_os_error() == Some(rustix::io::Errno::NOTSUP.raw_os_error()) => {
            return Ok(BTreeMap::new());
        }
        Err(err) => return Err(err),
    };
    let mut xattrs = BTreeMap::new();
    for name in names {
        let bytes = name.as_encoded_bytes();
        if ignore
            .iter()
            .any(|prefix| bytes.starts_with(prefix.as_bytes()))
        {
            continue;
        }
        // An attribute removed between list and get is simply not there.
        if let Some(value) = xattr::get(path, &name)? {
            xattrs.insert(name, value);
        }
    }
    Ok(xattrs)
}

/// For every non-directory that shares its inode, the other names of that inode.
fn link_groups(entries: &BTreeMap<PathBuf, Entry>) -> HashMap<&Path, BTreeSet<&Path>> {
    let mut by_inode: HashMap<(u64, u64), Vec<&Path>> = HashMap::new();
    for (path, entry) in entries {
        if entry.kind != EntryKind::Dir {
            by_inode.entry(entry.inode).or_default().push(path);
        }
    }
    let mut groups = HashMap::new();
    for names in by_inode.values().filter(|names| names.len() > 1) {
        for &name in names {
            let others = names
                .iter()
                .copied()
                .filter(|&other| other != name)
                .collect();
            groups.insert(name, others);
        }
    }
    groups
}

fn compare_entry(
    rel: &Path,
    e: &Entry,
    a: &Entry,
    (exp_path, act_path): &(PathBuf, PathBuf),
    opts: &CompareOptions,
    diffs: &mut Vec<String>,
) {
    let p = show(rel);
    if e.kind != a.kind {
        diffs.push(format!("{p}: type {:?} != {:?}", e.kind, a.kind));
        return;
    }
    if rel.as_os_str().is_empty() && !opts.compare_root_metadata {
        return;
    }
    let mut differ = |what: &str, exp: String, act: String| {
        if exp != act {
            diffs.push(format!("{p}: {what} {exp} != {act}"));
        }
    };
    differ("mode", format!("{:04o}", e.mode), format!("{:04o}", a.mode));
    differ("uid", e.uid.to_string(), a.uid.to_string());
    differ("gid", e.gid.to_string(), a.gid.to_string());
    if !(e.kind == EntryKind::Dir && opts.ignore_mtime_for_dirs) {
        let mtime = |(s, ns): (i64, i64)| format!("{s}.{ns:09}");
        differ("mtime", mtime(e.mtime), mtime(a.mtime));
    }
    if e.kind != EntryKind::Dir {
        differ("size", e.size.to_string(), a.size.to_string());
        differ("nlink", e.nlink.to_string(), a.nlink.to_string());
    }
    if matches!(e.kind, EntryKind::CharDevice | EntryKind::BlockDevice) {
        let dev = |d: u64| format!("{}:{}", rustix::fs::major(d), rustix::fs::minor(d));
        differ("rdev", dev(e.rdev), dev(a.rdev));
    }
    let target = |t: &Option<PathBuf>| t.as_deref().map(show).unwrap_or_default();
    differ(
        "symlink target",
        target(&e.link_target),
        target(&a.link_target),
    );

    for name in e
        .xattrs
        .keys()
        .chain(a.xattrs.keys())
        .collect::<BTreeSet<_>>()
    {
        let what = format!("xattr {}", name.to_string_lossy().escape_debug());
        let value = |v: Option<&Vec<u8>>| v.map_or_else(|| "(absent)".into(), |v| show_bytes(v));
        differ(&what, value(e.xattrs.get(name)), value(a.xattrs.get(name)));
    }

    if e.kind == EntryKind::File && e.size == a.size {
        match first_difference(exp_path, act_path) {
            Ok(None) => {}
            Ok(Some(offset)) => diffs.push(format!("{p}: content differs at byte {offset}")),
            Err(err) => diffs.push(format!("{p}: cannot compare content: {err}")),
        }
    }
}

/// Offset of the first byte where the two files differ (or where one ends first).
fn first_difference(a: &Path, b: &Path) -> io::Result<Option<u64>> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0; MIB as usize], vec![0; MIB as usize]);
    let mut offset = 0;
    loop {
        let (na, nb) = (read_full(&mut fa, &mut ba)?, read_full(&mut fb, &mut bb)?);
        if ba[..na] != bb[..nb] {
            let common = na.min(nb);
            let at = ba[..common]
                .iter()
                .zip(&bb[..common])
                .position(|(x, y)| x != y);
            return Ok(Some(offset + at.unwrap_or(common) as u64));
        }
        if na == 0 {
            return Ok(None);
        }
        offset += na as u64;
    }
}

/// Reads until `buf` is full or the file ends; returns how much was read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

/// A relative path for a message: "." for the root, control characters escaped.
fn show(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.to_string_lossy().escape_debug().to_string()
    }
}

fn show_names(names: &BTreeSet<&Path>) -> String {
    let shown: Vec<String> = names.iter().map(|p| show(p)).collect();
    format!("[{}]", shown.join(", "))
}

fn show_bytes(value: &[u8]) -> String {
    const SHOWN: usize = 32;
    if value.len() <= SHOWN {
        format!("b\"{}\"", value.escape_ascii())
    } else {
        format!(
            "b\"{}\"... ({} bytes)",
            value[..SHOWN].escape_ascii(),
            value.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    /// Smaller than the default so that the tests, run in every binary that includes
    /// this module, stay quick.
    fn small_spec() -> TreeSpec {
        TreeSpec {
            files: 80,
            large_file_bytes: 3 * MIB + 5,
            ..TreeSpec::default()
        }
    }

    /// Two trees from the same spec, in `expected/` and `actual/` of a temp dir.
    fn twin_trees() -> (TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().expect("create temp dir");
        let (expected, actual) = (tmp.path().join("expected"), tmp.path().join("actual"));
        for root in [&expected, &actual] {
            generate_tree(root, &small_spec())
                .expect("generate tree (needs root: mknod, chown, trusted.* xattrs)");
        }
        (tmp, expected, actual)
    }

    fn mtime_of(path: &Path) -> (i64, u32) {
        let meta = fs::symlink_metadata(path).expect("stat");
        (meta.mtime(), meta.mtime_nsec() as u32)
    }

    /// Runs `change` on `path` and puts back the mtimes of `path` and its parent, so
    /// the change is the only difference.
    fn keeping_mtimes(path: &Path, change: impl FnOnce()) {
        let parent = path.parent().expect("path has a parent");
        let (own, parents) = (mtime_of(path), mtime_of(parent));
        change();
        if fs::symlink_metadata(path).is_ok() {
            set_mtime(path, own).expect("restore mtime");
        }
        set_mtime(parent, parents).expect("restore parent mtime");
    }

    fn only_difference(expected: &Path, actual: &Path) -> String {
        let diffs = compare_trees(expected, actual, &CompareOptions::default());
        assert_eq!(
            diffs.len(),
            1,
            "expected exactly one difference, got {diffs:#?}"
        );
        diffs.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn same_seed_gives_equal_trees_and_other_seeds_do_not() {
        let (tmp, expected, actual) = twin_trees();
        assert_trees_equal(&expected, &actual, &CompareOptions::default());

        let other = tmp.path().join("other");
        let spec = TreeSpec {
            seed: 1,
            ..small_spec()
        };
        generate_tree(&other, &spec).expect("generate tree");
        let diffs = compare_trees(&expected, &other, &CompareOptions::default());
        assert_eq!(diffs.len(), MAX_DIFFERENCES + 1, "{diffs:#?}");
        assert!(diffs[MAX_DIFFERENCES].starts_with("... and "), "{diffs:#?}");
    }

    #[test]
    fn detects_a_changed_byte() {
        let (_tmp, expected, actual) = twin_trees();
        let path = actual.join("data/multi-mib-1");
        let offset = 2 * MIB + 5;
        keeping_mtimes(&path, || {
            let mut file = File::options()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open");
            let mut byte = [0];
            file.seek(SeekFrom::Start(offset)).expect("seek");
            file.read_exact(&mut byte).expect("read");
            file.seek(SeekFrom::Start(offset)).expect("seek");
            file.write_all(&[!byte[0]]).expect("write");
        });
        let diff = only_difference(&expected, &actual);
        assert_eq!(
            diff,
            format!("data/multi-mib-1: content differs at byte {offset}")
        );
    }

    #[test]
    fn detects_a_changed_mode_unless_on_an_ignored_root() {
        let (_tmp, expected, actual) = twin_trees();
        fs::set_permissions(actual.join("modes/setuid"), Permissions::from_mode(0o755))
            .expect("chmod");
        assert_eq!(
            only_difference(&expected, &actual),
            "modes/setuid: mode 4755 != 0755"
        );

        fs::set_permissions(actual.join("modes/setuid"), Permissions::from_mode(0o4755))
            .expect("chmod");
        fs::set_permissions(&actual, Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(only_difference(&expected, &actual), ".: mode 0750 != 0700");
        let opts = CompareOptions {
            compare_root_metadata: false,
            ..CompareOptions::default()
        };
        assert_trees_equal(&expected, &actual, &opts);
    }

    #[test]
    fn detects_a_changed_mtime_nanosecond_on_a_symlink() {
        let (_tmp, expected, actual) = twin_trees();
        let path = actual.join("links/relative");
        let (secs, nanos) = mtime_of(&path);
        set_mtime(&path, (secs, nanos ^ 1)).expect("set mtime");
        assert_eq!(
            only_difference(&expected, &actual),
            format!(
                "links/relative: mtime {secs}.{nanos:09} != {secs}.{:09}",
                nanos ^ 1
            )
        );
    }

    #[test]
    fn detects_a_changed_xattr_unless_ignored() {
        let (_tmp, expected, actual) = twin_trees();
        xattr::set(actual.join("xattrs/file"), "user.binary", b"changed").expect("set xattr");
        let diff = only_difference(&expected, &actual);
        assert!(
            diff.starts_with("xattrs/file: xattr user.binary b\""),
            "{diff}"
        );
        assert!(diff.ends_with("(256 bytes) != b\"changed\""), "{diff}");

        let opts = CompareOptions {
            ignore_xattr_prefixes: vec!["user.bin".into()],
            ..CompareOptions::default()
        };
        assert_trees_equal(&expected, &actual, &opts);
    }

    #[test]
    fn detects_a_broken_hardlink_group() {
        let (_tmp, expected, actual) = twin_trees();
        let original = actual.join("hard/original");
        let copy = actual.join("names/hardlink second name");
        keeping_mtimes(&copy, || {
            let meta = fs::symlink_metadata(&original).expect("stat");
            fs::remove_file(&copy).expect("unlink");
            fs::copy(&original, &copy).expect("copy");
            for name in xattr::list(&original).expect("list xattrs") {
                let value = xattr::get(&original, &name).expect("get xattr");
                xattr::set(&copy, &name, &value.unwrap_or_default()).expect("set xattr");
            }
            lchown(&copy, Some(meta.uid()), Some(meta.gid())).expect("chown");
            fs::set_permissions(&copy, meta.permissions()).expect("chmod");
        });

        let diffs = compare_trees(&expected, &actual, &CompareOptions::default());
        assert!(
            diffs.contains(&"names/hardlink second name: nlink 3 != 1".to_string()),
            "{diffs:#?}"
        );
        let partition = "hard/original: hardlinked with \
             [deep/level-00/level-01/level-02/level-03/level-04/level-05/level-06/level-07/\
             level-08/level-09/level-10/hardlink third, names/hardlink second name] != \
             [deep/level-00/level-01/level-02/level-03/level-04/level-05/level-06/level-07/\
             level-08/level-09/level-10/hardlink third]";
        assert!(diffs.contains(&partition.to_string()), "{diffs:#?}");
        assert!(
            diffs
                .iter()
                .all(|d| d.contains("nlink") || d.contains("hardlinked")),
            "{diffs:#?}"
        );
    }
}
