//! Arithmetic on sets of `[start, end)` byte ranges: what a host holds of a blob is a
//! merged, sorted list of them. The scheduler keeps holdings this way, and the agent
//! merges what it announces the same way, so both sides share one definition.
//!
//! A leaf: it knows [`ByteRange`] and nothing else of the protocol. [`merge`] also
//! and [`subtract`] also take plain `(start, end)` pairs, as the agent keeps them.

use crate::domain::ByteRange;

/// A `[start, end)` range [`merge`] and [`subtract`] can work on: [`ByteRange`] or a
/// `(start, end)` pair.
pub trait Span: Copy {
    fn start(&self) -> u64;
    fn end(&self) -> u64;
    /// The same range ending at `end`.
    fn with_end(self, end: u64) -> Self;
    /// The same range starting at `start`.
    fn with_start(self, start: u64) -> Self;
}

impl Span for ByteRange {
    fn start(&self) -> u64 {
        self.start
    }
    fn end(&self) -> u64 {
        self.end
    }
    fn with_end(self, end: u64) -> Self {
        ByteRange { end, ..self }
    }
    fn with_start(self, start: u64) -> Self {
        ByteRange { start, ..self }
    }
}

impl Span for (u64, u64) {
    fn start(&self) -> u64 {
        self.0
    }
    fn end(&self) -> u64 {
        self.1
    }
    fn with_end(self, end: u64) -> Self {
        (self.0, end)
    }
    fn with_start(self, start: u64) -> Self {
        (start, self.1)
    }
}

/// Sorts `ranges` and merges those that overlap or touch, in place: afterwards they
/// are sorted, disjoint and separated by gaps.
pub fn merge<R: Span>(ranges: &mut Vec<R>) {
    ranges.sort_unstable_by_key(|r| (r.start(), r.end()));
    let mut out: Vec<R> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(last) if r.start() <= last.end() => {
                *last = last.with_end(last.end().max(r.end()));
            }
            _ => out.push(r),
        }
    }
    *ranges = out;
}

/// Whether `a` and `b` share at least one byte.
pub fn overlaps(a: ByteRange, b: ByteRange) -> bool {
    a.start < b.end && b.start < a.end
}

/// Bytes of `want` that `ranges` (merged, sorted) hold.
pub fn covered(ranges: &[ByteRange], want: ByteRange) -> u64 {
    ranges
        .iter()
        .skip(ranges.partition_point(|r| r.end <= want.start))
        .take_while(|r| r.start < want.end)
        .map(|r| r.end.min(want.end) - r.start.max(want.start))
        .sum()
}

/// Whether `ranges` (merged, sorted) hold every byte of `want`.
pub fn covers(ranges: &[ByteRange], want: ByteRange) -> bool {
    covered(ranges, want) == want.end - want.start
}

/// Removes the bytes of `gone` from `ranges` (sorted, disjoint), splitting a range
/// that `gone` falls inside; order and disjointness are kept.
pub fn subtract<R: Span>(ranges: &mut Vec<R>, gone: R) {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for r in ranges.drain(..) {
        if r.end() <= gone.start() || r.start() >= gone.end() {
            out.push(r);
            continue;
        }
        if r.start() < gone.start() {
            out.push(r.with_end(gone.start()));
        }
        if r.end() > gone.end() {
            out.push(r.with_start(gone.end()));
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn br(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    #[test]
    fn ranges_merge_and_subtract() {
        let mut r = vec![br(10, 20), br(0, 10), br(30, 40)];
        merge(&mut r);
        assert_eq!(r, [br(0, 20), br(30, 40)]);
        assert!(covers(&r, br(5, 20)));
        assert!(!covers(&r, br(15, 35)));
        subtract(&mut r, br(5, 35));
        assert_eq!(r, [br(0, 5), br(35, 40)]);
    }

    #[test]
    fn pairs_merge_as_byte_ranges_do() {
        let mut r = vec![(30, 40), (10, 20), (0, 10), (35, 36)];
        merge(&mut r);
        assert_eq!(r, [(0, 20), (30, 40)]);
    }

    /// The bytes below `BITS` that `ranges` hold, one bit each: the model the
    /// operations are checked against.
    const BITS: u64 = 64;

    fn bits(ranges: &[ByteRange]) -> u64 {
        ranges
            .iter()
            .flat_map(|r| r.start..r.end)
            .fold(0, |acc, b| acc | 1 << b)
    }

    /// A deterministic generator (xorshift64), so failures reproduce without a
    /// property-testing dependency in the protocol crate.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        fn range(&mut self) -> ByteRange {
            let start = self.below(BITS - 1);
            br(start, start + 1 + self.below(BITS - start))
        }
    }

    fn sorted_and_apart(ranges: &[ByteRange]) -> bool {
        ranges.iter().all(|r| r.start < r.end) && ranges.windows(2).all(|w| w[0].end < w[1].start)
    }

    #[test]
    fn merge_covered_and_subtract_agree_with_a_bitmap() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for case in 0..5_000 {
            let mut ranges: Vec<ByteRange> = (0..rng.below(6)).map(|_| rng.range()).collect();
            let held = bits(&ranges);
            merge(&mut ranges);
            assert!(sorted_and_apart(&ranges), "case {case}: {ranges:?}");
            assert_eq!(bits(&ranges), held, "case {case}: merge changed the bytes");

            let want = rng.range();
            let in_want = bits(&[want]);
            assert_eq!(
                covered(&ranges, want),
                u64::from((held & in_want).count_ones()),
                "case {case}: covered({ranges:?}, {want:?})"
            );
            assert_eq!(covers(&ranges, want), held & in_want == in_want);

            let gone = rng.range();
            subtract(&mut ranges, gone);
            assert!(sorted_and_apart(&ranges), "case {case}: {ranges:?}");
            assert_eq!(
                bits(&ranges),
                held & !bits(&[gone]),
                "case {case}: subtract {gone:?}"
            );
            assert!(ranges.iter().all(|r| !overlaps(*r, gone)));
        }
    }
}
