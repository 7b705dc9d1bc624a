//! The fetch pipeline: every verified byte the agent uses — a chunk of a mounted image,
//! a piece of a blob the mirror serves — comes through here, in this order:
//!
//! 1. **Memory**: units handed out lately ([`memory`]).
//! 2. **Store**: the node's verified chunk cache ([`seams::Store`]).
//! 3. **Single flight**: a unit already being fetched (by digest, so across images and
//!    between mounts and the mirror) is waited for, not fetched again.
//! 4. **A run**: the leader also takes the units stored right after its own in the blob
//!    while they are missing, not in flight and within `fetch.merge_bytes`
//!    ([`Wanted::next_in_blob`]), so one request fetches them all ([`run`]).
//! 5. **Peers** ([`peers`]), when the node is in a swarm: one policy for busy holders,
//!    waits for another agent's origin fetch, slow, failing and lying peers.
//! 6. **Origin** ([`origin`]): Range requests, retried with backoff.
//!
//! Two callers fetch before anyone reads: prefetch and preheat ([`all`]), and a
//! listing's files from a peer holding their whole blob ([`ahead`]).
//!
//! Every unit is verified (decoded to its size, its digest compared) before it is
//! stored, announced or returned; a mismatch is counted against its source and the unit
//! is fetched elsewhere. What differs between image chunks and mirror pieces is behind
//! the one trait [`Wanted`]; the origin, the peers and the store are behind the traits
//! of [`seams`], which is how `tests` checks each policy in process.
//!
//! **The async rule.** The pipeline is async and never blocks a runtime thread: disk
//! I/O, hashing and decompression run on tokio's blocking pool through [`blocking`],
//! the one place work is handed off. FUSE worker threads, which are not runtime
//! threads, enter through the one blocking bridge, [`Fetcher::read_blocking`]: it
//! serves memory and store hits on the calling thread (a read of part of a stored chunk
//! reads only that part) and blocks on the pipeline only for a miss.

mod ahead;
mod all;
mod image;
mod memory;
mod metrics;
mod origin;
mod peers;
mod readahead;
mod recent;
mod run;
pub mod seams;
mod span;
#[cfg(test)]
mod span_tests;
mod unit;

#[cfg(test)]
mod tests;

pub use image::{ImageChunks, PullStats, PullSummary};
pub use metrics::{FetchMetrics, Source, SourceLabel};
pub use seams::{ForwardedOrigin, Origin, Peers, RegistryOrigin, Store};
pub use unit::{Event, Fetched, Resume, SpanStart, Unit, Wanted};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::watch;

use crate::cache::ChunkKey;
use crate::config::FetchConfig;
use crate::{ChunkFailure, Error, Result};
use memory::Memory;

/// What [`Fetcher::read_blocking`] answers: the whole chunk, or just the bytes asked
/// for when only those were read from the store.
#[derive(Debug)]
pub enum ChunkRead {
    Whole(Arc<Vec<u8>>),
    Part(Vec<u8>),
}

/// A unit's result, as everyone waiting for it receives it.
type Outcome = std::result::Result<Fetched, ChunkFailure>;

/// Runs blocking work (disk I/O, hashing, decompression) on the blocking pool: the one
/// place the async pipeline hands work off. `Stopped` when the runtime is going away.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, ChunkFailure> {
    started_blocking(work)
        .await
        .map_err(|_| ChunkFailure::Stopped)
}

/// [`blocking`], started now and awaited later (by a caller that goes on reading
/// while its earlier work is done).
fn started_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(work)
}

/// Stripes of [`Fetcher`]'s store-read locks: enough that readers of different chunks
/// rarely share one.
const STORE_READ_STRIPES: usize = 64;

/// The pipeline, shared by every mount, prefetch, preheat job and the mirror.
pub struct Fetcher {
    store: Arc<dyn Store>,
    /// The swarm, when P2P is on.
    peers: Option<Arc<dyn Peers>>,
    config: FetchConfig,
    /// Units being fetched, with the channel their result arrives on.
    flights: Mutex<HashMap<ChunkKey, watch::Receiver<Option<Outcome>>>>,
    /// Woken whenever a unit leaves `flights` ([`Fetcher::landed`] waits on it).
    landings: tokio::sync::Notify,
    /// Units handed out lately.
    memory: Mutex<Memory>,
    /// Compressed bytes of gzip layers that runs of spans fetched lately.
    recent_spans: Mutex<recent::RecentSpans>,
    /// Peers holding a whole blob, by blob, as the scheduler named them lately
    /// (`peers::HOLDERS_FRESH`): a run asks them without a trip to the scheduler.
    holders: Mutex<HashMap<String, (Vec<tessera_proto::domain::Peer>, Instant)>>,
    /// Turns to fetch ahead of a reader, [`ahead::AHEAD_RUNS`] of them.
    ahead_turns: tokio::sync::Semaphore,
    /// Listings waiting for, or in, their fetch-ahead.
    ahead_queued: AtomicUsize,
    /// Locks by key stripe around reads from the store, so that concurrent reads of
    /// one chunk (the kernel asks for a chunk in several requests at once) read it from
    /// disk once and the others find it in memory.
    store_reads: Box<[Mutex<()>]>,
    pub metrics: Arc<FetchMetrics>,
    /// Set when the agent stops: reads waiting on the pipeline give up ([`Fetcher::stop`]).
    stopped: watch::Sender<bool>,
    /// FUSE reads blocked on a miss in [`Fetcher::read_blocking`] right now.
    reads_waiting: AtomicUsize,
    /// When the last FUSE read came or a waiting one was answered, in milliseconds
    /// since `born`.
    last_read_ms: AtomicU64,
    born: std::time::Instant,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("peers", &self.peers.is_some())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a request for a missing unit does: lead a fetch, or wait for one under way.
enum Role {
    Lead(Arc<[run::Planned]>),
    Wait(watch::Receiver<Option<Outcome>>),
}

impl Fetcher {
    pub fn new(store: Arc<dyn Store>, config: FetchConfig, metrics: Arc<FetchMetrics>) -> Self {
        Fetcher {
            store,
            peers: None,
            flights: Mutex::new(HashMap::new()),
            landings: tokio::sync::Notify::new(),
            memory: Mutex::new(Memory::new(config.memory_bytes)),
            recent_spans: Mutex::default(),
            holders: Mutex::new(HashMap::new()),
            ahead_turns: tokio::sync::Semaphore::new(ahead::AHEAD_RUNS),
            ahead_queued: AtomicUsize::new(0),
            store_reads: (0..STORE_READ_STRIPES).map(|_| Mutex::new(())).collect(),
            config,
            metrics,
            stopped: watch::channel(false).0,
            reads_waiting: AtomicUsize::new(0),
            last_read_ms: AtomicU64::new(0),
            born: std::time::Instant::now(),
        }
    }

    /// Stops serving reads: every FUSE read waiting on the pipeline, and every later
    /// one, fails at once with [`ChunkFailure::Stopped`] (EIO to the reader) without
    /// touching the runtime, which may be going away. The agent calls it when its
    /// shutdown grace is over.
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    /// Whether nothing is being fetched and no read waits: work nobody waits for (a
    /// backing copy for a file's next open) may have the machine.
    pub fn is_idle(&self) -> bool {
        self.reads_waiting() == 0
            && self
                .flights
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// FUSE reads blocked on a miss right now (the shutdown waits for them, up to its
    /// grace period).
    pub fn reads_waiting(&self) -> usize {
        self.reads_waiting.load(Ordering::SeqCst)
    }

    /// Whether a FUSE read came, or a waiting one was answered, within the last
    /// `recently` (a reader's next read follows the answer, however long it waited).
    pub fn read_within(&self, recently: Duration) -> bool {
        let last = Duration::from_millis(self.last_read_ms.load(Ordering::SeqCst));
        self.born.elapsed().saturating_sub(last) < recently
    }

    /// Fetches from peers (found through `peers`) before the origin.
    pub fn with_peers(mut self, peers: Arc<dyn Peers>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// Waits, at most `limit`, until none of `keys` is in flight: each has been
    /// stored (or failed). Readers are answered before their unit is stored, so
    /// what needs the units on disk (a passthrough backing file made when a file
    /// closes) waits for this first.
    pub async fn landed(&self, keys: &[ChunkKey], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            // Listening before looking: a landing between the look and the wait
            // still wakes it.
            let landing = self.landings.notified();
            tokio::pin!(landing);
            landing.as_mut().enable();
            let flying = {
                let flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
                keys.iter().any(|key| flights.contains_key(key))
            };
            if !flying || tokio::time::timeout_at(deadline, landing).await.is_err() {
                return;
            }
        }
    }

    fn recent_spans(&self) -> std::sync::MutexGuard<'_, recent::RecentSpans> {
        self.recent_spans.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A verified unit of `wanted`: from memory, the store, a flight under way, or a new
    /// fetch this call leads.
    pub async fn unit(self: &Arc<Self>, wanted: &Arc<dyn Wanted>, unit: Unit) -> Outcome {
        let mut joined_a_failure = false;
        loop {
            if let Some(got) = self.in_memory(&unit) {
                return Ok(got);
            }
            if self.store.contains(&unit.key) {
                let this = self.clone();
                let wanted_here = wanted.clone();
                let hit = blocking(move || this.in_store(&wanted_here, &unit)).await?;
                if let Some(got) = hit {
                    return Ok(got);
                }
            }
            match self.through_flight(wanted, unit).await {
                // A flight this call only joined failed: it may have begun before the
                // source came back (a read-ahead run, retrying). Once more, maybe
                // leading a flight of its own.
                Some((Err(_), false)) if !joined_a_failure => joined_a_failure = true,
                Some((outcome, _)) => return outcome,
                // The leader went away without an answer: try again, maybe as leader.
                None => {}
            }
        }
    }

    /// The verified, uncompressed bytes of chunk `index` of `image`.
    pub async fn chunk(
        self: &Arc<Self>,
        image: &Arc<ImageChunks>,
        index: u32,
    ) -> Result<Arc<Vec<u8>>> {
        let unit = image.unit(index)?;
        let wanted: Arc<dyn Wanted> = image.clone();
        self.unit(&wanted, unit)
            .await
            .map(|got| got.data)
            .map_err(|reason| chunk_error(image, &unit, reason))
    }

    /// The blocking bridge for FUSE worker threads (not runtime threads): starts the
    /// read-ahead `window` calls for, serves bytes `within` of chunk `index` from memory
    /// or the store on this thread (reading only those bytes of a stored chunk not in
    /// memory), and blocks on the pipeline only for a miss.
    pub fn read_blocking(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        image: &Arc<ImageChunks>,
        index: u32,
        within: std::ops::Range<u32>,
        window: u64,
    ) -> Result<ChunkRead> {
        let unit = image.unit(index)?;
        let now_ms = self.born.elapsed().as_millis() as u64;
        self.last_read_ms.store(now_ms, Ordering::Relaxed);
        if *self.stopped.borrow() {
            return Err(chunk_error(image, &unit, ChunkFailure::Stopped));
        }
        let (sequential, ahead) = image.read_ahead(index, window);
        for next in ahead {
            let (fetcher, image) = (self.clone(), image.clone());
            runtime.spawn(async move {
                let _ = fetcher.chunk(&image, next).await;
            });
        }
        let wanted: Arc<dyn Wanted> = image.clone();
        if let Some(got) = self.in_memory(&unit) {
            return Ok(ChunkRead::Whole(got.data));
        }
        // A read from the chunk's start, or a sequential reader, will want the rest
        // of the chunk (read-ahead loads whole chunks into memory): read it whole,
        // once. A read into the middle of a chunk (random access): just its bytes.
        if sequential || within.start == 0 || within.len() >= unit.size as usize {
            if let Some(got) = self.in_store(&wanted, &unit) {
                return Ok(ChunkRead::Whole(got.data));
            }
        } else {
            match self.part_in_store(&wanted, &unit, within) {
                Ok(part) => return Ok(ChunkRead::Part(part)),
                Err(Some(got)) => return Ok(ChunkRead::Whole(got.data)),
                Err(None) => {}
            }
        }
        self.reads_waiting.fetch_add(1, Ordering::Relaxed);
        let mut stopped = self.stopped.subscribe();
        let got = runtime.block_on(async {
            // Biased: once stopped, the fetch is not polled again (its timers may
            // belong to a runtime that is shutting down).
            tokio::select! {
                biased;
                _ = stopped.wait_for(|s| *s) => Err(chunk_error(image, &unit, ChunkFailure::Stopped)),
                got = self.chunk(image, index) => got,
            }
        });
        // The answer counts as activity: a shutdown waiting for reads to go quiet must
        // not stop between this read and the reader's next.
        let now_ms = self.born.elapsed().as_millis() as u64;
        self.last_read_ms.store(now_ms, Ordering::SeqCst);
        self.reads_waiting.fetch_sub(1, Ordering::SeqCst);
        got.map(ChunkRead::Whole)
    }

    /// Blocking: bytes `within` of the unit from the store, reading only those (the
    /// unit is not kept in memory: the rest of it was not read). `Err(Some)`: the whole
    /// unit came into memory meanwhile (read-ahead), `Err(None)`: not stored.
    fn part_in_store(
        &self,
        wanted: &Arc<dyn Wanted>,
        unit: &Unit,
        within: std::ops::Range<u32>,
    ) -> std::result::Result<Vec<u8>, Option<Fetched>> {
        // After a whole read of this unit under way (the stripe's lock), which would
        // leave it in memory: then the disk is not read twice, nor its bytes counted.
        let _reading = self.store_reads[usize::from(unit.key.digest[0]) % self.store_reads.len()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(got) = self.in_memory(unit) {
            return Err(Some(got));
        }
        let started = Instant::now();
        let range = u64::from(within.start)..u64::from(within.end);
        match self.store.read(&unit.key, range) {
            Ok(Some(part)) => {
                self.served_locally(wanted, &part, started);
                Ok(part)
            }
            Ok(None) => Err(None),
            Err(e) => {
                // The index failed: a miss, and the fetch goes on to the network.
                tracing::warn!(unit = %unit.key, error = %e, "chunk cache read failed");
                Err(None)
            }
        }
    }

    /// The unit from the memory layer. Not counted as fetched from anywhere: these
    /// are bytes counted once already, when they came from their source (the kernel
    /// reads a chunk in several requests, and each must not count it again).
    fn in_memory(&self, unit: &Unit) -> Option<Fetched> {
        let data = self
            .memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&unit.key)?;
        Some(Fetched {
            data,
            source: Source::Cache,
            newly_stored: false,
        })
    }

    /// Blocking: reads and checks the unit from the store.
    fn in_store(&self, wanted: &Arc<dyn Wanted>, unit: &Unit) -> Option<Fetched> {
        let reading = wanted.keep_in_memory().then(|| {
            let stripe = usize::from(unit.key.digest[0]) % self.store_reads.len();
            self.store_reads[stripe]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        if reading.is_some() {
            if let Some(got) = self.in_memory(unit) {
                return Some(got);
            }
        }
        let started = Instant::now();
        let data = match self.store.get(&unit.key) {
            Ok(Some(data)) => Arc::new(data),
            Ok(None) => return None,
            Err(e) => {
                // The index failed: a miss, and the fetch goes on to the network.
                tracing::warn!(unit = %unit.key, error = %e, "chunk cache lookup failed");
                return None;
            }
        };
        self.served_locally(wanted, &data, started);
        if wanted.keep_in_memory() {
            self.remember(unit.key, &data);
        }
        Some(Fetched {
            data,
            source: Source::Cache,
            newly_stored: false,
        })
    }

    fn served_locally(&self, wanted: &Arc<dyn Wanted>, data: &[u8], started: Instant) {
        let bytes = data.len() as u64;
        wanted.observe(Event::Got {
            source: Source::Cache,
            bytes,
        });
        self.metrics.record(Source::Cache, bytes, started.elapsed());
    }

    fn remember(&self, key: ChunkKey, data: &Arc<Vec<u8>>) {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(key, data.clone());
    }

    /// Joins the unit's flight, or starts one led by a task of its own (the run goes on
    /// in the background once the first unit is answered, so a reader is not held for
    /// neighbours it may never read), and whether this call led it. `None`: the flight
    /// ended without an answer.
    async fn through_flight(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        unit: Unit,
    ) -> Option<(Outcome, bool)> {
        let role = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            match flights.get(&unit.key) {
                Some(rx) => Role::Wait(rx.clone()),
                // Stored between the lookup and now (a flight that just ended).
                None if self.store.contains(&unit.key) => return None,
                None => Role::Lead(self.plan_run(&mut flights, wanted.as_ref(), unit)),
            }
        };
        let (mut rx, led) = match role {
            Role::Lead(run) => {
                let rx = run[0].done.subscribe();
                tokio::spawn(self.clone().lead(wanted.clone(), run));
                (rx, true)
            }
            Role::Wait(rx) => (rx, false),
        };
        let answered = rx.wait_for(Option::is_some).await.ok()?.clone()?;
        let outcome = answered.map(|mut got| {
            if wanted.keep_in_memory() {
                self.remember(unit.key, &got.data);
            }
            // Only the caller whose request started the fetch stored the unit.
            got.newly_stored &= led;
            got
        });
        Some((outcome, led))
    }
}

/// The crate error for a chunk of `image` no source could give.
fn chunk_error(image: &ImageChunks, unit: &Unit, reason: ChunkFailure) -> Error {
    Error::Chunk {
        image: image.reference.to_string(),
        chunk: unit.index,
        digest: unit.key.to_string(),
        reason,
    }
}
