//! The compressed bytes of gzip layers that runs of spans fetched lately. Spans of one
//! checkpoint overlap (each starts at the checkpoint's byte): a read into a region an
//! earlier read inflated needs the stretch from the checkpoint again. The origin step
//! takes what is held here of a run's range and asks the origin for the rest only.

use std::collections::VecDeque;

/// How many bytes are held at most: a few checkpoints' spans of several layers.
pub(super) const RECENT_SPAN_BYTES: usize = 32 << 20;

/// Stretches of blobs, oldest first.
#[derive(Debug, Default)]
pub(super) struct RecentSpans {
    stretches: VecDeque<Stretch>,
    bytes: usize,
}

#[derive(Debug)]
struct Stretch {
    blob: String,
    start: u64,
    bytes: Vec<u8>,
}

impl Stretch {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl RecentSpans {
    /// The bytes of `blob` from `start` on, up to `end`, as far as one stretch holds
    /// them (empty when none holds `start`).
    pub(super) fn held(&self, blob: &str, start: u64, end: u64) -> Vec<u8> {
        self.stretches
            .iter()
            .filter(|s| s.blob == blob && s.start <= start && start < s.end())
            .max_by_key(|s| s.end())
            .map(|s| {
                let from = (start - s.start) as usize;
                let to = (end.min(s.end()) - s.start) as usize;
                s.bytes[from..to].to_vec()
            })
            .unwrap_or_default()
    }

    /// Keeps `bytes` of `blob` from `start`, dropping the stretches it covers and, while
    /// over [`RECENT_SPAN_BYTES`], the oldest.
    pub(super) fn keep(&mut self, blob: &str, start: u64, bytes: Vec<u8>) {
        if bytes.is_empty() || bytes.len() > RECENT_SPAN_BYTES {
            return;
        }
        let end = start + bytes.len() as u64;
        let covered = |s: &Stretch| s.blob == blob && start <= s.start && s.end() <= end;
        let freed: usize = self
            .stretches
            .iter()
            .filter(|s| covered(s))
            .map(|s| s.bytes.len())
            .sum();
        self.stretches.retain(|s| !covered(s));
        self.bytes = self.bytes - freed + bytes.len();
        self.stretches.push_back(Stretch {
            blob: blob.to_string(),
            start,
            bytes,
        });
        while self.bytes > RECENT_SPAN_BYTES {
            match self.stretches.pop_front() {
                Some(old) => self.bytes -= old.bytes.len(),
                None => break,
            }
        }
    }
}

impl RecentSpans {
    /// Drops every stretch of `blob` that overlaps `[start, end)` (bytes that failed
    /// verification there are not used again).
    pub(super) fn forget(&mut self, blob: &str, start: u64, end: u64) {
        let mut freed = 0;
        self.stretches.retain(|s| {
            let overlaps = s.blob == blob && s.start < end && start < s.end();
            if overlaps {
                freed += s.bytes.len();
            }
            !overlaps
        });
        self.bytes -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_one_stretch_has_from_a_start_and_forgets_the_oldest() {
        let mut recent = RecentSpans::default();
        recent.keep("a", 100, (0..50).collect());
        assert_eq!(recent.held("a", 110, 200), (10..50).collect::<Vec<u8>>());
        assert_eq!(recent.held("a", 110, 120), (10..20).collect::<Vec<u8>>());
        assert!(recent.held("a", 99, 200).is_empty(), "before the stretch");
        assert!(recent.held("a", 150, 200).is_empty(), "after it");
        assert!(recent.held("b", 110, 200).is_empty(), "another blob");
        // A wider stretch replaces the one it covers.
        recent.keep("a", 100, vec![7; 80]);
        assert_eq!(recent.stretches.len(), 1);
        assert_eq!(recent.held("a", 170, 200), vec![7; 10]);
        // Over the budget, the oldest goes.
        recent.keep("b", 0, vec![1; RECENT_SPAN_BYTES - 40]);
        recent.keep("c", 0, vec![2; 100]);
        assert!(recent.held("a", 100, 101).is_empty());
        assert_eq!(recent.held("c", 0, 1), vec![2]);
        assert!(recent.bytes <= RECENT_SPAN_BYTES);
        recent.forget("c", 50, 60);
        assert!(recent.held("c", 0, 1).is_empty());
    }
}
