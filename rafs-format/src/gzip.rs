//! Gzip layers read from the middle: a DEFLATE decoder that leaves checkpoints behind.
//!
//! An unconverted image keeps its layers as gzip streams, which have no random access:
//! a byte's meaning depends on the 32 KiB of output before it and on the bit where its
//! DEFLATE block starts. So while `tessera index` reads a layer once from the start,
//! [`GzipReader`] notes a [`Checkpoint`] at block boundaries spaced at least
//! `spacing` bytes of output apart: the bit offset of the next block's header, the
//! output offset there, and the last 32 KiB of output. [`GzipReader::resume`] starts a
//! decoder at a checkpoint given the compressed bytes from its byte on, so a read in the
//! middle of a layer fetches and inflates one span instead of the whole layer (the idea
//! of zlib's `zran.c`, SOCI's ztocs and Nydus's zran). The format of the checkpoints in
//! an index is in `docs/format.md`.
//!
//! Why a decoder of our own rather than zlib: zlib can stop at block boundaries
//! (`Z_BLOCK`) and start mid-stream (`inflatePrime`, `inflateSetDictionary`), but only
//! through its C-shaped interface, which `unsafe_code = "forbid"` keeps out of this
//! workspace, and flate2 exposes neither. DEFLATE is small (RFC 1951) and this decoder
//! is fuzzed (`fuzz_targets/gzip.rs`) and checked against flate2 in the tests below.
//!
//! Resumed decoders do not check the member's CRC-32 (the CRC of the output before the
//! checkpoint is not known); what they produce is checked against the index's chunk
//! digests instead. A decoder that starts at the beginning checks every member's CRC-32
//! and length.

use std::io::{self, Read};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// DEFLATE's window: the farthest back a match may refer.
pub const WINDOW: usize = 32 * 1024;
/// The longest match.
const MAX_MATCH: usize = 258;
/// Decoded output kept before the consumer must take it (plus the window behind it).
const OUT_WORK: usize = 1024 * 1024;
/// Output between two [`Mark`]s.
pub const MARK_SPACING: u64 = 64 * 1024;
/// Compressed input read from the source at once.
const IN_BUF: usize = 128 * 1024;
/// Bits looked up at once in a Huffman table; longer codes take the slow path.
const FAST_BITS: u32 = 10;

/// Base lengths and extra bits of length symbols 257..=285 (RFC 1951, 3.2.5).
const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Base distances and extra bits of distance symbols 0..=29.
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// The order in which a dynamic block sends its code-length code lengths.
const CODE_LENGTH_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Where decoding can start again in the middle of a gzip stream.
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Bit offset, from the start of the compressed stream, of the header of the block
    /// that starts here (bits are numbered from each byte's least significant bit).
    pub in_bits: u64,
    /// Offset in the uncompressed output where that block's output starts.
    pub out: u64,
    /// The output just before `out`: the last 32 KiB of it, or all of it when less was
    /// produced. A match in the blocks that follow may refer back this far.
    pub window: Vec<u8>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("in_bits", &self.in_bits)
            .field("out", &self.out)
            .field("window_len", &self.window.len())
            .finish()
    }
}

/// A pair of positions the decoder passed, so a caller can tell where in the
/// compressed stream an output range ends: every [`MARK_SPACING`] bytes of output, the
/// compressed bits consumed to produce the output up to `out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub out: u64,
    pub in_bits: u64,
}

/// What to fetch and inflate for one range of a stream's output: compressed bytes
/// `compressed` of the stream, inflated from `checkpoint` (or from the stream's start),
/// of which the first `skip` output bytes come before the range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Index into the checkpoints; `None`: the range starts before the first.
    pub checkpoint: Option<usize>,
    pub compressed: std::ops::Range<u64>,
    pub skip: u64,
}

/// The span that holds output `range` of a stream of `compressed_len` bytes, from the
/// checkpoints and marks a [`GzipReader::indexing`] pass recorded over it.
pub fn span(
    checkpoints: &[Checkpoint],
    marks: &[Mark],
    range: std::ops::Range<u64>,
    compressed_len: u64,
) -> Span {
    let before = checkpoints.partition_point(|c| c.out <= range.start);
    let (checkpoint, from_bits, from_out) = match before.checked_sub(1) {
        Some(i) => (Some(i), checkpoints[i].in_bits, checkpoints[i].out),
        None => (None, 0, 0),
    };
    let end = marks
        .get(marks.partition_point(|m| m.out < range.end))
        .map_or(compressed_len, |m| {
            m.in_bits.div_ceil(8).min(compressed_len)
        });
    Span {
        checkpoint,
        compressed: from_bits / 8..end,
        skip: range.start - from_out,
    }
}

/// Inflates `len` bytes of output from a span's compressed bytes: from `checkpoint`
/// (`None`: `compressed` starts the stream), after skipping `skip` bytes of output.
pub fn inflate_span(
    compressed: &[u8],
    checkpoint: Option<&Checkpoint>,
    skip: u64,
    len: usize,
) -> Result<Vec<u8>> {
    let mut got = Vec::new();
    inflate_ranges(compressed, checkpoint, &[(skip, len)], |_, bytes| {
        got = bytes
    })
    .map_err(|(_, e)| e)?;
    Ok(got)
}

/// Inflates several output ranges of one span in one pass, so ranges that share a
/// checkpoint cost one inflation, not one each: `ranges` are `(skip, len)` from the
/// checkpoint (or the stream's start), ascending and not overlapping. `each(i, bytes)`
/// receives range `i` as soon as it is complete. On an error (the span is damaged or
/// ends early) the pass stops: the error names the first range not delivered.
pub fn inflate_ranges(
    compressed: &[u8],
    checkpoint: Option<&Checkpoint>,
    ranges: &[(u64, usize)],
    mut each: impl FnMut(usize, Vec<u8>),
) -> std::result::Result<(), (usize, Error)> {
    let unwrap = |e: io::Error, what: &str| match e.into_inner().map(|e| e.downcast::<Error>()) {
        Some(Ok(e)) => *e,
        Some(Err(e)) => Error::Gzip {
            offset: 0,
            reason: format!("{what}: {e}"),
        },
        None => Error::Gzip {
            offset: 0,
            reason: format!("{what}: the span ends before its output does"),
        },
    };
    let mut reader = match checkpoint {
        Some(cp) => GzipReader::resume(compressed, cp).map_err(|e| (0, e))?,
        None => GzipReader::new(compressed),
    };
    let mut at = 0u64;
    for (i, &(skip, len)) in ranges.iter().enumerate() {
        let gap = skip.checked_sub(at).ok_or_else(|| {
            let reason = format!("range {i} starts at {skip}, before the end of the last, {at}");
            (i, Error::Gzip { offset: 0, reason })
        })?;
        let skipped = io::copy(&mut reader.by_ref().take(gap), &mut io::sink())
            .map_err(|e| (i, unwrap(e, "skipping to the range")))?;
        if skipped < gap {
            let eof = io::ErrorKind::UnexpectedEof.into();
            return Err((i, unwrap(eof, "skipping to the range")));
        }
        let mut out = vec![0u8; len];
        reader
            .read_exact(&mut out)
            .map_err(|e| (i, unwrap(e, "inflating the range")))?;
        at = skip + len as u64;
        each(i, out);
    }
    Ok(())
}

/// Which bytes of a checkpoint's window the output after it refers to. The
/// others are set to zero when the checkpoint is handed out: decoding from it never
/// reads them, and a window of mostly zeros compresses to little (format.md §17.1).
struct WindowUse {
    /// Output offset of the window's first byte.
    start: u64,
    /// The checkpoint's output offset (the window's end).
    out: u64,
    /// One bit per window byte.
    used: Vec<u64>,
}

impl WindowUse {
    fn new(checkpoint: &Checkpoint) -> Self {
        let len = checkpoint.window.len();
        WindowUse {
            start: checkpoint.out - len as u64,
            out: checkpoint.out,
            used: vec![0; len.div_ceil(64)],
        }
    }

    /// A match copying `len` bytes from output offset `from`.
    fn copied(&mut self, from: u64, len: usize) {
        let end = (from + len as u64).min(self.out);
        for at in from.max(self.start)..end {
            let i = (at - self.start) as usize;
            self.used[i / 64] |= 1 << (i % 64);
        }
    }

    /// Zeroes the bytes of `window` nothing used.
    fn apply(&self, window: &mut [u8]) {
        for (i, byte) in window.iter_mut().enumerate() {
            if self.used[i / 64] & (1 << (i % 64)) == 0 {
                *byte = 0;
            }
        }
    }
}

/// A gzip decoder (one or more members, RFC 1952) that is read like a file and, when
/// asked, records checkpoints and marks on the way.
pub struct GzipReader<R> {
    bits: BitReader<R>,
    state: State,
    /// Decoded output: up to [`WINDOW`] bytes already handed out (the history matches
    /// refer to), then what the consumer has not read yet.
    out: Box<[u8]>,
    out_len: usize,
    /// The next byte of `out` the consumer gets.
    read_pos: usize,
    /// Output offset of `out[0]`.
    out_start: u64,
    /// Literal/length and distance codes of the block being decoded.
    lit: Huffman,
    dist: Huffman,
    /// Whether the block being decoded is the member's last.
    last_block: bool,
    /// The member's CRC-32 and length so far; `None` when resumed mid-member.
    crc: Option<flate2::Crc>,
    /// `out[crc_pos..out_len]` is not yet in `crc`.
    crc_pos: usize,
    /// Output offset where the current member's output began.
    member_out: u64,
    /// Checkpoints are recorded only when this is set (`tessera index`).
    spacing: Option<u64>,
    checkpoints: Vec<Checkpoint>,
    /// Checkpoints whose windows matches may still refer into (the first [`WINDOW`]
    /// bytes of output after each), by index: which window bytes they used.
    window_uses: Vec<(usize, WindowUse)>,
    marks: Vec<Mark>,
    next_mark: u64,
    /// The error that stopped decoding; returned again on every later read.
    failed: Option<(u64, String)>,
}

impl<R> std::fmt::Debug for GzipReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GzipReader")
            .field("in_bits", &self.bits.consumed_bits())
            .field("out", &(self.out_start + self.read_pos as u64))
            .field("checkpoints", &self.checkpoints.len())
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    MemberHeader,
    BlockHeader,
    Stored {
        remaining: u16,
    },
    Codes,
    MemberTrailer,
    /// After the last member; only trailing zero bytes may follow.
    Done,
}

impl<R: Read> GzipReader<R> {
    /// A decoder of the gzip stream `source`, from its first byte. Records nothing.
    pub fn new(source: R) -> Self {
        Self::with_state(BitReader::new(source, 0), State::MemberHeader, 0, &[])
    }

    /// A decoder that also records a [`Checkpoint`] at the first block boundary after
    /// every `spacing` bytes of output, and a [`Mark`] every [`MARK_SPACING`] bytes.
    pub fn indexing(source: R, spacing: u64) -> Self {
        let mut reader = Self::new(source);
        reader.spacing = Some(spacing.max(1));
        reader
    }

    /// A decoder that starts at `checkpoint`. `source` yields the compressed stream from
    /// byte `checkpoint.in_bits / 8` on; reads return output from `checkpoint.out` on.
    /// The member's CRC is not checked (see the module's comment).
    pub fn resume(source: R, checkpoint: &Checkpoint) -> Result<Self> {
        if checkpoint.window.len() > WINDOW {
            return Err(Error::Gzip {
                offset: checkpoint.in_bits / 8,
                reason: format!(
                    "checkpoint window of {} bytes, longer than DEFLATE's {WINDOW}",
                    checkpoint.window.len()
                ),
            });
        }
        if checkpoint.window.len() as u64 > checkpoint.out {
            return Err(Error::Gzip {
                offset: checkpoint.in_bits / 8,
                reason: format!(
                    "checkpoint at output offset {} has a window of {} bytes",
                    checkpoint.out,
                    checkpoint.window.len()
                ),
            });
        }
        let start_byte = checkpoint.in_bits / 8;
        let mut bits = BitReader::new(source, start_byte);
        let skip = (checkpoint.in_bits % 8) as u32;
        if skip > 0 {
            bits.need(skip).map_err(|e| e.into_error(&bits))?;
            bits.consume(skip);
        }
        let out_start = checkpoint.out - checkpoint.window.len() as u64;
        let mut reader = Self::with_state(bits, State::BlockHeader, out_start, &checkpoint.window);
        reader.crc = None;
        Ok(reader)
    }

    fn with_state(bits: BitReader<R>, state: State, out_start: u64, window: &[u8]) -> Self {
        let mut out = vec![0u8; WINDOW + OUT_WORK].into_boxed_slice();
        out[..window.len()].copy_from_slice(window);
        let resumed_at = out_start + window.len() as u64;
        GzipReader {
            bits,
            state,
            out,
            out_len: window.len(),
            read_pos: window.len(),
            out_start,
            lit: Huffman::empty(288),
            dist: Huffman::empty(32),
            last_block: false,
            crc: Some(flate2::Crc::new()),
            crc_pos: window.len(),
            member_out: resumed_at,
            spacing: None,
            checkpoints: Vec::new(),
            window_uses: Vec::new(),
            marks: Vec::new(),
            next_mark: resumed_at + MARK_SPACING,
            failed: None,
        }
    }

    /// The source, positioned wherever decoding left it (read ahead in chunks).
    pub fn into_inner(self) -> R {
        self.bits.source
    }

    /// The checkpoints recorded since the last call, each window's bytes that nothing
    /// after it refers to set to zero. Until the stream ends, the last checkpoint is
    /// kept back while the output after it may still refer into its window.
    pub fn take_checkpoints(&mut self) -> Vec<Checkpoint> {
        if self.state == State::Done {
            self.close_window_uses(u64::MAX);
        }
        let kept = self
            .window_uses
            .first()
            .map_or(self.checkpoints.len(), |(i, _)| *i);
        let rest = self.checkpoints.split_off(kept);
        for (i, _) in &mut self.window_uses {
            *i -= kept;
        }
        std::mem::replace(&mut self.checkpoints, rest)
    }

    /// Applies the window use of every checkpoint nothing from output offset `here` on
    /// can refer into (`u64::MAX`: all of them).
    fn close_window_uses(&mut self, here: u64) {
        let checkpoints = &mut self.checkpoints;
        self.window_uses.retain(|(i, usage)| {
            let open = here < usage.out.saturating_add(WINDOW as u64);
            if !open {
                usage.apply(&mut checkpoints[*i].window);
            }
            open
        });
    }

    /// The marks recorded since the last call.
    pub fn take_marks(&mut self) -> Vec<Mark> {
        std::mem::take(&mut self.marks)
    }

    /// Output offset of the next byte a read returns.
    pub fn position(&self) -> u64 {
        self.out_start + self.read_pos as u64
    }

    /// Compressed bits consumed so far, from the start of the stream.
    pub fn compressed_bits(&self) -> u64 {
        self.bits.consumed_bits()
    }

    /// Whether the whole stream was decoded (every member and its trailer).
    pub fn finished(&self) -> bool {
        self.state == State::Done && self.read_pos == self.out_len
    }

    /// Decodes until there is output to read or the stream ends.
    fn fill(&mut self) -> Result<()> {
        if let Some((offset, reason)) = &self.failed {
            return Err(Error::Gzip {
                offset: *offset,
                reason: reason.clone(),
            });
        }
        if self.read_pos == self.out_len && self.full() {
            self.slide();
        }
        match self.inflate_some() {
            Ok(()) => {
                self.update_crc();
                let here = self.out_offset();
                if here >= self.next_mark {
                    if self.spacing.is_some() {
                        self.marks.push(Mark {
                            out: here,
                            in_bits: self.bits.consumed_bits(),
                        });
                    }
                    self.next_mark = here + MARK_SPACING - (here - self.next_mark) % MARK_SPACING;
                }
                Ok(())
            }
            Err(e) => {
                // What was decoded before the error is good (no path writes output it
                // has not fully decoded) and can still be read; the error comes after.
                self.crc_pos = self.out_len;
                if let Error::Gzip { offset, reason } = &e {
                    self.failed = Some((*offset, reason.clone()));
                } else {
                    self.failed = Some((self.bits.consumed_bits() / 8, e.to_string()));
                }
                Err(e)
            }
        }
    }

    /// Keeps the last [`WINDOW`] bytes of output at the front of the buffer.
    fn slide(&mut self) {
        let keep = self.out_len.min(WINDOW);
        let from = self.out_len - keep;
        self.out.copy_within(from..self.out_len, 0);
        self.out_start += from as u64;
        self.out_len = keep;
        self.read_pos -= from;
        self.crc_pos -= from;
    }

    /// Whether a longest match might not fit: the codes stop here.
    fn full(&self) -> bool {
        self.out_len + MAX_MATCH >= self.out.len()
    }

    fn update_crc(&mut self) {
        if let Some(crc) = &mut self.crc {
            crc.update(&self.out[self.crc_pos..self.out_len]);
        }
        self.crc_pos = self.out_len;
    }

    fn out_offset(&self) -> u64 {
        self.out_start + self.out_len as u64
    }

    /// Runs the state machine until some output was produced, the buffer is full, or
    /// the stream ended.
    fn inflate_some(&mut self) -> Result<()> {
        let produced_from = self.out_len;
        loop {
            if self.out_len > produced_from || self.full() {
                return Ok(());
            }
            match self.state {
                State::MemberHeader => self.member_header()?,
                State::BlockHeader => self.block_header()?,
                State::Stored { remaining } => self.stored(remaining)?,
                State::Codes => self.codes()?,
                State::MemberTrailer => self.member_trailer()?,
                State::Done => return self.trailing_bytes(),
            }
        }
    }

    fn member_header(&mut self) -> Result<()> {
        // A member refers to nothing before it.
        self.close_window_uses(u64::MAX);
        let b = &mut self.bits;
        let fixed = b.bytes::<10>().map_err(|e| e.into_error(b))?;
        if fixed[0..2] != [0x1f, 0x8b] {
            return Err(err_at(
                &self.bits,
                format!(
                    "not gzip: the member starts with {:02x} {:02x}, not 1f 8b",
                    fixed[0], fixed[1]
                ),
            ));
        }
        if fixed[2] != 8 {
            return Err(err_at(
                &self.bits,
                format!("compression method {} (only 8, DEFLATE, exists)", fixed[2]),
            ));
        }
        let flags = fixed[3];
        if flags & 0xe0 != 0 {
            return Err(err_at(
                &self.bits,
                format!("reserved header flags set: {flags:#04x}"),
            ));
        }
        let b = &mut self.bits;
        if flags & 0x04 != 0 {
            let [lo, hi] = b.bytes::<2>().map_err(|e| e.into_error(b))?;
            for _ in 0..u16::from_le_bytes([lo, hi]) {
                b.bytes::<1>().map_err(|e| e.into_error(b))?;
            }
        }
        for flag in [0x08, 0x10] {
            // FNAME, FCOMMENT: zero-terminated strings.
            if flags & flag != 0 {
                while b.bytes::<1>().map_err(|e| e.into_error(b))? != [0] {}
            }
        }
        if flags & 0x02 != 0 {
            b.bytes::<2>().map_err(|e| e.into_error(b))?;
        }
        self.crc = Some(flate2::Crc::new());
        self.crc_pos = self.out_len;
        self.member_out = self.out_offset();
        self.state = State::BlockHeader;
        Ok(())
    }

    fn block_header(&mut self) -> Result<()> {
        if let Some(spacing) = self.spacing {
            let last = self.checkpoints.last().map_or(0, |c| c.out);
            let here = self.out_offset();
            self.close_window_uses(here);
            if here >= last + spacing && here > self.member_out {
                let window = &self.out[self.out_len.saturating_sub(WINDOW)..self.out_len];
                let checkpoint = Checkpoint {
                    in_bits: self.bits.consumed_bits(),
                    out: here,
                    window: window.to_vec(),
                };
                let usage = WindowUse::new(&checkpoint);
                self.window_uses.push((self.checkpoints.len(), usage));
                self.checkpoints.push(checkpoint);
            }
        }
        let b = &mut self.bits;
        b.need(3).map_err(|e| e.into_error(b))?;
        let header = b.peek(3);
        b.consume(3);
        self.last_block = header & 1 == 1;
        match header >> 1 {
            0 => {
                b.align_to_byte();
                let [l0, l1, n0, n1] = b.bytes::<4>().map_err(|e| e.into_error(b))?;
                let len = u16::from_le_bytes([l0, l1]);
                if len != !u16::from_le_bytes([n0, n1]) {
                    return Err(err_at(
                        &self.bits,
                        format!("stored block length {len} does not match its complement"),
                    ));
                }
                self.state = State::Stored { remaining: len };
            }
            1 => {
                let fixed = fixed_codes();
                self.lit.clone_from(&fixed.0);
                self.dist.clone_from(&fixed.1);
                self.state = State::Codes;
            }
            2 => {
                self.dynamic_codes()?;
                self.state = State::Codes;
            }
            _ => return Err(err_at(&self.bits, "block type 3 (reserved)".into())),
        }
        Ok(())
    }

    fn end_of_block(&mut self) {
        self.state = if self.last_block {
            State::MemberTrailer
        } else {
            State::BlockHeader
        };
    }

    fn stored(&mut self, mut remaining: u16) -> Result<()> {
        while remaining > 0 {
            let room = self.out.len() - self.out_len;
            if room == 0 {
                break;
            }
            let n = self
                .bits
                .copy_bytes(&mut self.out[self.out_len..][..room.min(remaining as usize)])
                .map_err(|e| e.into_error(&self.bits))?;
            self.out_len += n;
            remaining -= n as u16;
        }
        if remaining == 0 {
            self.end_of_block();
        } else {
            self.state = State::Stored { remaining };
        }
        Ok(())
    }

    /// Reads a dynamic block's code lengths and builds its two codes (RFC 1951, 3.2.7).
    fn dynamic_codes(&mut self) -> Result<()> {
        let b = &mut self.bits;
        b.need(14).map_err(|e| e.into_error(b))?;
        let hlit = b.peek(5) as usize + 257;
        b.consume(5);
        let hdist = b.peek(5) as usize + 1;
        b.consume(5);
        let hclen = b.peek(4) as usize + 4;
        b.consume(4);
        if hlit > 286 || hdist > 30 {
            return Err(err_at(&self.bits, format!(
                "dynamic block declares {hlit} length codes and {hdist} distance codes (at most 286 and 30)"
            )));
        }
        let mut cl_lengths = [0u8; 19];
        for &i in &CODE_LENGTH_ORDER[..hclen] {
            b.need(3).map_err(|e| e.into_error(b))?;
            cl_lengths[i] = b.peek(3) as u8;
            b.consume(3);
        }
        let mut cl = Huffman::empty(19);
        cl.build(&cl_lengths)
            .map_err(|r| err_at(&self.bits, format!("code length code: {r}")))?;
        let mut lengths = [0u8; 286 + 30];
        let mut i = 0;
        while i < hlit + hdist {
            let b = &mut self.bits;
            b.need(15 + 7).map_err(|e| e.into_error(b))?;
            let sym = cl.decode(b).map_err(|r| err_at(&self.bits, r))?;
            let b = &mut self.bits;
            let (value, repeat) = match sym {
                0..=15 => (sym as u8, 1),
                16 => {
                    if i == 0 {
                        return Err(err_at(
                            &self.bits,
                            "repeat of a code length before the first".into(),
                        ));
                    }
                    let r = 3 + b.peek(2) as usize;
                    b.consume(2);
                    (lengths[i - 1], r)
                }
                17 => {
                    let r = 3 + b.peek(3) as usize;
                    b.consume(3);
                    (0, r)
                }
                _ => {
                    let r = 11 + b.peek(7) as usize;
                    b.consume(7);
                    (0, r)
                }
            };
            if i + repeat > hlit + hdist {
                return Err(err_at(
                    &self.bits,
                    format!(
                        "code lengths repeat past the {} the block declares",
                        hlit + hdist
                    ),
                ));
            }
            lengths[i..i + repeat].fill(value);
            i += repeat;
        }
        if lengths[256] == 0 {
            return Err(err_at(
                &self.bits,
                "the block has no end-of-block code".into(),
            ));
        }
        self.lit
            .build(&lengths[..hlit])
            .map_err(|r| err_at(&self.bits, format!("literal/length code: {r}")))?;
        self.dist
            .build(&lengths[hlit..hlit + hdist])
            .map_err(|r| err_at(&self.bits, format!("distance code: {r}")))?;
        Ok(())
    }

    /// Decodes literals and matches until the block ends, the output buffer fills or a
    /// mark is due.
    fn codes(&mut self) -> Result<()> {
        let stop_at = {
            let mark_in_buffer = (self.next_mark - self.out_start) as usize;
            (self.out.len() - MAX_MATCH).min(mark_in_buffer.max(self.out_len + 1))
        };
        let b = &mut self.bits;
        let mut block_ended = false;
        while self.out_len < stop_at {
            // One literal/length code, its extra bits, one distance code and its extra
            // bits: at most 15 + 5 + 15 + 13 = 48 bits.
            b.refill().map_err(|e| e.into_error(b))?;
            let sym = self.lit.decode(b).map_err(|r| err_at(b, r))?;
            if b.padding != 0 && b.overran() {
                break;
            }
            if sym < 256 {
                self.out[self.out_len] = sym as u8;
                self.out_len += 1;
                continue;
            }
            if sym == 256 {
                block_ended = true;
                break;
            }
            let index = sym as usize - 257;
            if index >= LEN_BASE.len() {
                return Err(err_at(b, format!("invalid length symbol {sym}")));
            }
            let extra = LEN_EXTRA[index] as u32;
            let len = LEN_BASE[index] as usize + b.peek(extra) as usize;
            b.consume(extra);
            let dsym = self.dist.decode(b).map_err(|r| err_at(b, r))? as usize;
            if dsym >= DIST_BASE.len() {
                return Err(err_at(b, format!("invalid distance symbol {dsym}")));
            }
            let extra = DIST_EXTRA[dsym] as u32;
            let dist = DIST_BASE[dsym] as usize + b.peek(extra) as usize;
            b.consume(extra);
            if b.padding != 0 && b.overran() {
                break;
            }
            if dist > self.out_len {
                return Err(err_at(
                    b,
                    format!("a match refers {dist} bytes back, before the start of the output"),
                ));
            }
            let from = self.out_len - dist;
            for (_, usage) in &mut self.window_uses {
                let at = self.out_start + from as u64;
                if at < usage.out {
                    usage.copied(at, len);
                }
            }
            if dist >= len {
                self.out.copy_within(from..from + len, self.out_len);
            } else {
                for i in 0..len {
                    self.out[self.out_len + i] = self.out[from + i];
                }
            }
            self.out_len += len;
        }
        // Codes are looked up in zero padding past the end of the source; using any of
        // it means the stream ended early. The loop stops before a symbol decoded from
        // padding writes anything, so the output so far stays good.
        if b.overran() {
            return Err(BitError::Truncated.into_error(b));
        }
        if block_ended {
            self.end_of_block();
        }
        Ok(())
    }

    fn member_trailer(&mut self) -> Result<()> {
        self.bits.align_to_byte();
        let b = &mut self.bits;
        let trailer = b.bytes::<8>().map_err(|e| e.into_error(b))?;
        self.update_crc();
        if let Some(crc) = self.crc.take() {
            let expected = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
            if crc.sum() != expected {
                return Err(err_at(
                    &self.bits,
                    format!(
                        "CRC-32 of the member's output is {:08x}, its trailer says {expected:08x}",
                        crc.sum()
                    ),
                ));
            }
            let size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
            let produced = (self.out_offset() - self.member_out) as u32;
            if produced != size {
                return Err(err_at(
                    &self.bits,
                    format!(
                    "the member inflated to {produced} bytes (mod 2^32), its trailer says {size}"
                ),
                ));
            }
        }
        self.state = match self
            .bits
            .peek_byte()
            .map_err(|e| e.into_error(&self.bits))?
        {
            Some(0x1f) => State::MemberHeader,
            _ => State::Done,
        };
        Ok(())
    }

    /// After the last member: zero bytes (some tools pad) or nothing.
    fn trailing_bytes(&mut self) -> Result<()> {
        loop {
            let b = &mut self.bits;
            match b.peek_byte().map_err(|e| e.into_error(b))? {
                None => return Ok(()),
                Some(0) => {
                    b.bytes::<1>().map_err(|e| e.into_error(b))?;
                }
                Some(other) => {
                    return Err(err_at(&self.bits, format!(
                        "byte {other:#04x} after the last gzip member (only zero padding may follow)"
                    )))
                }
            }
        }
    }
}

/// A gzip error at the reader's current position.
fn err_at<R>(bits: &BitReader<R>, reason: String) -> Error {
    Error::Gzip {
        offset: bits.consumed_bits() / 8,
        reason,
    }
}

impl<R: Read> Read for GzipReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.read_pos == self.out_len {
            if self.state == State::Done {
                // Checks what follows the last member once.
                self.fill()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return Ok(0);
            }
            if let Err(e) = self.fill() {
                if self.read_pos == self.out_len {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
        }
        let n = buf.len().min(self.out_len - self.read_pos);
        buf[..n].copy_from_slice(&self.out[self.read_pos..self.read_pos + n]);
        self.read_pos += n;
        Ok(n)
    }
}

/// Why the bit reader stopped.
#[derive(Debug)]
enum BitError {
    Truncated,
    Io(io::Error),
}

impl BitError {
    fn into_error<R>(self, bits: &BitReader<R>) -> Error {
        let offset = bits.consumed_bits() / 8;
        match self {
            BitError::Truncated => Error::Gzip {
                offset,
                reason: "the stream ends in the middle (truncated)".into(),
            },
            BitError::Io(e) => Error::Gzip {
                offset,
                reason: format!("reading the compressed stream: {e}"),
            },
        }
    }
}

/// The compressed stream as bits, least significant first, buffered 64 at a time.
struct BitReader<R> {
    source: R,
    input: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Stream offset of `input[0]`.
    input_start: u64,
    /// The next bits, least significant first; `count` of them are valid. Bits above
    /// `count` are zero or the true bits of `input[pos]` (the fast refill loads whole
    /// words), so OR-ing that byte in again is harmless.
    word: u64,
    count: u32,
    /// Zero bits appended after the end of the source, so a decode near the end can
    /// look ahead; consuming any of them means the stream was truncated.
    padding: u32,
    at_eof: bool,
}

impl<R> BitReader<R> {
    /// Bits consumed from the start of the stream.
    fn consumed_bits(&self) -> u64 {
        let loaded = (self.input_start + self.pos as u64) * 8;
        loaded + self.padding as u64 - self.count as u64
    }

    /// Buffered bits that came from the source (not padding).
    fn real_bits(&self) -> u32 {
        self.count.saturating_sub(self.padding)
    }

    #[inline]
    fn peek(&self, n: u32) -> u64 {
        self.word & ((1u64 << n) - 1)
    }

    #[inline]
    fn consume(&mut self, n: u32) {
        self.word >>= n;
        self.count -= n;
    }

    /// Whether consumed bits reached into the padding.
    fn overran(&self) -> bool {
        self.padding > self.count
    }

    fn align_to_byte(&mut self) {
        // Whole bytes are loaded (and padded), so the bits left of a partly read byte
        // are the buffered count's remainder.
        let drop = self.count % 8;
        self.consume(drop);
    }
}

impl<R: Read> BitReader<R> {
    fn new(source: R, input_start: u64) -> Self {
        BitReader {
            source,
            input: vec![0u8; IN_BUF].into_boxed_slice(),
            pos: 0,
            end: 0,
            input_start,
            word: 0,
            count: 0,
            padding: 0,
            at_eof: false,
        }
    }

    /// Reads more input into the buffer; false at the end of the source.
    fn fill_input(&mut self) -> Result<bool, BitError> {
        if self.at_eof {
            return Ok(false);
        }
        self.input_start += self.end as u64;
        self.pos = 0;
        self.end = 0;
        loop {
            match self.source.read(&mut self.input) {
                Ok(0) => {
                    self.at_eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BitError::Io(e)),
            }
        }
    }

    /// Fills `word` to at least 56 bits, with zero padding past the end of the source.
    #[inline]
    fn refill(&mut self) -> Result<(), BitError> {
        if self.count > 56 {
            return Ok(());
        }
        if self.end - self.pos >= 8 {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&self.input[self.pos..self.pos + 8]);
            self.word |= u64::from_le_bytes(bytes) << self.count;
            self.pos += ((63 - self.count) >> 3) as usize;
            self.count |= 56;
            return Ok(());
        }
        while self.count <= 56 {
            if self.pos == self.end && !self.fill_input()? {
                self.count += 8;
                self.padding += 8;
                continue;
            }
            self.word |= (self.input[self.pos] as u64) << self.count;
            self.pos += 1;
            self.count += 8;
        }
        Ok(())
    }

    /// Makes sure `n` (≤ 56) real bits are buffered.
    fn need(&mut self, n: u32) -> Result<(), BitError> {
        if self.count < n {
            self.refill()?;
        }
        if self.real_bits() < n {
            return Err(BitError::Truncated);
        }
        Ok(())
    }

    /// The next `N` bytes, from a byte-aligned position.
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], BitError> {
        let mut out = [0u8; N];
        for byte in &mut out {
            self.need(8)?;
            *byte = self.peek(8) as u8;
            self.consume(8);
        }
        Ok(out)
    }

    /// The next byte without consuming it, or `None` at the end of the stream (from a
    /// byte-aligned position).
    fn peek_byte(&mut self) -> Result<Option<u8>, BitError> {
        self.refill()?;
        if self.real_bits() < 8 {
            return Ok(None);
        }
        Ok(Some(self.peek(8) as u8))
    }

    /// Copies stored-block bytes into `dst` (from a byte-aligned position): first what
    /// `word` holds, then straight from the input. Returns how many were copied (> 0).
    fn copy_bytes(&mut self, dst: &mut [u8]) -> Result<usize, BitError> {
        let mut n = 0;
        while n < dst.len() && self.real_bits() >= 8 {
            dst[n] = self.peek(8) as u8;
            self.consume(8);
            n += 1;
        }
        if n > 0 {
            return Ok(n);
        }
        // Aligned, so `word` now holds no real bits.
        if self.padding > 0 {
            return Err(BitError::Truncated);
        }
        // Drop what the fast refill left above `count`: the input is now taken directly.
        self.word = 0;
        self.count = 0;
        if self.pos == self.end && !self.fill_input()? {
            return Err(BitError::Truncated);
        }
        let take = (dst.len() - n).min(self.end - self.pos);
        dst[n..n + take].copy_from_slice(&self.input[self.pos..self.pos + take]);
        self.pos += take;
        Ok(n + take)
    }
}

/// A canonical Huffman code: a table of the first [`FAST_BITS`] bits for short codes and
/// the counts per length for the rest (decoded bit by bit, as RFC 1951 describes).
#[derive(Clone, Debug)]
struct Huffman {
    /// Indexed by the next FAST_BITS bits: `symbol << 4 | length`, or 0 when the code is
    /// longer than FAST_BITS (or unused).
    fast: Vec<u16>,
    /// Codes of each length, 0..=15.
    counts: [u16; 16],
    /// Symbols in code order.
    symbols: Vec<u16>,
}

impl Huffman {
    fn empty(max_symbols: usize) -> Self {
        Huffman {
            fast: vec![0; 1 << FAST_BITS],
            counts: [0; 16],
            symbols: Vec::with_capacity(max_symbols),
        }
    }

    /// Builds the code from each symbol's code length (0: unused). An over-subscribed
    /// set of lengths is refused; an incomplete one is allowed (a block with one
    /// distance code has one), and an unused code fails when it is met.
    fn build(&mut self, lengths: &[u8]) -> Result<(), String> {
        self.counts = [0; 16];
        for &l in lengths {
            self.counts[l as usize] += 1;
        }
        self.counts[0] = 0;
        let mut left: i32 = 1;
        for len in 1..16 {
            left = (left << 1) - self.counts[len] as i32;
            if left < 0 {
                return Err(format!("over-subscribed at length {len}"));
            }
        }
        let mut offsets = [0u16; 16];
        for len in 1..15 {
            offsets[len + 1] = offsets[len] + self.counts[len];
        }
        self.symbols.clear();
        self.symbols
            .resize(lengths.iter().filter(|&&l| l > 0).count(), 0);
        for (sym, &l) in lengths.iter().enumerate() {
            if l > 0 {
                self.symbols[offsets[l as usize] as usize] = sym as u16;
                offsets[l as usize] += 1;
            }
        }
        self.fast.fill(0);
        let mut code: u32 = 0;
        let mut index = 0;
        for len in 1..=FAST_BITS {
            for _ in 0..self.counts[len as usize] {
                let sym = self.symbols[index];
                index += 1;
                let reversed = code.reverse_bits() >> (32 - len);
                let entry = (sym << 4) | len as u16;
                let mut i = reversed as usize;
                while i < self.fast.len() {
                    self.fast[i] = entry;
                    i += 1 << len;
                }
                code += 1;
            }
            code <<= 1;
        }
        Ok(())
    }

    /// Decodes one symbol; `bits` holds at least 15 bits (real or padding).
    #[inline]
    fn decode<R>(&self, bits: &mut BitReader<R>) -> Result<u16, String> {
        let entry = self.fast[bits.peek(FAST_BITS) as usize];
        if entry != 0 {
            bits.consume((entry & 15) as u32);
            return Ok(entry >> 4);
        }
        // Longer codes: walk the lengths, the code's bits most significant first.
        let word = bits.peek(15);
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..16u32 {
            code |= ((word >> (len - 1)) & 1) as i32;
            let count = self.counts[len as usize] as i32;
            if code - first < count {
                bits.consume(len);
                return Ok(self.symbols[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err("a code the block's Huffman table does not have".into())
    }
}

/// The fixed literal/length and distance codes (RFC 1951, 3.2.6).
fn fixed_codes() -> &'static (Huffman, Huffman) {
    static FIXED: OnceLock<(Huffman, Huffman)> = OnceLock::new();
    FIXED.get_or_init(|| {
        let mut lengths = [0u8; 288];
        lengths[..144].fill(8);
        lengths[144..256].fill(9);
        lengths[256..280].fill(7);
        lengths[280..].fill(8);
        let mut lit = Huffman::empty(288);
        let mut dist = Huffman::empty(30);
        // Neither can fail: the lengths are the RFC's.
        let _ = lit.build(&lengths);
        let _ = dist.build(&[5u8; 30]);
        (lit, dist)
    })
}

#[cfg(test)]
mod tests;
