//! On-disk layout of the bootstrap, format version 1 (docs/format.md is the
//! specification; this module is its transcription).
//!
//! Every structure is a fixed-size little-endian record read in place with `zerocopy`
//! (unaligned integer types, so no alignment requirement and no `unsafe`). Tables are
//! arrays of such records located by the superblock, which is what lets a reader mount an
//! image of hundreds of thousands of files by validating only the superblock up front and
//! each record when it is first used.
//!
//! The types here carry the version in their names (`SuperblockV1`, `InodeV1`, …) and are
//! kept apart from the validated in-memory views in `reader`.

use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// First eight bytes of every bootstrap.
pub const MAGIC: [u8; 8] = *b"TESSRAFS";
/// The format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Inode number of the root directory (also FUSE's root inode number).
pub const ROOT_INO: u32 = 1;
/// `FileChunkV1::chunk_index` value of a hole: `len` zero bytes with no stored data.
pub const HOLE: u32 = u32::MAX;
/// Longest path (from the root, without the leading `/`) an image may hold, as Linux's
/// PATH_MAX; it also bounds the depth of the tree.
pub const PATH_MAX: u32 = 4096;
/// Longest xattr name and value, as Linux's XATTR_NAME_MAX and XATTR_SIZE_MAX.
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_VALUE_MAX: usize = 65536;
/// Longest file name (one path component) the format allows, as Linux's NAME_MAX.
pub const NAME_MAX: usize = 255;

/// A table's place in the bootstrap: `count` records starting at byte `offset`.
/// For the string table `count` is a number of bytes.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct TableRefV1 {
    pub offset: U64,
    pub count: U64,
}

/// The superblock: the first 256 bytes of a bootstrap.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct SuperblockV1 {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: U32,
    /// No flags are defined in version 1; must be zero.
    pub flags: U32,
    /// BLAKE3 of the whole bootstrap with these 32 bytes set to zero.
    pub checksum: [u8; 32],
    /// Length of the whole bootstrap in bytes; catches truncation and appended junk.
    pub bootstrap_size: U64,
    /// Chunk digest algorithm: 1 = sha256, 2 = blake3.
    pub digest_algo: u8,
    /// How files were cut into chunks: 1 = fixed size, 2 = FastCDC. Informational
    /// (readers never need it); kept so a chunk dictionary can be judged compatible.
    pub chunking: u8,
    pub reserved0: [u8; 2],
    /// Fixed chunk size, or FastCDC's average size.
    pub chunk_size: U32,
    /// FastCDC minimum chunk size (0 for fixed chunking).
    pub cdc_min: U32,
    /// FastCDC maximum chunk size (0 for fixed chunking).
    pub cdc_max: U32,
    pub inodes: TableRefV1,
    pub dirents: TableRefV1,
    pub file_chunks: TableRefV1,
    pub chunks: TableRefV1,
    pub blobs: TableRefV1,
    pub xattrs: TableRefV1,
    pub prefetch: TableRefV1,
    pub strings: TableRefV1,
    /// Checkpoints in gzip layers, for an index of an unconverted image (format.md
    /// §17.2); all zero when absent, as in every converted image.
    pub checkpoints: TableRefV1,
    pub reserved2: [u8; 40],
}

/// One inode. Inode number `n` is record `n - 1`.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct InodeV1 {
    /// `st_mode`: file type bits (`S_IFMT`) and permission bits (`0o7777`).
    pub mode: U32,
    pub uid: U32,
    pub gid: U32,
    /// Number of directory entries naming this inode (2 + subdirectories for a directory).
    pub nlink: U32,
    /// File size in bytes (regular files, symlinks: target length; 0 for the rest).
    pub size: U64,
    pub mtime_sec: I64,
    pub mtime_nsec: U32,
    pub rdev_major: U32,
    pub rdev_minor: U32,
    /// Inode number of the directory holding the first entry naming this inode.
    pub parent: U32,
    /// Directory: first dirent index; regular file: first file-chunk index;
    /// symlink: offset of the target in the string table; others: 0.
    pub data_start: U32,
    /// Directory: number of dirents; regular file: number of file chunks;
    /// symlink: target length in bytes; others: 0.
    pub data_count: U32,
    /// First xattr record index.
    pub xattr_start: U32,
    /// Number of xattr records.
    pub xattr_count: U32,
}

/// One directory entry. A directory's entries are contiguous, sorted by name bytes.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct DirentV1 {
    /// Offset of the name in the string table.
    pub name_offset: U32,
    /// Name length in bytes, 1..=255.
    pub name_len: U16,
    /// File type of the target inode, as in `InodeV1::mode >> 12` (so `d_type` for
    /// readdir needs no inode read).
    pub kind: u8,
    pub reserved: u8,
    pub ino: U32,
    pub reserved2: U32,
}

/// One piece of a regular file: `len` bytes at `file_offset` come from chunk
/// `chunk_index`, or are zeros if it is [`HOLE`]. A file's pieces are contiguous and
/// in order, so a read at offset `x` finds its piece by binary search.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct FileChunkV1 {
    pub file_offset: U64,
    pub chunk_index: U32,
    pub len: U32,
}

/// One unique chunk.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct ChunkV1 {
    /// Digest of the uncompressed bytes (algorithm from the superblock).
    pub digest: [u8; 32],
    /// Index into the blob table.
    pub blob_index: U32,
    /// 0 = none, 1 = zstd, 2 = gzip, 3 = a span of a gzip layer.
    pub compression: u8,
    pub reserved: [u8; 3],
    /// Where the stored (compressed) bytes start in the blob.
    pub compressed_offset: U64,
    pub compressed_size: U32,
    pub uncompressed_size: U32,
    /// Zero, except for a span of a gzip layer: its checkpoint (u32, [`HOLE`] for the
    /// layer's start) and the output bytes to skip after it (u32).
    pub reserved2: [u8; 8],
}

/// Where decoding of a gzip layer can start in the middle (format.md §17.2).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct CheckpointV1 {
    /// Bit offset in the layer of the header of the block that starts here.
    pub in_bits: U64,
    /// Output offset (in the layer's tar stream) where that block's output starts.
    pub out: U64,
    /// The layer: an index into the blob table.
    pub blob_index: U32,
    /// The chunk holding the `min(out, 32 KiB)` bytes of output before `out`, or
    /// [`HOLE`] when they are all zero.
    pub window_chunk: U32,
    pub reserved: [u8; 8],
}

/// One blob: a file of concatenated stored chunks, named by its sha256.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct BlobV1 {
    /// sha256 of the whole blob (its OCI digest).
    pub digest: [u8; 32],
    /// Blob length in bytes.
    pub size: U64,
    /// Sum of the uncompressed sizes of its chunks.
    pub uncompressed_size: U64,
    pub chunk_count: U32,
    pub reserved: [u8; 12],
}

/// One extended attribute; an inode's are contiguous and sorted by name.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct XattrV1 {
    pub name_offset: U32,
    pub name_len: U32,
    pub value_offset: U32,
    pub value_len: U32,
}

/// One entry of the prefetch list: a file to fetch first, by inode and by path.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct PrefetchV1 {
    pub ino: U32,
    pub path_offset: U32,
    pub path_len: U32,
    pub reserved: U32,
}

/// File type bits of `st_mode`, as Linux defines them.
pub mod mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFSOCK: u32 = 0o140000;
    pub const S_IFLNK: u32 = 0o120000;
    pub const S_IFREG: u32 = 0o100000;
    pub const S_IFBLK: u32 = 0o060000;
    pub const S_IFDIR: u32 = 0o040000;
    pub const S_IFCHR: u32 = 0o020000;
    pub const S_IFIFO: u32 = 0o010000;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record sizes are part of the format (docs/format.md); changing one is a new
    /// format version.
    #[test]
    fn record_sizes_match_the_spec() {
        assert_eq!(size_of::<TableRefV1>(), 16);
        assert_eq!(size_of::<SuperblockV1>(), 256);
        assert_eq!(size_of::<InodeV1>(), 64);
        assert_eq!(size_of::<DirentV1>(), 16);
        assert_eq!(size_of::<FileChunkV1>(), 16);
        assert_eq!(size_of::<ChunkV1>(), 64);
        assert_eq!(size_of::<BlobV1>(), 64);
        assert_eq!(size_of::<XattrV1>(), 16);
        assert_eq!(size_of::<PrefetchV1>(), 16);
        assert_eq!(size_of::<CheckpointV1>(), 32);
    }
}
