//! What the pipeline fetches: *units* — a chunk of a Tessera image's blob or a piece of
//! a plain blob the mirror serves — and the one small trait, [`Wanted`], through which
//! each kind says what differs: which blob a unit lives in, which units may join its
//! request, the origin to use, whether verified units are offered to peers at once, and
//! who keeps account of what arrived.
//!
//! A unit carries everything needed to check it: it is good when its stored bytes
//! decode (`compression`) to exactly `size` bytes whose digest is `key`. A piece of a
//! plain blob is simply a unit stored uncompressed whose digest comes from the piece
//! table; whether the whole blob matches its own digest is the mirror's check, made
//! over the response it assembles.

use std::sync::Arc;

use rafs_format::chunk::Compression;
pub use rafs_format::reader::SpanStart;

use super::seams::Origin;
use super::Source;
use crate::cache::ChunkKey;

/// One verifiable unit of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// The digest of its decoded bytes: what verifies it, and what the store and peers
    /// know it by.
    pub key: ChunkKey,
    /// Its number in its [`Wanted`]'s own numbering (chunk index, piece index): for
    /// logs, errors and [`Wanted::next_in_blob`].
    pub index: u32,
    /// Which blob of its [`Wanted`] it lives in ([`Wanted::blob`] names it).
    pub blob: u32,
    /// `[offset, offset + stored_size)` of the blob holds its stored bytes.
    pub offset: u64,
    pub stored_size: u32,
    pub compression: Compression,
    /// Its size decoded.
    pub size: u32,
    /// For a span of an unconverted gzip layer (`compression` is `GzipSpan`,
    /// format.md §17.3): the checkpoint its inflation starts from (`None`: the layer's
    /// start, at `offset` 0) and the output bytes it skips. Its stored bytes start at
    /// the checkpoint's byte, so spans of one checkpoint overlap: the pipeline
    /// inflates those of a run together, once ([`super::span`]).
    pub span: Option<SpanStart>,
}

/// Where a span's inflation resumes: a checkpoint of its layer (format.md §17.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    pub in_bits: u64,
    pub out: u64,
    /// The unit holding the 32 KiB of output before `out` (an ordinary unit of the
    /// index's own blob); `None` when those bytes are all zero.
    pub window: Option<Unit>,
    pub window_len: u32,
}

impl Unit {
    /// `[start, end)` of its stored bytes in its blob: what is announced to peers and
    /// asked of the origin.
    pub fn range(&self) -> (u64, u64) {
        (self.offset, self.offset + u64::from(self.stored_size))
    }
}

/// A verified unit and where it came from.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub data: Arc<Vec<u8>>,
    pub source: Source,
    /// This call's own fetch put it in the store, or is putting it there now (the
    /// mirror drops such pieces again if the blob they were fetched for fails its
    /// digest, and offers them to peers).
    pub newly_stored: bool,
}

/// What happened to a unit, for its [`Wanted`]'s account (a mount's pull statistics,
/// the mirror's metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A unit of `bytes` (decoded) was had from `source`.
    Got { source: Source, bytes: u64 },
    /// Stored bytes of `bytes` crossed the network from the origin in one request.
    OriginTransfer { bytes: u64 },
    /// Bytes from `source` failed verification and were discarded.
    VerificationFailed(Source),
    /// A request to `source` failed (after the client's own retries).
    FetchFailed(Source),
}

/// What is being fetched (see the module docs).
pub trait Wanted: Send + Sync + 'static {
    /// Names it in logs and errors: the image reference, or the blob.
    fn name(&self) -> String;

    /// The blob (`sha256:…`) a unit lives in.
    fn blob(&self, unit: &Unit) -> &str;

    /// The unit stored right after `unit` in its blob, if requests may merge them.
    fn next_in_blob(&self, unit: &Unit) -> Option<Unit>;

    /// Where units are read when neither the store nor a peer has them.
    fn origin(&self) -> &dyn Origin;

    /// Units a request for `unit` brings at no cost in bytes: for a span, the spans of
    /// the same checkpoint whose output comes before its own (inflating up to it
    /// produces theirs).
    fn along_with(&self, _unit: &Unit) -> Vec<Unit> {
        Vec::new()
    }

    /// Checkpoint `index` of a span's layer; `None` if there is no such checkpoint.
    fn resume(&self, _checkpoint: u32) -> Option<Resume> {
        None
    }

    /// Whether a unit may be offered to peers as soon as it is verified (a kind that
    /// says no is announced by its caller when it sees fit).
    fn announce_at_once(&self) -> bool {
        true
    }

    /// Whether verified units are worth keeping in memory for the next reader (chunks
    /// read by the kernel in several requests are; mirror pieces, read once, are not).
    fn keep_in_memory(&self) -> bool {
        true
    }

    /// Accounts for what happened to one of its units.
    fn observe(&self, _event: Event) {}
}
