//! The chunk store of a build: cuts file data into chunks, deduplicates them, compresses
//! the new ones (in parallel) and spools them to a temporary file.
//!
//! Chunks land in the spool in the order files arrive; `writer` later copies the live
//! ones into the final blob in the order a reader will want them (prefetch list first),
//! which also drops data of files that a later layer replaced or deleted.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::options::{BuildOptions, BuildProgress, Chunking};
use crate::chunk::{compress, Compression, DigestAlgo};
use crate::layout::HOLE;
use crate::reader::{Bootstrap, LocalBlobs};
use crate::{Error, Result};

/// Chunk data is batched up to this many bytes before hashing and compressing it in
/// parallel, so small files still keep every core busy.
const BATCH_BYTES: usize = 32 << 20;

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(data: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match data.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Where a unique chunk's stored bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Location {
    /// In this build's spool file.
    Spool { offset: u64 },
    /// In a blob of the chunk dictionary (an earlier image), not written again.
    Dict { blob: u32, offset: u64 },
    /// At output offset `out` of indexed gzip layer `layer` (the builder's count of
    /// indexed layers): an index's chunk, stored nowhere new (format.md §17).
    Span { layer: u32, out: u64 },
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct UniqueChunk {
    pub digest: [u8; 32],
    pub uncompressed_size: u32,
    pub compressed_size: u32,
    pub compression: Compression,
    pub location: Location,
}

/// One piece of one file: a unique chunk, or [`HOLE`] for an all-zero piece.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Occurrence {
    pub chunk: u32,
    pub len: u32,
}

/// A blob of the chunk dictionary.
#[derive(Debug, Clone)]
pub(crate) struct DictBlob {
    pub digest: [u8; 32],
    pub size: u64,
    /// Where the blob file is, to link it into the new image dir; `None` when the
    /// dictionary's blobs are kept elsewhere.
    pub path: Option<std::path::PathBuf>,
}

/// Chunks of another image that a build may reference instead of storing again.
#[derive(Debug, Default)]
struct Dict {
    blobs: Vec<DictBlob>,
    chunks: HashMap<[u8; 32], UniqueChunk>,
}

/// Counters for the build summary.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StoreStats {
    /// File bytes read from the input (including files later replaced by a layer).
    pub bytes_in: u64,
    /// Chunks found in the dictionary.
    pub dict_hits: u64,
}

/// A piece read but not yet hashed.
#[derive(Debug)]
struct PendingPiece {
    /// The occurrence it fills.
    occ: u32,
    data: Vec<u8>,
    /// For an indexed layer's piece: that layer and the piece's offset in its output.
    origin: Option<(u32, u64)>,
}

pub(crate) struct ChunkStore {
    algo: DigestAlgo,
    compression: Compression,
    level: i32,
    chunking: Chunking,
    spool: BufWriter<File>,
    spool_len: u64,
    pub unique: Vec<UniqueChunk>,
    by_digest: HashMap<[u8; 32], u32>,
    dict: Dict,
    pub occurrences: Vec<Occurrence>,
    /// Chunk data waiting for the next parallel batch.
    pending: Vec<PendingPiece>,
    /// The indexed gzip layer whose files are being added: their chunks become spans
    /// of it instead of being compressed and stored.
    span_layer: Option<u32>,
    pending_bytes: usize,
    pub stats: StoreStats,
    progress: Option<Arc<BuildProgress>>,
    /// One chunk's worth of read buffer, kept across files: zeroing a fresh 1 MiB
    /// buffer per file cost ~5% of a build of many small files.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStore")
            .field("unique", &self.unique.len())
            .field("occurrences", &self.occurrences.len())
            .finish_non_exhaustive()
    }
}

impl ChunkStore {
    pub fn new(opts: &BuildOptions, spool: File) -> Result<Self> {
        let mut store = ChunkStore {
            algo: opts.digest,
            compression: opts.compression,
            level: opts.compression_level,
            chunking: opts.chunking,
            spool: BufWriter::with_capacity(1 << 20, spool),
            spool_len: 0,
            unique: Vec::new(),
            by_digest: HashMap::new(),
            dict: Dict::default(),
            occurrences: Vec::new(),
            pending: Vec::new(),
            span_layer: None,
            pending_bytes: 0,
            stats: StoreStats::default(),
            progress: opts.progress.clone(),
            scratch: Vec::new(),
        };
        if let Some(dict) = &opts.chunk_dict {
            store.load_dict(&dict.image_dir, dict.link_blobs)?;
        }
        Ok(store)
    }

    /// Indexes the chunks of the image at `dir` so matching chunks are referenced.
    fn load_dict(&mut self, dir: &Path, link_blobs: bool) -> Result<()> {
        let bootstrap = Bootstrap::open(&dir.join("bootstrap"))?;
        if bootstrap.digest_algo() != self.algo {
            return Err(Error::InvalidOption(format!(
                "--chunk-dict {} uses {} chunk digests but this build uses {}; build with the same --digest",
                dir.display(),
                bootstrap.digest_algo().name(),
                self.algo.name()
            )));
        }
        let local = LocalBlobs::new(dir);
        for blob in bootstrap.blobs()? {
            let path = local.path(&blob);
            if link_blobs && !path.is_file() {
                return Err(Error::io(
                    "find chunk-dict blob",
                    &path,
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            let path = link_blobs.then_some(path);
            self.dict.blobs.push(DictBlob {
                digest: blob.digest,
                size: blob.size,
                path,
            });
        }
        for c in 0..bootstrap.chunk_count() {
            let info = bootstrap.chunk(c)?;
            self.dict.chunks.entry(info.digest).or_insert(UniqueChunk {
                digest: info.digest,
                uncompressed_size: info.uncompressed_size,
                compressed_size: info.compressed_size,
                compression: info.compression,
                location: Location::Dict {
                    blob: info.blob_index,
                    offset: info.compressed_offset,
                },
            });
        }
        Ok(())
    }

    pub fn dict_blob(&self, index: u32) -> &DictBlob {
        &self.dict.blobs[index as usize]
    }

    /// Makes the files added next chunks of indexed layer `layer` (`None`: stored as
    /// usual).
    pub fn set_span_layer(&mut self, layer: Option<u32>) {
        self.span_layer = layer;
    }

    /// Adds one chunk as it is (no cutting), stored as usual: a checkpoint's window.
    /// Returns its occurrence, whose `chunk` is [`HOLE`] if the data is all zeros.
    pub fn add_chunk(&mut self, data: Vec<u8>) -> std::io::Result<u32> {
        let occ = self.occurrences.len() as u32;
        self.push_piece(data, None)?;
        Ok(occ)
    }

    /// Reads a whole file, cutting it into chunks; returns its size and its pieces.
    /// `at` is the offset of the file's data in the layer's output, which an indexed
    /// layer's chunks record.
    pub fn add_file(
        &mut self,
        mut data: impl Read,
        at: Option<u64>,
    ) -> std::io::Result<(u64, Range<u32>)> {
        let first = self.occurrences.len() as u32;
        let mut size = 0u64;
        let span_layer = self.span_layer.zip(at);
        let origin = |size: u64| span_layer.map(|(layer, at)| (layer, at + size));
        match self.chunking {
            Chunking::Fixed { size: chunk_size } => {
                // Read into the scratch buffer and keep exact-size copies, so a 1 KiB
                // file does not hold a 1 MiB allocation while its batch waits.
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.resize(chunk_size as usize, 0);
                loop {
                    let n = read_full(&mut data, &mut scratch)?;
                    if n == 0 {
                        break;
                    }
                    self.push_piece(scratch[..n].to_vec(), origin(size))?;
                    size += n as u64;
                    if n < scratch.len() {
                        break;
                    }
                }
                self.scratch = scratch;
            }
            Chunking::Cdc { min, avg, max } => {
                for piece in fastcdc::v2020::StreamCDC::new(&mut data, min, avg, max) {
                    let piece = piece.map_err(|e| match e {
                        fastcdc::v2020::Error::IoError(e) => e,
                        other => std::io::Error::other(other.to_string()),
                    })?;
                    let len = piece.data.len() as u64;
                    self.push_piece(piece.data, origin(size))?;
                    size += len;
                }
            }
        }
        self.stats.bytes_in += size;
        if let Some(p) = &self.progress {
            p.files.fetch_add(1, Ordering::Relaxed);
            p.bytes.fetch_add(size, Ordering::Relaxed);
        }
        Ok((size, first..self.occurrences.len() as u32))
    }

    fn push_piece(&mut self, data: Vec<u8>, origin: Option<(u32, u64)>) -> std::io::Result<()> {
        let occ = self.occurrences.len() as u32;
        self.occurrences.push(Occurrence {
            chunk: HOLE,
            len: data.len() as u32,
        });
        self.pending_bytes += data.len();
        self.pending.push(PendingPiece { occ, data, origin });
        if self.pending_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Hashes, deduplicates, compresses and spools the pending batch.
    pub fn flush(&mut self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let algo = self.algo;
        // Hash in parallel; an all-zero piece becomes a hole and is never stored.
        type Hashed = (u32, Vec<u8>, Option<(u32, u64)>, Option<[u8; 32]>);
        let hashed: Vec<Hashed> = pending
            .into_par_iter()
            .map(|PendingPiece { occ, data, origin }| {
                let digest = (!data.iter().all(|&b| b == 0)).then(|| algo.digest(&data));
                (occ, data, origin, digest)
            })
            .collect();
        // Decide sequentially (deterministic ids) which pieces are new.
        let mut to_compress = Vec::new();
        for (occ, data, origin, digest) in hashed {
            let Some(digest) = digest else { continue };
            // A window must be a stored chunk (format.md §17.2): one whose bytes equal
            // a span chunk's is stored again rather than shared.
            let known = self.by_digest.get(&digest).copied().filter(|&id| {
                origin.is_some()
                    || !matches!(self.unique[id as usize].location, Location::Span { .. })
            });
            let id = match known {
                Some(id) => id,
                None => {
                    let id = self.unique.len() as u32;
                    self.by_digest.insert(digest, id);
                    match (self.dict.chunks.get(&digest), origin) {
                        (Some(c), _) => {
                            self.stats.dict_hits += 1;
                            self.unique.push(*c);
                        }
                        (None, Some((layer, out))) => self.unique.push(UniqueChunk {
                            digest,
                            uncompressed_size: data.len() as u32,
                            // The span's length is known once the layer is read whole.
                            compressed_size: 0,
                            compression: Compression::GzipSpan,
                            location: Location::Span { layer, out },
                        }),
                        (None, None) => {
                            self.unique.push(UniqueChunk {
                                digest,
                                uncompressed_size: data.len() as u32,
                                compressed_size: 0,
                                compression: Compression::None,
                                location: Location::Spool { offset: 0 },
                            });
                            to_compress.push((id, data));
                        }
                    }
                    id
                }
            };
            self.occurrences[occ as usize].chunk = id;
        }
        let (compression, level) = (self.compression, self.level);
        let compressed: Vec<(u32, Vec<u8>, Compression)> = to_compress
            .into_par_iter()
            .map(|(id, data)| {
                let (stored, used) = compress(&data, compression, level);
                (id, stored, used)
            })
            .collect();
        for (id, stored, used) in compressed {
            self.spool.write_all(&stored)?;
            let u = &mut self.unique[id as usize];
            u.compressed_size = stored.len() as u32;
            u.compression = used;
            u.location = Location::Spool {
                offset: self.spool_len,
            };
            self.spool_len += stored.len() as u64;
        }
        Ok(())
    }

    /// Flushes everything and hands back the spool file for reading.
    pub fn finish_spool(&mut self) -> std::io::Result<&File> {
        self.flush()?;
        self.spool.flush()?;
        Ok(self.spool.get_ref())
    }
}
