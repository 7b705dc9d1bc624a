//! The cache's on-disk records: the sled index's keys and values, and where chunk files
//! live. Changing any of them needs a new [`LAYOUT_VERSION`].
//!
//! ```text
//! <dir>/index/                         sled database, one tree (the default one):
//!     "version"                        → LAYOUT_VERSION, u64 big-endian
//!     'e' algo digest[32]              → size u64 BE, seq u64 BE      (entry record)
//! <dir>/data/<algo>/<xx>/<hex>         the chunk's uncompressed bytes; xx = first digest byte
//! <dir>/data/<algo>/<xx>/.tmp-*        a write in progress (removed at open)
//! <dir>/synced                         "tessera-cache-synced <ns>\n": every chunk file
//!                                      modified before <ns> (nanoseconds since the Unix
//!                                      epoch) was on stable storage by then
//! ```
//!
//! `algo` is [`DigestAlgo::to_byte`] in the index and [`DigestAlgo::name`] in paths.
//! The use order lives in memory; an entry's `seq` is its place in it as last written
//! (uses are written in batches, so after a crash the order is a few seconds old).

use std::path::{Path, PathBuf};

use rafs_format::chunk::DigestAlgo;

use super::ChunkKey;

/// Stored under [`VERSION_KEY`]; an index of another version is rebuilt from the
/// chunk files at open, never misread.
pub(super) const LAYOUT_VERSION: u64 = 2;
pub(super) const VERSION_KEY: &[u8] = b"version";
/// First byte of entry records.
pub(super) const ENTRY_PREFIX: u8 = b'e';
/// The checkpoint file's name and its content's first word.
pub(super) const SYNCED_FILE: &str = "synced";
const SYNCED_MAGIC: &str = "tessera-cache-synced";

/// The checkpoint file's content for time `at`.
pub(super) fn encode_synced(at: std::time::SystemTime) -> String {
    let ns = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{SYNCED_MAGIC} {ns}\n")
}

/// The time a checkpoint file names; `None` for anything else (a torn or foreign file
/// trusts nothing).
pub(super) fn decode_synced(text: &str) -> Option<std::time::SystemTime> {
    let ns: u64 = text
        .strip_prefix(SYNCED_MAGIC)?
        .strip_prefix(' ')?
        .strip_suffix('\n')?
        .parse()
        .ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
}

/// Temp files start with this; chunk file names (hex) never do.
pub(super) const TMP_PREFIX: &str = ".tmp-";

/// An entry record's value: what the cache knows about a stored chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// Length of the chunk file, checked at open and on every read.
    pub size: u64,
    /// When the chunk was last put or read (a counter, not a clock).
    pub seq: u64,
}

impl Entry {
    pub fn encode(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.size.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; 16] = bytes.try_into().ok()?;
        let (size, seq) = bytes.split_at(8);
        Some(Entry {
            size: u64::from_be_bytes(size.try_into().ok()?),
            seq: u64::from_be_bytes(seq.try_into().ok()?),
        })
    }
}

pub(super) fn entry_key(key: &ChunkKey) -> [u8; 34] {
    let mut out = [0; 34];
    out[0] = ENTRY_PREFIX;
    out[1] = key.algo.to_byte();
    out[2..].copy_from_slice(&key.digest);
    out
}

pub(super) fn decode_entry_key(bytes: &[u8]) -> Option<ChunkKey> {
    match bytes.split_first()? {
        (&ENTRY_PREFIX, rest) => decode_chunk_key(rest),
        _ => None,
    }
}

fn decode_chunk_key(bytes: &[u8]) -> Option<ChunkKey> {
    let (&algo, digest) = bytes.split_first()?;
    Some(ChunkKey {
        algo: DigestAlgo::from_byte(algo)?,
        digest: digest.try_into().ok()?,
    })
}

/// The directory holding `key`'s file (and its temp files, so the rename stays within it).
pub(super) fn shard_dir(data_dir: &Path, key: &ChunkKey) -> PathBuf {
    data_dir
        .join(key.algo.name())
        .join(hex::encode(&key.digest[..1]))
}

pub(super) fn chunk_path(data_dir: &Path, key: &ChunkKey) -> PathBuf {
    shard_dir(data_dir, key).join(hex::encode(key.digest))
}

/// The key a file named `name` in a shard of `algo`'s directory would hold.
pub(super) fn parse_file_name(algo: DigestAlgo, name: &str) -> Option<ChunkKey> {
    let mut digest = [0; 32];
    hex::decode_to_slice(name, &mut digest).ok()?;
    Some(ChunkKey { algo, digest })
}
