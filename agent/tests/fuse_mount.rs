//! The FUSE filesystem through real mounts: images built by the `tessera` binary,
//! mounted with `tessera_agent::fs::mount`, read with ordinary system calls.
//!
//! Runs as root with `/dev/fuse` and `fusermount3` (Debian `fuse3`). Every mount is held
//! by a `Mounted` declared after the temp dir it lives in, so it is unmounted first —
//! also when an assertion fails and the test unwinds.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rafs_format::reader::{Bootstrap, LocalBlobs};
use rustix::io::Errno;
use support::fstree::{assert_trees_equal, generate_tree, CompareOptions, TreeSpec};
use support::{build, s};
use tessera_agent::fs::{self as tfs, ChunkReader, Data, MountOptions, Mounted};

const MIB: usize = 1 << 20;

/// A [`ChunkReader`] over a local image dir, with faults to inject.
struct ImageReader {
    bootstrap: Arc<Bootstrap>,
    blobs: LocalBlobs,
    /// This chunk takes this long to read.
    slow: Option<(u32, Duration)>,
    /// Set when the slow chunk's read has begun.
    slow_started: AtomicBool,
    /// This chunk cannot be had.
    failing: Option<u32>,
}

impl ImageReader {
    fn new(image: &Path, bootstrap: &Arc<Bootstrap>) -> Self {
        ImageReader {
            bootstrap: bootstrap.clone(),
            blobs: LocalBlobs::new(image),
            slow: None,
            slow_started: AtomicBool::new(false),
            failing: None,
        }
    }
}

impl ChunkReader for ImageReader {
    fn read_chunk(&self, chunk: u32, within: Range<u32>) -> io::Result<Data> {
        if self.failing == Some(chunk) {
            return Err(io::Error::other("injected failure"));
        }
        if let Some((slow, delay)) = self.slow {
            if slow == chunk {
                self.slow_started.store(true, Ordering::SeqCst);
                std::thread::sleep(delay);
            }
        }
        let info = self.bootstrap.chunk(chunk).map_err(io::Error::other)?;
        let bytes = self
            .blobs
            .read_chunk(&self.bootstrap, &info)
            .map_err(io::Error::other)?;
        Ok(Data::part_of(
            Arc::new(bytes),
            within.start as usize..within.end as usize,
        ))
    }
}

/// Builds `src` into `out` with `tessera build --dir` and opens its bootstrap.
fn build_image(src: &Path, out: &Path, extra: &[&str]) -> Arc<Bootstrap> {
    let mut args = vec!["--dir", s(src)];
    args.extend_from_slice(extra);
    build(out, &args);
    Arc::new(Bootstrap::open(&out.join("bootstrap")).unwrap())
}

fn mount(bootstrap: &Arc<Bootstrap>, reader: Arc<ImageReader>, mountpoint: &Path) -> Mounted {
    fs::create_dir_all(mountpoint).unwrap();
    let opts = MountOptions {
        fsname: "tessera:test".into(),
        workers: 16,
        ..MountOptions::default()
    };
    tfs::mount(bootstrap.clone(), reader, mountpoint, &opts).unwrap()
}

/// The line of `/proc/self/mountinfo` for a mount at `path`, if any.
fn mountinfo_line(path: &Path) -> Option<String> {
    let path = path.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(s(&path)))
        .map(str::to_string)
}

/// The mount point is an ordinary empty directory again.
fn assert_unmounted(path: &Path) {
    assert_eq!(
        mountinfo_line(path),
        None,
        "{} is still mounted",
        path.display()
    );
    assert!(fs::metadata(path).unwrap().is_dir());
    assert_eq!(fs::read_dir(path).unwrap().count(), 0);
}

fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
}

/// SplitMix64 bytes: varied, reproducible, incompressible.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes `files` (name → content) into a new directory `dir`.
fn write_tree(dir: &Path, files: &BTreeMap<&str, Vec<u8>>) {
    fs::create_dir_all(dir).unwrap();
    for (name, content) in files {
        fs::write(dir.join(name), content).unwrap();
    }
}

/// The pieces' chunk indexes of the file at `path` in the image.
fn chunks_of(bootstrap: &Bootstrap, path: &str) -> Vec<Option<u32>> {
    let inode = bootstrap.resolve(path.as_bytes()).unwrap().unwrap();
    let pieces = bootstrap.file_chunks(&inode).unwrap();
    pieces.iter().map(|p| p.chunk).collect()
}

/// Opens a file bypassing the page cache, so every read is a FUSE read.
fn open_direct(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .unwrap()
}

/// Reads up to `len` bytes at `offset`, as many as there are.
fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

fn expected_range(content: &[u8], offset: usize, len: usize) -> &[u8] {
    let start = offset.min(content.len());
    &content[start..(offset + len).min(content.len())]
}

/// Whether a line of `diff -r` is "File A is a T while file B is a T" with one type T.
fn same_type_special(line: &str) -> bool {
    let Some(kind) = line.rsplit_once(" is a ").map(|(_, kind)| kind) else {
        return false;
    };
    line.starts_with("File ") && line.contains(&format!(" is a {kind} while file "))
}

/// Every file type and every piece of metadata the tree generator makes (devices,
/// fifos, sockets, symlinks, hardlinks, sparse files, xattrs, odd modes and owners,
/// nanosecond mtimes, odd names) reads back through the mount exactly as it went in.
#[test]
fn every_file_type_and_all_metadata_read_back_exactly() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    generate_tree(&src, &TreeSpec::default()).unwrap();
    let img = t.path().join("img");
    let bootstrap = build_image(&src, &img, &[]);
    let reader = Arc::new(ImageReader::new(&img, &bootstrap));
    let mp = t.path().join("mnt");
    let mounted = mount(&bootstrap, reader, &mp);

    assert_trees_equal(&src, &mp, &CompareOptions::default());

    let out = std::process::Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&src)
        .arg(&mp)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // GNU diff cannot compare special files and names each pair, even of one type.
    let differences: Vec<&str> = stdout.lines().filter(|l| !same_type_special(l)).collect();
    assert!(differences.is_empty(), "diff -r: {differences:#?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let stats: BTreeMap<_, _> = mounted.stats().snapshot().into_iter().collect();
    assert!(stats["reads"] > 0 && stats["read_bytes"] > 0, "{stats:?}");
    assert_eq!(stats["errors"], 0, "{stats:?}");
}

/// Large directories list completely, inode numbers are the bootstrap's (hardlinks
/// share one), `.` and `..` are right, misses are cached, statfs and the mount table describe the image, the xattr size
/// probe works, pre-1970 nanosecond mtimes survive and sparse files look sparse.
#[test]
fn inodes_statfs_xattrs_and_times_are_faithful() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let spec = TreeSpec {
        files: 30,
        large_file_bytes: MIB as u64,
        ..TreeSpec::default()
    };
    generate_tree(&src, &spec).unwrap();
    let old = src.join("before-1970");
    fs::write(&old, b"old").unwrap();
    let time = rustix::fs::Timespec {
        tv_sec: -2,
        tv_nsec: 500_000_000,
    };
    let times = rustix::fs::Timestamps {
        last_access: time,
        last_modification: time,
    };
    rustix::fs::utimensat(rustix::fs::CWD, &old, &times, rustix::fs::AtFlags::empty()).unwrap();
    // More entries than one readdir reply holds.
    let many: Vec<String> = (0..600)
        .map(|i| format!("entry-with-a-longish-name-{i:04}"))
        .collect();
    fs::create_dir(src.join("many")).unwrap();
    for name in &many {
        fs::write(src.join("many").join(name), name).unwrap();
    }
    let img = t.path().join("img");
    let bootstrap = build_image(&src, &img, &[]);
    let reader = Arc::new(ImageReader::new(&img, &bootstrap));
    let mp = t.path().join("mnt");
    let mounted = mount(&bootstrap, reader, &mp);

    let mut listed: Vec<String> = fs::read_dir(mp.join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, many);

    // Every path's st_ino is its bootstrap inode number.
    let mut pending = vec![PathBuf::new()];
    let mut inodes = std::collections::HashSet::new();
    while let Some(rel) = pending.pop() {
        let meta = fs::symlink_metadata(mp.join(&rel)).unwrap();
        let inode = bootstrap
            .resolve(rel.as_os_str().as_encoded_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(meta.ino(), u64::from(inode.ino), "{}", rel.display());
        assert_eq!(meta.nlink(), u64::from(inode.nlink), "{}", rel.display());
        if meta.is_dir() {
            for e in fs::read_dir(mp.join(&rel)).unwrap() {
                pending.push(rel.join(e.unwrap().file_name()));
            }
        }
        inodes.insert(meta.ino());
    }
    assert_eq!(inodes.len(), bootstrap.inode_count() as usize);
    assert_eq!(fs::metadata(&mp).unwrap().ino(), 1);

    let deep: PathBuf = (0..=10).map(|i| format!("level-{i:02}")).collect();
    let names = [
        mp.join("hard/original"),
        mp.join("names/hardlink second name"),
        mp.join("deep").join(deep).join("hardlink third"),
    ];
    let inos: Vec<u64> = names
        .iter()
        .map(|p| fs::metadata(p).unwrap().ino())
        .collect();
    assert!(inos.iter().all(|&i| i == inos[0]), "{inos:?}");
    assert_eq!(fs::metadata(&names[1]).unwrap().nlink(), 3);

    // `.` and `..` as readdir returns them.
    let dir = File::open(mp.join("deep/level-00")).unwrap();
    let dots: BTreeMap<String, u64> = rustix::fs::Dir::read_from(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.ino()))
        .filter(|(name, _)| name.starts_with('.'))
        .collect();
    let ino = |p: &str| fs::metadata(mp.join(p)).unwrap().ino();
    assert_eq!(dots["."], ino("deep/level-00"));
    assert_eq!(dots[".."], ino("deep"));

    // A miss asks the filesystem once; the kernel then remembers it.
    let lookups = || mounted.stats().lookups.load(Ordering::Relaxed);
    let before = lookups();
    for _ in 0..3 {
        let e = fs::metadata(mp.join("no-such-name")).unwrap_err();
        assert_eq!(errno(&e), Some(Errno::NOENT.raw_os_error()));
    }
    assert_eq!(lookups(), before + 1);

    // A directory is listed by the filesystem once; the kernel keeps the listing.
    let readdirs = || mounted.stats().readdirs.load(Ordering::Relaxed);
    let list = || {
        let mut names: Vec<_> = fs::read_dir(mp.join("deep"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let first = list();
    let before = readdirs();
    assert_eq!(list(), first);
    assert_eq!(
        readdirs(),
        before,
        "the second listing came from the kernel's cache"
    );

    let vfs = rustix::fs::statvfs(&mp).unwrap();
    assert_eq!(vfs.f_files, u64::from(bootstrap.inode_count()));
    assert_eq!((vfs.f_bfree, vfs.f_ffree, vfs.f_namemax), (0, 0, 255));
    assert!(
        vfs.f_blocks * vfs.f_frsize >= MIB as u64,
        "{}",
        vfs.f_blocks
    );
    assert!(vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY));
    let line = mountinfo_line(&mp).unwrap();
    let (options, fs_part) = line.split_once(" - ").unwrap();
    assert!(fs_part.starts_with("fuse.tessera tessera:test "), "{line}");
    let options = options.split(' ').nth(5).unwrap();
    for want in ["ro", "nosuid", "nodev", "noatime"] {
        assert!(options.split(',').any(|o| o == want), "{line}");
    }

    // getxattr/listxattr size probes: 0 asks the size, too small is ERANGE.
    let file = mp.join("xattrs/file");
    assert_eq!(rustix::fs::getxattr_query(&file, "user.text"), Ok(5));
    let mut small = [0u8; 4];
    assert_eq!(
        rustix::fs::getxattr(&file, "user.text", &mut small[..]),
        Err(Errno::RANGE)
    );
    let mut buf = [0u8; 64];
    assert_eq!(
        rustix::fs::getxattr(&file, "user.text", &mut buf[..]),
        Ok(5)
    );
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(
        rustix::fs::getxattr(&file, "user.empty", &mut buf[..]),
        Ok(0)
    );
    assert_eq!(
        rustix::fs::getxattr(&file, "user.missing", &mut buf[..]),
        Err(Errno::NODATA)
    );
    let size = rustix::fs::listxattr_query(&file).unwrap();
    assert_eq!(
        rustix::fs::listxattr(&file, &mut vec![0u8; size - 1][..]),
        Err(Errno::RANGE)
    );
    let mut list = vec![0u8; size];
    assert_eq!(rustix::fs::listxattr(&file, &mut list[..]), Ok(size));
    let names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
    assert!(names.contains(&&b"user.binary"[..]), "{names:?}");
    assert!(names.contains(&&b"trusted.tessera"[..]), "{names:?}");
    let mut value = [0u8; 8];
    let link = mp.join("xattrs/link");
    assert_eq!(
        rustix::fs::lgetxattr(&link, "trusted.link", &mut value[..]),
        Ok(4)
    );
    assert_eq!(&value[..4], &[0, 1, 0xff, 0]);

    let old = fs::metadata(mp.join("before-1970")).unwrap();
    assert_eq!((old.mtime(), old.mtime_nsec()), (-2, 500_000_000));

    let blocks = |p: &str| fs::metadata(mp.join(p)).unwrap().blocks();
    assert_eq!(blocks("sparse/all-hole.img"), 0);
    let islands = fs::metadata(mp.join("sparse/islands.img")).unwrap();
    assert!(islands.blocks() * 512 < islands.size(), "{islands:?}");
    assert_eq!(blocks("data/exactly-1mib"), (MIB / 512) as u64);
}

/// The files the read tests use: sizes around page and chunk boundaries, a hole.
fn read_test_files() -> BTreeMap<&'static str, Vec<u8>> {
    let mut files = BTreeMap::new();
    for (i, (name, len)) in [
        ("empty", 0),
        ("one", 1),
        ("page", 4096),
        ("odd", 65_537),
        ("two-chunks", 2 * 65_536),
        ("multi", 3 * MIB + 17),
        ("big", 5 * MIB - 1),
        ("slow.bin", MIB),
    ]
    .into_iter()
    .enumerate()
    {
        files.insert(name, random_bytes(i as u64 + 1, len));
    }
    // A hole in the middle: 64 KiB pieces of zeros become holes.
    let mut holey = random_bytes(99, 1_000_000);
    holey[200_000..700_000].fill(0);
    files.insert("holey", holey);
    files
}

/// 32 threads reading whole files and random ranges (through the page cache and
/// around it) all get the right bytes; a read stuck on a slow chunk holds up no
/// other file.
#[test]
fn concurrent_reads_are_correct_and_a_slow_chunk_blocks_no_other_file() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let files = Arc::new(read_test_files());
    write_tree(&src, &files);
    let img = t.path().join("img");
    let bootstrap = build_image(&src, &img, &["--chunk-size", "64K"]);
    assert!(
        chunks_of(&bootstrap, "holey").contains(&None),
        "the zeros became a hole"
    );
    let slow_chunk = chunks_of(&bootstrap, "slow.bin")[0].unwrap();
    let mut reader = ImageReader::new(&img, &bootstrap);
    reader.slow = Some((slow_chunk, Duration::from_secs(2)));
    let reader = Arc::new(reader);
    let mp = t.path().join("mnt");
    let _mounted = mount(&bootstrap, reader.clone(), &mp);

    // A reader stuck on the slow chunk...
    let slow_path = mp.join("slow.bin");
    let started = Instant::now();
    let slow = std::thread::spawn(move || (fs::read(slow_path), started.elapsed()));
    while !reader.slow_started.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "slow read never began"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // ...does not hold up reads of other files, which go to FUSE every time.
    let others = Instant::now();
    for (name, content) in files.iter().filter(|(n, _)| **n != "slow.bin") {
        let file = open_direct(&mp.join(name));
        assert_eq!(
            read_at(&file, 0, 256 * 1024).unwrap(),
            expected_range(content, 0, 256 * 1024)
        );
    }
    let others = others.elapsed();
    assert!(
        !slow.is_finished(),
        "the slow read ended before the others were done"
    );
    assert!(
        others < Duration::from_millis(1500),
        "other reads took {others:?}"
    );
    let (slow_result, slow_took) = slow.join().unwrap();
    assert_eq!(slow_result.unwrap(), files["slow.bin"]);
    assert!(slow_took >= Duration::from_secs(2), "{slow_took:?}");

    let workers: Vec<_> = (0..32u64)
        .map(|thread| {
            let (files, mp) = (files.clone(), mp.clone());
            std::thread::spawn(move || {
                let names: Vec<&str> = files.keys().copied().collect();
                let mut rng = random_bytes(1000 + thread, 40 * 4 * 8).into_iter();
                let mut next = || u64::from_le_bytes(std::array::from_fn(|_| rng.next().unwrap()));
                for _ in 0..40 {
                    let name = names[next() as usize % names.len()];
                    let content = &files[name];
                    let path = mp.join(name);
                    match next() % 4 {
                        0 => assert_eq!(&fs::read(&path).unwrap(), content, "{name}"),
                        how => {
                            let offset = (next() % (content.len() as u64 + 100)) as usize;
                            let len = 1 + (next() % 300_000) as usize;
                            let file = if how == 1 {
                                open_direct(&path)
                            } else {
                                File::open(&path).unwrap()
                            };
                            let got = read_at(&file, offset as u64, len).unwrap();
                            assert!(
                                got == expected_range(content, offset, len),
                                "{name} [{offset}, +{len}) differs"
                            );
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

/// A chunk that cannot be had fails the reads that need it with EIO and nothing else.
#[test]
fn a_failed_chunk_is_eio_for_its_range_only() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let files = read_test_files();
    write_tree(&src, &files);
    let img = t.path().join("img");
    // 1 MiB chunks: the kernel's readahead (128 KiB) from a good chunk never reaches
    // into the failing one.
    let bootstrap = build_image(&src, &img, &[]);
    let bad = chunks_of(&bootstrap, "multi")[1].unwrap();
    let mut reader = ImageReader::new(&img, &bootstrap);
    reader.failing = Some(bad);
    let mp = t.path().join("mnt");
    let mounted = mount(&bootstrap, Arc::new(reader), &mp);

    let content = &files["multi"];
    for file in [
        File::open(mp.join("multi")).unwrap(),
        open_direct(&mp.join("multi")),
    ] {
        assert_eq!(read_at(&file, 0, 4096).unwrap(), content[..4096]);
        let e = read_at(&file, MIB as u64 + 10, 4096).unwrap_err();
        assert_eq!(errno(&e), Some(Errno::IO.raw_os_error()), "{e}");
        let after = read_at(&file, 2 * MIB as u64, 4096).unwrap();
        assert_eq!(after, content[2 * MIB..2 * MIB + 4096]);
    }
    let e = fs::read(mp.join("multi")).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::IO.raw_os_error()), "{e}");
    for name in ["big", "odd", "holey"] {
        assert_eq!(&fs::read(mp.join(name)).unwrap(), &files[name], "{name}");
    }
    assert!(mounted.stats().errors.load(Ordering::Relaxed) >= 1);
}

/// Nothing can change the image: every kind of write is EROFS.
#[test]
fn every_write_is_erofs() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_tree(&src, &BTreeMap::from([("file", b"content".to_vec())]));
    fs::create_dir(src.join("dir")).unwrap();
    let img = t.path().join("img");
    let bootstrap = build_image(&src, &img, &[]);
    let mp = t.path().join("mnt");
    let _mounted = mount(
        &bootstrap,
        Arc::new(ImageReader::new(&img, &bootstrap)),
        &mp,
    );

    let file = mp.join("file");
    let attempts: Vec<(&str, io::Result<()>)> = vec![
        ("create", File::create(mp.join("new")).map(drop)),
        (
            "open for writing",
            OpenOptions::new().write(true).open(&file).map(drop),
        ),
        (
            "append",
            OpenOptions::new().append(true).open(&file).map(drop),
        ),
        (
            "truncate",
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&file)
                .map(drop),
        ),
        (
            "chmod",
            fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)),
        ),
        ("chown", std::os::unix::fs::chown(&file, Some(1), Some(1))),
        ("setxattr", xattr::set(&file, "user.new", b"v")),
        ("removexattr", xattr::remove(mp.join("dir"), "user.none")),
        ("mkdir", fs::create_dir(mp.join("newdir"))),
        ("unlink", fs::remove_file(&file)),
        ("rmdir", fs::remove_dir(mp.join("dir"))),
        ("rename", fs::rename(&file, mp.join("renamed"))),
        ("link", fs::hard_link(&file, mp.join("linked"))),
        (
            "symlink",
            std::os::unix::fs::symlink("file", mp.join("sym")),
        ),
        (
            "utimes",
            File::open(&file).and_then(|f| f.set_modified(std::time::SystemTime::now())),
        ),
        (
            "access(W_OK)",
            rustix::fs::access(&file, rustix::fs::Access::WRITE_OK).map_err(io::Error::from),
        ),
    ];
    for (what, result) in attempts {
        let e = result.expect_err(what);
        assert_eq!(errno(&e), Some(Errno::ROFS.raw_os_error()), "{what}: {e}");
    }
    assert_eq!(fs::read(&file).unwrap(), b"content");
    let mut writer = File::open(&file).unwrap();
    assert!(
        writer.write_all(b"x").is_err(),
        "a read-only handle cannot write"
    );
}

/// Unmounting leaves an ordinary empty directory: explicitly, on drop, on a panic,
/// and when a file is still open (the mount is detached and the open file keeps
/// working). Mount points that are not empty directories are refused.
#[test]
fn unmount_leaves_an_ordinary_empty_directory() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    write_tree(&src, &BTreeMap::from([("file", random_bytes(7, 300_000))]));
    let img = t.path().join("img");
    let bootstrap = build_image(&src, &img, &[]);
    let reader = || Arc::new(ImageReader::new(&img, &bootstrap));
    let mp = t.path().join("mnt");
    let content = fs::read(src.join("file")).unwrap();

    let mounted = mount(&bootstrap, reader(), &mp);
    assert!(mountinfo_line(&mp).is_some());
    assert_eq!(fs::read(mp.join("file")).unwrap(), content);
    mounted.unmount().unwrap();
    assert_unmounted(&mp);

    // The same place again, dropped this time.
    let mounted = mount(&bootstrap, reader(), &mp);
    assert_eq!(fs::read(mp.join("file")).unwrap(), content);
    drop(mounted);
    assert_unmounted(&mp);

    // Busy: detached at once, still serving the file that is open.
    let mounted = mount(&bootstrap, reader(), &mp);
    let open = open_direct(&mp.join("file"));
    mounted.unmount().unwrap();
    assert_unmounted(&mp);
    assert_eq!(read_at(&open, 0, content.len()).unwrap(), content);
    drop(open);

    // A panic while mounted unmounts on the way out.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _mounted = mount(&bootstrap, reader(), &mp);
        assert!(mountinfo_line(&mp).is_some());
        panic!("a test failing while mounted");
    }));
    assert!(panicked.is_err());
    assert_unmounted(&mp);

    // Not a mount point we accept.
    let opts = MountOptions::default();
    let refused = |path: &Path| tfs::mount(bootstrap.clone(), reader(), path, &opts).unwrap_err();
    let e = refused(&src);
    assert!(e.to_string().contains("not an empty directory"), "{e}");
    let e = refused(&src.join("file"));
    assert!(e.to_string().contains("Not a directory"), "{e}");
    let e = refused(&t.path().join("missing"));
    assert!(e.to_string().contains("No such file"), "{e}");
    assert_eq!(mountinfo_line(&src), None);
}
