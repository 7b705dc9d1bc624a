//! Read-ahead within a file: when reads of a blob go sequentially, the chunks that
//! follow the one read, of the same file and within a byte window, are fetched in the
//! background so the network works while the reader reads. Pure bookkeeping over the
//! image's chunk order, tested on its own.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug)]
pub(super) struct ReadAhead {
    /// Chunk indices of each blob in offset order.
    pub order: Vec<Vec<u32>>,
    /// Each chunk's position in its blob's `order`.
    pub position: Vec<u32>,
    /// The first file (inode) that uses each chunk: read-ahead stays within a file.
    pub owner: Vec<u32>,
    /// Each chunk's stored size (what the window counts).
    pub stored: Vec<u32>,
    /// Per blob, the position of the last chunk read and the furthest position
    /// read-ahead was started for.
    sequence: Mutex<HashMap<u32, (u32, u32)>>,
}

impl ReadAhead {
    pub(super) fn new(
        order: Vec<Vec<u32>>,
        position: Vec<u32>,
        owner: Vec<u32>,
        stored: Vec<u32>,
    ) -> Self {
        ReadAhead {
            order,
            position,
            owner,
            stored,
            sequence: Mutex::new(HashMap::new()),
        }
    }

    /// Chunks to read ahead after a read of `chunk` (of blob `blob`): when reads of its
    /// blob go sequentially, the following chunks of the same file, up to `window`
    /// bytes past the read, that no earlier read-ahead has asked for.
    #[cfg(test)]
    pub(super) fn after(&self, blob: u32, chunk: u32, window: u64) -> Vec<u32> {
        self.step(blob, chunk, window).1
    }

    /// Records a read of `chunk`: whether reads of its blob go sequentially, and the
    /// chunks to read ahead (see [`after`](Self::after)).
    pub(super) fn step(&self, blob: u32, chunk: u32, window: u64) -> (bool, Vec<u32>) {
        let (Some(&pos), Some(order)) = (
            self.position.get(chunk as usize),
            self.order.get(blob as usize),
        ) else {
            return (false, Vec::new());
        };
        let mut sequence = self.sequence.lock().unwrap_or_else(|p| p.into_inner());
        let (last, ahead) = sequence.entry(blob).or_insert((u32::MAX, 0));
        let sequential = *last != u32::MAX && (pos == *last || pos == last.wrapping_add(1));
        *last = pos;
        if !sequential || window == 0 {
            return (sequential, Vec::new());
        }
        let owner = self.owner[chunk as usize];
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for (p, &next) in order.iter().enumerate().skip(pos as usize + 1) {
            if self.owner[next as usize] != owner || bytes >= window {
                break;
            }
            bytes += u64::from(self.stored[next as usize]);
            if p as u32 > *ahead {
                out.push(next);
                *ahead = p as u32;
            }
        }
        (true, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One blob of ten 100-byte chunks: 0..4 belong to file 7, 4..10 to file 8.
    fn two_files() -> ReadAhead {
        let owner = (0..10).map(|c| if c < 4 { 7 } else { 8 }).collect();
        ReadAhead::new(
            vec![(0..10).collect()],
            (0..10).collect(),
            owner,
            vec![100; 10],
        )
    }

    #[test]
    fn sequential_reads_fetch_ahead_within_the_file_and_window() {
        let ra = two_files();
        assert!(
            ra.after(0, 4, 250).is_empty(),
            "a first read is not a sequence"
        );
        // Sequential now: up to 250 bytes ahead, i.e. the next three chunks.
        assert_eq!(ra.after(0, 5, 250), [6, 7, 8]);
        // Already asked for: only the newly reachable one.
        assert_eq!(ra.after(0, 6, 250), [9]);
        // The end of the file (and blob): nothing more.
        assert!(ra.after(0, 7, 250).is_empty());
    }

    #[test]
    fn read_ahead_stops_at_the_end_of_the_file() {
        let ra = two_files();
        ra.after(0, 0, 10_000);
        assert_eq!(
            ra.after(0, 1, 10_000),
            [2, 3],
            "chunks 4.. are another file's"
        );
    }

    #[test]
    fn random_reads_and_a_zero_window_fetch_nothing_ahead() {
        let ra = two_files();
        ra.after(0, 1, 1000);
        assert!(ra.after(0, 5, 1000).is_empty(), "a jump is not sequential");
        assert!(ra.after(0, 6, 0).is_empty(), "window 0 is off");
        assert!(ra.after(3, 6, 1000).is_empty(), "an unknown blob");
        assert!(ra.after(0, 99, 1000).is_empty(), "an unknown chunk");
    }
}
