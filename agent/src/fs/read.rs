//! A byte range of a file, assembled from its pieces (format.md §9.3): chunks from the
//! [`ChunkReader`], holes as zeros.

use std::ops::Range;
use std::sync::Arc;

use rafs_format::reader::FileChunk;

use super::ChunkReader;

/// The bytes of a read: borrowed from a whole chunk in memory (a page-cache read inside
/// one chunk costs no copy), or owned (read alone, or assembled from several chunks).
#[derive(Debug)]
pub enum Data {
    Chunk(Arc<Vec<u8>>, Range<usize>),
    Owned(Vec<u8>),
}

impl Data {
    /// Bytes `within` of a whole chunk; empty if `within` lies outside it (the length
    /// check every reader's answer gets turns that into an error).
    pub fn part_of(chunk: Arc<Vec<u8>>, within: Range<usize>) -> Data {
        let within = if within.end <= chunk.len() && within.start <= within.end {
            within
        } else {
            0..0
        };
        Data::Chunk(chunk, within)
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            // The range was checked against the chunk when it was made.
            Data::Chunk(chunk, range) => chunk.get(range.clone()).unwrap_or_default(),
            Data::Owned(bytes) => bytes,
        }
    }
}

/// Why a read failed: which chunk, and what the reader said.
#[derive(Debug)]
pub struct Failure {
    pub chunk: u32,
    pub cause: std::io::Error,
}

/// The bytes a read of `size` at `offset` gets from a file of `file_size` bytes:
/// short at the end of the file, empty past it.
pub fn clamp(offset: u64, size: u32, file_size: u64) -> Range<u64> {
    let end = offset.saturating_add(size.into()).min(file_size);
    offset.min(end)..end
}

/// Reads `range` (already clamped to the file) of a file made of `pieces`, which tile
/// it from offset 0 (`Bootstrap::file_chunks` checked that). Any chunk that cannot be
/// had, or that comes back the wrong length, fails the whole read: a reader gets its
/// bytes or an error, never a mix of data and garbage.
pub fn read_range(
    pieces: &[FileChunk],
    range: Range<u64>,
    reader: &dyn ChunkReader,
) -> Result<Data, Failure> {
    if range.is_empty() {
        return Ok(Data::Owned(Vec::new()));
    }
    // The last piece starting at or before the offset: pieces start at 0, so there is one.
    let first = pieces
        .partition_point(|p| p.file_offset <= range.start)
        .saturating_sub(1);
    let len = (range.end - range.start) as usize;
    let mut out: Vec<u8> = Vec::new();
    for piece in pieces[first..]
        .iter()
        .take_while(|p| p.file_offset < range.end)
    {
        let piece_end = piece.file_offset + u64::from(piece.len);
        // Both within 0..=piece.len (at most 16 MiB), so the casts are exact.
        let from = (range.start.max(piece.file_offset) - piece.file_offset) as usize;
        let to = (range.end.min(piece_end) - piece.file_offset) as usize;
        let Some(chunk) = piece.chunk else {
            out.resize(out.len() + (to - from), 0);
            continue;
        };
        let data = reader
            .read_chunk(chunk, from as u32..to as u32)
            .map_err(|cause| Failure { chunk, cause })?;
        let bytes = data.as_slice();
        if bytes.len() != to - from {
            return Err(Failure {
                chunk,
                cause: std::io::Error::other(format!(
                    "the reader returned {} bytes for {} of a chunk of {}",
                    bytes.len(),
                    to - from,
                    piece.len
                )),
            });
        }
        if to - from == len {
            return Ok(data);
        }
        if out.capacity() == 0 {
            out.reserve_exact(len);
        }
        out.extend_from_slice(bytes);
    }
    Ok(Data::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Chunk `i` is `len` bytes of value `i + 1`; chunk 99 fails; records what was read.
    struct Fake {
        len: usize,
        asked: Mutex<Vec<u32>>,
    }

    impl ChunkReader for Fake {
        fn read_chunk(&self, chunk: u32, within: Range<u32>) -> std::io::Result<Data> {
            self.asked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(chunk);
            if chunk == 99 {
                return Err(std::io::Error::other("injected"));
            }
            let whole = Arc::new(vec![chunk as u8 + 1; self.len]);
            Ok(Data::part_of(
                whole,
                within.start as usize..within.end as usize,
            ))
        }
    }

    fn piece(file_offset: u64, len: u32, chunk: Option<u32>) -> FileChunk {
        FileChunk {
            file_offset,
            len,
            chunk,
        }
    }

    #[test]
    fn assembles_chunks_and_holes_and_stops_at_the_end() {
        let reader = Fake {
            len: 4,
            asked: Mutex::new(Vec::new()),
        };
        // [0,4) chunk 0, [4,8) hole, [8,12) chunk 1.
        let pieces = [
            piece(0, 4, Some(0)),
            piece(4, 4, None),
            piece(8, 4, Some(1)),
        ];
        let read = |offset, size| {
            let data = read_range(&pieces, clamp(offset, size, 12), &reader).map_err(|f| f.chunk);
            data.map(|d| d.as_slice().to_vec())
        };
        assert_eq!(read(2, 8), Ok(vec![1, 1, 0, 0, 0, 0, 2, 2]));
        assert_eq!(read(9, 100), Ok(vec![2, 2, 2]));
        assert_eq!(read(5, 2), Ok(vec![0, 0]));
        assert_eq!(read(12, 10), Ok(vec![]));
        assert_eq!(read(40, 10), Ok(vec![]));
        // Holes were never asked for; each read asked only for the chunks it touches.
        assert_eq!(
            *reader.asked.lock().unwrap_or_else(|p| p.into_inner()),
            [0, 1, 1]
        );
    }

    #[test]
    fn a_failed_or_wrong_sized_chunk_fails_the_whole_read() {
        let reader = Fake {
            len: 4,
            asked: Mutex::new(Vec::new()),
        };
        let pieces = [piece(0, 4, Some(0)), piece(4, 4, Some(99))];
        let failed = read_range(&pieces, 0..8, &reader).map(|_| ());
        assert!(matches!(failed, Err(Failure { chunk: 99, .. })));
        let short = [piece(0, 8, Some(0))];
        assert!(read_range(&short, 0..8, &reader).is_err());
    }
}
