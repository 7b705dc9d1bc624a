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
use sha2::{Digest, Sha256};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::options::{BuildOptions, BuildProgress, Chunking};
use crate::chunk::{compress, Compression, DigestAlgo};
use crate::layout::HOLE;
use crate::reader::{Bootstrap, LocalBlobs};
use crate::{Error, Result};

/// Chunk data is batched up to this many bytes before hashing and compressing it in
/// parallel, so small files still keep every core busy.
const BATCH_BYTES: usize = 16 << 20;

/// Batches waiting between stages. With one being filled, one hashed and compressed
/// and one written, file data in memory stays under ~4 batches whatever the image's
/// size.
const QUEUED_BATCHES: usize = 1;

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

/// The spool once every chunk is in it.
#[derive(Debug)]
pub(crate) struct Spool {
    /// Open for reading.
    pub file: File,
    pub len: u64,
    /// sha256 of the spool's bytes, if they were hashed as they were written (see
    /// [`ChunkStore::stop_hashing_spool`]): the blob's digest when the spool's order is
    /// the blob's.
    pub sha256: Option<[u8; 32]>,
    /// The spool's name, to keep it as the blob.
    pub named: tempfile::TempPath,
}

/// The stages behind the reading thread: dedup (hash, decide, compress, on every core)
/// and the spool writer, each a thread fed by a bounded queue, so reading the next
/// batch overlaps hashing and compressing this one and writing the last.
struct Stages {
    batches: SyncSender<Vec<PendingPiece>>,
    dedup: JoinHandle<std::io::Result<Deduped>>,
    /// Cleared once the spool can no longer be the blob: its hash is not worth taking.
    hash_spool: Arc<AtomicBool>,
}

/// What the dedup stage found, handed back when the last batch is done.
struct Deduped {
    unique: Vec<UniqueChunk>,
    /// (occurrence, unique chunk) for every piece that is not a hole.
    assigned: Vec<(u32, u32)>,
    dict_hits: u64,
    spool_len: u64,
    spool_sha256: Option<[u8; 32]>,
}

/// The dedup stage's state: every unique chunk so far, by digest.
struct Dedup {
    algo: DigestAlgo,
    compression: Compression,
    level: i32,
    unique: Vec<UniqueChunk>,
    by_digest: HashMap<[u8; 32], u32>,
    dict: HashMap<[u8; 32], UniqueChunk>,
    assigned: Vec<(u32, u32)>,
    dict_hits: u64,
    spool_len: u64,
}

/// A piece after the parallel pass.
struct Hashed {
    occ: u32,
    origin: Option<(u32, u64)>,
    /// `None`: all zeros, a hole.
    digest: Option<[u8; 32]>,
    len: u32,
    bytes: PieceBytes,
}

/// A piece's bytes after the parallel pass: compressed if it may be new, else as read.
enum PieceBytes {
    Stored(Vec<u8>, Compression),
    Raw(Vec<u8>),
}

impl Dedup {
    /// Whether a piece with this digest needs storing (as of the batch's start): not a
    /// span, and not already a chunk it may share. A window must be a stored chunk
    /// (format.md §17.2), so one whose bytes equal a span chunk's is stored again.
    fn known(&self, digest: &[u8; 32], origin: Option<(u32, u64)>) -> Option<u32> {
        self.by_digest.get(digest).copied().filter(|&id| {
            origin.is_some() || !matches!(self.unique[id as usize].location, Location::Span { .. })
        })
    }

    /// Hashes a batch and compresses what may be new (in parallel), then decides in
    /// order which pieces are new (so ids are deterministic). Returns the new chunks'
    /// stored bytes in spool order.
    fn batch(&mut self, pending: Vec<PendingPiece>) -> Vec<Vec<u8>> {
        let (algo, compression, level) = (self.algo, self.compression, self.level);
        let this = &*self;
        let hashed: Vec<Hashed> = pending
            .into_par_iter()
            .map(|PendingPiece { occ, data, origin }| {
                let len = data.len() as u32;
                let digest = (!data.iter().all(|&b| b == 0)).then(|| algo.digest(&data));
                let store = digest.is_some_and(|d| {
                    origin.is_none()
                        && this.known(&d, origin).is_none()
                        && !this.dict.contains_key(&d)
                });
                let bytes = if store {
                    let (stored, used) = compress(&data, compression, level);
                    PieceBytes::Stored(stored, used)
                } else {
                    PieceBytes::Raw(data)
                };
                Hashed {
                    occ,
                    origin,
                    digest,
                    len,
                    bytes,
                }
            })
            .collect();
        let mut out = Vec::new();
        for Hashed {
            occ,
            origin,
            digest,
            len,
            bytes,
        } in hashed
        {
            let Some(digest) = digest else { continue };
            let id = match self.known(&digest, origin) {
                Some(id) => id,
                None => {
                    let id = self.unique.len() as u32;
                    self.by_digest.insert(digest, id);
                    let chunk = match (self.dict.get(&digest), origin, bytes) {
                        (Some(c), _, _) => {
                            self.dict_hits += 1;
                            *c
                        }
                        (None, Some((layer, out)), _) => UniqueChunk {
                            digest,
                            uncompressed_size: len,
                            // The span's length is known once the layer is read whole.
                            compressed_size: 0,
                            compression: Compression::GzipSpan,
                            location: Location::Span { layer, out },
                        },
                        (None, None, bytes) => {
                            // Compressed above (nothing before this batch had it).
                            let (bytes, used) = match bytes {
                                PieceBytes::Stored(stored, used) => (stored, used),
                                PieceBytes::Raw(data) => compress(&data, compression, level),
                            };
                            let chunk = UniqueChunk {
                                digest,
                                uncompressed_size: len,
                                compressed_size: bytes.len() as u32,
                                compression: used,
                                location: Location::Spool {
                                    offset: self.spool_len,
                                },
                            };
                            self.spool_len += bytes.len() as u64;
                            out.push(bytes);
                            chunk
                        }
                    };
                    self.unique.push(chunk);
                    id
                }
            };
            self.assigned.push((occ, id));
        }
        out
    }
}

/// The dedup stage: batches in, stored bytes out to the spool writer.
fn run_dedup(
    mut dedup: Dedup,
    batches: Receiver<Vec<PendingPiece>>,
    spool: File,
    hash_spool: Arc<AtomicBool>,
) -> std::io::Result<Deduped> {
    let (to_writer, chunks) = sync_channel::<Vec<Vec<u8>>>(QUEUED_BATCHES);
    let writer = std::thread::Builder::new()
        .name("build-spool".into())
        .spawn(move || write_spool(spool, chunks, &hash_spool))?;
    for batch in batches {
        let stored = dedup.batch(batch);
        if to_writer.send(stored).is_err() {
            break; // The writer failed; its error is below.
        }
    }
    drop(to_writer);
    let (spool_len, spool_sha256) = writer
        .join()
        .map_err(|_| std::io::Error::other("the spool writer stopped unexpectedly"))??;
    debug_assert_eq!(spool_len, dedup.spool_len);
    Ok(Deduped {
        unique: dedup.unique,
        assigned: dedup.assigned,
        dict_hits: dedup.dict_hits,
        spool_len,
        spool_sha256,
    })
}

/// The spool writer: appends stored chunks in order, hashing them while the spool may
/// still become the blob. Returns the length and, if hashed throughout, the digest.
fn write_spool(
    spool: File,
    chunks: Receiver<Vec<Vec<u8>>>,
    hash_spool: &AtomicBool,
) -> std::io::Result<(u64, Option<[u8; 32]>)> {
    let mut out = BufWriter::with_capacity(1 << 20, spool);
    let mut hasher = Some(Sha256::new());
    let mut len = 0u64;
    for batch in chunks {
        if !hash_spool.load(Ordering::Relaxed) {
            hasher = None;
        }
        for c in batch {
            if let Some(h) = &mut hasher {
                h.update(&c);
            }
            out.write_all(&c)?;
            len += c.len() as u64;
        }
    }
    out.flush()?;
    Ok((len, hasher.map(|h| h.finalize().into())))
}

pub(crate) struct ChunkStore {
    chunking: Chunking,
    /// The reading side of the dedup and spool stages; `None` once finished.
    stages: Option<Stages>,
    /// The spool file, named so it can become the blob.
    spool: Option<tempfile::NamedTempFile>,
    /// Filled when the stages finish ([`ChunkStore::finish_spool`]).
    pub unique: Vec<UniqueChunk>,
    dict_blobs: Vec<DictBlob>,
    pub occurrences: Vec<Occurrence>,
    /// Chunk data waiting for the next batch.
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
    /// A store spooling into a new file in `dir` (the image's `blobs/`), its stages
    /// started.
    pub fn new(opts: &BuildOptions, dir: &Path) -> Result<Self> {
        let spool = tempfile::Builder::new()
            .prefix(".spool")
            .tempfile_in(dir)
            .map_err(|e| Error::io("create chunk spool in", dir, e))?;
        let mut dedup = Dedup {
            algo: opts.digest,
            compression: opts.compression,
            level: opts.compression_level,
            unique: Vec::new(),
            by_digest: HashMap::new(),
            dict: HashMap::new(),
            assigned: Vec::new(),
            dict_hits: 0,
            spool_len: 0,
        };
        let mut dict_blobs = Vec::new();
        if let Some(dict) = &opts.chunk_dict {
            load_dict(
                &mut dedup,
                &mut dict_blobs,
                &dict.image_dir,
                dict.link_blobs,
            )?;
        }
        let writer = spool
            .as_file()
            .try_clone()
            .map_err(|e| Error::io("open chunk spool", spool.path(), e))?;
        let (batches, from_reader) = sync_channel(QUEUED_BATCHES);
        let hash_spool = Arc::new(AtomicBool::new(true));
        let hashing = hash_spool.clone();
        let dedup = std::thread::Builder::new()
            .name("build-dedup".into())
            .spawn(move || run_dedup(dedup, from_reader, writer, hashing))
            .map_err(|e| Error::io("start the build's dedup thread for", spool.path(), e))?;
        Ok(ChunkStore {
            chunking: opts.chunking,
            stages: Some(Stages {
                batches,
                dedup,
                hash_spool,
            }),
            spool: Some(spool),
            unique: Vec::new(),
            dict_blobs,
            occurrences: Vec::new(),
            pending: Vec::new(),
            span_layer: None,
            pending_bytes: 0,
            stats: StoreStats::default(),
            progress: opts.progress.clone(),
            scratch: Vec::new(),
        })
    }

    /// The spool will not be the blob (a second source: its chunks interleave with the
    /// first's in reading order), so its writer stops hashing it.
    pub fn stop_hashing_spool(&self) {
        if let Some(stages) = &self.stages {
            stages.hash_spool.store(false, Ordering::Relaxed);
        }
    }

    pub fn dict_blob(&self, index: u32) -> &DictBlob {
        &self.dict_blobs[index as usize]
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

    /// Hands the pending batch to the dedup stage (waiting while it is a batch
    /// behind); an error it stopped on comes back here.
    fn flush(&mut self) -> std::io::Result<()> {
        let batch = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let Some(stages) = &self.stages else {
            return Err(std::io::Error::other("the chunk store is already finished"));
        };
        if stages.batches.send(batch).is_ok() {
            return Ok(());
        }
        // The stage stopped, on an error: report it.
        match self.join_stages() {
            Err(e) => Err(e),
            Ok(_) => Err(std::io::Error::other("the chunk store stopped early")),
        }
    }

    /// Closes the queue and waits for every batch to be spooled.
    fn join_stages(&mut self) -> std::io::Result<Deduped> {
        let Some(stages) = self.stages.take() else {
            return Err(std::io::Error::other("the chunk store is already finished"));
        };
        drop(stages.batches);
        stages
            .dedup
            .join()
            .map_err(|_| std::io::Error::other("the build's dedup stage stopped unexpectedly"))?
    }

    /// Spools everything pending, waits for the stages and hands back the spool; the
    /// chunks' ids are then in [`ChunkStore::occurrences`] and [`ChunkStore::unique`].
    pub fn finish_spool(&mut self) -> std::io::Result<Spool> {
        if !self.pending.is_empty() {
            self.flush()?;
        }
        let done = self.join_stages()?;
        for (occ, id) in done.assigned {
            self.occurrences[occ as usize].chunk = id;
        }
        self.unique = done.unique;
        self.stats.dict_hits = done.dict_hits;
        let named = self
            .spool
            .take()
            .ok_or_else(|| std::io::Error::other("the chunk store is already finished"))?;
        let file = named.reopen()?;
        Ok(Spool {
            file,
            len: done.spool_len,
            sha256: done.spool_sha256,
            named: named.into_temp_path(),
        })
    }
}

/// Indexes the chunks of the image at `dir` so matching chunks are referenced.
fn load_dict(
    dedup: &mut Dedup,
    blobs: &mut Vec<DictBlob>,
    dir: &Path,
    link_blobs: bool,
) -> Result<()> {
    let bootstrap = Bootstrap::open(&dir.join("bootstrap"))?;
    if bootstrap.digest_algo() != dedup.algo {
        return Err(Error::InvalidOption(format!(
            "--chunk-dict {} uses {} chunk digests but this build uses {}; build with the same --digest",
            dir.display(),
            bootstrap.digest_algo().name(),
            dedup.algo.name()
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
        blobs.push(DictBlob {
            digest: blob.digest,
            size: blob.size,
            path,
        });
    }
    for c in 0..bootstrap.chunk_count() {
        let info = bootstrap.chunk(c)?;
        dedup.dict.entry(info.digest).or_insert(UniqueChunk {
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
