//! The node's chunk cache: verified, uncompressed chunks on local disk, keyed by digest
//! and shared by every image, so a chunk common to many images is stored once and a
//! restarted agent serves what it had without touching the network.
//!
//! Each chunk is a file (`data/<algo>/<xx>/<hex>`); a sled database (`index/`) holds an
//! entry record per chunk (size, last use) and an LRU record per chunk, keyed by its
//! last-use sequence number so that sled's key order is the eviction order. The layout
//! is specified in `layout.rs`. The invariants:
//!
//! - **A file is complete before anything points at it.** `put` writes a temp file in
//!   the chunk's own directory and renames it into place, then indexes it. A crash
//!   leaves at most a temp file or an unindexed file, both removed at open. Nothing is
//!   fsynced: a file torn by a power cut is caught by the next invariant.
//! - **Nothing unverified is served.** `get` checks the file's size and digest before
//!   returning it; a mismatch or an unreadable file drops the entry and is a miss.
//! - **The index is checked at open and rebuilt from the files.** Entries whose file is
//!   missing or has the wrong size are dropped; temp files and files not named like a
//!   chunk are removed; chunk files without an entry (records lost to sled's periodic
//!   flush, or a whole index lost) are indexed again, oldest first; the byte total is
//!   recounted. An index that does not open is rebuilt this way, never a reason not
//!   to start.
//! - **Entry and LRU records change together.** Every change is one atomic sled batch,
//!   made under the key's stripe lock together with the file change, so concurrent
//!   `put`, `get`, eviction and removal of one key are serialised (reads of the file are
//!   not locked: a rename or unlink never disturbs an open reader).
//! - **LRU by sequence, not clock.** Each put or hit takes the next value of a counter
//!   (restored at open from the largest stored one), so order survives restarts and
//!   clock jumps, and a hit costs one batch rather than a scan.
//! - **Capacity is kept after every put** by evicting from the front of the LRU order,
//!   skipping pinned chunks; a full disk evicts a little and tries the write again.
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

mod layout;
pub mod pieces;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rafs_format::chunk::DigestAlgo;
use serde::{Deserialize, Serialize};
use tempfile::NamedTempFile;

use crate::{Error, Result};
use layout::{
    chunk_path, entry_key, lru_key, shard_dir, Entry, ENTRY_PREFIX, LRU_PREFIX, TMP_PREFIX,
};

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

/// Pin counts of the keys of one stripe; the stripe's mutex also serialises every change
/// to those keys' files and index records.
type Pins = HashMap<ChunkKey, u32>;

/// The cache. `Send + Sync`: share it in an `Arc` between all reader threads.
pub struct ChunkCache {
    /// `<dir>/data`: the chunk files.
    data_dir: PathBuf,
    /// Entry and LRU records (see `layout.rs`).
    index: sled::Db,
    capacity: u64,
    /// The next last-use sequence number.
    next_seq: AtomicU64,
    /// Sum of the indexed chunks' sizes, and their number: kept here because sled
    /// counts by scanning.
    bytes: AtomicU64,
    entries: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    verification_failures: AtomicU64,
    stored_bytes: AtomicU64,
    stripes: Box<[Mutex<Pins>]>,
    /// One evictor at a time: two would race each other over the same LRU front.
    evicting: Mutex<()>,
    /// The last put found the disk full with nothing left to evict.
    disk_full: AtomicBool,
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
        let cache = ChunkCache {
            data_dir,
            index,
            capacity,
            next_seq: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            verification_failures: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            evicting: Mutex::new(()),
            disk_full: AtomicBool::new(false),
            full_warned: Mutex::new(None),
            on_drop: std::sync::OnceLock::new(),
            #[cfg(test)]
            full_writes: Default::default(),
        };
        let dropped = cache.check_entries()?;
        let (adopted, strays) = cache.index_unindexed_files()?;
        tracing::info!(
            dir = %dir.display(),
            entries = cache.entries.load(Relaxed),
            bytes = cache.bytes.load(Relaxed),
            dropped,
            adopted,
            strays,
            "chunk cache opened"
        );
        cache.evict_to(capacity)?;
        Ok(cache)
    }

    /// The chunk's verified bytes, or `None` if it is not cached or its file no longer
    /// matches its digest (then it is dropped). `Err` only if the index fails.
    pub fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        let Some(entry) = self.entry(key)? else {
            self.misses.fetch_add(1, Relaxed);
            return Ok(None);
        };
        match self.read_verified(key, entry) {
            Ok(data) => {
                // The bytes are good whatever happens to the LRU order.
                if let Err(e) = self.touch(key) {
                    tracing::warn!(chunk = %key, error = %e, "could not record a cache hit");
                }
                self.hits.fetch_add(1, Relaxed);
                Ok(Some(data))
            }
            Err(why) => {
                // If the entry changed meanwhile, an eviction or a new put got there
                // first and this file is no longer the cache's business.
                if self.remove_if_current(key, entry)? {
                    if !matches!(why, Unusable::Unreadable(_)) {
                        self.verification_failures.fetch_add(1, Relaxed);
                    }
                    let path = chunk_path(&self.data_dir, key);
                    tracing::warn!(chunk = %key, path = %path.display(), "dropped a cached chunk: {why}");
                    self.tell_dropped(&[*key], DropCause::Corrupt);
                }
                self.misses.fetch_add(1, Relaxed);
                Ok(None)
            }
        }
    }

    /// Whether the chunk is indexed (its bytes are verified only by [`get`](Self::get)).
    pub fn contains(&self, key: &ChunkKey) -> bool {
        self.index.contains_key(entry_key(key)).unwrap_or(false)
    }

    /// Stores a chunk the caller has verified against `key`. Storing a chunk already
    /// present only marks it used. A chunk larger than the capacity is not stored.
    /// `Err` means the chunk is not cached; the caller can still use its bytes.
    pub fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()> {
        debug_assert_eq!(key.algo.digest(data), key.digest, "unverified chunk put");
        let size = data.len() as u64;
        if size > self.capacity || self.touch(key)? {
            return Ok(());
        }
        let tmp = match self.write_temp(key, data) {
            Ok(tmp) => tmp,
            Err(e) => return Err(self.disk_full_or(e)),
        };
        {
            let _stripe = self.stripe(key);
            if self.entry(key)?.is_some() {
                // A concurrent put of the same bytes won; `tmp` is deleted on drop.
                return Ok(());
            }
            let path = chunk_path(&self.data_dir, key);
            tmp.persist(&path)
                .map_err(|e| Error::io("rename into", &path, e.error))?;
            let entry = Entry {
                size,
                seq: self.next_seq.fetch_add(1, Relaxed),
            };
            let mut batch = sled::Batch::default();
            batch.insert(&entry_key(key)[..], &entry.encode()[..]);
            batch.insert(&lru_key(entry.seq, key)[..], &[][..]);
            if let Err(e) = self.index.apply_batch(batch) {
                let _ = fs::remove_file(&path);
                return Err(index_error("index a chunk")(e));
            }
            self.bytes.fetch_add(size, Relaxed);
            self.entries.fetch_add(1, Relaxed);
            self.stored_bytes.fetch_add(size, Relaxed);
        }
        if self.disk_full.swap(false, Relaxed) {
            tracing::info!(dir = %self.data_dir.display(), "the cache disk has room again: caching chunks again");
        }
        self.evict_to(self.capacity)
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

    /// Drops a chunk (the registry mirror drops the pieces of a blob that failed its
    /// digest); `true` if it was cached.
    pub fn remove(&self, key: &ChunkKey) -> Result<bool> {
        let removed = match self.entry(key)? {
            Some(entry) => self.remove_if_current(key, entry)?,
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
        }
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

    fn entry(&self, key: &ChunkKey) -> Result<Option<Entry>> {
        let value = self
            .index
            .get(entry_key(key))
            .map_err(index_error("read the index"))?;
        Ok(value.and_then(|v| Entry::decode(&v)))
    }

    /// Makes `key` the most recently used; false if it is not cached.
    fn touch(&self, key: &ChunkKey) -> Result<bool> {
        let _stripe = self.stripe(key);
        let Some(old) = self.entry(key)? else {
            return Ok(false);
        };
        let new = Entry {
            seq: self.next_seq.fetch_add(1, Relaxed),
            ..old
        };
        let mut batch = sled::Batch::default();
        batch.insert(&entry_key(key)[..], &new.encode()[..]);
        batch.remove(&lru_key(old.seq, key)[..]);
        batch.insert(&lru_key(new.seq, key)[..], &[][..]);
        self.index
            .apply_batch(batch)
            .map_err(index_error("record a use"))?;
        Ok(true)
    }

    /// Reads a chunk file and checks it against its entry and digest. The read is bounded
    /// by the entry's size, so a grown file cannot make it allocate more.
    fn read_verified(&self, key: &ChunkKey, entry: Entry) -> Result<Vec<u8>, Unusable> {
        let file = fs::File::open(chunk_path(&self.data_dir, key)).map_err(Unusable::Unreadable)?;
        let mut data = Vec::with_capacity(entry.size as usize);
        file.take(entry.size + 1)
            .read_to_end(&mut data)
            .map_err(Unusable::Unreadable)?;
        if data.len() as u64 != entry.size {
            return Err(Unusable::WrongSize(data.len() as u64));
        }
        if key.algo.digest(&data) != key.digest {
            return Err(Unusable::WrongDigest);
        }
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
        self.bytes.load(Relaxed) > 0
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

    /// Drops `key` if its entry is still `expected`; true if it did.
    fn remove_if_current(&self, key: &ChunkKey, expected: Entry) -> Result<bool> {
        let _stripe = self.stripe(key);
        if self.entry(key)? != Some(expected) {
            return Ok(false);
        }
        self.remove_locked(key, expected)?;
        Ok(true)
    }

    /// Drops `key`, whose current entry is `entry`; the caller holds its stripe. The
    /// index goes first: a crash before the unlink leaves a stray file, never an entry
    /// without one.
    fn remove_locked(&self, key: &ChunkKey, entry: Entry) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.remove(&entry_key(key)[..]);
        batch.remove(&lru_key(entry.seq, key)[..]);
        self.index
            .apply_batch(batch)
            .map_err(index_error("remove a chunk"))?;
        self.bytes.fetch_sub(entry.size, Relaxed);
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

    /// [`evict_to`](Self::evict_to)'s scan; the caller holds `evicting`. The keys it
    /// evicted go to `evicted`.
    fn evict_locked(&self, target: u64, evicted: &mut Vec<ChunkKey>) -> Result<()> {
        for record in self.index.scan_prefix([LRU_PREFIX]) {
            if self.bytes.load(Relaxed) <= target {
                break;
            }
            let (lru, _) = record.map_err(index_error("read the LRU order"))?;
            let Some((seq, key)) = layout::decode_lru_key(&lru) else {
                self.index
                    .remove(lru)
                    .map_err(index_error("remove a bad LRU record"))?;
                continue;
            };
            let stripe = self.stripe(&key);
            if stripe.contains_key(&key) {
                continue;
            }
            match self.entry(&key)? {
                Some(entry) if entry.seq == seq => {
                    self.remove_locked(&key, entry)?;
                    self.evictions.fetch_add(1, Relaxed);
                    evicted.push(key);
                }
                // Not the key's current record: the iterator saw it before a use or a
                // removal replaced it (or sled once lost half a batch). Removing it
                // again is harmless; a used key's new record comes later in the scan.
                _ => {
                    self.index
                        .remove(lru)
                        .map_err(index_error("remove a stale LRU record"))?;
                }
            }
        }
        Ok(())
    }

    /// Drops entries whose file is missing or has the wrong size, and undecodable
    /// records; counts the rest and restores the sequence counter. Returns the number
    /// dropped.
    fn check_entries(&self) -> Result<u64> {
        let mut dropped = 0;
        let mut max_seq = None;
        for record in self.index.scan_prefix([ENTRY_PREFIX]) {
            let (record_key, value) = record.map_err(index_error("read the index"))?;
            let decoded = layout::decode_entry_key(&record_key).zip(Entry::decode(&value));
            let mut batch = sled::Batch::default();
            batch.remove(record_key);
            if let Some((key, entry)) = decoded {
                let path = chunk_path(&self.data_dir, &key);
                if fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == entry.size) {
                    self.bytes.fetch_add(entry.size, Relaxed);
                    self.entries.fetch_add(1, Relaxed);
                    max_seq = max_seq.max(Some(entry.seq));
                    continue;
                }
                tracing::warn!(chunk = %key, path = %path.display(), "dropping a cache entry whose file is missing or cut short");
                batch.remove(&lru_key(entry.seq, &key)[..]);
                // Not to be indexed again as it is.
                let _ = fs::remove_file(&path);
            }
            self.index
                .apply_batch(batch)
                .map_err(index_error("drop a bad entry"))?;
            dropped += 1;
        }
        // LRU records left without an entry (only if sled lost atomicity) may hold the
        // largest sequence number; a new record must not collide with them.
        let last_lru = self
            .index
            .scan_prefix([LRU_PREFIX])
            .keys()
            .next_back()
            .transpose()
            .map_err(index_error("read the LRU order"))?
            .and_then(|k| layout::decode_lru_key(&k))
            .map(|(seq, _)| seq);
        let next = max_seq.max(last_lru).map_or(0, |s| s + 1);
        self.next_seq.store(next, Relaxed);
        Ok(dropped)
    }

    /// Indexes chunk files that have no entry (their records were lost, or the whole
    /// index was), oldest first so the LRU order roughly survives; removes temp files
    /// and files not named like a chunk. Returns how many files it indexed and removed.
    /// Directories it did not make are left alone.
    fn index_unindexed_files(&self) -> Result<(u64, u64)> {
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
                    let indexed = self
                        .index
                        .contains_key(entry_key(&key))
                        .map_err(index_error("read the index"))?;
                    if !indexed {
                        let meta = fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
                        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                        unindexed.push((modified, key, meta.len()));
                    }
                }
            }
        }
        // A file is renamed into place only once written whole, so these are chunks
        // that were verified when stored (short of a power cut, as nothing is fsynced);
        // `get` checks each again before serving it.
        unindexed.sort_by_key(|(modified, _, _)| *modified);
        let adopted = unindexed.len() as u64;
        for (_, key, size) in unindexed {
            let entry = Entry {
                size,
                seq: self.next_seq.fetch_add(1, Relaxed),
            };
            let mut batch = sled::Batch::default();
            batch.insert(&entry_key(&key)[..], &entry.encode()[..]);
            batch.insert(&lru_key(entry.seq, &key)[..], &[][..]);
            self.index
                .apply_batch(batch)
                .map_err(index_error("index a chunk file"))?;
            self.bytes.fetch_add(size, Relaxed);
            self.entries.fetch_add(1, Relaxed);
        }
        Ok((adopted, removed))
    }
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
