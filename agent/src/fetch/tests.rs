//! The pipeline's policies, each tested in process: fakes stand behind the seams (an
//! origin, peers and a store in memory) and time is paused, so waits, stalls and
//! backoffs take no real time and the tests cannot be flaky about it.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rafs_format::chunk::{Compression, DigestAlgo};
use tessera_proto::domain::{ChunkData, ChunkEncoding, HostId, Peer, PeerChoice};
use tessera_proto::pb;
use tokio::time::Instant;

use super::seams::{BoxFuture, PeerStream};
use super::*;
use crate::peer::network::PeerFailure;

const UNIT: u32 = 1000;
const BLOB: &str = "sha256:blob";

fn unit_bytes(i: u32) -> Vec<u8> {
    (0..UNIT)
        .map(|b| (b as u8) ^ (i as u8).wrapping_mul(31))
        .collect()
}

fn key_of(i: u32) -> ChunkKey {
    ChunkKey {
        algo: DigestAlgo::Sha256,
        digest: DigestAlgo::Sha256.digest(&unit_bytes(i)),
    }
}

/// The blob all tests fetch from: `n` units of [`UNIT`] bytes stored uncompressed.
fn blob(n: u32) -> Vec<u8> {
    (0..n).flat_map(unit_bytes).collect()
}

// ---- the origin ----

#[derive(Default)]
struct FakeOrigin {
    blob: Vec<u8>,
    /// Each request: its range and when it was made.
    requests: Mutex<Vec<(Range<u64>, Instant)>>,
    /// Requests that fail before the origin answers well.
    failures: AtomicUsize,
    /// Requests that send corrupt bytes before the origin answers well.
    corruptions: AtomicUsize,
    /// How long each request takes.
    latency: Duration,
    /// Requests under way now, and the most at once.
    now: AtomicUsize,
    most: AtomicUsize,
}

impl FakeOrigin {
    fn new(units: u32) -> Self {
        FakeOrigin {
            blob: blob(units),
            ..Default::default()
        }
    }

    /// `(start, end)` of each request made.
    fn ranges(&self) -> Vec<(u64, u64)> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| (r.start, r.end))
            .collect()
    }
}

impl Origin for FakeOrigin {
    fn range<'a>(
        &'a self,
        _blob: &'a str,
        range: Range<u64>,
        arrived: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            self.requests
                .lock()
                .unwrap()
                .push((range.clone(), Instant::now()));
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.latency).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            let take = |n: &AtomicUsize| {
                n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                    .is_ok()
            };
            if take(&self.failures) {
                return Err(Error::Transport {
                    registry: "origin".into(),
                    repository: "test".into(),
                    what: "blob".into(),
                    reason: "connection reset".into(),
                });
            }
            let mut bytes = self.blob[range.start as usize..range.end as usize].to_vec();
            if take(&self.corruptions) {
                bytes[0] ^= 0xff;
            }
            arrived(&bytes);
            Ok(bytes)
        })
    }
}

// ---- peers ----

/// How a fake peer behaves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Behaviour {
    Serves,
    /// Answers "busy" this many times, then serves.
    BusyFor(usize),
    /// Never sends anything.
    Stalls,
    /// Sends bytes that are not the unit.
    Lies,
    /// The connection fails.
    Fails,
    /// Holds only this unit, skipping the others as a real peer does.
    ServesOnly(u32),
    /// Serves every unit zstd-compressed.
    ServesZstd,
    /// Refuses units of a restricted image this node cannot prove access to.
    Refuses,
}

struct FakePeers {
    blob: Vec<u8>,
    /// Answers to `find`, in turn; the last one repeats.
    answers: Mutex<VecDeque<PeerChoice>>,
    behaviour: Mutex<HashMap<HostId, Behaviour>>,
    finds: AtomicUsize,
    /// The range of each `find`.
    found: Mutex<Vec<(u64, u64)>>,
    opened: Mutex<Vec<HostId>>,
    reports: Mutex<Vec<(Option<HostId>, pb::Outcome, u64)>>,
    held: Mutex<Vec<(u64, u64)>>,
    max_wait: Duration,
}

fn peer(n: u8) -> Peer {
    Peer {
        id: HostId(format!("peer-{n}")),
        address: SocketAddr::from(([127, 0, 0, n], 9000)),
        whole_blob: false,
    }
}

/// Peer `n`, holding the whole blob.
fn whole_holder(n: u8) -> Peer {
    Peer {
        whole_blob: true,
        ..peer(n)
    }
}

impl FakePeers {
    fn new(units: u32, answers: Vec<PeerChoice>, peers: &[(u8, Behaviour)]) -> Self {
        FakePeers {
            blob: blob(units),
            answers: Mutex::new(answers.into()),
            behaviour: Mutex::new(peers.iter().map(|&(n, b)| (peer(n).id, b)).collect()),
            finds: AtomicUsize::new(0),
            found: Mutex::default(),
            opened: Mutex::default(),
            reports: Mutex::default(),
            held: Mutex::default(),
            max_wait: Duration::from_secs(5),
        }
    }

    fn outcomes(&self, of: Option<u8>) -> Vec<pb::Outcome> {
        let id = of.map(|n| peer(n).id);
        self.reports
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| *p == id)
            .map(|(_, o, _)| *o)
            .collect()
    }
}

/// A peer's stream: the units it serves, or a failure where it fails.
struct FakeStream {
    items: VecDeque<std::result::Result<ChunkData, PeerFailure>>,
    stalls: bool,
}

impl PeerStream for FakeStream {
    fn next(&mut self) -> BoxFuture<'_, std::result::Result<Option<ChunkData>, PeerFailure>> {
        Box::pin(async move {
            if self.stalls {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            self.items.pop_front().transpose()
        })
    }
}

impl Peers for FakePeers {
    fn find<'a>(&'a self, _blob: &'a str, range: (u64, u64)) -> BoxFuture<'a, Option<PeerChoice>> {
        Box::pin(async move {
            self.finds.fetch_add(1, Ordering::SeqCst);
            self.found.lock().unwrap().push(range);
            let mut answers = self.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.pop_front()
            } else {
                answers.front().cloned()
            }
        })
    }

    fn open<'a>(
        &'a self,
        peer: &'a Peer,
        _blob: &'a str,
        _algo: DigestAlgo,
        digests: Vec<[u8; 32]>,
    ) -> BoxFuture<'a, std::result::Result<Box<dyn PeerStream>, PeerFailure>> {
        Box::pin(async move {
            self.opened.lock().unwrap().push(peer.id.clone());
            let behaviour = {
                let mut all = self.behaviour.lock().unwrap();
                let b = all.get_mut(&peer.id).ok_or(PeerFailure::Connection)?;
                let now = *b;
                if let Behaviour::BusyFor(n) = b {
                    *b = if *n > 1 {
                        Behaviour::BusyFor(*n - 1)
                    } else {
                        Behaviour::Serves
                    };
                }
                now
            };
            let units = |corrupt: bool| {
                digests
                    .iter()
                    .map(|d| {
                        let i = (0..self.blob.len() as u32 / UNIT)
                            .find(|&i| key_of(i).digest == *d)
                            .ok_or(PeerFailure::NotFound)?;
                        let mut data = unit_bytes(i);
                        if corrupt {
                            data[0] ^= 0xff;
                        }
                        Ok(ChunkData {
                            digest: *d,
                            data,
                            encoding: ChunkEncoding::Plain,
                        })
                    })
                    .collect()
            };
            let stream = match behaviour {
                Behaviour::Serves => FakeStream {
                    items: units(false),
                    stalls: false,
                },
                Behaviour::ServesZstd => FakeStream {
                    items: units(false)
                        .into_iter()
                        .map(|u| {
                            u.map(|u| ChunkData {
                                data: zstd::bulk::compress(&u.data, 1).unwrap(),
                                encoding: ChunkEncoding::Zstd,
                                ..u
                            })
                        })
                        .collect(),
                    stalls: false,
                },
                Behaviour::ServesOnly(only) => FakeStream {
                    items: units(false)
                        .into_iter()
                        .filter(|u| u.as_ref().is_ok_and(|u| u.digest == key_of(only).digest))
                        .collect(),
                    stalls: false,
                },
                Behaviour::BusyFor(_) => return Err(PeerFailure::Busy),
                Behaviour::Fails => return Err(PeerFailure::Connection),
                Behaviour::Refuses => return Err(PeerFailure::Refused),
                Behaviour::Stalls => FakeStream {
                    items: VecDeque::new(),
                    stalls: true,
                },
                Behaviour::Lies => FakeStream {
                    items: units(true),
                    stalls: false,
                },
            };
            Ok(Box::new(stream) as Box<dyn PeerStream>)
        })
    }

    fn report(
        &self,
        peer: Option<&Peer>,
        _blob: &str,
        _range: (u64, u64),
        bytes: u64,
        _took: Duration,
        outcome: pb::Outcome,
    ) {
        self.reports
            .lock()
            .unwrap()
            .push((peer.map(|p| p.id.clone()), outcome, bytes));
    }

    fn held(&self, _blob: &str, chunks: Vec<(ChunkKey, (u64, u64))>) {
        self.held
            .lock()
            .unwrap()
            .extend(chunks.into_iter().map(|(_, range)| range));
    }

    fn peer_timeout(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn max_wait(&self) -> Duration {
        self.max_wait
    }

    fn member(&self) -> bool {
        true
    }
}

// ---- the store ----

#[derive(Default)]
struct FakeStore {
    units: Mutex<HashMap<ChunkKey, Vec<u8>>>,
    gets: AtomicUsize,
    /// Partial reads.
    reads: AtomicUsize,
    /// When set, the next put waits for a message on it first (a slow disk; 5 s at
    /// most).
    put_gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Store for FakeStore {
    fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Ok(self.units.lock().unwrap().get(key).cloned())
    }
    fn read(&self, key: &ChunkKey, range: Range<u64>) -> Result<Option<Vec<u8>>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let units = self.units.lock().unwrap();
        Ok(units
            .get(key)
            .map(|unit| unit[range.start as usize..range.end as usize].to_vec()))
    }
    fn contains(&self, key: &ChunkKey) -> bool {
        self.units.lock().unwrap().contains_key(key)
    }
    fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()> {
        assert_eq!(key.algo.digest(data), key.digest, "unverified bytes stored");
        let gate = self.put_gate.lock().unwrap().take();
        if let Some(gate) = gate {
            // Bounded: a fetcher that stores before answering fails its test, not hangs.
            let _ = gate.recv_timeout(Duration::from_secs(5));
        }
        self.units.lock().unwrap().insert(*key, data.to_vec());
        Ok(())
    }
    fn remove(&self, key: &ChunkKey) -> Result<bool> {
        Ok(self.units.lock().unwrap().remove(key).is_some())
    }
}

// ---- what is wanted ----

/// `units` units of one blob, stored one after another, read from `origin`.
struct FakeWanted {
    units: u32,
    origin: Arc<FakeOrigin>,
    events: Mutex<Vec<Event>>,
}

impl FakeWanted {
    fn new(units: u32, origin: Arc<FakeOrigin>) -> Arc<Self> {
        Arc::new(FakeWanted {
            units,
            origin,
            events: Mutex::default(),
        })
    }

    fn unit(&self, i: u32) -> Unit {
        Unit {
            key: key_of(i),
            index: i,
            blob: 0,
            offset: u64::from(i * UNIT),
            stored_size: UNIT,
            compression: Compression::None,
            size: UNIT,
            span: None,
        }
    }

    fn count(&self, wanted: Event) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| **e == wanted)
            .count()
    }
}

impl Wanted for FakeWanted {
    fn name(&self) -> String {
        "test image".into()
    }
    fn blob(&self, _unit: &Unit) -> &str {
        BLOB
    }
    fn next_in_blob(&self, unit: &Unit) -> Option<Unit> {
        (unit.index + 1 < self.units).then(|| self.unit(unit.index + 1))
    }
    fn origin(&self) -> &dyn Origin {
        self.origin.as_ref()
    }
    fn observe(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

/// Runs of readers and of `fetch_all` alike within `merge_units` units.
fn config(merge_units: u64) -> FetchConfig {
    FetchConfig {
        merge_bytes: merge_units * u64::from(UNIT),
        stream_bytes: merge_units * u64::from(UNIT),
        ..FetchConfig::default()
    }
}

struct Bed {
    fetcher: Arc<Fetcher>,
    store: Arc<FakeStore>,
    origin: Arc<FakeOrigin>,
    wanted: Arc<FakeWanted>,
}

impl Bed {
    fn new(units: u32, merge_units: u64, origin: FakeOrigin, peers: Option<Arc<FakePeers>>) -> Bed {
        let store = Arc::new(FakeStore::default());
        let mut fetcher = Fetcher::new(
            store.clone(),
            config(merge_units),
            Arc::new(FetchMetrics::default()),
        );
        if let Some(peers) = peers {
            fetcher = fetcher.with_peers(peers);
        }
        let origin = Arc::new(origin);
        Bed {
            fetcher: Arc::new(fetcher),
            store,
            wanted: FakeWanted::new(units, origin.clone()),
            origin,
        }
    }

    /// Waits until every run led in the background has ended (its reports made).
    async fn settle(&self) {
        while self.fetcher.metrics.inflight.get() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn get(&self, i: u32) -> Outcome {
        let wanted: Arc<dyn Wanted> = self.wanted.clone();
        self.fetcher.unit(&wanted, self.wanted.unit(i)).await
    }
}

fn data(outcome: Outcome) -> Vec<u8> {
    outcome.expect("the unit").data.to_vec()
}

// ---- the tests ----

#[tokio::test(start_paused = true)]
async fn a_miss_is_fetched_verified_and_stored_then_served_from_the_store() {
    let bed = Bed::new(4, 1, FakeOrigin::new(4), None);
    let got = bed.get(2).await.unwrap();
    assert_eq!(*got.data, unit_bytes(2));
    assert_eq!((got.source, got.newly_stored), (Source::Origin, true));
    assert_eq!(bed.origin.ranges(), [(2000, 3000)]);
    bed.settle().await;
    assert!(bed.store.contains(&key_of(2)));
    // Again: from memory, then (a fetcher with an empty memory) from the store; no
    // new request.
    assert_eq!(bed.get(2).await.unwrap().source, Source::Cache);
    let fresh = Bed {
        fetcher: Arc::new(Fetcher::new(
            bed.store.clone(),
            config(1),
            Arc::new(FetchMetrics::default()),
        )),
        store: bed.store.clone(),
        origin: bed.origin.clone(),
        wanted: bed.wanted.clone(),
    };
    assert_eq!(data(fresh.get(2).await), unit_bytes(2));
    assert_eq!(bed.store.gets.load(Ordering::SeqCst), 1);
    assert_eq!(bed.origin.ranges().len(), 1);
    assert_eq!(
        bed.wanted.count(Event::Got {
            source: Source::Origin,
            bytes: u64::from(UNIT)
        }),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_reader_is_answered_before_its_unit_is_stored_and_nobody_fetches_it_twice() {
    let bed = Bed::new(4, 1, FakeOrigin::new(4), None);
    let (release, gate) = std::sync::mpsc::channel();
    *bed.store.put_gate.lock().unwrap() = Some(gate);
    // The store is stuck writing unit 1; its reader has the verified bytes anyway.
    let got = tokio::time::timeout(Duration::from_secs(5), bed.get(1)).await;
    assert_eq!(
        data(got.expect("answered while the store writes")),
        unit_bytes(1)
    );
    assert!(!bed.store.contains(&key_of(1)), "answered before the store");
    // Asked again meanwhile: from the flight (or memory), not the origin again.
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
    release.send(()).unwrap();
    bed.settle().await;
    assert!(bed.store.contains(&key_of(1)));
    assert_eq!(bed.origin.ranges(), [(1000, 2000)], "one request");
}

#[tokio::test(start_paused = true)]
async fn single_flight_across_images() {
    // Two images sharing one chunk, read at the same moment: one origin request.
    let origin = FakeOrigin {
        latency: Duration::from_millis(300),
        ..FakeOrigin::new(4)
    };
    let bed = Bed::new(4, 1, origin, None);
    let other: Arc<dyn Wanted> = FakeWanted::new(4, bed.origin.clone());
    let this: Arc<dyn Wanted> = bed.wanted.clone();
    let unit = bed.wanted.unit(1);
    let (f1, f2) = (bed.fetcher.clone(), bed.fetcher.clone());
    let a = tokio::spawn(async move { f1.unit(&this, unit).await });
    let b = tokio::spawn(async move { f2.unit(&other, unit).await });
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!((*a.data).clone(), unit_bytes(1));
    assert_eq!(a.data, b.data);
    assert_eq!(bed.origin.ranges(), [(1000, 2000)], "one request for both");
    // Only the request that led the fetch stored it.
    assert!(a.newly_stored ^ b.newly_stored);
}

#[tokio::test(start_paused = true)]
async fn a_run_merges_missing_neighbours_within_merge_bytes() {
    let bed = Bed::new(10, 4, FakeOrigin::new(10), None);
    // Unit 6 is already here: a run from 4 stops before it.
    bed.store.put(&key_of(6), &unit_bytes(6)).unwrap();
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    assert_eq!(data(bed.get(4).await), unit_bytes(4));
    bed.settle().await;
    assert_eq!(
        bed.origin.ranges(),
        [(0, 4000), (4000, 6000)],
        "4 units at most per request, and not past a unit already stored"
    );
    for i in [1, 2, 3, 5] {
        assert!(bed.store.contains(&key_of(i)), "unit {i} came with its run");
        assert_eq!(data(bed.get(i).await), unit_bytes(i));
    }
    assert_eq!(
        bed.origin.ranges().len(),
        2,
        "neighbours served from the store"
    );
}

#[tokio::test(start_paused = true)]
async fn origin_failures_are_retried_with_backoff() {
    let origin = FakeOrigin::new(2);
    origin.failures.store(2, Ordering::SeqCst);
    let bed = Bed::new(2, 1, origin, None);
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    let times: Vec<Instant> = bed
        .origin
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(times.len(), 3);
    assert_eq!(times[1] - times[0], origin::backoff(1));
    assert_eq!(times[2] - times[1], origin::backoff(2));
    assert!(origin::backoff(2) > origin::backoff(1));
    assert_eq!(bed.wanted.count(Event::FetchFailed(Source::Origin)), 2);
}

#[tokio::test(start_paused = true)]
async fn an_origin_that_keeps_failing_gives_a_typed_error_after_the_attempts() {
    let origin = FakeOrigin::new(2);
    origin.failures.store(100, Ordering::SeqCst);
    let bed = Bed::new(2, 1, origin, None);
    match bed.get(1).await {
        Err(ChunkFailure::Exhausted { attempts, last }) => {
            assert_eq!(attempts, FetchConfig::default().attempts);
            assert!(last.contains("connection reset"), "{last}");
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert!(!bed.store.contains(&key_of(1)));
    // Nothing is left in flight: the next read tries again.
    bed.origin.failures.store(0, Ordering::SeqCst);
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_joined_a_failed_flight_tries_once_more_itself() {
    // The origin fails exactly the first flight's attempts, then is back.
    let attempts = FetchConfig::default().attempts as usize;
    let origin = FakeOrigin {
        latency: Duration::from_millis(100),
        ..FakeOrigin::new(2)
    };
    origin.failures.store(attempts, Ordering::SeqCst);
    let bed = Bed::new(2, 1, origin, None);
    let (led, joined) = tokio::join!(bed.get(1), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        bed.get(1).await
    });
    assert!(led.is_err(), "the flight's own reader has its failure");
    assert_eq!(data(joined), unit_bytes(1), "the joiner led a new flight");
    assert_eq!(bed.origin.ranges().len(), attempts + 1);
}

#[tokio::test(start_paused = true)]
async fn corrupt_origin_bytes_are_discarded_and_fetched_again() {
    let origin = FakeOrigin::new(2);
    origin.corruptions.store(1, Ordering::SeqCst);
    let bed = Bed::new(2, 1, origin, None);
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    assert_eq!(bed.origin.ranges().len(), 2);
    assert_eq!(
        bed.wanted.count(Event::VerificationFailed(Source::Origin)),
        1
    );
}

fn swarm(answers: Vec<PeerChoice>, peers: &[(u8, Behaviour)]) -> Arc<FakePeers> {
    Arc::new(FakePeers::new(8, answers, peers))
}

#[tokio::test(start_paused = true)]
async fn peers_serve_before_the_origin_in_parallel_slices() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Serves), (2, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 4, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    bed.settle().await;
    assert!(bed.origin.ranges().is_empty(), "no origin request");
    let mut opened = peers.opened.lock().unwrap().clone();
    opened.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(opened, [peer(1).id, peer(2).id], "the run split over both");
    for i in 0..4 {
        assert!(bed.store.contains(&key_of(i)));
    }
    assert_eq!(peers.held.lock().unwrap().len(), 4, "every unit announced");
    assert_eq!(peers.outcomes(Some(1)), [pb::Outcome::Ok]);
}

#[tokio::test(start_paused = true)]
async fn a_lying_peer_is_reported_and_the_unit_comes_from_elsewhere() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Lies), (2, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(3).await), unit_bytes(3));
    bed.settle().await;
    assert!(peers
        .outcomes(Some(1))
        .contains(&pb::Outcome::VerificationFailed));
    assert_eq!(bed.wanted.count(Event::VerificationFailed(Source::Peer)), 1);
    assert!(bed.origin.ranges().is_empty(), "the honest peer served it");
}

#[tokio::test(start_paused = true)]
async fn a_stalling_peer_is_abandoned_after_its_timeout() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Stalls), (2, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(3).await), unit_bytes(3));
    bed.settle().await;
    assert!(
        started.elapsed() >= peers.peer_timeout(),
        "it waited for the stall"
    );
    assert!(started.elapsed() < peers.peer_timeout() * 2);
    assert_eq!(peers.outcomes(Some(1)), [pb::Outcome::Timeout]);
    assert_eq!(peers.outcomes(Some(2)), [pb::Outcome::Ok]);
}

#[tokio::test(start_paused = true)]
async fn whole_blob_holders_are_asked_again_without_the_scheduler_until_they_fail() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![whole_holder(1)])],
        &[(1, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    for i in [1, 3, 5] {
        assert_eq!(data(bed.get(i).await), unit_bytes(i));
    }
    assert_eq!(
        peers.finds.load(Ordering::SeqCst),
        1,
        "one scheduler trip for three runs"
    );
    // Kept only for a while: then the scheduler is asked again.
    tokio::time::sleep(peers::HOLDERS_FRESH).await;
    assert_eq!(data(bed.get(6).await), unit_bytes(6));
    assert_eq!(peers.finds.load(Ordering::SeqCst), 2);
    assert!(bed.origin.ranges().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_remembered_holder_that_fails_sends_the_next_run_to_the_scheduler() {
    let peers = swarm(
        vec![
            PeerChoice::Peers(vec![whole_holder(1)]),
            PeerChoice::Peers(vec![peer(2)]),
        ],
        &[(1, Behaviour::ServesOnly(1)), (2, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
    // Peer 1 no longer has unit 4: the scheduler is asked, and names peer 2.
    assert_eq!(data(bed.get(4).await), unit_bytes(4));
    bed.settle().await;
    assert_eq!(peers.finds.load(Ordering::SeqCst), 2);
    assert!(bed.origin.ranges().is_empty());
    // Peer 2 is not a whole holder: not remembered.
    assert_eq!(data(bed.get(6).await), unit_bytes(6));
    assert_eq!(peers.finds.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_run_with_holes_asks_for_one_stretch_of_missing_units_at_a_time() {
    // Peers 1 and 2 give units 1 and 2 of the run 0..4: units 0 and 3 are asked for
    // one at a time, not as the span 0..4 whose holders hold only what the run has.
    let peers = swarm(
        vec![
            PeerChoice::Peers(vec![peer(1), peer(2)]),
            PeerChoice::Peers(vec![peer(3)]),
        ],
        &[
            (1, Behaviour::ServesOnly(1)),
            (2, Behaviour::ServesOnly(2)),
            (3, Behaviour::Serves),
        ],
    );
    let bed = Bed::new(8, 4, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    bed.settle().await;
    assert_eq!(
        *peers.found.lock().unwrap(),
        [(0, 4000), (0, 1000), (3000, 4000)]
    );
    assert!(bed.origin.ranges().is_empty());
    for i in 0..4 {
        assert!(bed.store.contains(&key_of(i)), "unit {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn compressed_chunks_from_peers_are_decoded_then_verified() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::ServesZstd)],
    );
    let bed = Bed::new(8, 4, FakeOrigin::new(8), Some(peers.clone()));
    let got = bed.get(2).await.unwrap();
    assert_eq!(
        (*got.data == unit_bytes(2), got.source),
        (true, Source::Peer)
    );
    bed.settle().await;
    assert!(bed.origin.ranges().is_empty());
    assert_eq!(bed.store.get(&key_of(5)).unwrap(), Some(unit_bytes(5)));
}

#[tokio::test(start_paused = true)]
async fn failing_peers_leave_the_unit_to_the_origin() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::Fails)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(5).await), unit_bytes(5));
    bed.settle().await;
    assert_eq!(bed.origin.ranges(), [(5000, 6000)]);
    assert_eq!(
        peers.finds.load(Ordering::SeqCst),
        2,
        "two fruitless rounds"
    );
    assert_eq!(bed.wanted.count(Event::FetchFailed(Source::Peer)), 2);
    // The origin transfer is reported for the scheduler's account.
    assert_eq!(peers.outcomes(None), [pb::Outcome::Ok]);
}

#[tokio::test(start_paused = true)]
async fn a_peer_refusing_a_private_image_sends_the_read_on_without_blame() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Refuses), (2, Behaviour::Refuses)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    assert_eq!(data(bed.get(5).await), unit_bytes(5));
    bed.settle().await;
    assert_eq!(bed.origin.ranges(), [(5000, 6000)]);
    // Not the peers' fault: neither reported to the scheduler nor counted as failures.
    assert!(peers.outcomes(Some(1)).is_empty());
    assert!(peers.outcomes(Some(2)).is_empty());
    assert_eq!(bed.wanted.count(Event::FetchFailed(Source::Peer)), 0);

    // One refuses, the next serves.
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Refuses), (2, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let got = bed.get(3).await.unwrap();
    assert_eq!(
        (*got.data == unit_bytes(3), got.source),
        (true, Source::Peer)
    );
    assert!(bed.origin.ranges().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_busy_sole_holder_is_waited_for() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::BusyFor(3))],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(2).await), unit_bytes(2));
    assert!(
        bed.origin.ranges().is_empty(),
        "the holder served it in the end"
    );
    // Rests of 0.1, 0.2 and 0.4 s between the busy answers.
    assert_eq!(started.elapsed(), Duration::from_millis(700));
    assert_eq!(
        bed.wanted.count(Event::FetchFailed(Source::Peer)),
        0,
        "busy is no failure"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_busy_past_max_wait_leaves_the_unit_to_the_origin() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::BusyFor(usize::MAX))],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(2).await), unit_bytes(2));
    assert_eq!(bed.origin.ranges(), [(2000, 3000)]);
    let waited = started.elapsed();
    assert!(waited <= peers.max_wait, "{waited:?}");
    assert!(
        waited >= peers.max_wait - peers::BUSY_PAUSE_MAX,
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn another_agents_origin_fetch_is_waited_for_then_peers_serve() {
    let wait = PeerChoice::Wait(Duration::from_millis(200));
    let peers = swarm(
        vec![wait.clone(), wait, PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    assert!(bed.origin.ranges().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_live_origin_fetch_is_waited_for_past_max_wait_but_not_for_ever() {
    // Each Wait vouches for another agent's origin fetch still alive: waited for past
    // max_wait (5 s), up to WAIT_PATIENCE times it in all.
    let peers = swarm(vec![PeerChoice::Wait(Duration::from_secs(2))], &[]);
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
    let ceiling = peers.max_wait * peers::WAIT_PATIENCE;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(74),
        "waits of 2 s up to {ceiling:?}"
    );
    assert_eq!(bed.origin.ranges(), [(1000, 2000)]);
}

#[tokio::test(start_paused = true)]
async fn busy_rests_after_a_wait_count_from_it() {
    // 4 s of waits (within max_wait, 5 s), then a holder busy for ever: its rests are
    // bounded by max_wait counted from the last Wait, not from the run's start.
    let wait = PeerChoice::Wait(Duration::from_secs(2));
    let peers = swarm(
        vec![wait.clone(), wait, PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::BusyFor(usize::MAX))],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let started = Instant::now();
    assert_eq!(data(bed.get(2).await), unit_bytes(2));
    assert_eq!(bed.origin.ranges(), [(2000, 3000)]);
    let waited = started.elapsed();
    let resting = waited - Duration::from_secs(4);
    assert!(resting <= peers.max_wait, "{waited:?}");
    assert!(
        resting >= peers.max_wait - peers::BUSY_PAUSE_MAX,
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn remembered_holders_are_asked_starting_from_the_next_one_each_run() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![
            whole_holder(1),
            whole_holder(2),
            whole_holder(3),
        ])],
        &[
            (1, Behaviour::Serves),
            (2, Behaviour::Serves),
            (3, Behaviour::Serves),
        ],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    for i in [1, 3, 5, 7] {
        assert_eq!(data(bed.get(i).await), unit_bytes(i));
    }
    bed.settle().await;
    assert_eq!(peers.finds.load(Ordering::SeqCst), 1, "one scheduler trip");
    assert_eq!(
        *peers.opened.lock().unwrap(),
        [peer(1).id, peer(2).id, peer(3).id, peer(1).id],
        "each run starts at the next holder"
    );
}

#[tokio::test(start_paused = true)]
async fn each_slice_is_announced_as_it_ends() {
    // Peer 1 serves its slice at once; peer 2 stalls until its timeout (2 s): peer 1's
    // units are announced before then.
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1), peer(2)])],
        &[(1, Behaviour::Serves), (2, Behaviour::Stalls)],
    );
    let bed = Arc::new(Bed::new(8, 4, FakeOrigin::new(8), Some(peers.clone())));
    let reading = {
        let bed = bed.clone();
        tokio::spawn(async move { data(bed.get(0).await) })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        *peers.held.lock().unwrap(),
        [(0, 1000), (1000, 2000)],
        "the first slice announced while the second stalls"
    );
    assert_eq!(reading.await.unwrap(), unit_bytes(0));
    bed.settle().await;
    assert_eq!(peers.held.lock().unwrap().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_slow_origin_fetch_keeps_its_flight_alive() {
    let origin = FakeOrigin {
        latency: Duration::from_secs(10),
        ..FakeOrigin::new(8)
    };
    let peers = swarm(vec![PeerChoice::Origin], &[]);
    let bed = Bed::new(8, 1, origin, Some(peers.clone()));
    assert_eq!(data(bed.get(1).await), unit_bytes(1));
    bed.settle().await;
    assert_eq!(
        peers.finds.load(Ordering::SeqCst),
        1 + 3,
        "the lookup, then one every 3 s while the 10 s fetch streams"
    );
    // Without a swarm, nobody to tell.
    let quiet = Bed::new(
        8,
        1,
        FakeOrigin {
            latency: Duration::from_secs(10),
            ..FakeOrigin::new(8)
        },
        None,
    );
    assert_eq!(data(quiet.get(1).await), unit_bytes(1));
}

#[tokio::test(start_paused = true)]
async fn pieces_not_to_be_announced_at_once_are_not() {
    struct Quiet(Arc<FakeWanted>);
    impl Wanted for Quiet {
        fn name(&self) -> String {
            self.0.name()
        }
        fn blob(&self, u: &Unit) -> &str {
            self.0.blob(u)
        }
        fn next_in_blob(&self, _: &Unit) -> Option<Unit> {
            None
        }
        fn origin(&self) -> &dyn Origin {
            self.0.origin()
        }
        fn announce_at_once(&self) -> bool {
            false
        }
    }
    let peers = swarm(vec![PeerChoice::Origin], &[]);
    let bed = Bed::new(8, 8, FakeOrigin::new(8), Some(peers.clone()));
    let quiet: Arc<dyn Wanted> = Arc::new(Quiet(bed.wanted.clone()));
    let got = bed.fetcher.unit(&quiet, bed.wanted.unit(0)).await.unwrap();
    bed.settle().await;
    assert!(got.newly_stored);
    assert_eq!(
        bed.origin.ranges(),
        [(0, 1000)],
        "no merging without neighbours"
    );
    assert!(peers.held.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn fetch_all_keeps_to_its_concurrency() {
    let origin = FakeOrigin {
        latency: Duration::from_millis(50),
        ..FakeOrigin::new(10)
    };
    let bed = Bed::new(10, 1, origin, None);
    let wanted: Arc<dyn Wanted> = bed.wanted.clone();
    let units: Vec<Unit> = (0..10).map(|i| bed.wanted.unit(i)).collect();
    let mut done = Vec::new();
    bed.fetcher
        .fetch_all(&wanted, units, 3, |unit, outcome| {
            outcome.unwrap();
            done.push(unit.index);
        })
        .await;
    done.sort_unstable();
    assert_eq!(done, (0..10).collect::<Vec<_>>());
    assert_eq!(bed.origin.most.load(Ordering::SeqCst), 3);
    for i in 0..10 {
        assert_eq!(
            bed.store.get(&key_of(i)).unwrap(),
            Some(unit_bytes(i)),
            "unit {i} stored"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn fetch_all_in_a_swarm_starts_anywhere_and_fetches_every_unit_once() {
    // Nobody holds anything: every run goes to the origin. Whatever point the list is
    // led from, each unit is requested once and stored.
    for _ in 0..4 {
        let peers = swarm(vec![PeerChoice::Origin], &[]);
        let bed = Bed::new(8, 2, FakeOrigin::new(8), Some(peers.clone()));
        let wanted: Arc<dyn Wanted> = bed.wanted.clone();
        let mut units: Vec<Unit> = (0..8).map(|i| bed.wanted.unit(i)).collect();
        bed.fetcher.start_anywhere(&mut units);
        let mut done = Vec::new();
        bed.fetcher
            .fetch_all(&wanted, units, 2, |unit, outcome| {
                outcome.unwrap();
                done.push(unit.index);
            })
            .await;
        done.sort_unstable();
        assert_eq!(done, (0..8).collect::<Vec<_>>());
        let mut asked: Vec<u64> = bed
            .origin
            .ranges()
            .iter()
            .flat_map(|&(s, e)| (s / u64::from(UNIT)..e / u64::from(UNIT)).collect::<Vec<_>>())
            .collect();
        asked.sort_unstable();
        assert_eq!(asked, (0..8).collect::<Vec<u64>>(), "each unit once");
    }
}

#[test]
fn fetch_all_start_points_are_spread() {
    let starts: std::collections::HashSet<usize> =
        (0..200).map(|_| all::random_below(1000)).collect();
    assert!(starts.iter().all(|&s| s < 1000));
    assert!(starts.len() > 100, "{} distinct of 200", starts.len());
    assert_eq!(all::random_below(1), 0);
}

#[tokio::test(start_paused = true)]
async fn fetch_all_streams_in_large_runs_and_readers_wait_for_the_stream() {
    let origin = FakeOrigin {
        latency: Duration::from_millis(50),
        ..FakeOrigin::new(12)
    };
    let mut bed = Bed::new(12, 1, origin, None);
    // Readers merge one unit; the stream takes eight.
    bed.fetcher = Arc::new(Fetcher::new(
        bed.store.clone(),
        FetchConfig {
            stream_bytes: 8 * u64::from(UNIT),
            ..config(1)
        },
        Arc::new(FetchMetrics::default()),
    ));
    // Unit 11 is stored already: done without a request or a read.
    bed.store.put(&key_of(11), &unit_bytes(11)).unwrap();
    let wanted: Arc<dyn Wanted> = bed.wanted.clone();
    // Unit 9 is not asked for: the stream stops before it.
    let units: Vec<Unit> = (0..12)
        .filter(|&i| i != 9)
        .map(|i| bed.wanted.unit(i))
        .collect();
    let streaming = {
        let (fetcher, wanted) = (bed.fetcher.clone(), wanted.clone());
        tokio::spawn(async move {
            let mut done = Vec::new();
            fetcher
                .fetch_all(&wanted, units, 1, |unit, outcome| {
                    outcome.unwrap();
                    done.push(unit.index);
                })
                .await;
            done
        })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    // A reader of a unit the stream is bringing waits for it.
    let read = bed.get(5).await.unwrap();
    assert_eq!(*read.data, unit_bytes(5));
    let mut done = streaming.await.unwrap();
    done.sort_unstable();
    assert_eq!(done, [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11]);
    assert_eq!(
        bed.origin.ranges(),
        [(0, 8000), (8000, 9000), (10000, 11000)],
        "streamed requests of the units asked for, none of the reader's own"
    );
    assert_eq!(
        bed.store.gets.load(Ordering::SeqCst),
        0,
        "nothing read back"
    );
}

#[tokio::test(start_paused = true)]
async fn listed_units_are_fetched_ahead_from_a_whole_blob_holder_only() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![whole_holder(1)])],
        &[(1, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 2, FakeOrigin::new(8), Some(peers.clone()));
    let wanted: Arc<dyn Wanted> = bed.wanted.clone();
    let runtime = tokio::runtime::Handle::current();
    let listed = |units: &[u32]| {
        units
            .iter()
            .map(|&i| bed.wanted.unit(i))
            .collect::<Vec<_>>()
    };
    // No holder known yet: nothing is fetched on speculation.
    assert_eq!(
        bed.fetcher.fetch_ahead(&runtime, &wanted, listed(&[4, 5])),
        0
    );
    // A read finds the whole-blob holder...
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    bed.settle().await;
    // ...and a listing's units then come from it, in runs, before anyone reads them;
    // one already stored is not asked for.
    assert_eq!(
        bed.fetcher
            .fetch_ahead(&runtime, &wanted, listed(&[1, 4, 5, 6])),
        3
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    bed.settle().await;
    for i in [4, 5, 6] {
        assert!(bed.store.contains(&key_of(i)), "unit {i} fetched ahead");
    }
    assert!(
        !bed.store.contains(&key_of(7)),
        "nothing beyond the listing"
    );
    assert!(bed.origin.ranges().is_empty(), "never from the origin");
    assert_eq!(bed.fetcher.metrics.ahead_units.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_fetched_ahead_when_the_holders_hold_only_parts() {
    let peers = swarm(
        vec![PeerChoice::Peers(vec![peer(1)])],
        &[(1, Behaviour::Serves)],
    );
    let bed = Bed::new(8, 1, FakeOrigin::new(8), Some(peers.clone()));
    let wanted: Arc<dyn Wanted> = bed.wanted.clone();
    assert_eq!(data(bed.get(0).await), unit_bytes(0));
    bed.settle().await;
    let units = vec![bed.wanted.unit(4)];
    let queued = bed
        .fetcher
        .fetch_ahead(&tokio::runtime::Handle::current(), &wanted, units);
    assert_eq!(queued, 0);
}

#[tokio::test(start_paused = true)]
async fn landed_returns_as_the_last_unit_is_stored_or_at_its_limit() {
    let origin = FakeOrigin {
        latency: Duration::from_millis(300),
        ..FakeOrigin::new(4)
    };
    let bed = Arc::new(Bed::new(4, 1, origin, None));
    let keys = [key_of(1), key_of(2)];
    // Nothing in flight: at once.
    let started = Instant::now();
    bed.fetcher.landed(&keys, Duration::from_secs(5)).await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Two fetches under way: it returns once both are stored, not before and not a
    // poll interval later.
    for i in [1, 2] {
        let bed = bed.clone();
        tokio::spawn(async move { bed.get(i).await });
    }
    tokio::task::yield_now().await;
    bed.fetcher.landed(&keys, Duration::from_secs(5)).await;
    let took = started.elapsed();
    assert!(keys.iter().all(|k| bed.store.contains(k)), "both stored");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(301),
        "returned after {took:?}"
    );
    // A unit that stays in flight: at the limit.
    let slow = FakeOrigin {
        latency: Duration::from_secs(60),
        ..FakeOrigin::new(4)
    };
    let bed = Arc::new(Bed::new(4, 1, slow, None));
    let waiting = bed.clone();
    tokio::spawn(async move { waiting.get(3).await });
    tokio::task::yield_now().await;
    let started = Instant::now();
    bed.fetcher
        .landed(&[key_of(3)], Duration::from_secs(2))
        .await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(!bed.store.contains(&key_of(3)));
}
