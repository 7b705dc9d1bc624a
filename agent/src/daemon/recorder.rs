//! What a mount's workload reads: `mount --record`'s paths of the files read, in
//! first-read order, written as they are read (a prefetch list for `tessera convert
//! --prefetch-list`); and the chunks read, kept for `Request::ReadChunks` (a
//! checkpoint's working set).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rafs_format::reader::{Bootstrap, FileChunk, FileKind};

use crate::api::ReadChunks;

use crate::{Error, Result};

/// Writes the path of each regular file the workload reads, once, in first-read order:
/// a prefetch list for `tessera convert --prefetch-list`.
#[derive(Debug)]
pub struct Recorder {
    /// Path (from the root, with a leading `/`) of each regular file, by inode.
    paths: HashMap<u32, Vec<u8>>,
    /// The inodes recorded already, and the file they were written to.
    seen: Mutex<(HashSet<u32>, std::fs::File)>,
}

impl Recorder {
    pub(super) fn new(bootstrap: &Bootstrap, out: &Path) -> Result<Self> {
        let mut paths = HashMap::new();
        rafs_format::image::for_each_entry(bootstrap, |path, inode, first| {
            if first && inode.kind == FileKind::Regular {
                let mut p = Vec::with_capacity(path.len() + 1);
                p.push(b'/');
                p.extend_from_slice(path);
                paths.insert(inode.ino, p);
            }
        })?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| Error::io("open record file", out, e))?;
        Ok(Recorder {
            paths,
            seen: Mutex::new((HashSet::new(), file)),
        })
    }

    pub(super) fn saw(&self, ino: u32) {
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, file) = &mut *guard;
        if !seen.insert(ino) {
            return;
        }
        if let Some(path) = self.paths.get(&ino) {
            let mut line = path.clone();
            line.push(b'\n');
            if let Err(e) = file.write_all(&line) {
                tracing::warn!(error = %e, "could not record a read");
            }
        }
    }
}

/// Keeps every read a mount serves, for [`ChunkRecorder::read`]: which chunks a
/// workload read, in first-read order (a checkpoint's working set). Reads are kept as
/// they come (the session thread must not block) and turned into chunks when asked.
#[derive(Debug)]
pub struct ChunkRecorder {
    bootstrap: Arc<Bootstrap>,
    /// `(inode, offset, len)` of each read, in order, up to [`MAX_READS`].
    reads: Mutex<Vec<(u32, u64, u64)>>,
}

/// Reads kept at most (24 bytes each): past it a recording stops growing, and says so.
const MAX_READS: usize = 1 << 20;

impl ChunkRecorder {
    pub(super) fn new(bootstrap: Arc<Bootstrap>) -> Self {
        ChunkRecorder {
            bootstrap,
            reads: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn saw(&self, ino: u32, offset: u64, len: u64) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        if reads.len() < MAX_READS {
            reads.push((ino, offset, len));
        }
    }

    /// The chunks read so far, in first-read order.
    pub(super) fn read(&self) -> ReadChunks {
        let reads = self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let truncated = reads.len() >= MAX_READS;
        let mut pieces: HashMap<u32, Vec<FileChunk>> = HashMap::new();
        let mut seen = HashSet::new();
        let mut out = ReadChunks {
            chunks: Vec::new(),
            compressed_bytes: 0,
            bytes: 0,
            truncated,
        };
        for (ino, offset, len) in reads {
            let file = pieces.entry(ino).or_insert_with(|| {
                self.bootstrap
                    .inode(ino)
                    .and_then(|inode| self.bootstrap.file_chunks(&inode))
                    .unwrap_or_default()
            });
            let end = offset.saturating_add(len);
            // Pieces are in file order: the ones that overlap [offset, end).
            let first = file.partition_point(|p| p.file_offset + u64::from(p.len) <= offset);
            for piece in file[first..].iter().take_while(|p| p.file_offset < end) {
                let Some(chunk) = piece.chunk else { continue };
                if !seen.insert(chunk) {
                    continue;
                }
                if let Ok(info) = self.bootstrap.chunk(chunk) {
                    out.compressed_bytes += u64::from(info.compressed_size);
                    out.bytes += u64::from(info.uncompressed_size);
                }
                out.chunks.push(chunk);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafs_format::builder::{BuildOptions, Builder};
    use rafs_format::chunk::Chunking;
    use rafs_format::reader::Verify;

    const CHUNK: usize = 4096;

    /// An image of `a` (3 chunks of distinct bytes) and `b` (2 chunks, its first the
    /// same bytes as `a`'s second: one chunk, deduplicated); its bootstrap, and the
    /// inodes of `a` and `b`.
    fn image(dir: &Path) -> (Arc<Bootstrap>, u32, u32) {
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let block = |v: u8| vec![v; CHUNK];
        std::fs::write(root.join("a"), [block(1), block(2), block(3)].concat()).unwrap();
        std::fs::write(root.join("b"), [block(2), block(4)].concat()).unwrap();
        let out = dir.join("out");
        let opts = BuildOptions {
            chunking: Chunking::Fixed { size: CHUNK as u32 },
            ..BuildOptions::default()
        };
        let mut builder = Builder::new(&out, opts).unwrap();
        builder.add_dir(&root).unwrap();
        builder.finish().unwrap();
        let bytes = std::fs::read(out.join("bootstrap")).unwrap();
        let b = Bootstrap::from_bytes(bytes, Verify::Checksum).unwrap();
        let mut inodes = HashMap::new();
        rafs_format::image::for_each_entry(&b, |path, inode, _| {
            inodes.insert(path.to_vec(), inode.ino);
        })
        .unwrap();
        let (a, bb) = (inodes[&b"a".to_vec()], inodes[&b"b".to_vec()]);
        (Arc::new(b), a, bb)
    }

    fn chunks_of(b: &Bootstrap, ino: u32) -> Vec<u32> {
        let inode = b.inode(ino).unwrap();
        b.file_chunks(&inode)
            .unwrap()
            .iter()
            .map(|p| p.chunk.unwrap())
            .collect()
    }

    #[test]
    fn reads_become_the_chunks_they_touched_once_in_first_read_order() {
        let dir = tempfile::tempdir().unwrap();
        let (bootstrap, a, b) = image(dir.path());
        let (ca, cb) = (chunks_of(&bootstrap, a), chunks_of(&bootstrap, b));
        assert_eq!(ca[1], cb[0], "the shared block is one chunk");
        let recorder = ChunkRecorder::new(bootstrap.clone());
        // b's second chunk; then a read across a's first two chunks; then b's first
        // (a's second again: recorded already); then a's last byte.
        recorder.saw(b, CHUNK as u64 + 10, 100);
        recorder.saw(a, CHUNK as u64 - 1, 2);
        recorder.saw(b, 0, CHUNK as u64);
        recorder.saw(a, 3 * CHUNK as u64 - 1, 1);
        let read = recorder.read();
        assert_eq!(read.chunks, vec![cb[1], ca[0], ca[1], ca[2]]);
        assert!(!read.truncated);
        assert_eq!(read.bytes, 4 * CHUNK as u64);
        let stored: u64 = read
            .chunks
            .iter()
            .map(|c| u64::from(bootstrap.chunk(*c).unwrap().compressed_size))
            .sum();
        assert_eq!(read.compressed_bytes, stored);
        // A read of an inode that is no file adds nothing.
        recorder.saw(u32::MAX, 0, 10);
        assert_eq!(recorder.read().chunks.len(), 4);
    }
}
