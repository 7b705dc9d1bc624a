//! A mounted image as the pipeline sees it: its bootstrap, where its blobs are, the
//! order of its chunks within each blob (for merging neighbours into one request and
//! reading ahead within a file), and what its mount pulled.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rafs_format::reader::{Bootstrap, ChunkInfo};
use serde::{Deserialize, Serialize};

use super::readahead::ReadAhead;
use super::seams::{Origin, Store};
use super::unit::{Event, Resume, Unit, Wanted};
use super::Source;
use crate::cache::ChunkKey;
use crate::peer::Network;
use crate::registry::reference::Reference;
use crate::Result;

/// One mounted image.
pub struct ImageChunks {
    pub bootstrap: Arc<Bootstrap>,
    /// The image, pinned by digest: blobs are read from its repository.
    pub reference: Reference,
    /// Where its blobs are read from the origin (the node's credentials).
    origin: Arc<dyn Origin>,
    /// `sha256:…` of each blob, by blob-table index.
    blob_digests: Vec<String>,
    /// The chunk order of each blob, and where sequential reads stand.
    ahead: ReadAhead,
    pub stats: PullStats,
    /// Whether its chunks are kept in memory for the next reader (not for a preheat,
    /// which fills the cache disk for mounts to come).
    in_memory: AtomicBool,
}

impl std::fmt::Debug for ImageChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageChunks")
            .field("reference", &self.reference)
            .field("blobs", &self.blob_digests)
            .finish_non_exhaustive()
    }
}

/// What one mount pulled, for its summary line and `tessera status`.
#[derive(Debug, Default)]
pub struct PullStats {
    pub cache_bytes: AtomicU64,
    pub origin_bytes: AtomicU64,
    /// Compressed bytes transferred from the origin (what the network carried).
    pub origin_wire_bytes: AtomicU64,
    pub peer_bytes: AtomicU64,
    pub chunks_fetched: AtomicU64,
    pub verification_failures: AtomicU64,
    pub fetch_errors: AtomicU64,
}

/// A snapshot of [`PullStats`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PullSummary {
    pub cache_bytes: u64,
    pub origin_bytes: u64,
    pub origin_wire_bytes: u64,
    #[serde(default)]
    pub peer_bytes: u64,
    pub chunks_fetched: u64,
    pub verification_failures: u64,
    pub fetch_errors: u64,
}

impl PullStats {
    pub fn summary(&self) -> PullSummary {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PullSummary {
            cache_bytes: l(&self.cache_bytes),
            origin_bytes: l(&self.origin_bytes),
            origin_wire_bytes: l(&self.origin_wire_bytes),
            peer_bytes: l(&self.peer_bytes),
            chunks_fetched: l(&self.chunks_fetched),
            verification_failures: l(&self.verification_failures),
            fetch_errors: l(&self.fetch_errors),
        }
    }
}

impl ImageChunks {
    pub fn new(
        bootstrap: Arc<Bootstrap>,
        reference: Reference,
        origin: Arc<dyn Origin>,
    ) -> Result<Self> {
        let blobs = bootstrap.blobs()?;
        // In each blob, by place; spans of one checkpoint (one place) in output order.
        let mut order: Vec<Vec<(u64, u32, u32)>> = vec![Vec::new(); blobs.len()];
        for c in 0..bootstrap.chunk_count() {
            let info = bootstrap.chunk(c)?;
            let skip = info.span.map_or(0, |s| s.skip);
            order[info.blob_index as usize].push((info.compressed_offset, skip, c));
        }
        let mut position = vec![0u32; bootstrap.chunk_count() as usize];
        let order: Vec<Vec<u32>> = order
            .into_iter()
            .map(|mut chunks| {
                chunks.sort_unstable();
                chunks.into_iter().map(|(_, _, c)| c).collect::<Vec<u32>>()
            })
            .collect();
        for chunks in &order {
            for (pos, &c) in chunks.iter().enumerate() {
                position[c as usize] = pos as u32;
            }
        }
        let mut owner = vec![0u32; bootstrap.chunk_count() as usize];
        rafs_format::image::for_each_entry(&bootstrap, |_, inode, first| {
            if first && inode.kind == rafs_format::reader::FileKind::Regular {
                for piece in bootstrap.file_chunks(inode).unwrap_or_default() {
                    if let Some(c) = piece.chunk {
                        let slot = &mut owner[c as usize];
                        if *slot == 0 {
                            *slot = inode.ino;
                        }
                    }
                }
            }
        })?;
        let stored = (0..bootstrap.chunk_count())
            .map(|c| bootstrap.chunk(c).map_or(0, |i| i.compressed_size))
            .collect();
        Ok(ImageChunks {
            blob_digests: blobs.iter().map(|b| b.oci_digest()).collect(),
            bootstrap,
            reference,
            origin,
            ahead: ReadAhead::new(order, position, owner, stored),
            stats: PullStats::default(),
            in_memory: AtomicBool::new(true),
        })
    }

    /// Chunk `index` as a unit of the pipeline.
    pub fn unit(&self, index: u32) -> Result<Unit> {
        Ok(self.unit_of(&self.bootstrap.chunk(index)?))
    }

    fn unit_of(&self, info: &ChunkInfo) -> Unit {
        Unit {
            key: ChunkKey {
                algo: self.bootstrap.digest_algo(),
                digest: info.digest,
            },
            index: info.index,
            blob: info.blob_index,
            offset: info.compressed_offset,
            stored_size: info.compressed_size,
            compression: info.compression,
            size: info.uncompressed_size,
            span: info.span,
        }
    }

    /// Every chunk's cache key, duplicates included (what a mount pins).
    pub fn keys(&self) -> Vec<ChunkKey> {
        let algo = self.bootstrap.digest_algo();
        (0..self.bootstrap.chunk_count())
            .filter_map(|c| self.bootstrap.chunk(c).ok())
            .map(|info| ChunkKey {
                algo,
                digest: info.digest,
            })
            .collect()
    }

    /// Fetches its chunks into the cache only, not into memory (a preheat).
    pub fn bypass_memory(&self) {
        self.in_memory.store(false, Ordering::Relaxed);
    }

    /// Chunks to read ahead after a read of `chunk` (see [`ReadAhead::after`]).
    pub fn read_ahead(&self, chunk: u32, window: u64) -> (bool, Vec<u32>) {
        match self.bootstrap.chunk(chunk) {
            Ok(info) => self.ahead.step(info.blob_index, chunk, window),
            Err(_) => (false, Vec::new()),
        }
    }

    /// Announces the chunks of this image the node already has stored (from earlier
    /// mounts or another image sharing them), so peers can fetch them from here; and
    /// the image itself with its blobs' sizes, for the admin's view. Blocking: it
    /// probes the store's index once per chunk.
    pub fn announce_stored(&self, store: &dyn Store, network: &Network) {
        if let Ok(blobs) = self.bootstrap.blobs() {
            network.blob_sizes(
                blobs
                    .iter()
                    .zip(&self.blob_digests)
                    .map(|(info, digest)| (digest.clone(), info.size)),
            );
        }
        network.uses_image(&self.reference.to_string(), self.blob_digests.clone());
        for (blob, chunks) in self.ahead.order.iter().enumerate() {
            let held: Vec<(ChunkKey, (u64, u64))> = chunks
                .iter()
                .filter_map(|&c| self.bootstrap.chunk(c).ok())
                .map(|info| self.unit_of(&info))
                .filter(|unit| store.contains(&unit.key))
                .map(|unit| (unit.key, unit.range()))
                .collect();
            network.held(&self.blob_digests[blob], held);
        }
    }
}

impl Wanted for ImageChunks {
    fn name(&self) -> String {
        self.reference.to_string()
    }

    fn blob(&self, unit: &Unit) -> &str {
        self.blob_digests
            .get(unit.blob as usize)
            .map_or("", String::as_str)
    }

    fn next_in_blob(&self, unit: &Unit) -> Option<Unit> {
        let order = self.ahead.order.get(unit.blob as usize)?;
        let pos = *self.ahead.position.get(unit.index as usize)? as usize;
        let next = *order.get(pos + 1)?;
        self.unit(next).ok()
    }

    fn origin(&self) -> &dyn Origin {
        self.origin.as_ref()
    }

    fn along_with(&self, unit: &Unit) -> Vec<Unit> {
        let Some(span) = unit.span else {
            return Vec::new();
        };
        let (Some(order), Some(&pos)) = (
            self.ahead.order.get(unit.blob as usize),
            self.ahead.position.get(unit.index as usize),
        ) else {
            return Vec::new();
        };
        order[..pos as usize]
            .iter()
            .rev()
            .map_while(|&c| {
                let before = self.unit(c).ok()?;
                (before.span?.checkpoint == span.checkpoint).then_some(before)
            })
            .collect()
    }

    fn resume(&self, checkpoint: u32) -> Option<Resume> {
        let cp = self.bootstrap.checkpoint(checkpoint).ok()?;
        let window = match cp.window_chunk {
            Some(w) => Some(self.unit(w).ok()?),
            None => None,
        };
        Some(Resume {
            in_bits: cp.in_bits,
            out: cp.out,
            window,
            window_len: cp.window_len(),
        })
    }

    fn keep_in_memory(&self) -> bool {
        self.in_memory.load(Ordering::Relaxed)
    }

    fn observe(&self, event: Event) {
        let s = &self.stats;
        let add = |c: &AtomicU64, n: u64| {
            c.fetch_add(n, Ordering::Relaxed);
        };
        match event {
            Event::Got {
                source: Source::Cache,
                bytes,
            } => add(&s.cache_bytes, bytes),
            Event::Got {
                source: Source::Origin,
                bytes,
            } => {
                add(&s.origin_bytes, bytes);
                add(&s.chunks_fetched, 1);
            }
            Event::Got {
                source: Source::Peer,
                bytes,
            } => {
                add(&s.peer_bytes, bytes);
                add(&s.chunks_fetched, 1);
            }
            Event::OriginTransfer { bytes } => add(&s.origin_wire_bytes, bytes),
            Event::VerificationFailed(_) => add(&s.verification_failures, 1),
            Event::FetchFailed(_) => add(&s.fetch_errors, 1),
        }
    }
}
