//! Backing files for FUSE passthrough: the data of one regular file of an image, whole,
//! in one file on local disk that the kernel reads with no round trip to the agent.
//!
//! A file that is one whole chunk needs nothing new: the chunk's own file is its
//! backing file. A file of several chunks (or with holes) gets a copy, made once all its
//! chunks are cached and trusted: `<dir>/files/<xx>/<hex>`, named by the file's
//! [`FileLayout`] (a digest over its size and each piece), so identical files of
//! different images share one. Each is copied from trusted chunk files
//! (`copy_file_range`: the kernel copies, and filesystems that share extents, such as
//! XFS and Btrfs, share them instead), written to a temp file and renamed into place, so
//! it is whole or absent. Backing files count against the cache's capacity and may take
//! at most a quarter of it; the least recently opened go first. At open, those the last
//! checkpoint did not cover are removed (made again when next needed), like temp files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
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
    /// Layouts being made now: one maker each.
    making: Mutex<HashSet<[u8; 32]>>,
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
            making: Mutex::default(),
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

    /// Makes `layout`'s backing file by copying each piece from `chunk_file(key)`
    /// (which the caller has pinned and trusts); `false` if it exists or is being made.
    pub(super) fn make(
        &self,
        layout: &FileLayout,
        chunk_file: impl Fn(&ChunkKey) -> PathBuf,
    ) -> Result<bool> {
        let id = layout.id();
        if self.index().files.contains_key(&id) {
            return Ok(false);
        }
        if !self
            .making
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id)
        {
            return Ok(false);
        }
        let made = self.write(&id, layout, chunk_file);
        self.making
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        made.map(|()| true)
    }

    fn write(
        &self,
        id: &[u8; 32],
        layout: &FileLayout,
        chunk_file: impl Fn(&ChunkKey) -> PathBuf,
    ) -> Result<()> {
        let path = file_path(&self.dir, id);
        let shard = path.parent().unwrap_or(&self.dir).to_path_buf();
        fs::create_dir_all(&shard).map_err(|e| Error::io("create", &shard, e))?;
        let tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(&shard)
            .map_err(|e| Error::io("create a backing file in", &shard, e))?;
        for (offset, len, chunk) in &layout.pieces {
            let Some(key) = chunk else {
                continue; // a hole: left sparse
            };
            let from = chunk_file(key);
            let source = fs::File::open(&from).map_err(|e| Error::io("open", &from, e))?;
            copy_range(&source, tmp.as_file(), *offset, u64::from(*len))
                .map_err(|e| Error::io("copy into a backing file", &from, e))?;
        }
        tmp.as_file()
            .set_len(layout.size)
            .map_err(|e| Error::io("size", tmp.path(), e))?;
        tmp.persist(&path)
            .map_err(|e| Error::io("rename into", &path, e.error))?;
        self.index().insert(*id, layout.size);
        self.bytes.fetch_add(layout.size, Relaxed);
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
fn copy_range(from: &fs::File, to: &fs::File, at: u64, len: u64) -> std::io::Result<()> {
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
