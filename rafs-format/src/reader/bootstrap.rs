//! A validated, lazily parsed view of a bootstrap.
//!
//! `Bootstrap::from_bytes` checks the superblock and that every table lies inside the
//! bootstrap (O(1) in the number of files); each record is validated when it is read, so
//! mounting an image of 200,000 files costs a read of the file and a checksum, not a
//! parse. `validate_all` checks everything, including the tree's shape, for `check` and
//! `unpack`. No method panics or reads out of bounds on hostile input.

use std::path::Path;

use zerocopy::{FromBytes, Immutable, KnownLayout};

use crate::chunk::{Chunking, Compression, DigestAlgo, MAX_CHUNK_SIZE};
use crate::layout::{
    mode, BlobV1, CheckpointV1, ChunkV1, DirentV1, FileChunkV1, InodeV1, PrefetchV1, SuperblockV1,
    TableRefV1, XattrV1, HOLE, MAGIC, NAME_MAX, PATH_MAX, ROOT_INO, VERSION, XATTR_NAME_MAX,
    XATTR_VALUE_MAX,
};
use crate::{Error, Result};

/// Whether to check the superblock checksum when opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Hash the whole bootstrap and compare with the superblock's checksum.
    Checksum,
    /// Skip it: the caller already verified the bytes (e.g. against the manifest's
    /// sha256), or is a fuzzer exploring the structure checks.
    Trusted,
}

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileKind {
    Directory,
    Regular,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileKind {
    /// From the `S_IFMT` bits of a mode.
    pub fn from_mode(m: u32) -> Option<Self> {
        Some(match m & mode::S_IFMT {
            mode::S_IFDIR => FileKind::Directory,
            mode::S_IFREG => FileKind::Regular,
            mode::S_IFLNK => FileKind::Symlink,
            mode::S_IFCHR => FileKind::CharDevice,
            mode::S_IFBLK => FileKind::BlockDevice,
            mode::S_IFIFO => FileKind::Fifo,
            mode::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Directory => mode::S_IFDIR,
            FileKind::Regular => mode::S_IFREG,
            FileKind::Symlink => mode::S_IFLNK,
            FileKind::CharDevice => mode::S_IFCHR,
            FileKind::BlockDevice => mode::S_IFBLK,
            FileKind::Fifo => mode::S_IFIFO,
            FileKind::Socket => mode::S_IFSOCK,
        }
    }

    /// The one-character type `ls -l` prints.
    pub fn ls_char(self) -> char {
        match self {
            FileKind::Directory => 'd',
            FileKind::Regular => '-',
            FileKind::Symlink => 'l',
            FileKind::CharDevice => 'c',
            FileKind::BlockDevice => 'b',
            FileKind::Fifo => 'p',
            FileKind::Socket => 's',
        }
    }
}

/// A validated inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    pub ino: u32,
    pub kind: FileKind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub parent: u32,
    data_start: u32,
    data_count: u32,
    xattr_start: u32,
    xattr_count: u32,
}

impl Inode {
    /// The full `st_mode`.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm
    }
}

/// A validated directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    pub name: &'a [u8],
    pub ino: u32,
    pub kind: FileKind,
}

/// A validated piece of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileChunk {
    pub file_offset: u64,
    pub len: u32,
    /// Index into the chunk table, or `None` for a hole (zeros, nothing stored).
    pub chunk: Option<u32>,
}

/// A validated chunk-table record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub index: u32,
    pub digest: [u8; 32],
    pub blob_index: u32,
    pub compression: Compression,
    pub compressed_offset: u64,
    pub compressed_size: u32,
    pub uncompressed_size: u32,
    /// For [`Compression::GzipSpan`]: where in the layer's output the chunk starts.
    pub span: Option<SpanStart>,
}

/// Where a span chunk's output starts (format.md §17.3): at `skip` bytes after a
/// checkpoint, or after the layer's start when `checkpoint` is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanStart {
    pub checkpoint: Option<u32>,
    pub skip: u32,
}

/// A validated checkpoint-table record (format.md §17.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub index: u32,
    pub in_bits: u64,
    pub out: u64,
    pub blob_index: u32,
    /// The chunk holding the window, or `None` when the window is all zeros.
    pub window_chunk: Option<u32>,
}

impl CheckpointInfo {
    /// Bytes of output before `out` that the window holds.
    pub fn window_len(&self) -> u32 {
        self.out.min(crate::gzip::WINDOW as u64) as u32
    }
}

/// Largest span a chunk of code 3 may name: a checkpoint's spacing plus a block and a
/// mark, with room for layers compressed in big blocks.
pub const MAX_SPAN_SIZE: u32 = 64 << 20;

/// A validated blob-table record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobInfo {
    pub index: u32,
    /// sha256 of the blob.
    pub digest: [u8; 32],
    pub size: u64,
    pub uncompressed_size: u64,
    pub chunk_count: u32,
}

impl BlobInfo {
    /// Lowercase hex of the digest: the blob's file name under `blobs/`.
    pub fn hex(&self) -> String {
        hex::encode(self.digest)
    }

    /// `sha256:<hex>`, the blob's OCI digest.
    pub fn oci_digest(&self) -> String {
        format!("sha256:{}", self.hex())
    }
}

/// A validated prefetch-list entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchEntry<'a> {
    pub ino: u32,
    pub path: &'a [u8],
}

/// Names a record in errors ("inode[17]"), formatted only when an error is made: record
/// reads are the hot path of lookups and must not allocate.
#[derive(Debug, Clone, Copy)]
struct Loc {
    table: &'static str,
    index: u64,
    inode: Option<u32>,
}

impl Loc {
    fn new(table: &'static str, index: u64) -> Self {
        Loc {
            table,
            index,
            inode: None,
        }
    }
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.table, self.index)?;
        if let Some(ino) = self.inode {
            write!(f, " of inode {ino}")?;
        }
        Ok(())
    }
}

/// A table located and bounds-checked at open time.
#[derive(Debug, Clone, Copy)]
struct Table {
    name: &'static str,
    offset: u64,
    count: u64,
    record_size: u64,
}

/// A bootstrap held in memory, validated lazily.
#[derive(Debug)]
pub struct Bootstrap {
    bytes: Vec<u8>,
    digest_algo: DigestAlgo,
    chunking: Chunking,
    inodes: Table,
    dirents: Table,
    file_chunks: Table,
    chunks: Table,
    blobs: Table,
    xattrs: Table,
    prefetch: Table,
    strings: Table,
    /// Empty (count 0) unless the bootstrap is an index of gzip layers.
    checkpoints: Table,
}

const SUPERBLOCK_SIZE: u64 = size_of::<SuperblockV1>() as u64;
/// Byte range of `SuperblockV1::checksum`.
pub(crate) const CHECKSUM_RANGE: std::ops::Range<usize> = 16..48;

/// Computes the bootstrap checksum: BLAKE3 over the bytes with the checksum field zeroed.
pub(crate) fn checksum(bytes: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&bytes[..CHECKSUM_RANGE.start]);
    h.update(&[0u8; 32]);
    h.update(&bytes[CHECKSUM_RANGE.end..]);
    h.finalize().into()
}

impl Bootstrap {
    /// Reads a bootstrap file and verifies its checksum.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("read bootstrap", path, e))?;
        Self::from_bytes(bytes, Verify::Checksum)
    }

    /// Validates the superblock and table bounds of an in-memory bootstrap.
    pub fn from_bytes(bytes: Vec<u8>, verify: Verify) -> Result<Self> {
        let len = bytes.len() as u64;
        let sb = SuperblockV1::read_from_prefix(&bytes)
            .map_err(|_| Error::Truncated {
                what: "superblock".into(),
                start: 0,
                end: SUPERBLOCK_SIZE,
                len,
            })?
            .0;
        if sb.magic != MAGIC {
            return Err(Error::BadMagic {
                found: sb.magic.to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        if sb.version.get() != VERSION {
            return Err(Error::UnsupportedVersion {
                found: sb.version.get(),
                supported: VERSION,
            });
        }
        if sb.bootstrap_size.get() != len {
            return Err(Error::corrupt(
                "superblock",
                "bootstrap_size",
                48,
                sb.bootstrap_size.get(),
                format!("the bootstrap is {len} bytes long (truncated or extended)"),
            ));
        }
        if verify == Verify::Checksum {
            let actual = checksum(&bytes);
            if actual != sb.checksum {
                return Err(Error::ChecksumMismatch {
                    expected: hex::encode(sb.checksum),
                    actual: hex::encode(actual),
                });
            }
        }
        let zero = |field, offset, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(Error::corrupt(
                    "superblock",
                    field,
                    offset,
                    "non-zero",
                    "reserved in version 1, must be zero",
                ))
            }
        };
        zero("flags", 12, sb.flags.get() == 0)?;
        zero("reserved0", 58, sb.reserved0 == [0; 2])?;
        zero("reserved2", 216, sb.reserved2 == [0; 40])?;
        let digest_algo = DigestAlgo::from_byte(sb.digest_algo).ok_or_else(|| {
            Error::corrupt(
                "superblock",
                "digest_algo",
                56,
                sb.digest_algo,
                "expected 1 (sha256) or 2 (blake3)",
            )
        })?;
        let chunking = match sb.chunking {
            1 => Chunking::Fixed {
                size: sb.chunk_size.get(),
            },
            2 => Chunking::Cdc {
                min: sb.cdc_min.get(),
                avg: sb.chunk_size.get(),
                max: sb.cdc_max.get(),
            },
            other => {
                return Err(Error::corrupt(
                    "superblock",
                    "chunking",
                    57,
                    other,
                    "expected 1 (fixed) or 2 (cdc)",
                ))
            }
        };
        let table = |name: &'static str, field_offset: u64, r: TableRefV1, record_size: usize| {
            let t = Table {
                name,
                offset: r.offset.get(),
                count: r.count.get(),
                record_size: record_size as u64,
            };
            let end = t
                .count
                .checked_mul(t.record_size)
                .and_then(|n| n.checked_add(t.offset));
            match end {
                Some(end) if t.offset >= SUPERBLOCK_SIZE && end <= len => Ok(t),
                Some(end) if t.offset >= SUPERBLOCK_SIZE => Err(Error::Truncated {
                    what: format!("{name} table ({} records)", t.count),
                    start: t.offset,
                    end,
                    len,
                }),
                _ => Err(Error::corrupt(
                    "superblock",
                    name,
                    field_offset,
                    format!("offset {} count {}", t.offset, t.count),
                    "table lies outside the bootstrap",
                )),
            }
        };
        let b = Bootstrap {
            digest_algo,
            chunking,
            inodes: table("inodes", 72, sb.inodes, size_of::<InodeV1>())?,
            dirents: table("dirents", 88, sb.dirents, size_of::<DirentV1>())?,
            file_chunks: table("file_chunks", 104, sb.file_chunks, size_of::<FileChunkV1>())?,
            chunks: table("chunks", 120, sb.chunks, size_of::<ChunkV1>())?,
            blobs: table("blobs", 136, sb.blobs, size_of::<BlobV1>())?,
            xattrs: table("xattrs", 152, sb.xattrs, size_of::<XattrV1>())?,
            prefetch: table("prefetch", 168, sb.prefetch, size_of::<PrefetchV1>())?,
            strings: table("strings", 184, sb.strings, 1)?,
            // All zero: no checkpoint table (a converted image).
            checkpoints: if sb.checkpoints.offset.get() == 0 && sb.checkpoints.count.get() == 0 {
                Table {
                    name: "checkpoints",
                    offset: SUPERBLOCK_SIZE,
                    count: 0,
                    record_size: size_of::<CheckpointV1>() as u64,
                }
            } else {
                table(
                    "checkpoints",
                    200,
                    sb.checkpoints,
                    size_of::<CheckpointV1>(),
                )?
            },
            bytes,
        };
        if b.inodes.count == 0 || b.inodes.count > u64::from(u32::MAX - 1) {
            return Err(Error::corrupt(
                "superblock",
                "inodes",
                80,
                b.inodes.count,
                "an image has between 1 and 2^32-2 inodes",
            ));
        }
        let root = b.inode(ROOT_INO)?;
        if root.kind != FileKind::Directory {
            return Err(Error::corrupt(
                "inode[1]",
                "mode",
                b.inodes.offset,
                format!("{:o}", root.mode()),
                "the root inode must be a directory",
            ));
        }
        Ok(b)
    }

    /// The raw bytes (for hashing or writing out).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn digest_algo(&self) -> DigestAlgo {
        self.digest_algo
    }

    pub fn chunking(&self) -> Chunking {
        self.chunking
    }

    pub fn inode_count(&self) -> u32 {
        self.inodes.count as u32
    }

    pub fn chunk_count(&self) -> u32 {
        self.chunks.count.min(u64::from(u32::MAX)) as u32
    }

    pub fn blob_count(&self) -> u32 {
        self.blobs.count.min(u64::from(u32::MAX)) as u32
    }

    /// Reads record `index` of `table`, returning it and its byte offset.
    fn record<T: FromBytes + KnownLayout + Immutable>(
        &self,
        table: &Table,
        index: u64,
    ) -> Result<(T, u64)> {
        if index >= table.count {
            return Err(Error::corrupt(
                table.name,
                "index",
                table.offset,
                index,
                format!("the table has {} records", table.count),
            ));
        }
        let offset = table.offset + index * table.record_size;
        // In bounds: checked against the bootstrap length when the table was located.
        let start = offset as usize;
        let rec = T::read_from_prefix(&self.bytes[start..])
            .map_err(|_| Error::Truncated {
                what: format!("{}[{index}]", table.name),
                start: offset,
                end: offset + table.record_size,
                len: self.bytes.len() as u64,
            })?
            .0;
        Ok((rec, offset))
    }

    /// `len` bytes of the string table from `offset`.
    fn string(
        &self,
        structure: &dyn std::fmt::Display,
        field: &'static str,
        at: u64,
        offset: u64,
        len: u64,
    ) -> Result<&[u8]> {
        match offset.checked_add(len) {
            Some(end) if end <= self.strings.count => {
                let s = (self.strings.offset + offset) as usize;
                Ok(&self.bytes[s..s + len as usize])
            }
            _ => Err(Error::corrupt(
                structure,
                field,
                at,
                format!("{offset}+{len}"),
                format!("outside the string table ({} bytes)", self.strings.count),
            )),
        }
    }

    fn check_range(
        structure: &dyn std::fmt::Display,
        field: &'static str,
        at: u64,
        start: u32,
        count: u32,
        table: &Table,
    ) -> Result<()> {
        if u64::from(start) + u64::from(count) > table.count {
            return Err(Error::corrupt(
                structure,
                field,
                at,
                format!("{start}+{count}"),
                format!("outside the {} table ({} records)", table.name, table.count),
            ));
        }
        Ok(())
    }

    /// Reads and validates inode `ino` (1-based).
    pub fn inode(&self, ino: u32) -> Result<Inode> {
        let index = u64::from(ino).wrapping_sub(1);
        let (r, at) = self.record::<InodeV1>(&self.inodes, index)?;
        let name = Loc::new("inode", ino.into());
        let kind = FileKind::from_mode(r.mode.get()).ok_or_else(|| {
            Error::corrupt(
                name,
                "mode",
                at,
                format!("{:o}", r.mode.get()),
                "unknown file type",
            )
        })?;
        if r.mode.get() & !(mode::S_IFMT | 0o7777) != 0 {
            return Err(Error::corrupt(
                name,
                "mode",
                at,
                format!("{:o}", r.mode.get()),
                "unknown mode bits",
            ));
        }
        if r.mtime_nsec.get() >= 1_000_000_000 {
            return Err(Error::corrupt(
                name,
                "mtime_nsec",
                at + 32,
                r.mtime_nsec.get(),
                "must be below 10^9",
            ));
        }
        if r.nlink.get() == 0 {
            return Err(Error::corrupt(
                name,
                "nlink",
                at + 12,
                0,
                "must be at least 1",
            ));
        }
        if r.parent.get() == 0 || u64::from(r.parent.get()) > self.inodes.count {
            return Err(Error::corrupt(
                name,
                "parent",
                at + 44,
                r.parent.get(),
                "not an inode number of this image",
            ));
        }
        let (start, count) = (r.data_start.get(), r.data_count.get());
        match kind {
            FileKind::Directory => {
                Self::check_range(&name, "data_start", at + 48, start, count, &self.dirents)?
            }
            FileKind::Regular => Self::check_range(
                &name,
                "data_start",
                at + 48,
                start,
                count,
                &self.file_chunks,
            )?,
            FileKind::Symlink => {
                if count == 0 || u64::from(count) != r.size.get() {
                    return Err(Error::corrupt(
                        name,
                        "data_count",
                        at + 52,
                        count,
                        "a symlink target is non-empty and its length is the inode size",
                    ));
                }
                self.string(&name, "data_start", at + 48, start.into(), count.into())?;
            }
            _ => {
                if start != 0 || count != 0 || r.size.get() != 0 {
                    return Err(Error::corrupt(
                        name,
                        "data_count",
                        at + 52,
                        count,
                        "devices, fifos and sockets have no data",
                    ));
                }
            }
        }
        Self::check_range(
            &name,
            "xattr_start",
            at + 56,
            r.xattr_start.get(),
            r.xattr_count.get(),
            &self.xattrs,
        )?;
        Ok(Inode {
            ino,
            kind,
            perm: r.mode.get() & 0o7777,
            uid: r.uid.get(),
            gid: r.gid.get(),
            nlink: r.nlink.get(),
            size: r.size.get(),
            mtime_sec: r.mtime_sec.get(),
            mtime_nsec: r.mtime_nsec.get(),
            rdev_major: r.rdev_major.get(),
            rdev_minor: r.rdev_minor.get(),
            parent: r.parent.get(),
            data_start: start,
            data_count: count,
            xattr_start: r.xattr_start.get(),
            xattr_count: r.xattr_count.get(),
        })
    }

    /// Reads and validates dirent `index`.
    fn dirent(&self, index: u64) -> Result<DirEntry<'_>> {
        let (r, at) = self.record::<DirentV1>(&self.dirents, index)?;
        let structure = Loc::new("dirent", index);
        let len = r.name_len.get();
        let name = self.string(
            &structure,
            "name_offset",
            at,
            r.name_offset.get().into(),
            len.into(),
        )?;
        if let Err(why) = check_name(name) {
            return Err(Error::corrupt(
                structure,
                "name",
                at,
                String::from_utf8_lossy(name),
                why,
            ));
        }
        if r.ino.get() == 0 || u64::from(r.ino.get()) > self.inodes.count {
            return Err(Error::corrupt(
                structure,
                "ino",
                at + 8,
                r.ino.get(),
                "not an inode number of this image",
            ));
        }
        let kind = (r.kind < 16)
            .then(|| FileKind::from_mode(u32::from(r.kind) << 12))
            .flatten()
            .ok_or_else(|| {
                Error::corrupt(structure, "kind", at + 6, r.kind, "unknown file type")
            })?;
        if r.reserved != 0 || r.reserved2.get() != 0 {
            return Err(Error::corrupt(
                structure,
                "reserved",
                at + 7,
                "non-zero",
                "must be zero",
            ));
        }
        Ok(DirEntry {
            name,
            ino: r.ino.get(),
            kind,
        })
    }

    /// The entries of a directory, in name order (without `.` and `..`).
    pub fn dir_entries<'a>(
        &'a self,
        dir: &Inode,
    ) -> impl Iterator<Item = Result<DirEntry<'a>>> + 'a {
        let (start, count) = if dir.kind == FileKind::Directory {
            (u64::from(dir.data_start), u64::from(dir.data_count))
        } else {
            (0, 0)
        };
        (start..start + count).map(move |i| self.dirent(i))
    }

    /// Number of entries in a directory.
    pub fn dir_len(&self, dir: &Inode) -> u32 {
        if dir.kind == FileKind::Directory {
            dir.data_count
        } else {
            0
        }
    }

    /// The `n`th entry of a directory (for readdir offsets).
    pub fn dir_entry(&self, dir: &Inode, n: u32) -> Result<Option<DirEntry<'_>>> {
        if dir.kind != FileKind::Directory || n >= dir.data_count {
            return Ok(None);
        }
        self.dirent(u64::from(dir.data_start) + u64::from(n))
            .map(Some)
    }

    /// Finds `name` in a directory by binary search.
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<DirEntry<'_>>> {
        if dir.kind != FileKind::Directory {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0u32, dir.data_count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = self.dirent(u64::from(dir.data_start) + u64::from(mid))?;
            match e.name.cmp(name) {
                std::cmp::Ordering::Equal => return Ok(Some(e)),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }

    /// Resolves a `/`-separated path from the root without following symlinks.
    pub fn resolve(&self, path: &[u8]) -> Result<Option<Inode>> {
        let mut cur = self.inode(ROOT_INO)?;
        for comp in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            match self.lookup(&cur, comp)? {
                Some(e) => cur = self.inode(e.ino)?,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The pieces of a regular file, checked to tile `0..size` exactly.
    pub fn file_chunks(&self, file: &Inode) -> Result<Vec<FileChunk>> {
        if file.kind != FileKind::Regular {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(file.data_count as usize);
        let mut expect = 0u64;
        for i in 0..u64::from(file.data_count) {
            let index = u64::from(file.data_start) + i;
            let (r, at) = self.record::<FileChunkV1>(&self.file_chunks, index)?;
            let structure = Loc {
                inode: Some(file.ino),
                ..Loc::new("file_chunk", index)
            };
            if r.file_offset.get() != expect {
                return Err(Error::corrupt(
                    structure,
                    "file_offset",
                    at,
                    r.file_offset.get(),
                    format!("expected {expect}: pieces must be contiguous"),
                ));
            }
            let len = r.len.get();
            if len == 0 || len > MAX_CHUNK_SIZE {
                return Err(Error::corrupt(
                    structure,
                    "len",
                    at + 12,
                    len,
                    format!("must be 1..={MAX_CHUNK_SIZE}"),
                ));
            }
            let chunk = match r.chunk_index.get() {
                HOLE => None,
                c => {
                    let info = self.chunk(c)?;
                    if info.uncompressed_size != len {
                        return Err(Error::corrupt(
                            structure,
                            "len",
                            at + 12,
                            len,
                            format!("chunk {c} holds {} bytes", info.uncompressed_size),
                        ));
                    }
                    Some(c)
                }
            };
            out.push(FileChunk {
                file_offset: expect,
                len,
                chunk,
            });
            expect += u64::from(len);
        }
        if expect != file.size {
            return Err(Error::corrupt(
                format!("inode[{}]", file.ino),
                "size",
                0,
                file.size,
                format!("its pieces cover {expect} bytes"),
            ));
        }
        Ok(out)
    }

    /// Reads and validates chunk `index`.
    pub fn chunk(&self, index: u32) -> Result<ChunkInfo> {
        let (r, at) = self.record::<ChunkV1>(&self.chunks, index.into())?;
        let structure = Loc::new("chunk", index.into());
        let compression = Compression::from_byte(r.compression).ok_or_else(|| {
            Error::corrupt(
                structure,
                "compression",
                at + 36,
                r.compression,
                "expected 0 (none), 1 (zstd) or 2 (gzip)",
            )
        })?;
        let (usize_, csize) = (r.uncompressed_size.get(), r.compressed_size.get());
        if usize_ == 0 || usize_ > MAX_CHUNK_SIZE {
            return Err(Error::corrupt(
                structure,
                "uncompressed_size",
                at + 52,
                usize_,
                format!("must be 1..={MAX_CHUNK_SIZE}"),
            ));
        }
        let max_stored = if compression == Compression::GzipSpan {
            MAX_SPAN_SIZE
        } else {
            MAX_CHUNK_SIZE
        };
        if csize == 0 || (compression == Compression::None && csize != usize_) || csize > max_stored
        {
            return Err(Error::corrupt(
                structure,
                "compressed_size",
                at + 48,
                csize,
                "must be non-zero, at most 16 MiB (64 MiB for a gzip span), and equal to \
                 uncompressed_size when stored raw",
            ));
        }
        let blob = self.blob(r.blob_index.get())?;
        let end = r.compressed_offset.get().checked_add(csize.into());
        if end.is_none_or(|e| e > blob.size) {
            return Err(Error::corrupt(
                structure,
                "compressed_offset",
                at + 40,
                r.compressed_offset.get(),
                format!(
                    "+{csize} runs past the end of blob {} ({} bytes)",
                    r.blob_index.get(),
                    blob.size
                ),
            ));
        }
        if r.reserved != [0; 3] || (compression != Compression::GzipSpan && r.reserved2 != [0; 8]) {
            return Err(Error::corrupt(
                structure,
                "reserved",
                at + 37,
                "non-zero",
                "must be zero",
            ));
        }
        let span = if compression == Compression::GzipSpan {
            let word = |i: usize| {
                u32::from_le_bytes([
                    r.reserved2[i],
                    r.reserved2[i + 1],
                    r.reserved2[i + 2],
                    r.reserved2[i + 3],
                ])
            };
            let (checkpoint, skip) = (word(0), word(4));
            let starts_at = if checkpoint == HOLE {
                0
            } else {
                let cp = self.checkpoint(checkpoint)?;
                if cp.blob_index != r.blob_index.get() {
                    return Err(Error::corrupt(
                        structure,
                        "checkpoint",
                        at + 56,
                        checkpoint,
                        format!(
                            "is in blob {}, the chunk in blob {}",
                            cp.blob_index,
                            r.blob_index.get()
                        ),
                    ));
                }
                cp.in_bits / 8
            };
            if r.compressed_offset.get() != starts_at {
                return Err(Error::corrupt(
                    structure,
                    "compressed_offset",
                    at + 40,
                    r.compressed_offset.get(),
                    format!("a span starts at its checkpoint's byte, {starts_at}"),
                ));
            }
            Some(SpanStart {
                checkpoint: (checkpoint != HOLE).then_some(checkpoint),
                skip,
            })
        } else {
            None
        };
        Ok(ChunkInfo {
            index,
            digest: r.digest,
            blob_index: r.blob_index.get(),
            compression,
            compressed_offset: r.compressed_offset.get(),
            compressed_size: csize,
            uncompressed_size: usize_,
            span,
        })
    }

    pub fn checkpoint_count(&self) -> u32 {
        self.checkpoints.count as u32
    }

    /// Reads and validates checkpoint `index` (format.md §17.2), its window chunk
    /// included.
    pub fn checkpoint(&self, index: u32) -> Result<CheckpointInfo> {
        let (r, at) = self.record::<CheckpointV1>(&self.checkpoints, index.into())?;
        let structure = || format!("checkpoint[{index}]");
        if r.reserved != [0; 8] {
            return Err(Error::corrupt(
                structure(),
                "reserved",
                at + 24,
                "non-zero",
                "must be zero",
            ));
        }
        let out = r.out.get();
        if out == 0 {
            return Err(Error::corrupt(
                structure(),
                "out",
                at + 8,
                0,
                "a checkpoint follows a block's output",
            ));
        }
        let blob = self.blob(r.blob_index.get())?;
        if r.in_bits.get() / 8 >= blob.size {
            return Err(Error::corrupt(
                structure(),
                "in_bits",
                at,
                r.in_bits.get(),
                format!(
                    "lies past the end of blob {} ({} bytes)",
                    blob.index, blob.size
                ),
            ));
        }
        let info = CheckpointInfo {
            index,
            in_bits: r.in_bits.get(),
            out,
            blob_index: blob.index,
            window_chunk: (r.window_chunk.get() != HOLE).then_some(r.window_chunk.get()),
        };
        if let Some(w) = info.window_chunk {
            let (wr, _) = self.record::<ChunkV1>(&self.chunks, w.into())?;
            if wr.compression == Compression::GzipSpan.to_byte()
                || wr.uncompressed_size.get() != info.window_len()
            {
                return Err(Error::corrupt(
                    structure(),
                    "window_chunk",
                    at + 20,
                    w,
                    format!(
                        "must name a chunk of {} bytes that is not itself a span",
                        info.window_len()
                    ),
                ));
            }
        }
        Ok(info)
    }

    /// Reads and validates blob `index`.
    pub fn blob(&self, index: u32) -> Result<BlobInfo> {
        let (r, at) = self.record::<BlobV1>(&self.blobs, index.into())?;
        if r.reserved != [0; 12] {
            return Err(Error::corrupt(
                format!("blob[{index}]"),
                "reserved",
                at + 52,
                "non-zero",
                "must be zero",
            ));
        }
        Ok(BlobInfo {
            index,
            digest: r.digest,
            size: r.size.get(),
            uncompressed_size: r.uncompressed_size.get(),
            chunk_count: r.chunk_count.get(),
        })
    }

    /// All blobs, in table order.
    pub fn blobs(&self) -> Result<Vec<BlobInfo>> {
        (0..self.blob_count()).map(|i| self.blob(i)).collect()
    }

    /// The extended attributes of an inode, sorted by name.
    pub fn xattrs(&self, inode: &Inode) -> Result<Vec<(&[u8], &[u8])>> {
        let mut out = Vec::with_capacity(inode.xattr_count as usize);
        for i in 0..u64::from(inode.xattr_count) {
            let index = u64::from(inode.xattr_start) + i;
            let (r, at) = self.record::<XattrV1>(&self.xattrs, index)?;
            let structure = Loc::new("xattr", index);
            let name = self.string(
                &structure,
                "name_offset",
                at,
                r.name_offset.get().into(),
                r.name_len.get().into(),
            )?;
            let value = self.string(
                &structure,
                "value_offset",
                at + 8,
                r.value_offset.get().into(),
                r.value_len.get().into(),
            )?;
            if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
                return Err(Error::corrupt(
                    structure,
                    "name_len",
                    at + 4,
                    name.len(),
                    "an xattr name is 1..=255 bytes without NUL",
                ));
            }
            if value.len() > XATTR_VALUE_MAX {
                return Err(Error::corrupt(
                    structure,
                    "value_len",
                    at + 12,
                    value.len(),
                    "an xattr value is at most 64 KiB",
                ));
            }
            out.push((name, value));
        }
        Ok(out)
    }

    /// The target of a symlink.
    pub fn symlink_target(&self, inode: &Inode) -> Result<&[u8]> {
        if inode.kind != FileKind::Symlink {
            return Ok(&[]);
        }
        self.string(
            &Loc::new("inode", inode.ino.into()),
            "data_start",
            0,
            inode.data_start.into(),
            inode.data_count.into(),
        )
    }

    /// The prefetch list, in the order files should be fetched.
    pub fn prefetch(&self) -> Result<Vec<PrefetchEntry<'_>>> {
        let mut out = Vec::new();
        for index in 0..self.prefetch.count {
            let (r, at) = self.record::<PrefetchV1>(&self.prefetch, index)?;
            let structure = Loc::new("prefetch", index);
            if r.ino.get() == 0 || u64::from(r.ino.get()) > self.inodes.count {
                return Err(Error::corrupt(
                    structure,
                    "ino",
                    at,
                    r.ino.get(),
                    "not an inode number of this image",
                ));
            }
            if r.reserved.get() != 0 {
                return Err(Error::corrupt(
                    structure,
                    "reserved",
                    at + 12,
                    r.reserved.get(),
                    "must be zero",
                ));
            }
            let path = self.string(
                &structure,
                "path_offset",
                at + 4,
                r.path_offset.get().into(),
                r.path_len.get().into(),
            )?;
            out.push(PrefetchEntry {
                ino: r.ino.get(),
                path,
            });
        }
        Ok(out)
    }

    /// Validates every record and the shape of the tree: every inode reachable from the
    /// root exactly as its link count says, directories forming a tree (no cycles), each
    /// directory's names strictly sorted, dirent kinds matching their inodes, every file's
    /// pieces tiling it, every chunk inside its blob.
    pub fn validate_all(&self) -> Result<()> {
        self.validate_range_order()?;
        let n = self.inodes.count as usize;
        let mut links = vec![0u32; n + 1];
        let mut seen_dir = vec![false; n + 1];
        // Length of each directory's path from the root, to bound paths at PATH_MAX.
        let mut path_len = vec![0u32; n + 1];
        seen_dir[ROOT_INO as usize] = true;
        let mut stack = vec![ROOT_INO];
        while let Some(dir_ino) = stack.pop() {
            let dir = self.inode(dir_ino)?;
            let dir_path_len = path_len[dir_ino as usize];
            let mut subdirs = 0u32;
            let mut prev: Option<&[u8]> = None;
            for e in self.dir_entries(&dir) {
                let e = e?;
                if prev.is_some_and(|p| p >= e.name) {
                    return Err(Error::corrupt(
                        format!("directory inode {dir_ino}"),
                        "dirents",
                        0,
                        String::from_utf8_lossy(e.name),
                        "entries are not strictly sorted by name",
                    ));
                }
                prev = Some(e.name);
                let len = dir_path_len + 1 + e.name.len() as u32;
                if len > PATH_MAX {
                    return Err(Error::corrupt(
                        format!(
                            "entry {:?} of inode {dir_ino}",
                            String::from_utf8_lossy(e.name)
                        ),
                        "name",
                        0,
                        len,
                        format!("its path is longer than {PATH_MAX} bytes"),
                    ));
                }
                let target = self.inode(e.ino)?;
                if target.kind != e.kind {
                    return Err(Error::corrupt(
                        format!(
                            "entry {:?} of inode {dir_ino}",
                            String::from_utf8_lossy(e.name)
                        ),
                        "kind",
                        0,
                        format!("{:?}", e.kind),
                        format!("inode {} is a {:?}", e.ino, target.kind),
                    ));
                }
                if target.kind == FileKind::Directory {
                    if seen_dir[e.ino as usize] {
                        return Err(Error::corrupt(
                            format!(
                                "entry {:?} of inode {dir_ino}",
                                String::from_utf8_lossy(e.name)
                            ),
                            "ino",
                            0,
                            e.ino,
                            "a directory is named twice (or the tree has a cycle)",
                        ));
                    }
                    if target.parent != dir_ino {
                        return Err(Error::corrupt(
                            format!("inode[{}]", e.ino),
                            "parent",
                            0,
                            target.parent,
                            format!("it is an entry of directory {dir_ino}"),
                        ));
                    }
                    seen_dir[e.ino as usize] = true;
                    path_len[e.ino as usize] = len;
                    subdirs += 1;
                    stack.push(e.ino);
                } else {
                    links[e.ino as usize] += 1;
                }
            }
            if dir.nlink != 2 + subdirs {
                return Err(Error::corrupt(
                    format!("inode[{dir_ino}]"),
                    "nlink",
                    0,
                    dir.nlink,
                    format!(
                        "a directory with {subdirs} subdirectories has {} links",
                        2 + subdirs
                    ),
                ));
            }
        }
        for ino in 1..=n as u32 {
            let inode = self.inode(ino)?;
            let xattrs = self.xattrs(&inode)?;
            if xattrs.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(Error::corrupt(
                    format!("inode[{ino}]"),
                    "xattr_start",
                    0,
                    inode.xattr_start,
                    "xattrs are not strictly sorted by name",
                ));
            }
            if inode.kind == FileKind::Directory {
                if !seen_dir[ino as usize] {
                    return Err(Error::corrupt(
                        format!("inode[{ino}]"),
                        "parent",
                        0,
                        inode.parent,
                        "directory is not reachable from the root",
                    ));
                }
                continue;
            }
            if links[ino as usize] != inode.nlink {
                return Err(Error::corrupt(
                    format!("inode[{ino}]"),
                    "nlink",
                    0,
                    inode.nlink,
                    format!("{} entries name it", links[ino as usize]),
                ));
            }
            self.file_chunks(&inode)?;
            self.symlink_target(&inode)?;
        }
        for c in 0..self.checkpoint_count() {
            self.checkpoint(c)?;
        }
        for c in 0..self.chunk_count() {
            self.chunk(c)?;
        }
        self.blobs()?;
        for p in self.prefetch()? {
            let found = self.resolve(p.path)?;
            if found.map(|i| i.ino) != Some(p.ino) {
                return Err(Error::corrupt(
                    "prefetch",
                    "ino",
                    0,
                    p.ino,
                    format!(
                        "path {:?} does not name it",
                        String::from_utf8_lossy(p.path)
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Bootstrap {
    /// Requires every inode's dirent, file-chunk and xattr ranges to follow the previous
    /// inode's in each table (as writers lay them out). Without this, many inodes could
    /// share one large range and whole-image validation would take quadratic time.
    fn validate_range_order(&self) -> Result<()> {
        let (mut dirents_end, mut chunks_end, mut xattrs_end) = (0u64, 0u64, 0u64);
        for ino in 1..=self.inode_count() {
            let inode = self.inode(ino)?;
            let follow = |end: &mut u64, start: u32, count: u32, field| {
                if u64::from(start) < *end && count > 0 {
                    return Err(Error::corrupt(
                        Loc::new("inode", ino.into()),
                        field,
                        0,
                        start,
                        format!("ranges must not overlap: the previous inode's ends at {end}"),
                    ));
                }
                *end = (*end).max(u64::from(start) + u64::from(count));
                Ok(())
            };
            match inode.kind {
                FileKind::Directory => follow(
                    &mut dirents_end,
                    inode.data_start,
                    inode.data_count,
                    "data_start",
                )?,
                FileKind::Regular => follow(
                    &mut chunks_end,
                    inode.data_start,
                    inode.data_count,
                    "data_start",
                )?,
                _ => {}
            }
            follow(
                &mut xattrs_end,
                inode.xattr_start,
                inode.xattr_count,
                "xattr_start",
            )?;
        }
        Ok(())
    }
}

/// Why a directory-entry name is not allowed, if it is not.
pub(crate) fn check_name(name: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err("a name is 1..=255 bytes");
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err("a name contains neither '/' nor NUL");
    }
    if name == b"." || name == b".." {
        return Err("'.' and '..' are not stored");
    }
    Ok(())
}
