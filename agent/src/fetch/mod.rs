//! The chunk path: local cache → peers (when the agent is in a swarm) → origin
//! registry, for the chunks of mounted images.
//!
//! - **Single-flight.** Concurrent requests for one chunk (by digest, so across images
//!   too) share one fetch: the first becomes the leader, the others wait for its result.
//! - **Merged ranges.** A leader also takes the chunks that follow its own in the blob,
//!   while they are contiguous, missing from the cache, not already in flight and within
//!   `merge_bytes`: one Range request instead of many small ones (sequential reads and
//!   small chunks are the common case).
//! - **Verify before use.** Every chunk is decompressed and checked against its digest
//!   from the bootstrap before it is cached or returned; a mismatch is counted against
//!   the source, logged, and the fetch is tried again, up to `attempts`.
//! - **Peers before the origin** ([`peers`]): a leader asks the scheduler who holds its
//!   run, fetches slices of it from several peers at once, abandons and reports a slow,
//!   failing or lying peer, waits while another agent fetches the run from the origin,
//!   and goes to the origin itself when told to or when no peer can help. Everything
//!   verified is announced at once, so other agents can fetch it from here.

mod metrics;
mod peers;

pub use metrics::{FetchMetrics, Source, SourceLabel};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rafs_format::chunk::decode_and_verify;
use rafs_format::reader::{Bootstrap, ChunkInfo};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::cache::{ChunkCache, ChunkKey};
use crate::config::FetchConfig;
use crate::peer::Network;
use crate::registry::client::RegistryClient;
use crate::registry::reference::Reference;
use crate::{Error, Result};

/// A chunk's bytes, or why it could not be had.
type Outcome = std::result::Result<Arc<Vec<u8>>, String>;

/// One mounted image as the fetcher sees it: its bootstrap, where its blobs are, and
/// the order of chunks within each blob (for merging neighbours).
#[derive(Debug)]
pub struct ImageChunks {
    pub bootstrap: Arc<Bootstrap>,
    /// The image, pinned by digest: blobs are read from its repository.
    pub reference: Reference,
    /// `sha256:…` of each blob, by blob-table index.
    blob_digests: Vec<String>,
    /// Chunk indices of each blob in offset order.
    order: Vec<Vec<u32>>,
    /// Each chunk's position in its blob's `order`.
    position: Vec<u32>,
    /// The first file (inode) that uses each chunk: read-ahead stays within a file.
    owner: Vec<u32>,
    /// Per blob, the position of the last chunk read and the furthest position
    /// read-ahead was started for.
    sequence: Mutex<HashMap<u32, (u32, u32)>>,
    pub stats: PullStats,
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
    pub fn new(bootstrap: Arc<Bootstrap>, reference: Reference) -> Result<Self> {
        let blobs = bootstrap.blobs()?;
        let mut order: Vec<Vec<(u64, u32)>> = vec![Vec::new(); blobs.len()];
        for c in 0..bootstrap.chunk_count() {
            let info = bootstrap.chunk(c)?;
            order[info.blob_index as usize].push((info.compressed_offset, c));
        }
        let mut position = vec![0u32; bootstrap.chunk_count() as usize];
        let order: Vec<Vec<u32>> = order
            .into_iter()
            .map(|mut chunks| {
                chunks.sort_unstable();
                chunks.into_iter().map(|(_, c)| c).collect::<Vec<u32>>()
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
        Ok(ImageChunks {
            blob_digests: blobs.iter().map(|b| b.oci_digest()).collect(),
            bootstrap,
            reference,
            order,
            position,
            owner,
            sequence: Mutex::new(HashMap::new()),
            stats: PullStats::default(),
        })
    }

    /// Chunks to read ahead after a read of `chunk`: when reads of its blob go
    /// sequentially, the following chunks of the same file, up to `window` bytes past
    /// the read, that no earlier read-ahead has asked for.
    pub fn read_ahead(&self, chunk: u32, window: u64) -> Vec<u32> {
        let Ok(info) = self.bootstrap.chunk(chunk) else {
            return Vec::new();
        };
        let pos = self.position[chunk as usize];
        let mut sequence = self.sequence.lock().unwrap_or_else(|p| p.into_inner());
        let (last, ahead) = sequence.entry(info.blob_index).or_insert((u32::MAX, 0));
        let sequential = *last != u32::MAX && (pos == *last || pos == last.wrapping_add(1));
        *last = pos;
        if !sequential || window == 0 {
            return Vec::new();
        }
        let order = &self.order[info.blob_index as usize];
        let owner = self.owner[chunk as usize];
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for (p, &next) in order.iter().enumerate().skip(pos as usize + 1) {
            if self.owner[next as usize] != owner || bytes >= window {
                break;
            }
            bytes += self
                .bootstrap
                .chunk(next)
                .map_or(0, |i| u64::from(i.compressed_size));
            if p as u32 > *ahead {
                out.push(next);
                *ahead = p as u32;
            }
        }
        out
    }

    fn key(&self, info: &ChunkInfo) -> ChunkKey {
        ChunkKey {
            algo: self.bootstrap.digest_algo(),
            digest: info.digest,
        }
    }
}

/// Fetches verified chunks for every mount of the agent.
#[derive(Debug)]
pub struct Fetcher {
    cache: Arc<ChunkCache>,
    origin: Arc<RegistryClient>,
    /// The swarm, when P2P is on.
    network: Option<Arc<Network>>,
    config: FetchConfig,
    /// Chunks being fetched, with the channel their result will arrive on.
    inflight: Mutex<HashMap<ChunkKey, watch::Receiver<Option<Outcome>>>>,
    /// Chunks handed out lately, in memory.
    recent: Mutex<Recent>,
    pub metrics: Arc<FetchMetrics>,
}

/// Chunks handed out lately, kept in memory up to a byte budget, oldest dropped first:
/// the kernel reads a 1 MiB chunk in several requests (and many readers read the same
/// hot chunks), and each must not cost a disk read and a digest.
#[derive(Debug)]
struct Recent {
    budget: u64,
    bytes: u64,
    chunks: HashMap<ChunkKey, Arc<Vec<u8>>>,
    order: std::collections::VecDeque<ChunkKey>,
}

impl Recent {
    fn new(budget: u64) -> Self {
        Recent {
            budget,
            bytes: 0,
            chunks: HashMap::new(),
            order: std::collections::VecDeque::new(),
        }
    }

    fn get(&self, key: &ChunkKey) -> Option<Arc<Vec<u8>>> {
        self.chunks.get(key).cloned()
    }

    fn put(&mut self, key: ChunkKey, data: Arc<Vec<u8>>) {
        let len = data.len() as u64;
        if len > self.budget || self.chunks.contains_key(&key) {
            return;
        }
        self.chunks.insert(key, data);
        self.order.push_back(key);
        self.bytes += len;
        while self.bytes > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(d) = self.chunks.remove(&old) {
                self.bytes -= d.len() as u64;
            }
        }
    }
}

/// `[start, end)` of a chunk's stored bytes in its blob: what is announced to peers.
fn blob_range(info: &ChunkInfo) -> (u64, u64) {
    (
        info.compressed_offset,
        info.compressed_offset + u64::from(info.compressed_size),
    )
}

/// What a request for a chunk does: fetch it (and its neighbours), or wait for the
/// fetch already under way.
enum Role {
    Lead(Vec<Planned>),
    Wait(watch::Receiver<Option<Outcome>>),
}

/// A chunk a leader fetches, and where its waiters listen.
struct Planned {
    info: ChunkInfo,
    key: ChunkKey,
    done: watch::Sender<Option<Outcome>>,
}

impl Fetcher {
    pub fn new(
        cache: Arc<ChunkCache>,
        origin: Arc<RegistryClient>,
        config: FetchConfig,
        metrics: Arc<FetchMetrics>,
    ) -> Self {
        Fetcher {
            cache,
            origin,
            network: None,
            inflight: Mutex::new(HashMap::new()),
            recent: Mutex::new(Recent::new(config.memory_bytes)),
            config,
            metrics,
        }
    }

    /// Fetches from peers (found through `network`) before the origin.
    pub fn with_network(mut self, network: Arc<Network>) -> Self {
        self.network = Some(network);
        self
    }

    pub fn network(&self) -> Option<&Arc<Network>> {
        self.network.as_ref()
    }

    pub fn cache(&self) -> &Arc<ChunkCache> {
        &self.cache
    }

    /// Announces the chunks of `image` this node already has cached (from earlier
    /// mounts or another image sharing them), so peers can fetch them from here; and
    /// the image itself with its blobs' sizes, for the admin's view.
    pub fn announce_cached(&self, image: &ImageChunks) {
        let Some(network) = &self.network else { return };
        if let Ok(blobs) = image.bootstrap.blobs() {
            network.blob_sizes(
                blobs
                    .iter()
                    .zip(&image.blob_digests)
                    .map(|(info, digest)| (digest.clone(), info.size)),
            );
        }
        network.uses_image(&image.reference.to_string(), image.blob_digests.clone());
        for (blob, chunks) in image.order.iter().enumerate() {
            let held: Vec<(u64, u64)> = chunks
                .iter()
                .filter_map(|&c| image.bootstrap.chunk(c).ok())
                .filter(|info| self.cache.contains(&image.key(info)))
                .map(|info| blob_range(&info))
                .collect();
            network.held(&image.blob_digests[blob], held);
        }
    }

    /// The verified, uncompressed bytes of chunk `index` of `image`.
    ///
    /// A leader's run goes on in the background once its first chunk is here: the
    /// reader, usually one thread of a program starting up, goes on with its chunk
    /// while the rest of the run arrives (and is answered chunk by chunk to whoever
    /// waits for it), so it is not held for bytes it may never read.
    pub async fn chunk(
        self: &Arc<Self>,
        image: &Arc<ImageChunks>,
        index: u32,
    ) -> Result<Arc<Vec<u8>>> {
        let info = image.bootstrap.chunk(index)?;
        let key = image.key(&info);
        let fail = |reason: String| Error::Chunk {
            image: image.reference.to_string(),
            chunk: index,
            digest: image.bootstrap.digest_algo().format(&info.digest),
            reason,
        };
        loop {
            let started = Instant::now();
            let recent = self
                .recent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key);
            let cached = match recent {
                Some(data) => Some(data),
                None => self.cache.get(&key)?.map(Arc::new),
            };
            if let Some(data) = cached {
                let len = data.len() as u64;
                image.stats.cache_bytes.fetch_add(len, Ordering::Relaxed);
                self.metrics.record(Source::Cache, len, started.elapsed());
                self.remember(key, &data);
                return Ok(data);
            }
            let role = {
                let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
                match inflight.get(&key) {
                    Some(rx) => Role::Wait(rx.clone()),
                    None => Role::Lead(self.plan_run(&mut inflight, image, info, key)),
                }
            };
            let mut rx = match role {
                Role::Lead(run) => {
                    let rx = run[0].done.subscribe();
                    let (fetcher, image) = (self.clone(), image.clone());
                    let runtime = tokio::runtime::Handle::current();
                    // A blocking thread: the cache does file I/O and hashing.
                    tokio::task::spawn_blocking(move || {
                        runtime.block_on(fetcher.lead(&image, run));
                    });
                    rx
                }
                Role::Wait(rx) => rx,
            };
            let answered = rx.wait_for(Option::is_some).await.map(|o| o.clone());
            match answered {
                Ok(outcome) => {
                    let data = outcome
                        .unwrap_or_else(|| Err("no result".into()))
                        .map_err(fail)?;
                    self.remember(key, &data);
                    return Ok(data);
                }
                // The leader went away without an answer: try again, maybe as leader.
                Err(_) => continue,
            }
        }
    }

    fn remember(&self, key: ChunkKey, data: &Arc<Vec<u8>>) {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(key, data.clone());
    }

    /// Registers `first` and the contiguous missing chunks after it (within
    /// `merge_bytes`) as in flight, led by the caller.
    fn plan_run(
        &self,
        inflight: &mut HashMap<ChunkKey, watch::Receiver<Option<Outcome>>>,
        image: &ImageChunks,
        first: ChunkInfo,
        key: ChunkKey,
    ) -> Vec<Planned> {
        let mut planned = vec![(first, key)];
        let blob_order = &image.order[first.blob_index as usize];
        let mut end = first.compressed_offset + u64::from(first.compressed_size);
        let mut bytes = u64::from(first.compressed_size);
        for &next in &blob_order[image.position[first.index as usize] as usize + 1..] {
            let Ok(info) = image.bootstrap.chunk(next) else {
                break;
            };
            let size = u64::from(info.compressed_size);
            let key = image.key(&info);
            if info.compressed_offset != end
                || bytes + size > self.config.merge_bytes
                || inflight.contains_key(&key)
                || planned.iter().any(|(_, k)| *k == key)
                || self.cache.contains(&key)
            {
                break;
            }
            end += size;
            bytes += size;
            planned.push((info, key));
        }
        planned
            .into_iter()
            .map(|(info, key)| {
                let (done, rx) = watch::channel(None);
                inflight.insert(key, rx);
                Planned { info, key, done }
            })
            .collect()
    }

    /// Fetches a planned run; each chunk is answered as soon as it is verified
    /// ([`accept`](Self::accept)), the failures at the end.
    async fn lead(&self, image: &ImageChunks, run: Vec<Planned>) {
        self.metrics.inflight.inc();
        let outcomes = self.fetch_run(image, &run).await;
        self.metrics.inflight.dec();
        for (planned, outcome) in run.iter().zip(outcomes) {
            if planned.done.borrow().is_none() {
                self.answer(planned, outcome);
            }
        }
    }

    /// Answers everyone waiting for a chunk of a run; from now on it is no longer in
    /// flight (a verified chunk is in the cache by then).
    fn answer(&self, planned: &Planned, outcome: Outcome) {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&planned.key);
        let _ = planned.done.send(Some(outcome));
    }

    /// Fetches the run: from peers first when in a swarm, then what is still missing
    /// from the origin.
    async fn fetch_run(&self, image: &ImageChunks, run: &[Planned]) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; run.len()];
        if let Some(network) = &self.network {
            self.fetch_from_peers(network, image, run, &mut outcomes)
                .await;
        }
        let last_error = self.fetch_from_origin(image, run, &mut outcomes).await;
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(format!(
                        "not fetched after {} attempts: {last_error}",
                        self.config.attempts
                    ))
                })
            })
            .collect()
    }

    /// Counts a failed fetch from `source` (or, with `verification`, bytes that failed
    /// verification) in the mount's statistics and the metrics.
    fn count_failure(&self, image: &ImageChunks, source: Source, verification: bool) {
        let (stat, family) = if verification {
            (
                &image.stats.verification_failures,
                &self.metrics.verification_failures,
            )
        } else {
            (&image.stats.fetch_errors, &self.metrics.errors)
        };
        stat.fetch_add(1, Ordering::Relaxed);
        family.get_or_create(&source.label()).inc();
    }

    /// Caches a verified chunk of the run, makes it the chunk's outcome and answers its
    /// waiters at once; `true` when it was cached (so it may be announced: peers are
    /// served from the cache).
    fn accept(&self, planned: &Planned, data: Vec<u8>, slot: &mut Option<Outcome>) -> bool {
        let cached = match self.cache.put(&planned.key, &data) {
            Ok(()) => true,
            Err(e) => {
                // Serve it anyway; it will be fetched again next time.
                tracing::warn!(error = %e, "could not cache a chunk");
                false
            }
        };
        let outcome: Outcome = Ok(Arc::new(data));
        self.answer(planned, outcome.clone());
        *slot = Some(outcome);
        cached
    }

    /// Fetches the run's missing chunks from the origin and verifies each, trying again
    /// (after a pause) for chunks that failed, up to `attempts`. Returns the last error.
    async fn fetch_from_origin(
        &self,
        image: &ImageChunks,
        run: &[Planned],
        outcomes: &mut [Option<Outcome>],
    ) -> String {
        let mut last_error = String::new();
        for attempt in 0..self.config.attempts {
            let pending: Vec<usize> = (0..run.len()).filter(|&i| outcomes[i].is_none()).collect();
            let (Some(&lo), Some(&hi)) = (pending.first(), pending.last()) else {
                break;
            };
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
            }
            let start = run[lo].info.compressed_offset;
            let end = run[hi].info.compressed_offset + u64::from(run[hi].info.compressed_size);
            let blob = &image.blob_digests[run[lo].info.blob_index as usize];
            let started = Instant::now();
            let mut held = Vec::new();
            // Chunks of `pending` looked at in this attempt, in blob order: each is
            // verified and answered as soon as its last byte is here.
            let mut looked_at = 0;
            let mut take = |arrived: &[u8]| {
                while let Some(&i) = pending.get(looked_at) {
                    let info = &run[i].info;
                    let from = (info.compressed_offset - start) as usize;
                    let to = from + info.compressed_size as usize;
                    if arrived.len() < to {
                        break;
                    }
                    looked_at += 1;
                    match decode_and_verify(
                        &arrived[from..to],
                        info.compression,
                        info.uncompressed_size,
                        image.bootstrap.digest_algo(),
                        &info.digest,
                    ) {
                        Ok(data) => {
                            let len = data.len() as u64;
                            image.stats.origin_bytes.fetch_add(len, Ordering::Relaxed);
                            image.stats.chunks_fetched.fetch_add(1, Ordering::Relaxed);
                            self.metrics.record(Source::Origin, len, started.elapsed());
                            if self.accept(&run[i], data, &mut outcomes[i]) {
                                held.push(blob_range(info));
                            }
                        }
                        Err(reason) => {
                            self.count_failure(image, Source::Origin, true);
                            tracing::error!(
                                image = %image.reference,
                                chunk = info.index,
                                blob,
                                offset = info.compressed_offset,
                                attempt,
                                reason,
                                "chunk from origin failed verification; discarded"
                            );
                            last_error = format!("failed verification: {reason}");
                        }
                    }
                }
            };
            let fetched = self
                .origin
                .blob_range_streamed(&image.reference, blob, start..end, &mut take)
                .await;
            let e = match fetched {
                // Every chunk has been looked at by now; this is for a client that
                // shows the bytes only at the end.
                Ok(bytes) => {
                    take(&bytes);
                    None
                }
                Err(e) => Some(e),
            };
            if let Some(e) = e {
                self.count_failure(image, Source::Origin, false);
                tracing::warn!(image = %image.reference, blob, start, end, attempt, error = %e, "origin fetch failed");
                if let Some(network) = &self.network {
                    // Frees the scheduler's origin slot for another agent.
                    network.report(
                        None,
                        blob,
                        (start, end),
                        0,
                        started.elapsed(),
                        tessera_proto::pb::Outcome::Connection,
                    );
                }
                last_error = e.to_string();
                // What was verified before the cut is kept (and may be announced).
                if let Some(network) = &self.network {
                    network.held(blob, held);
                }
                continue;
            }
            image
                .stats
                .origin_wire_bytes
                .fetch_add(end - start, Ordering::Relaxed);
            if let Some(network) = &self.network {
                // For the scheduler's account of peer vs origin bytes.
                network.report(
                    None,
                    blob,
                    (start, end),
                    end - start,
                    started.elapsed(),
                    tessera_proto::pb::Outcome::Ok,
                );
            }
            if let Some(network) = &self.network {
                network.held(blob, held);
            }
        }
        last_error
    }
}
