//! The node's chunk cache: verified, uncompressed chunks on local disk, keyed by digest
//! and shared by every image, so a chunk common to many images is stored once and a
//! restarted agent serves what it had without touching the network.
//!
//! Each chunk is a file (`data/<algo>/<xx>/<hex>`), so a read of part of a chunk reads
//! just those bytes. The index — each chunk's size, its place in the use (LRU) order and
//! whether its bytes are trusted — lives in memory; a sled database (`index/`) keeps
//! each chunk's size and last use across restarts, written at every put and removal
//! and, for uses, in batches. The layout is specified in `layout.rs`. The invariants:
//!
//! - **A file is complete before anything points at it.** `put` writes a temp file in
//!   the chunk's own directory and renames it into place, then indexes it. A crash
//!   leaves at most a temp file or an unindexed file: temp files are removed at open,
//!   unindexed chunk files are indexed again.
//! - **Verified once, on the way in** (the trust model, shared/MISSION.md): bytes are
//!   verified before they are put and then trusted like the page cache, so a hit reads
//!   only the bytes asked for and hashes nothing. Trust needs the bytes to have reached
//!   the disk: nothing is fsynced per chunk, instead [`ChunkCache::checkpoint`] (the
//!   daemon calls it every few seconds of activity and at shutdown) syncs the
//!   filesystem and records when (`synced`). At open, a chunk file modified before the
//!   last checkpoint is trusted; a later one (a crash or power cut may have torn it) is
//!   verified in full the first time it is read, and dropped if it fails. A size that
//!   no longer matches is caught on every read. [`ChunkCache::verify`] re-checks a
//!   chunk on demand (the background scrub and `tessera cache verify`).
//! - **The index is checked at open and rebuilt from the files.** Entries whose file is
//!   missing or has the wrong size are dropped; temp files and files not named like a
//!   chunk are removed; chunk files without an entry (records lost in a crash, or a
//!   whole index lost) are indexed again, oldest first; the byte total is recounted. An
//!   index that does not open is rebuilt this way, never a reason not to start.
//! - **One key's changes are serialised.** A put, eviction or removal changes the file,
//!   the sled record and the memory index under the key's stripe lock (reads of the
//!   file are not locked: a rename or unlink never disturbs an open reader).
//! - **LRU by sequence, not clock.** Each put or hit takes the next value of a counter
//!   (restored at open from the largest stored one), so order survives restarts and
//!   clock jumps; a hit changes memory only.
//! - **Capacity is kept after every put** by evicting from the front of the LRU order,
//!   skipping pinned chunks; a full disk evicts a little and tries the write again.
//! - **What runs is never evicted.** The chunks of mounted images are pinned
//!   ([`ChunkCache::pin_image`], `pins.rs`) and kept out of the LRU order; when they
//!   alone exceed the capacity they are stored past it (logged, reported) and the
//!   release of the last pin on them evicts back to it. Besides the capacity, high/low
//!   watermarks on the filesystem's usage evict unpinned chunks (`disk.rs`).
//! - **A full disk degrades, it does not stop.** When the disk (shared with other
//!   tenants) is full and nothing can be evicted, `put` fails with
//!   [`Error::CacheDiskFull`], the cache reports itself degraded (status, metric, one
//!   warning a minute) and the caller serves the bytes uncached; the next put that fits
//!   ends it. At open, a full disk gives up the oldest chunk files for the index; with
//!   none left the index is kept in memory (sled's temporary mode) until the next start,
//!   whose rebuild picks up whatever was cached meanwhile.
//!
//! Whoever must know what left the cache (the swarm's announcements: peers must not
//! be sent here for chunks no longer held) sets a hook with
//! [`ChunkCache::on_drop`]; it is called after the change, with no lock held, with
//! the keys and why they went.
//!
//! [`pieces`] keeps, beside the chunks, the piece tables of plain blobs the registry
//! mirror cut (the peer service serves them too, so they sit below both).

mod disk;
mod files;
mod layout;
pub mod pieces;
mod pins;
#[cfg(test)]
mod tests;
mod warm;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rafs_format::chunk::DigestAlgo;
use serde::{Deserialize, Serialize};
use tempfile::NamedTempFile;

use crate::{Error, Result};
pub use disk::{DiskSpace, DiskUsage, Watermarks};
pub use files::FileLayout;
use layout::{chunk_path, entry_key, shard_dir, Entry, ENTRY_PREFIX, SYNCED_FILE, TMP_PREFIX};
pub use pins::{ImagePin, PinnedSet};

/// A chunk's identity: the digest of its uncompressed bytes and the algorithm that made
/// it (images choose the algorithm, so it is part of the key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ChunkKey {
    pub algo: DigestAlgo,
    pub digest: [u8; 32],
}

impl fmt::Display for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.algo.format(&self.digest))
    }
}

/// Figures for `tessera status` and the Prometheus collector; counters since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    pub entries: u64,
    pub bytes: u64,
    pub capacity: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Cached files that no longer matched their size or digest (disk corruption).
    pub verification_failures: u64,
    /// The disk is full: chunks are served without being cached.
    #[serde(default)]
    pub degraded: bool,
    /// Bytes written to the cache since open: each chunk stored, once.
    #[serde(default)]
    pub stored_bytes: u64,
    /// Chunks written after the last checkpoint before this start (a crash may have
    /// torn them) and not yet verified: each is verified when first read.
    #[serde(default)]
    pub unverified: u64,
    /// Bytes [`ChunkCache::verify`] re-checked since open (scrub and `cache verify`).
    #[serde(default)]
    pub verified_bytes: u64,
    /// Bytes of backing files for FUSE passthrough (copies of cached chunks, within
    /// the capacity; not in `bytes`).
    #[serde(default)]
    pub backing_bytes: u64,
    /// Bytes read into the page cache ahead of a walk of the mount (see
    /// [`ChunkCache::warm`]).
    #[serde(default)]
    pub warmed_bytes: u64,
    /// Bytes of cached chunks that mounted images pin (never evicted while mounted).
    #[serde(default)]
    pub pinned_bytes: u64,
    /// Pinned chunks alone exceed the capacity: the cache holds more than it should
    /// until images are unmounted.
    #[serde(default)]
    pub pinned_over_capacity: bool,
}

/// Why chunks left the cache, for the hook set with [`ChunkCache::on_drop`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DropCause {
    /// Its file no longer matched its digest or size, or could not be read (a
    /// corrupt or lost disk): found by a read, so others may be asking for it now.
    Corrupt,
    /// Evicted to keep the capacity.
    Evicted,
    /// Removed by a caller ([`ChunkCache::remove`]).
    Removed,
}

/// Told which chunks left the cache and why (see [`ChunkCache::on_drop`]).
pub type DropHook = Box<dyn Fn(&[ChunkKey], DropCause) + Send + Sync>;

/// What [`ChunkCache::verify`] found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verified {
    /// The file matches its digest; this many bytes were read.
    Good(u64),
    /// It did not (or could not be read) and was dropped.
    Dropped,
    /// Not cached (evicted or removed meanwhile).
    Absent,
}

/// Memory sled may use for its page cache (its default is 1 GiB).
const INDEX_MEMORY: u64 = 64 << 20;
/// Stripes of per-key locks: enough that reader threads rarely share one.
const STRIPES: usize = 64;
/// Times `put` frees space and writes again after the disk reported itself full.
const FULL_RETRIES: u32 = 2;
/// Chunk bytes given up at open when the disk is too full for the index to open.
const INDEX_ROOM: u64 = 16 << 20;
/// At most one warning this often while the disk stays full.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(60);
/// Uses are written to the index on disk when this many wait, or this long after the
/// last write (whichever comes first), and at every checkpoint.
const USES_BATCH: usize = 4096;
const USES_EVERY: Duration = Duration::from_secs(5);
/// A file modified this close to the last checkpoint is not trusted by it: file times
/// come from a coarse clock that may lag the checkpoint's.
const CHECKPOINT_SLACK: Duration = Duration::from_secs(1);
/// Keys an eviction scan takes from the LRU order at a time.
const EVICT_BATCH: usize = 64;

/// Pin counts of the keys of one stripe; the stripe's mutex also serialises every change
/// to those keys' files and index records.
type Pins = HashMap<ChunkKey, u32>;

/// What the cache knows about a stored chunk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Slot {
    size: u64,
    /// Its place in the use order.
    seq: u64,
    /// Its bytes are known to be those verified when it was put (see the module
    /// docs); an untrusted chunk is verified in full when next read.
    trusted: bool,
}

/// The index in memory: every cached chunk and the use order.
#[derive(Default)]
struct Index {
    slots: HashMap<ChunkKey, Slot>,
    /// seq → key, least recently used first.
    order: BTreeMap<u64, ChunkKey>,
    /// Keys whose use is not yet written to sled.
    used: HashSet<ChunkKey>,
    /// When uses were last written.
    uses_written: Option<Instant>,
    /// Untrusted slots.
    untrusted: u64,
    /// Mounted images' pins (`pins.rs`); pinned slots are not in `order`.
    pins: pins::MountPins,
}

impl Index {
    fn insert(&mut self, key: ChunkKey, slot: Slot) {
        let old = self.slots.insert(key, slot);
        if let Some(old) = old {
            self.order.remove(&old.seq);
            self.untrusted -= u64::from(!old.trusted);
        }
        if self.pins.contains(&key) {
            self.pins.bytes = self.pins.bytes - old.map_or(0, |o| o.size) + slot.size;
        } else {
            self.order.insert(slot.seq, key);
        }
        self.untrusted += u64::from(!slot.trusted);
    }

    fn remove(&mut self, key: &ChunkKey) -> Option<Slot> {
        let slot = self.slots.remove(key)?;
        if self.pins.contains(key) {
            self.pins.bytes -= slot.size;
        } else {
            self.order.remove(&slot.seq);
        }
        self.used.remove(key);
        self.untrusted -= u64::from(!slot.trusted);
        Some(slot)
    }

    /// Whether the uses waiting should be written now.
    fn uses_due(&self) -> bool {
        self.used.len() >= USES_BATCH
            || (!self.used.is_empty()
                && self
                    .uses_written
                    .is_none_or(|at| at.elapsed() >= USES_EVERY))
    }
}

/// The cache. `Send + Sync`: share it in an `Arc` between all reader threads.
pub struct ChunkCache {
    /// The cache's directory.
    dir: PathBuf,
    /// `<dir>/data`: the chunk files.
    data_dir: PathBuf,
    /// Entry records on disk (see `layout.rs`).
    index: sled::Db,
    /// Backing files for FUSE passthrough (`files.rs`).
    files: files::BackingFiles,
    /// The index in memory: what reads, puts and evictions consult.
    memory: Mutex<Index>,
    capacity: u64,
    /// The next last-use sequence number.
    next_seq: AtomicU64,
    /// Sum of the indexed chunks' sizes, and their number.
    bytes: AtomicU64,
    entries: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    verification_failures: AtomicU64,
    stored_bytes: AtomicU64,
    verified_bytes: AtomicU64,
    /// Bytes read into the page cache ahead of a walk (`warm.rs`).
    warmed_bytes: AtomicU64,
    /// The warming threads, started at the first [`warm`](Self::warm); `None` if none
    /// could be.
    warmer: std::sync::OnceLock<Option<warm::Warmer>>,
    stripes: Box<[Mutex<Pins>]>,
    /// One evictor at a time: two would race each other over the same LRU front.
    evicting: Mutex<()>,
    /// One checkpoint at a time.
    checkpointing: Mutex<()>,
    /// The last put found the disk full with nothing left to evict.
    disk_full: AtomicBool,
    /// Pinned chunks alone exceed the capacity (`pins.rs`).
    pinned_over: AtomicBool,
    /// The high/low watermarks on the cache filesystem's usage (`disk.rs`); `None`:
    /// only the byte capacity bounds the cache.
    disk: Option<disk::DiskWatch>,
    /// When the full disk was last warned about.
    full_warned: Mutex<Option<Instant>>,
    /// Told of every chunk that leaves the cache after open (set once; a callback so
    /// the cache, below the swarm in the layers, need not know it).
    on_drop: std::sync::OnceLock<DropHook>,
    /// Test hook: how many coming writes fail as if the disk were full.
    #[cfg(test)]
    full_writes: std::sync::atomic::AtomicU32,
}

impl fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkCache")
            .field("data_dir", &self.data_dir)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Keeps a chunk from being evicted while it lives (a pin does not make a missing chunk
/// present, and does not stop a corrupt one from being dropped).
#[derive(Debug)]
#[must_use = "the chunk is pinned only while the guard lives"]
pub struct PinGuard<'a> {
    cache: &'a ChunkCache,
    key: ChunkKey,
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        let mut pins = self.cache.stripe(&self.key);
        if let Some(count) = pins.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                pins.remove(&self.key);
            }
        }
    }
}

/// Why a cached file cannot be served.
#[derive(Debug)]
enum Unusable {
    Unreadable(io::Error),
    WrongSize(u64),
    WrongDigest,
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unusable::Unreadable(e) => write!(f, "unreadable: {e}"),
            Unusable::WrongSize(size) => write!(f, "file has {size} bytes"),
            Unusable::WrongDigest => f.write_str("digest mismatch"),
        }
    }
}

fn index_error(what: &'static str) -> impl Fn(sled::Error) -> Error {
    move |e| Error::Cache {
        reason: format!("{what}: {e}"),
    }
}

fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
}

impl ChunkCache {
    /// Opens (creating) the cache in `dir` and makes its index and files agree, which
    /// reads every entry and lists every file. Fails if another process has it open.
    pub fn open(dir: &Path, capacity: u64) -> Result<Self> {
        let data_dir = dir.join("data");
        fs::create_dir_all(&data_dir).map_err(|e| Error::io("create", &data_dir, e))?;
        let index = open_index(dir, &data_dir)?;
        let trusted_before = last_checkpoint(dir);
        let cache = ChunkCache {
            dir: dir.to_path_buf(),
            data_dir,
            index,
            files: files::BackingFiles::open(dir.join("files"), trusted_before)?,
            memory: Mutex::default(),
            capacity,
            next_seq: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            verification_failures: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            verified_bytes: AtomicU64::new(0),
            warmed_bytes: AtomicU64::new(0),
            warmer: std::sync::OnceLock::new(),
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            evicting: Mutex::new(()),
            checkpointing: Mutex::new(()),
            disk_full: AtomicBool::new(false),
            pinned_over: AtomicBool::new(false),
            disk: None,
            full_warned: Mutex::new(None),
            on_drop: std::sync::OnceLock::new(),
            #[cfg(test)]
            full_writes: Default::default(),
        };
        let dropped = cache.load_entries(trusted_before)?;
        let (adopted, strays) = cache.index_unindexed_files(trusted_before)?;
        tracing::info!(
            dir = %dir.display(),
            entries = cache.entries.load(Relaxed),
            bytes = cache.bytes.load(Relaxed),
            unverified = cache.memory().untrusted,
            dropped,
            adopted,
            strays,
            "chunk cache opened"
        );
        cache.keep_capacity()?;
        Ok(cache)
    }

    /// The chunk's whole bytes, or `None` if it is not cached or its file is no longer
    /// good (then it is dropped). `Err` only if the index fails.
    pub fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        let Some(slot) = self.slot(key) else {
            self.misses.fetch_add(1, Relaxed);
            return Ok(None);
        };
        let read = if slot.trusted {
            self.read_file(key, 0..slot.size)
        } else {
            self.read_verified(key, slot)
        };
        self.answer(key, slot, read)
    }

    /// The chunk's whole bytes checked against its digest now, whatever its trust, for
    /// bytes that leave the node (a peer's request: the receiver verifies again, but a
    /// node must not serve what its own disk spoiled); `None` as for [`get`](Self::get),
    /// and a chunk that fails is dropped.
    pub fn get_verified(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        let Some(slot) = self.slot(key) else {
            self.misses.fetch_add(1, Relaxed);
            return Ok(None);
        };
        let read = self.read_verified(key, slot);
        self.answer(key, slot, read)
    }

    /// Bytes `range` of the chunk (the caller keeps it within the chunk's size), read
    /// from its file alone; `None` as for [`get`](Self::get). An untrusted chunk is read
    /// and verified whole first.
    pub fn read(&self, key: &ChunkKey, range: Range<u64>) -> Result<Option<Vec<u8>>> {
        let Some(slot) = self.slot(key) else {
            self.misses.fetch_add(1, Relaxed);
            return Ok(None);
        };
        if range.end > slot.size || range.start > range.end {
            return Err(Error::Cache {
                reason: format!(
                    "bytes {}..{} asked of chunk {key}, which has {}",
                    range.start, range.end, slot.size
                ),
            });
        }
        let read = if slot.trusted {
            self.read_file(key, range)
        } else {
            self.read_verified(key, slot)
                .map(|whole| whole[range.start as usize..range.end as usize].to_vec())
        };
        self.answer(key, slot, read)
    }

    /// A read's answer: the bytes (recording the use), or a miss that drops the entry
    /// whose file failed.
    fn answer(
        &self,
        key: &ChunkKey,
        slot: Slot,
        read: Result<Vec<u8>, Unusable>,
    ) -> Result<Option<Vec<u8>>> {
        match read {
            Ok(data) => {
                self.touch(key);
                self.hits.fetch_add(1, Relaxed);
                Ok(Some(data))
            }
            Err(why) => {
                self.drop_unusable(key, slot, &why)?;
                self.misses.fetch_add(1, Relaxed);
                Ok(None)
            }
        }
    }

    /// Drops `key`, whose file failed as `why`, unless its entry changed meanwhile (an
    /// eviction or a new put got there first: that file is no longer the cache's
    /// business). `true` if it dropped it.
    fn drop_unusable(&self, key: &ChunkKey, slot: Slot, why: &Unusable) -> Result<bool> {
        if !self.remove_if_current(key, slot)? {
            return Ok(false);
        }
        if !matches!(why, Unusable::Unreadable(_)) {
            self.verification_failures.fetch_add(1, Relaxed);
        }
        let path = chunk_path(&self.data_dir, key);
        tracing::warn!(chunk = %key, path = %path.display(), "dropped a cached chunk: {why}");
        self.tell_dropped(&[*key], DropCause::Corrupt);
        Ok(true)
    }

    /// Reads the chunk's file whole and checks it against its digest, whatever its
    /// trust (the background scrub and `tessera cache verify`); drops it if it fails.
    pub fn verify(&self, key: &ChunkKey) -> Result<Verified> {
        let Some(slot) = self.slot(key) else {
            return Ok(Verified::Absent);
        };
        match self.read_verified(key, slot) {
            Ok(data) => {
                self.verified_bytes.fetch_add(data.len() as u64, Relaxed);
                Ok(Verified::Good(data.len() as u64))
            }
            Err(why) => Ok(if self.drop_unusable(key, slot, &why)? {
                Verified::Dropped
            } else {
                Verified::Absent
            }),
        }
    }

    /// Every cached chunk's key, least recently used first (what a scrub walks),
    /// pinned ones included.
    pub fn keys(&self) -> Vec<ChunkKey> {
        let mut keys: Vec<(u64, ChunkKey)> = {
            let memory = self.memory();
            memory.slots.iter().map(|(k, s)| (s.seq, *k)).collect()
        };
        keys.sort_unstable_by_key(|(seq, _)| *seq);
        keys.into_iter().map(|(_, key)| key).collect()
    }

    /// Whether the chunk is cached.
    pub fn contains(&self, key: &ChunkKey) -> bool {
        self.memory().slots.contains_key(key)
    }

    /// Stores a chunk the caller has verified against `key`. Storing a chunk already
    /// present only marks it used. A chunk larger than the capacity is not stored.
    /// `Err` means the chunk is not cached; the caller can still use its bytes.
    pub fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()> {
        debug_assert_eq!(key.algo.digest(data), key.digest, "unverified chunk put");
        let size = data.len() as u64;
        if size > self.capacity || self.touch(key) {
            return Ok(());
        }
        let tmp = match self.write_temp(key, data) {
            Ok(tmp) => tmp,
            Err(e) => return Err(self.disk_full_or(e)),
        };
        {
            let _stripe = self.stripe(key);
            if self.slot(key).is_some() {
                // A concurrent put of the same bytes won; `tmp` is deleted on drop.
                return Ok(());
            }
            let path = chunk_path(&self.data_dir, key);
            tmp.persist(&path)
                .map_err(|e| Error::io("rename into", &path, e.error))?;
            let slot = Slot {
                size,
                seq: self.next_seq.fetch_add(1, Relaxed),
                trusted: true,
            };
            let entry = Entry {
                size,
                seq: slot.seq,
            };
            if let Err(e) = self.index.insert(entry_key(key), &entry.encode()[..]) {
                let _ = fs::remove_file(&path);
                return Err(index_error("index a chunk")(e));
            }
            self.memory().insert(*key, slot);
            self.bytes.fetch_add(size, Relaxed);
            self.entries.fetch_add(1, Relaxed);
            self.stored_bytes.fetch_add(size, Relaxed);
        }
        if self.disk_full.swap(false, Relaxed) {
            tracing::info!(dir = %self.data_dir.display(), "the cache disk has room again: caching chunks again");
        }
        self.keep_capacity()?;
        self.check_pinned_capacity();
        self.written(size);
        Ok(())
    }

    /// Evicts what is past the capacity: backing files past their quarter first, then
    /// chunks past what the backing files leave.
    fn keep_capacity(&self) -> Result<()> {
        self.files.evict_to(self.capacity / 4);
        self.evict_to(self.capacity.saturating_sub(self.files.bytes()))
    }

    /// A file holding exactly the bytes `layout` describes, opened for reading, for FUSE
    /// passthrough: the chunk's own file when the file is one whole chunk, else the
    /// backing file made for it; `None` if there is none, or the chunk is not trusted
    /// yet (its first read verifies it).
    pub fn backing_file(&self, layout: &FileLayout) -> Option<fs::File> {
        let Some(key) = layout.single_chunk() else {
            return self.files.open_file(layout);
        };
        self.slot(&key)
            .filter(|slot| slot.trusted && slot.size == layout.size)?;
        let file = fs::File::open(chunk_path(&self.data_dir, &key)).ok()?;
        if file.metadata().ok()?.len() != layout.size {
            return None;
        }
        self.touch(&key);
        Some(file)
    }

    /// Whether [`make_backing_file`](Self::make_backing_file) would make one now: the
    /// file is not one whole chunk, has none yet, and all its chunks are cached and
    /// trusted. An index probe, cheap enough for a FUSE session thread.
    pub fn wants_backing_file(&self, layout: &FileLayout) -> bool {
        if layout.single_chunk().is_some() || self.files.contains(layout) {
            return false;
        }
        let memory = self.memory();
        layout
            .pieces
            .iter()
            .filter_map(|(_, _, key)| key.as_ref())
            .all(|key| memory.slots.get(key).is_some_and(|slot| slot.trusted))
    }

    /// Reads what the cache holds of `layouts` into the kernel's page cache, in the
    /// background and several files at once, ahead of a walk that is about to read
    /// them (see `warm.rs`). Never blocks: what the queue has no room for is not warmed.
    pub fn warm(self: &Arc<Self>, layouts: impl IntoIterator<Item = FileLayout>) {
        let warmer = self
            .warmer
            .get_or_init(|| warm::Warmer::start(Arc::downgrade(self)));
        if let Some(warmer) = warmer {
            for layout in layouts {
                if !warmer.offer(layout) {
                    break;
                }
            }
        }
    }

    /// The local files a read of `layout` would read: its backing copy if it has one,
    /// else the files of its chunks that are cached.
    fn warm_paths(&self, layout: &FileLayout) -> Vec<PathBuf> {
        if let Some(copy) = self.files.path(layout) {
            return vec![copy];
        }
        let memory = self.memory();
        layout
            .pieces
            .iter()
            .filter_map(|(_, _, key)| key.as_ref())
            .filter(|key| memory.slots.contains_key(key))
            .map(|key| chunk_path(&self.data_dir, key))
            .collect()
    }

    /// Makes the backing file of a file whose chunks are all cached and trusted (a
    /// copy: see `files.rs`); `false` if it has one, or a chunk is missing.
    pub fn make_backing_file(&self, layout: &FileLayout) -> Result<bool> {
        if layout.single_chunk().is_some() || layout.size > self.capacity / 4 {
            return Ok(false);
        }
        let keys: Vec<ChunkKey> = layout.pieces.iter().filter_map(|p| p.2).collect();
        let _pins: Vec<PinGuard<'_>> = keys.iter().map(|key| self.pin(key)).collect();
        if !self.wants_backing_file(layout) {
            return Ok(false);
        }
        let made = self
            .files
            .make(layout, |key| chunk_path(&self.data_dir, key))
            .map_err(|e| self.disk_full_or(e))?;
        if made {
            self.keep_capacity()?;
        }
        Ok(made)
    }

    /// `e`, or [`Error::CacheDiskFull`] (marking the cache degraded, warning at most
    /// once a minute) when `e` says the disk is full.
    fn disk_full_or(&self, e: Error) -> Error {
        if !matches!(&e, Error::Io { cause, .. } if is_disk_full(cause)) {
            return e;
        }
        self.disk_full.store(true, Relaxed);
        let full = Error::CacheDiskFull {
            dir: self.data_dir.clone(),
        };
        let mut warned = self
            .full_warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warned.is_none_or(|at| at.elapsed() >= FULL_WARNING_EVERY) {
            *warned = Some(Instant::now());
            tracing::warn!(
                dir = %self.data_dir.display(),
                cached_bytes = self.bytes.load(Relaxed),
                "the cache disk is full and nothing more can be evicted: not caching chunks until space returns (free space on that disk, or lower cache_capacity)"
            );
        }
        full
    }

    /// Evicts least recently used chunks that no mount pins until at most `keep`
    /// bytes of chunks remain (`tessera cache prune`); 0 evicts all of them. Backing
    /// files go down to a quarter of `keep` first: they are copies, and one left
    /// behind would keep serving a pruned image (open ones stay readable, and a
    /// mounted image's are made again at their next close). Returns the chunks and
    /// bytes evicted.
    pub fn prune(&self, keep: u64) -> Result<(u64, u64)> {
        let (evictions, bytes) = (self.evictions.load(Relaxed), self.bytes.load(Relaxed));
        self.files.evict_to(keep / 4);
        self.evict_to(keep)?;
        Ok((
            self.evictions.load(Relaxed) - evictions,
            bytes.saturating_sub(self.bytes.load(Relaxed)),
        ))
    }

    /// Drops a chunk (the registry mirror drops the pieces of a blob that failed its
    /// digest); `true` if it was cached.
    pub fn remove(&self, key: &ChunkKey) -> Result<bool> {
        let removed = match self.slot(key) {
            Some(slot) => self.remove_if_current(key, slot)?,
            None => false,
        };
        if removed {
            self.tell_dropped(&[*key], DropCause::Removed);
        }
        Ok(removed)
    }

    /// Sets the hook told of every chunk that leaves the cache from now on; `false`
    /// (and `hook` unused) if one was set already.
    pub fn on_drop(&self, hook: DropHook) -> bool {
        self.on_drop.set(hook).is_ok()
    }

    fn tell_dropped(&self, keys: &[ChunkKey], cause: DropCause) {
        if let (Some(hook), false) = (self.on_drop.get(), keys.is_empty()) {
            hook(keys, cause);
        }
    }

    /// Keeps `key` from being evicted until the guard is dropped.
    pub fn pin(&self, key: &ChunkKey) -> PinGuard<'_> {
        *self.stripe(key).entry(*key).or_insert(0) += 1;
        PinGuard {
            cache: self,
            key: *key,
        }
    }

    pub fn stats(&self) -> CacheStats {
        // Each takes the index lock: not within one expression, whose temporaries
        // would hold the first guard while the second waits.
        let unverified = self.memory().untrusted;
        let pinned_bytes = self.pinned_bytes();
        CacheStats {
            entries: self.entries.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            capacity: self.capacity,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            verification_failures: self.verification_failures.load(Relaxed),
            degraded: self.disk_full.load(Relaxed),
            stored_bytes: self.stored_bytes.load(Relaxed),
            unverified,
            verified_bytes: self.verified_bytes.load(Relaxed),
            backing_bytes: self.files.bytes(),
            warmed_bytes: self.warmed_bytes.load(Relaxed),
            pinned_bytes,
            pinned_over_capacity: self.pinned_over.load(Relaxed),
        }
    }

    /// Makes what the cache holds durable and trusted across a crash: writes the uses
    /// waiting, flushes the index, syncs the filesystem and records the time it started
    /// (`synced`), so every chunk file written before it is trusted at the next open.
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self
            .checkpointing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let started = SystemTime::now();
        self.write_uses()?;
        self.flush()?;
        let data =
            fs::File::open(&self.data_dir).map_err(|e| Error::io("open", &self.data_dir, e))?;
        rustix::fs::syncfs(&data)
            .map_err(|e| Error::io("sync the filesystem of", &self.data_dir, e.into()))?;
        let path = self.dir.join(SYNCED_FILE);
        let write = || -> io::Result<()> {
            let mut tmp = tempfile::Builder::new()
                .prefix(TMP_PREFIX)
                .tempfile_in(&self.dir)?;
            tmp.write_all(layout::encode_synced(started).as_bytes())?;
            tmp.as_file().sync_all()?;
            tmp.persist(&path)?;
            fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| Error::io("write", &path, e))
    }

    /// Writes the index to disk now (sled also does every half second and on drop).
    pub fn flush(&self) -> Result<()> {
        self.index
            .flush()
            .map(drop)
            .map_err(index_error("flush the index"))
    }

    fn stripe(&self, key: &ChunkKey) -> MutexGuard<'_, Pins> {
        // Pin counts stay consistent whatever panicked while holding the lock.
        self.stripes[usize::from(key.digest[0]) % STRIPES]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn memory(&self) -> MutexGuard<'_, Index> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, key: &ChunkKey) -> Option<Slot> {
        self.memory().slots.get(key).copied()
    }

    /// Makes `key` the most recently used (in memory; written to the index in
    /// batches); false if it is not cached.
    fn touch(&self, key: &ChunkKey) -> bool {
        let due = {
            let mut memory = self.memory();
            let Some(&old) = memory.slots.get(key) else {
                return false;
            };
            let new = Slot {
                seq: self.next_seq.fetch_add(1, Relaxed),
                ..old
            };
            memory.insert(*key, new);
            memory.used.insert(*key);
            memory.uses_due()
        };
        if due {
            if let Err(e) = self.write_uses() {
                tracing::warn!(error = %e, "could not record cache uses");
            }
        }
        true
    }

    /// Writes the uses waiting in memory to the index, in one batch.
    fn write_uses(&self) -> Result<()> {
        let mut batch = sled::Batch::default();
        {
            let mut memory = self.memory();
            let used: Vec<ChunkKey> = memory.used.drain().collect();
            for key in used {
                if let Some(slot) = memory.slots.get(&key) {
                    let entry = Entry {
                        size: slot.size,
                        seq: slot.seq,
                    };
                    batch.insert(&entry_key(&key)[..], &entry.encode()[..]);
                }
            }
            memory.uses_written = Some(Instant::now());
        }
        // A key removed since is written back here and dropped again at the next
        // open (its file is gone): harmless, and rare.
        self.index
            .apply_batch(batch)
            .map_err(index_error("record cache uses"))
    }

    /// Marks `key` trusted if it is still the chunk `slot` was read for (verified just
    /// now).
    fn trust(&self, key: &ChunkKey, slot: Slot) {
        let mut memory = self.memory();
        let Some(current) = memory.slots.get_mut(key) else {
            return;
        };
        if !current.trusted && current.size == slot.size {
            current.trusted = true;
            memory.untrusted -= 1;
        }
    }

    /// Bytes `range` of a trusted chunk's file.
    fn read_file(&self, key: &ChunkKey, range: Range<u64>) -> Result<Vec<u8>, Unusable> {
        let file = fs::File::open(chunk_path(&self.data_dir, key)).map_err(Unusable::Unreadable)?;
        let mut data = vec![0; (range.end - range.start) as usize];
        file.read_exact_at(&mut data, range.start)
            .map_err(|e| match e.kind() {
                ErrorKind::UnexpectedEof => {
                    Unusable::WrongSize(file.metadata().map_or(0, |m| m.len()))
                }
                _ => Unusable::Unreadable(e),
            })?;
        Ok(data)
    }

    /// Reads a chunk file whole and checks it against its entry and digest, trusting it
    /// from then on. The read is bounded by the entry's size, so a grown file cannot
    /// make it allocate more.
    fn read_verified(&self, key: &ChunkKey, slot: Slot) -> Result<Vec<u8>, Unusable> {
        let file = fs::File::open(chunk_path(&self.data_dir, key)).map_err(Unusable::Unreadable)?;
        let mut data = Vec::with_capacity(slot.size as usize);
        file.take(slot.size + 1)
            .read_to_end(&mut data)
            .map_err(Unusable::Unreadable)?;
        if data.len() as u64 != slot.size {
            return Err(Unusable::WrongSize(data.len() as u64));
        }
        if key.algo.digest(&data) != key.digest {
            return Err(Unusable::WrongDigest);
        }
        self.trust(key, slot);
        Ok(data)
    }

    /// Writes `data` to a temp file beside its final place. When the disk is full, frees
    /// some space (twice the chunk's size, then eight times) and tries again.
    fn write_temp(&self, key: &ChunkKey, data: &[u8]) -> Result<NamedTempFile> {
        let shard = shard_dir(&self.data_dir, key);
        let mut attempt = 0;
        loop {
            match self.try_write_temp(&shard, data) {
                Ok(tmp) => return Ok(tmp),
                Err(e) if is_disk_full(&e) && attempt < FULL_RETRIES && self.evictable() => {
                    attempt += 1;
                    let room = (data.len() as u64) << (2 * attempt - 1);
                    tracing::debug!(chunk = %key, room, "disk full: evicting to make room");
                    self.evict_to(self.bytes.load(Relaxed).saturating_sub(room))?;
                }
                Err(e) => return Err(Error::io("write a chunk in", shard, e)),
            }
        }
    }

    /// Whether eviction could free anything (pinned chunks aside).
    fn evictable(&self) -> bool {
        self.bytes.load(Relaxed) > self.pinned_bytes()
    }

    fn try_write_temp(&self, shard: &Path, data: &[u8]) -> io::Result<NamedTempFile> {
        #[cfg(test)]
        if self
            .full_writes
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ErrorKind::StorageFull.into());
        }
        fs::create_dir_all(shard)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(shard)?;
        tmp.write_all(data)?;
        Ok(tmp)
    }

    /// Drops `key` if its slot is still `expected` (its use order aside); true if it
    /// did.
    fn remove_if_current(&self, key: &ChunkKey, expected: Slot) -> Result<bool> {
        let _stripe = self.stripe(key);
        match self.slot(key) {
            Some(slot) if slot.size == expected.size => {
                self.remove_locked(key, slot)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Drops `key`, whose current slot is `slot`; the caller holds its stripe. The
    /// index goes first: a crash before the unlink leaves a stray file, never an entry
    /// without one.
    fn remove_locked(&self, key: &ChunkKey, slot: Slot) -> Result<()> {
        self.index
            .remove(entry_key(key))
            .map_err(index_error("remove a chunk"))?;
        self.memory().remove(key);
        self.bytes.fetch_sub(slot.size, Relaxed);
        self.entries.fetch_sub(1, Relaxed);
        let path = chunk_path(&self.data_dir, key);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            // Left for the next open to remove.
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a chunk file")
            }
        }
        Ok(())
    }

    /// Evicts least recently used, unpinned chunks until at most `target` bytes remain
    /// (or none but pinned ones).
    fn evict_to(&self, target: u64) -> Result<()> {
        if self.bytes.load(Relaxed) <= target {
            return Ok(());
        }
        let mut evicted = Vec::new();
        let done = {
            let _evicting = self.evicting.lock().unwrap_or_else(PoisonError::into_inner);
            self.evict_locked(target, &mut evicted)
        };
        // Told in one batch, with no lock held, even when the scan stopped on an error:
        // those chunks are gone either way.
        self.tell_dropped(&evicted, DropCause::Evicted);
        done
    }

    /// [`evict_to`](Self::evict_to)'s scan of the use order; the caller holds
    /// `evicting`. The keys it evicted go to `evicted`.
    fn evict_locked(&self, target: u64, evicted: &mut Vec<ChunkKey>) -> Result<()> {
        let mut from = 0;
        while self.bytes.load(Relaxed) > target {
            let front: Vec<(u64, ChunkKey)> = self
                .memory()
                .order
                .range(from..)
                .take(EVICT_BATCH)
                .map(|(seq, key)| (*seq, *key))
                .collect();
            if front.is_empty() {
                break;
            }
            for (seq, key) in front {
                from = seq + 1;
                if self.bytes.load(Relaxed) <= target {
                    break;
                }
                let stripe = self.stripe(&key);
                if stripe.contains_key(&key) {
                    continue;
                }
                // A key used since the scan took it has a later place: not evicted now.
                // (None is pinned since: `pin_image` waits for the scan to end.)
                let slot = self.slot(&key).filter(|slot| slot.seq == seq);
                if let Some(slot) = slot.filter(|_| !self.memory().pins.contains(&key)) {
                    self.remove_locked(&key, slot)?;
                    self.evictions.fetch_add(1, Relaxed);
                    evicted.push(key);
                }
            }
        }
        Ok(())
    }

    /// Loads the entries into memory, dropping those whose file is missing or has the
    /// wrong size, and undecodable records; restores the sequence counter. A chunk whose
    /// file was modified before `trusted_before` is trusted. Returns the number dropped.
    fn load_entries(&self, trusted_before: SystemTime) -> Result<u64> {
        let mut dropped = 0;
        let mut max_seq = None;
        let mut memory = self.memory();
        for record in self.index.scan_prefix([ENTRY_PREFIX]) {
            let (record_key, value) = record.map_err(index_error("read the index"))?;
            let decoded = layout::decode_entry_key(&record_key).zip(Entry::decode(&value));
            if let Some((key, entry)) = decoded {
                let path = chunk_path(&self.data_dir, &key);
                match fs::metadata(&path) {
                    // Two entries cannot share a seq but a damaged index could say so:
                    // the second is indexed again as an unindexed file.
                    Ok(meta)
                        if meta.is_file()
                            && meta.len() == entry.size
                            && !memory.order.contains_key(&entry.seq) =>
                    {
                        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                        let slot = Slot {
                            size: entry.size,
                            seq: entry.seq,
                            trusted: modified < trusted_before,
                        };
                        memory.insert(key, slot);
                        self.bytes.fetch_add(entry.size, Relaxed);
                        self.entries.fetch_add(1, Relaxed);
                        max_seq = max_seq.max(Some(entry.seq));
                        continue;
                    }
                    Ok(meta) if meta.is_file() && meta.len() == entry.size => {}
                    _ => {
                        tracing::warn!(chunk = %key, path = %path.display(), "dropping a cache entry whose file is missing or cut short");
                        // Not to be indexed again as it is.
                        let _ = fs::remove_file(&path);
                    }
                }
            }
            self.index
                .remove(record_key)
                .map_err(index_error("drop a bad entry"))?;
            dropped += 1;
        }
        self.next_seq.store(max_seq.map_or(0, |s| s + 1), Relaxed);
        Ok(dropped)
    }

    /// Indexes chunk files that have no entry (their records were lost, or the whole
    /// index was), oldest first so the LRU order roughly survives; removes temp files
    /// and files not named like a chunk. Returns how many files it indexed and removed.
    /// Directories it did not make are left alone.
    fn index_unindexed_files(&self, trusted_before: SystemTime) -> Result<(u64, u64)> {
        let mut removed = 0;
        let mut unindexed = Vec::new();
        for (algo_dir, _) in list(&self.data_dir)?.into_iter().filter(|(_, dir)| *dir) {
            let algo_name = algo_dir.file_name().and_then(|n| n.to_str());
            let Some(algo) = algo_name.and_then(|n| n.parse::<DigestAlgo>().ok()) else {
                tracing::warn!(path = %algo_dir.display(), "unexpected directory in the chunk cache");
                continue;
            };
            for (shard, _) in list(&algo_dir)?.into_iter().filter(|(_, dir)| *dir) {
                for (path, _) in list(&shard)?.into_iter().filter(|(_, dir)| !*dir) {
                    let key = path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| layout::parse_file_name(algo, n))
                        // Another shard's name, or upper-case hex: not where get looks.
                        .filter(|key| chunk_path(&self.data_dir, key) == path);
                    let Some(key) = key else {
                        fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
                        removed += 1;
                        continue;
                    };
                    if !self.contains(&key) {
                        let meta = fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
                        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                        unindexed.push((modified, key, meta.len()));
                    }
                }
            }
        }
        // A file is renamed into place only once written whole, so these are chunks
        // that were verified when stored; those the last checkpoint did not cover are
        // verified again when first read.
        unindexed.sort_by_key(|(modified, _, _)| *modified);
        let adopted = unindexed.len() as u64;
        let mut batch = sled::Batch::default();
        let mut memory = self.memory();
        for (modified, key, size) in unindexed {
            let slot = Slot {
                size,
                seq: self.next_seq.fetch_add(1, Relaxed),
                trusted: modified < trusted_before,
            };
            let entry = Entry {
                size,
                seq: slot.seq,
            };
            batch.insert(&entry_key(&key)[..], &entry.encode()[..]);
            memory.insert(key, slot);
            self.bytes.fetch_add(size, Relaxed);
            self.entries.fetch_add(1, Relaxed);
        }
        drop(memory);
        self.index
            .apply_batch(batch)
            .map_err(index_error("index the chunk files"))?;
        Ok((adopted, removed))
    }
}

impl Drop for ChunkCache {
    /// Writes the uses still in memory (sled flushes itself when dropped).
    fn drop(&mut self) {
        if let Err(e) = self.write_uses() {
            tracing::warn!(error = %e, "could not record cache uses");
        }
    }
}

/// When the last checkpoint of the cache in `dir` started, less the slack for coarse file
/// times; the epoch (nothing trusted) without one.
fn last_checkpoint(dir: &Path) -> SystemTime {
    fs::read_to_string(dir.join(SYNCED_FILE))
        .ok()
        .and_then(|text| layout::decode_synced(&text))
        .and_then(|at| at.checked_sub(CHECKPOINT_SLACK))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Opens the index in `dir/index` at this agent's layout version. An index that does
/// not open, or holds another layout version, is removed and made anew (the caller
/// rebuilds it from the files). A disk too full for it first gives up the oldest chunk
/// files, and with none left the index lives in memory until the next start.
fn open_index(dir: &Path, data_dir: &Path) -> Result<sled::Db> {
    let path = dir.join("index");
    // Sets `disk_full` when that was why it failed.
    let open = |disk_full: &mut bool| -> Result<sled::Db> {
        let index = sled::Config::new()
            .path(&path)
            .cache_capacity(INDEX_MEMORY)
            .open()
            .map_err(|e| {
                *disk_full = matches!(&e, sled::Error::Io(io) if is_disk_full(io));
                index_error("open the index")(e)
            })?;
        check_layout_version(&index)?;
        Ok(index)
    };
    let mut disk_full = false;
    let problem = match open(&mut disk_full) {
        Ok(index) => return Ok(index),
        Err(e) => e,
    };
    if disk_full {
        let freed = remove_oldest_chunk_files(data_dir, INDEX_ROOM);
        tracing::warn!(
            dir = %dir.display(),
            freed,
            "chunk cache: the disk is too full to open the index: removed the oldest chunk files"
        );
    } else {
        tracing::warn!(
            dir = %dir.display(),
            error = %problem,
            "chunk cache: the index is damaged: rebuilding it from the chunk files"
        );
        if let Err(e) = fs::remove_dir_all(&path) {
            tracing::warn!(path = %path.display(), error = %e, "could not remove the damaged index");
        }
    }
    match open(&mut disk_full) {
        Ok(index) => return Ok(index),
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            error = %e,
            "chunk cache: keeping the index in memory until the agent restarts (its disk is full or failing)"
        ),
    }
    let index = sled::Config::new()
        .temporary(true)
        .cache_capacity(INDEX_MEMORY)
        .open()
        .map_err(index_error("open an index in memory"))?;
    check_layout_version(&index)?;
    Ok(index)
}

/// Fails unless the index is at this agent's layout version (writing it if unset).
fn check_layout_version(index: &sled::Db) -> Result<()> {
    let version = layout::LAYOUT_VERSION.to_be_bytes();
    match index
        .get(layout::VERSION_KEY)
        .map_err(index_error("read the layout version"))?
    {
        Some(v) if *v == version => Ok(()),
        Some(v) => Err(Error::Cache {
            reason: format!(
                "index layout version {v:?}, this agent reads version {}",
                layout::LAYOUT_VERSION
            ),
        }),
        None => index
            .insert(layout::VERSION_KEY, &version)
            .map(drop)
            .map_err(index_error("write the layout version")),
    }
}

/// Removes chunk files under `data_dir`, least recently modified first, until `room`
/// bytes are freed or none is left; returns the bytes freed. Used before the index is
/// open, so it goes by the files alone.
fn remove_oldest_chunk_files(data_dir: &Path, room: u64) -> u64 {
    let mut files = Vec::new();
    let mut dirs = vec![data_dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for (path, is_dir) in list(&dir).unwrap_or_default() {
            if is_dir {
                dirs.push(path);
            } else if let Ok(meta) = fs::metadata(&path) {
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((modified, path, meta.len()));
            }
        }
    }
    files.sort_by_key(|(modified, _, _)| *modified);
    let mut freed = 0;
    for (_, path, size) in files {
        if freed >= room {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            freed += size;
        }
    }
    freed
}

/// What `dir` holds: each path, and whether it is a directory.
fn list(dir: &Path) -> Result<Vec<(PathBuf, bool)>> {
    let fail = |e| Error::io("list", dir, e);
    let mut out = Vec::new();
    for item in fs::read_dir(dir).map_err(fail)? {
        let item = item.map_err(fail)?;
        out.push((item.path(), item.file_type().map_err(fail)?.is_dir()));
    }
    Ok(out)
}
