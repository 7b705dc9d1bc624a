//! What a mount's filesystem reads through: the image's chunks from the fetcher (the
//! blocking bridge, since FUSE workers are not runtime threads), and the mount's read
//! statistics — bytes, reads, first byte, slow reads — and its recorder.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::Recorder;
use rafs_format::reader::FileChunk;

use crate::cache::{ChunkCache, FileLayout};
use crate::fetch::{ChunkRead, Fetcher, ImageChunks, Wanted};
use crate::fs::{ChunkReader, Data};
use crate::peer::Network;

/// How long a closed file's backing copy waits for its last chunks to be stored.
const BACKING_WAIT: Duration = Duration::from_secs(5);

/// How long the node must have been quiet — nothing fetched, no read waiting, no upload
/// to a peer — before a backing copy is made. The copy only speeds up the file's next
/// open, and it is a whole extra copy of the file: made while a swarm is still pulling
/// it took a tenth of every agent's CPU in the 20-node benchmark (benches/README.md),
/// from the reads and uploads others wait for.
const BACKING_QUIET: Duration = Duration::from_millis(200);

/// The longest a backing copy gives way to other work; then it is made anyway (a node
/// that never goes quiet still gets passthrough for its files).
const BACKING_QUIET_LIMIT: Duration = Duration::from_secs(60);

/// How often a backing copy waiting for quiet looks.
const QUIET_POLL: Duration = Duration::from_millis(100);

/// What the filesystem reads through: the image's chunks, and the read statistics.
#[derive(Debug)]
pub struct MountedImage {
    pub chunks: Arc<ImageChunks>,
    /// Where every chunk comes from.
    pub(super) fetcher: Arc<Fetcher>,
    /// The node's cache, for backing files (FUSE passthrough).
    pub(super) cache: Arc<ChunkCache>,
    /// The swarm, when P2P is on: its uploads count as work a backing copy waits for.
    pub(super) network: Option<Arc<Network>>,
    /// Backing copies are made one at a time (only the one holding the turn watches
    /// for quiet).
    pub(super) backing_turn: Arc<tokio::sync::Semaphore>,
    /// `fetch.readahead_bytes`.
    pub(super) readahead: u64,
    /// The runtime FUSE worker threads block on for a miss.
    pub(super) runtime: tokio::runtime::Handle,
    /// The image as the mount request named it.
    pub(super) requested: String,
    /// Manifest digest, for status and logs.
    pub(super) digest: String,
    /// When the mount was asked for (time to first byte is measured from it).
    pub(super) started: Instant,
    /// Bytes the workload read (status, metrics).
    pub(super) bytes_read: AtomicU64,
    /// Reads the workload made (status).
    pub(super) reads: AtomicU64,
    /// Time from the mount request to the first read (status).
    pub(super) first_byte: OnceLock<Duration>,
    /// `mount --record`'s file, if asked for.
    pub(super) recorder: Option<Recorder>,
    /// `fetch.slow_read_ms`: a read waiting longer is a slow read.
    pub(super) slow_read: Duration,
    /// Reads that waited longer than `slow_read` (status, metrics).
    pub(super) slow_reads: AtomicU64,
    /// When a slow read was last logged (ms since `started`): one line a second at most.
    pub(super) slow_logged_ms: AtomicU64,
}

/// Waits until the node has been quiet for [`BACKING_QUIET`] (nothing fetched, no read
/// waiting, no upload to a peer), or [`BACKING_QUIET_LIMIT`] has passed.
async fn until_quiet(fetcher: &Fetcher, network: Option<&Network>) {
    let started = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    while started.elapsed() < BACKING_QUIET_LIMIT {
        let uploading = network.is_some_and(|n| n.server().active_uploads() > 0);
        if fetcher.is_idle() && !uploading {
            if quiet_since.get_or_insert_with(Instant::now).elapsed() >= BACKING_QUIET {
                return;
            }
        } else {
            quiet_since = None;
        }
        tokio::time::sleep(QUIET_POLL).await;
    }
}

impl MountedImage {
    /// Where the bytes of a file made of `pieces` are, by chunk digest; `None` if a
    /// piece names a chunk the image does not have (a corrupt record: no passthrough).
    fn layout(&self, pieces: &[FileChunk], size: u64) -> Option<FileLayout> {
        let pieces = pieces
            .iter()
            .map(|p| match p.chunk {
                Some(chunk) => Some((
                    p.file_offset,
                    p.len,
                    Some(self.chunks.unit(chunk).ok()?.key),
                )),
                None => Some((p.file_offset, p.len, None)),
            })
            .collect::<Option<Vec<_>>>()?;
        Some(FileLayout { size, pieces })
    }
}

impl ChunkReader for MountedImage {
    fn read_chunk(&self, chunk: u32, within: Range<u32>) -> std::io::Result<Data> {
        // FUSE worker threads are not runtime threads: the fetcher's blocking bridge.
        let read = self
            .fetcher
            .read_blocking(
                &self.runtime,
                &self.chunks,
                chunk,
                within.clone(),
                self.readahead,
            )
            .map_err(|e| {
                tracing::error!(image = %self.chunks.reference, chunk, error = %e, "read failed");
                std::io::Error::other(e.to_string())
            })?;
        Ok(match read {
            ChunkRead::Whole(whole) => {
                Data::part_of(whole, within.start as usize..within.end as usize)
            }
            ChunkRead::Part(part) => Data::Owned(part),
        })
    }

    fn backing_file(&self, pieces: &[FileChunk], size: u64) -> Option<std::fs::File> {
        self.cache.backing_file(&self.layout(pieces, size)?)
    }

    fn file_closed(&self, pieces: &Arc<[FileChunk]>, size: u64) {
        let Some(layout) = self.layout(pieces, size) else {
            return;
        };
        if layout.single_chunk().is_some() {
            // Its chunk's own file is its backing file: nothing to make, nothing to wait
            // for (most files are one chunk).
            return;
        }
        let (cache, fetcher) = (self.cache.clone(), self.fetcher.clone());
        let (network, turn) = (self.network.clone(), self.backing_turn.clone());
        // The file's last chunks may still be on their way to the disk (a reader is
        // answered before its chunk is stored): wait for them and for the node to go
        // quiet, then copy, which may take a while (the kernel copies, or shares
        // extents) — all off the session thread.
        self.runtime.spawn(async move {
            let Ok(_turn) = turn.acquire_owned().await else {
                return;
            };
            let keys: Vec<_> = layout.pieces.iter().filter_map(|p| p.2).collect();
            fetcher.landed(&keys, BACKING_WAIT).await;
            until_quiet(&fetcher, network.as_deref()).await;
            if !cache.wants_backing_file(&layout) {
                return;
            }
            let bytes = layout.size;
            match tokio::task::spawn_blocking(move || cache.make_backing_file(&layout)).await {
                Ok(Ok(true)) => tracing::debug!(bytes, "made a passthrough backing file"),
                Ok(Ok(false)) | Err(_) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not make a passthrough backing file")
                }
            }
        });
    }

    fn listed(&self, files: Vec<(Vec<FileChunk>, u64)>) {
        let layouts = files
            .iter()
            .filter_map(|(pieces, size)| self.layout(pieces, *size));
        self.cache.warm(layouts);
        // What is not on this node may be on a peer holding the whole blob: fetched
        // ahead from it while the reader is still listing. The units are made only if
        // the node is in a swarm (the iterator is lazy).
        let units = files
            .iter()
            .flat_map(|(pieces, _)| pieces.iter().filter_map(|p| p.chunk))
            .filter_map(|chunk| self.chunks.unit(chunk).ok());
        let wanted: Arc<dyn Wanted> = self.chunks.clone();
        self.fetcher.fetch_ahead(&self.runtime, &wanted, units);
    }

    fn observe_read(&self, ino: u32, _offset: u64, len: u64) {
        self.bytes_read.fetch_add(len, Ordering::Relaxed);
        self.fetcher.metrics.read_bytes.inc_by(len);
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.first_byte.get_or_init(|| self.started.elapsed());
        if let Some(r) = &self.recorder {
            r.saw(ino);
        }
    }

    fn read_done(&self, ino: u32, len: u64, waited: Duration) {
        if waited < self.slow_read {
            return;
        }
        let count = self.slow_reads.fetch_add(1, Ordering::Relaxed) + 1;
        self.fetcher.metrics.slow_reads.inc();
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.slow_logged_ms.load(Ordering::Relaxed);
        if (count == 1 || now_ms >= last + 1000)
            && self
                .slow_logged_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                image = %self.requested,
                ino,
                len,
                waited_ms = waited.as_millis() as u64,
                slow_reads = count,
                "slow read: the workload waited over fetch.slow_read_ms for data (see tessera status: bytes by source)"
            );
        }
    }
}
