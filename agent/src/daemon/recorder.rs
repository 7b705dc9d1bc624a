//! What a mount's workload reads: `mount --record`'s paths of the files read, in
//! first-read order, written as they are read (a prefetch list for `tessera convert
//! --prefetch-list`); and which chunks hold given ranges of an image's files
//! (`Request::ChunksOf`: a checkpoint's working set).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use rafs_format::reader::{Bootstrap, FileChunk, FileKind};

use crate::api::ChunkList;

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

/// The chunks of `bootstrap` that hold `ranges` (`(inode, offset, len)`), each once, in
/// the order of the ranges; a range of no inode (`None`: a path the image does not
/// have) or of an inode that is no regular file counts as unknown.
pub(super) fn chunks_of(
    bootstrap: &Bootstrap,
    ranges: impl IntoIterator<Item = (Option<u32>, u64, u64)>,
) -> ChunkList {
    let mut pieces: HashMap<u32, Option<Vec<FileChunk>>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut out = ChunkList {
        chunks: Vec::new(),
        compressed_bytes: 0,
        bytes: 0,
        unknown: 0,
    };
    for (ino, offset, len) in ranges {
        let Some(ino) = ino else {
            out.unknown += 1;
            continue;
        };
        let file = pieces.entry(ino).or_insert_with(|| {
            let inode = bootstrap.inode(ino).ok()?;
            (inode.kind == FileKind::Regular)
                .then(|| bootstrap.file_chunks(&inode).ok())
                .flatten()
        });
        let Some(file) = file else {
            out.unknown += 1;
            continue;
        };
        let end = offset.saturating_add(len);
        // Pieces are in file order: the ones that overlap [offset, end).
        let first = file.partition_point(|p| p.file_offset + u64::from(p.len) <= offset);
        for piece in file[first..].iter().take_while(|p| p.file_offset < end) {
            let Some(chunk) = piece.chunk else { continue };
            if !seen.insert(chunk) {
                continue;
            }
            if let Ok(info) = bootstrap.chunk(chunk) {
                out.compressed_bytes += u64::from(info.compressed_size);
                out.bytes += u64::from(info.uncompressed_size);
            }
            out.chunks.push(chunk);
        }
    }
    out
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
    fn image(dir: &Path) -> (Bootstrap, u32, u32) {
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
        (b, a, bb)
    }

    fn chunks_of_file(b: &Bootstrap, ino: u32) -> Vec<u32> {
        let inode = b.inode(ino).unwrap();
        b.file_chunks(&inode)
            .unwrap()
            .iter()
            .map(|p| p.chunk.unwrap())
            .collect()
    }

    #[test]
    fn ranges_become_the_chunks_that_hold_them_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (bootstrap, a, b) = image(dir.path());
        let (ca, cb) = (chunks_of_file(&bootstrap, a), chunks_of_file(&bootstrap, b));
        assert_eq!(ca[1], cb[0], "the shared block is one chunk");
        let c = CHUNK as u64;
        // b's second chunk; a range across a's first two chunks; b's first (a's second
        // again: listed already); a's last byte; an inode that is no file.
        let list = chunks_of(
            &bootstrap,
            [
                (Some(b), c + 10, 100),
                (Some(a), c - 1, 2),
                (Some(b), 0, c),
                (Some(a), 3 * c - 1, 1),
                (Some(u32::MAX), 0, 10),
            ],
        );
        assert_eq!(list.chunks, vec![cb[1], ca[0], ca[1], ca[2]]);
        assert_eq!(list.unknown, 1);
        assert_eq!(list.bytes, 4 * c);
        let stored: u64 = list
            .chunks
            .iter()
            .map(|c| u64::from(bootstrap.chunk(*c).unwrap().compressed_size))
            .sum();
        assert_eq!(list.compressed_bytes, stored);
    }
}
