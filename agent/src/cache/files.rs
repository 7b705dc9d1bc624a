//! Backing files for FUSE passthrough: the data of one regular file of an image, whole,
//! in one file on local disk that the kernel reads with no round trip to the agent.
//!
//! A file that is one whole chunk needs nothing new: the chunk's own file is its
//! backing file. A file of several chunks (or with holes) gets a copy:
//! `<dir>/files/<xx>/<hex>`, named by the file's [`FileLayout`] (a digest over its size
//! and each piece), so identical files of different images share one. A copy is built
//! piece by piece in a temp file (a [`Build`]) and renamed into place once every piece
//! is in it, so it is whole or absent. Pieces come from trusted chunk files
//! (`copy_file_range`: the kernel copies, and filesystems that share extents, such as
//! XFS and Btrfs, share them instead), or, for a build begun when the file was opened,
//! from the fetcher's bytes as each chunk is verified, before the reader gets them: a
//! file read whole is ready for passthrough by the time its reader has its last byte. Backing files count against the cache's capacity and may take
//! at most a quarter of it; the least recently opened go first. At open, those the last
//! checkpoint did not cover are removed (made again when next needed), like temp files.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::layout::TMP_PREFIX;
use super::{list, ChunkKey};
use crate::{Error, Result};

/// Where a file's bytes come from: its size, and its pieces in order, each a byte range
/// of the file and the chunk that fills it (`None`: a hole, zeros).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLayout {
    pub size: u64,
    pub pieces: Vec<(u64, u32, Option<ChunkKey>)>,
}

impl FileLayout {
    /// The one chunk that is the whole file, if it is.
    pub fn single_chunk(&self) -> Option<ChunkKey> {
        match self.pieces.as_slice() {
            [(0, len, Some(key))] if u64::from(*len) == self.size => Some(*key),
            _ => None,
        }
    }

    /// Names the backing file: equal for files with the same bytes from the same chunks.
    fn id(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"tessera-backing-file-v1");
        h.update(self.size.to_le_bytes());
        for (offset, len, chunk) in &self.pieces {
            h.update(offset.to_le_bytes());
            h.update(len.to_le_bytes());
            match chunk {
                Some(key) => {
                    h.update([1, key.algo.to_byte()]);
                    h.update(key.digest);
                }
                None => h.update([0]),
            }
        }
        h.finalize().into()
    }
}

/// The backing files on disk, in memory: size and last open of each.
#[derive(Default)]
struct Index {
    files: HashMap<[u8; 32], (u64, u64)>,
    /// seq → id, least recently opened first.
    order: BTreeMap<u64, [u8; 32]>,
    next_seq: u64,
}

impl Index {
    fn insert(&mut self, id: [u8; 32], size: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some((_, old)) = self.files.insert(id, (size, seq)) {
            self.order.remove(&old);
        }
        self.order.insert(seq, id);
    }

    fn remove(&mut self, id: &[u8; 32]) -> Option<u64> {
        let (size, seq) = self.files.remove(id)?;
        self.order.remove(&seq);
        Some(size)
    }
}

/// The backing files of one cache (see the module docs).
pub(super) struct BackingFiles {
    dir: PathBuf,
    index: Mutex<Index>,
    bytes: AtomicU64,
    /// Backing files being built now.
    builds: Mutex<Builds>,
    /// How many builds there are: a chunk verified while there are none costs no lock.
    building: AtomicUsize,
}

/// The backing files being built, and which chunks each still lacks.
#[derive(Default)]
struct Builds {
    by_id: HashMap<[u8; 32], Build>,
    /// chunk → the builds lacking it.
    lacking: HashMap<ChunkKey, Vec<[u8; 32]>>,
    /// The sum of the builds' file sizes: what they may come to take on disk.
    bytes: u64,
    /// Numbers the builds, so a writer finishing after its build was dropped and begun
    /// again does not count against the new one.
    next_serial: u64,
}

/// A backing file being built: a temp file beside its final place (made at the first
/// piece written), and the pieces not in it yet.
struct Build {
    serial: u64,
    size: u64,
    tmp: Option<(Arc<fs::File>, tempfile::TempPath)>,
    /// chunk → the pieces (file offset, length) it fills.
    missing: HashMap<ChunkKey, Vec<(u64, u32)>>,
    /// Pieces being written now, outside the lock: the build is done when none is
    /// missing and none is being written.
    writers: usize,
    /// Opens of the file it was begun for that have not closed: a close that finds
    /// chunks still missing drops the build only when no other open may yet read them.
    opens: usize,
}

impl Builds {
    /// Takes build `id` out, and out of the lacking lists.
    fn take(&mut self, id: &[u8; 32]) -> Option<Build> {
        let build = self.by_id.remove(id)?;
        self.bytes -= build.size;
        for key in build.missing.keys() {
            self.unlack(key, id);
        }
        Some(build)
    }

    fn unlack(&mut self, key: &ChunkKey, id: &[u8; 32]) {
        if let Some(ids) = self.lacking.get_mut(key) {
            ids.retain(|other| other != id);
            if ids.is_empty() {
                self.lacking.remove(key);
            }
        }
    }
}

/// A writer's share of a build: its id and serial, its temp file, the pieces to write.
type Job = ([u8; 32], u64, Arc<fs::File>, Vec<(u64, u32)>);

/// What [`BackingFiles::begin`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Begun {
    /// The backing file exists.
    Made,
    /// Too big for what builds may take now: none begun.
    NoRoom,
    /// A build (new or already under way) that lacks these chunks.
    Lacking(Vec<ChunkKey>),
}

impl BackingFiles {
    /// Opens `dir` (creating it): indexes the backing files the last checkpoint covered
    /// (`trusted_before`), oldest first, and removes the rest.
    pub(super) fn open(dir: PathBuf, trusted_before: SystemTime) -> Result<Self> {
        fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let mut found = Vec::new();
        for (shard, is_dir) in list(&dir)? {
            if !is_dir {
                fs::remove_file(&shard).map_err(|e| Error::io("remove", &shard, e))?;
                continue;
            }
            for (path, _) in list(&shard)? {
                let id = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| {
                        let mut id = [0; 32];
                        hex::decode_to_slice(n, &mut id).ok().map(|()| id)
                    })
                    .filter(|id| file_path(&dir, id) == path);
                let meta = fs::metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                match id {
                    Some(id) if meta.is_file() && modified < trusted_before => {
                        found.push((modified, id, meta.len()))
                    }
                    _ if meta.is_dir() => {
                        tracing::warn!(path = %path.display(), "unexpected directory among the backing files")
                    }
                    _ => fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?,
                }
            }
        }
        found.sort_by_key(|(modified, _, _)| *modified);
        let files = BackingFiles {
            dir,
            index: Mutex::default(),
            bytes: AtomicU64::new(0),
            builds: Mutex::default(),
            building: AtomicUsize::new(0),
        };
        let mut index = files.index();
        for (_, id, size) in found {
            index.insert(id, size);
            files.bytes.fetch_add(size, Relaxed);
        }
        drop(index);
        Ok(files)
    }

    pub(super) fn contains(&self, layout: &FileLayout) -> bool {
        self.index().files.contains_key(&layout.id())
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the backing file of `layout` is, if one was made (not counted as a use).
    pub(super) fn path(&self, layout: &FileLayout) -> Option<PathBuf> {
        let id = layout.id();
        self.index()
            .files
            .contains_key(&id)
            .then(|| file_path(&self.dir, &id))
    }

    /// The backing file of `layout`, opened for reading, if one was made; its use is
    /// recorded.
    pub(super) fn open_file(&self, layout: &FileLayout) -> Option<fs::File> {
        let id = layout.id();
        let size = {
            let mut index = self.index();
            let (size, _) = *index.files.get(&id)?;
            index.insert(id, size);
            size
        };
        match fs::File::open(file_path(&self.dir, &id)) {
            Ok(file) if file.metadata().is_ok_and(|m| m.len() == size) => Some(file),
            _ => {
                tracing::warn!(file = %hex::encode(id), "a backing file is missing or cut short: dropped");
                self.remove(&id);
                None
            }
        }
    }

    fn builds(&self) -> MutexGuard<'_, Builds> {
        self.builds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `layout`'s backing file is being built.
    pub(super) fn building(&self, layout: &FileLayout) -> bool {
        self.building.load(Relaxed) > 0 && self.builds().by_id.contains_key(&layout.id())
    }

    /// Begins building `layout`'s backing file, or joins the build under way (counting
    /// an open of the file, if `open`, until [`closed`](Self::closed)): in memory only,
    /// cheap enough for a FUSE session thread (the temp file is made at the first
    /// piece). Builds may together take `room` bytes. Pieces go in through
    /// [`feed`](Self::feed).
    pub(super) fn begin(&self, layout: &FileLayout, room: u64, open: bool) -> Begun {
        let id = layout.id();
        if self.index().files.contains_key(&id) {
            return Begun::Made;
        }
        let mut builds = self.builds();
        if let Some(build) = builds.by_id.get_mut(&id) {
            build.opens += usize::from(open);
            return Begun::Lacking(build.missing.keys().copied().collect());
        }
        if builds.bytes + layout.size > room {
            return Begun::NoRoom;
        }
        let mut missing: HashMap<ChunkKey, Vec<(u64, u32)>> = HashMap::new();
        for (offset, len, chunk) in &layout.pieces {
            if let Some(key) = chunk {
                missing.entry(*key).or_default().push((*offset, *len));
            }
        }
        if missing.is_empty() {
            // All holes: nothing to wait for.
            drop(builds);
            let build = Build {
                serial: 0,
                size: layout.size,
                tmp: None,
                missing,
                writers: 0,
                opens: 0,
            };
            return match self.finish(&id, build) {
                Ok(()) => Begun::Made,
                Err(e) => {
                    tracing::warn!(error = %e, "could not make a passthrough backing file");
                    Begun::NoRoom
                }
            };
        }
        for key in missing.keys() {
            builds.lacking.entry(*key).or_default().push(id);
        }
        let lacking = missing.keys().copied().collect();
        builds.bytes += layout.size;
        let serial = builds.next_serial;
        builds.next_serial += 1;
        builds.by_id.insert(
            id,
            Build {
                serial,
                size: layout.size,
                tmp: None,
                missing,
                writers: 0,
                opens: usize::from(open),
            },
        );
        self.building.store(builds.by_id.len(), Relaxed);
        Begun::Lacking(lacking)
    }

    /// Counts the close of an open that [`begin`](Self::begin) counted.
    pub(super) fn closed(&self, layout: &FileLayout) {
        if let Some(build) = self.builds().by_id.get_mut(&layout.id()) {
            build.opens = build.opens.saturating_sub(1);
        }
    }

    /// Drops `layout`'s build, if one is under way and its file is not open, and what
    /// it wrote.
    pub(super) fn abandon(&self, layout: &FileLayout) {
        let mut builds = self.builds();
        let id = layout.id();
        if builds.by_id.get(&id).is_some_and(|build| build.opens == 0) {
            builds.take(&id);
        }
        self.building.store(builds.by_id.len(), Relaxed);
    }

    /// Writes chunk `key`'s pieces into every build lacking them, with `write(file,
    /// offset, len)` (the chunk's first `len` bytes at `offset`: the caller has them
    /// verified), and makes the backing files that are then whole; how many it made. A
    /// build whose piece could not be written is dropped (a file that is never whole
    /// simply has no backing file).
    pub(super) fn feed(
        &self,
        key: &ChunkKey,
        write: impl Fn(&fs::File, u64, u32) -> std::io::Result<()>,
    ) -> Result<usize> {
        if self.building.load(Relaxed) == 0 {
            return Ok(0);
        }
        let mut jobs = Vec::new();
        let mut failed = None;
        {
            let mut builds = self.builds();
            let ids = builds.lacking.get(key).cloned().unwrap_or_default();
            for id in ids {
                match self.job(&mut builds, &id, key) {
                    Ok(Some(job)) => jobs.push(job),
                    Ok(None) => {}
                    Err(e) => {
                        builds.take(&id);
                        failed = Some(e);
                    }
                }
            }
            self.building.store(builds.by_id.len(), Relaxed);
        }
        let written: Vec<_> = jobs
            .into_iter()
            .map(|(id, serial, file, pieces)| {
                let result = pieces
                    .iter()
                    .try_for_each(|(offset, len)| write(&file, *offset, *len));
                (id, serial, result)
            })
            .collect();
        let mut whole = Vec::new();
        {
            let mut builds = self.builds();
            for (id, serial, result) in written {
                let Some(build) = builds.by_id.get_mut(&id).filter(|b| b.serial == serial) else {
                    continue; // dropped meanwhile
                };
                build.writers -= 1;
                if let Err(e) = result {
                    builds.take(&id);
                    failed = Some(Error::io("write into a backing file", &self.dir, e));
                    continue;
                }
                build.missing.remove(key);
                let done = build.missing.is_empty() && build.writers == 0;
                builds.unlack(key, &id);
                if done {
                    whole.extend(builds.take(&id).map(|build| (id, build)));
                }
            }
            self.building.store(builds.by_id.len(), Relaxed);
        }
        let made = whole.len();
        for (id, build) in whole {
            self.finish(&id, build)?;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(made),
        }
    }

    /// Counts a writer of `key`'s pieces into build `id`, making its temp file if this is
    /// its first piece: the file and pieces to write, or `None` if it has them already.
    fn job(&self, builds: &mut Builds, id: &[u8; 32], key: &ChunkKey) -> Result<Option<Job>> {
        let Some(build) = builds.by_id.get_mut(id) else {
            return Ok(None);
        };
        let Some(pieces) = build.missing.get(key).cloned() else {
            return Ok(None);
        };
        let file = match &build.tmp {
            Some((file, _)) => file.clone(),
            None => {
                let (file, path) = self.temp_file(id)?;
                let file = Arc::new(file);
                build.tmp = Some((file.clone(), path));
                file
            }
        };
        build.writers += 1;
        Ok(Some((*id, build.serial, file, pieces)))
    }

    /// A new temp file in backing file `id`'s shard.
    fn temp_file(&self, id: &[u8; 32]) -> Result<(fs::File, tempfile::TempPath)> {
        let path = file_path(&self.dir, id);
        let shard = path.parent().unwrap_or(&self.dir).to_path_buf();
        fs::create_dir_all(&shard).map_err(|e| Error::io("create", &shard, e))?;
        let tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(&shard)
            .map_err(|e| Error::io("create a backing file in", &shard, e))?;
        Ok(tmp.into_parts())
    }

    /// Puts a whole build in place as backing file `id`.
    fn finish(&self, id: &[u8; 32], build: Build) -> Result<()> {
        let (file, tmp) = match build.tmp {
            Some(made) => made,
            None => self
                .temp_file(id)
                .map(|(file, tmp)| (Arc::new(file), tmp))?, // all holes
        };
        file.set_len(build.size)
            .map_err(|e| Error::io("size", &tmp, e))?;
        let path = file_path(&self.dir, id);
        tmp.persist(&path)
            .map_err(|e| Error::io("rename into", &path, e.error))?;
        self.index().insert(*id, build.size);
        self.bytes.fetch_add(build.size, Relaxed);
        Ok(())
    }

    fn remove(&self, id: &[u8; 32]) {
        let Some(size) = self.index().remove(id) else {
            return;
        };
        self.bytes.fetch_sub(size, Relaxed);
        let path = file_path(&self.dir, id);
        if let Err(e) = fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a backing file");
            }
        }
    }

    /// Removes the least recently opened backing files until at most `target` bytes
    /// remain (an open one stays readable: the kernel holds it).
    pub(super) fn evict_to(&self, target: u64) {
        while self.bytes() > target {
            let Some(id) = self.index().order.values().next().copied() else {
                return;
            };
            self.remove(&id);
        }
    }
}

fn file_path(dir: &Path, id: &[u8; 32]) -> PathBuf {
    dir.join(hex::encode(&id[..1])).join(hex::encode(id))
}

/// Copies `len` bytes of `from` (from its start) to `to` at `at`, in the kernel.
pub(super) fn copy_range(from: &fs::File, to: &fs::File, at: u64, len: u64) -> std::io::Result<()> {
    let (mut read_at, mut write_at) = (0u64, at);
    while read_at < len {
        let left = usize::try_from(len - read_at).unwrap_or(usize::MAX);
        let copied = rustix::fs::copy_file_range(
            from.as_fd(),
            Some(&mut read_at),
            to.as_fd(),
            Some(&mut write_at),
            left,
        )?;
        if copied == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("chunk file ends after {read_at} of {len} bytes"),
            ));
        }
    }
    Ok(())
}
