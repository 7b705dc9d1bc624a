//! The discrete-event model: N agents fetching one image through the scheduler's real
//! [`Swarm`], peers and an origin over [`Net`].
//!
//! Each agent behaves as the real agent's fetch path does (agent/src/fetch: `run.rs`,
//! `peers.rs`, `origin.rs`, `readahead.rs`, `all.rs`), pulling the image one of two ways
//! ([`Pull`]):
//!
//! - **A reader of every file** (`Pull::Read`, the swarm benchmark's lazy read): node k
//!   reads the image's files starting at the k-th, each from its first chunk on; while
//!   it reads a file, read-ahead keeps the next chunks of the same file, up to `window`
//!   bytes, in flight. `fetch.merge_bytes` (256 KiB) is less than a chunk, so every
//!   miss leads a run of exactly one chunk.
//! - **A whole-image pull** (`Pull::All`, `fetch_all`: a preheat job, or prefetch
//!   `all`; what Kraken's agents do): every chunk in blob order, each missing chunk
//!   leading a run of the contiguous missing chunks after it up to
//!   `fetch.stream_bytes`, at most `concurrency` runs at once.
//!
//! A run (`Fetcher::lead` → `from_peers`, then `from_origin`):
//!
//! - **Peers.** It asks the scheduler (`find_peers`, one round trip) for the first
//!   stretch of its consecutive missing chunks, unless it remembers holders of the whole blob named in the
//!   last `HOLDERS_FRESH` (5 s), which are asked starting from the next one each run.
//!   A round over the named peers cuts that stretch into up to `PARALLEL_PEERS`
//!   contiguous slices of about equal bytes, slice n to the n+turn-th usable peer;
//!   each slice is one stream from its peer holding one of its upload slots, chunk
//!   after chunk, skipping what the peer lacks (reported "not found"). A peer serving
//!   `max_uploads` answers Busy and is not asked again this round; turns go on while
//!   chunks are missing and peers are usable. Each slice's chunks are announced as the
//!   slice ends. After a round: a remembered holder that did not give everything is
//!   forgotten; a round that got something asks again; a round where every peer was
//!   busy rests 0.1 s doubling to 1 s, and gives up for the origin once rests since the
//!   run last made progress pass `max_wait` (20 s); otherwise two fruitless rounds send
//!   it to the origin.
//! - **Wait** sleeps the scheduler's pause and asks again (progress: the scheduler
//!   vouches for a live origin fetch), up to `WAIT_PATIENCE` × `max_wait` in all;
//!   **Origin** streams the missing chunks from the origin, asking the scheduler again
//!   every `FLIGHT_KEEPALIVE` (3 s) while it does, and announces each as it lands (the
//!   scheduler then keeps the rest of the flight in flight).
//! - Transfers are reported (`report`) per slice and per origin request; heartbeats
//!   every 10 s (a third of the 30 s lease) carry the host's uploads and reset the
//!   scheduler's spreading counter.
//!
//! Not modelled: failures (dead, slow or lying peers, origin errors), verification
//! and disk time outside the testbed's CPU capacity, chunks compressed on the wire,
//! the manifest and bootstrap fetch and the mount, eviction.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tessera_proto::domain::{
    Announce, BlobDigest, BlobRanges, ByteRange, FindPeers, Host, HostId, Outcome, Transfer,
};
use tessera_scheduler::swarm::{Decision, Swarm, SwarmConfig};

use super::net::{Finish, From, Net};

/// The agent's `peers::HOLDERS_FRESH`.
const HOLDERS_FRESH: f64 = 5.0;
/// The agent's `peers::BUSY_PAUSE` and `BUSY_PAUSE_MAX`.
const BUSY_PAUSE: f64 = 0.1;
const BUSY_PAUSE_MAX: f64 = 1.0;
/// The agent's `peers::FRUITLESS_ROUNDS`.
const FRUITLESS_ROUNDS: u32 = 2;
/// The agent's `peers::PARALLEL_PEERS`.
const PARALLEL_PEERS: usize = 4;
/// The agent's `peers::WAIT_PATIENCE`.
const WAIT_PATIENCE: f64 = 15.0;
/// The agent's `run::FLIGHT_KEEPALIVE`.
const FLIGHT_KEEPALIVE: f64 = 3.0;
/// A third of the scheduler's default 30 s lease, as `membership::keep_member` beats.
const HEARTBEAT_EVERY: f64 = 10.0;
/// A flow's tag: its run times this plus its slice; `ORIGIN_SLICE` for the origin's.
const TAG_RUN: u32 = 8;
const ORIGIN_SLICE: u32 = 7;

/// How each node pulls the image (see the module docs).
#[derive(Debug, Clone, Copy)]
pub enum Pull {
    /// A reader of every file; read-ahead keeps `window_bytes` of the file in flight
    /// (`fetch.readahead_bytes`).
    Read { window_bytes: u64 },
    /// `fetch_all`: runs of up to `stream_bytes` (`fetch.stream_bytes`), `concurrency`
    /// at once (`fetch.prefetch_concurrency`).
    All {
        stream_bytes: u64,
        concurrency: usize,
    },
}

/// One simulated set-up.
#[derive(Debug, Clone)]
pub struct Setup {
    pub name: String,
    pub nodes: usize,
    /// Each blob's (layer's) size in bytes.
    pub layers: Vec<u64>,
    pub file_bytes: u64,
    pub chunk_bytes: u64,
    pub pull: Pull,
    pub host_up_bps: f64,
    pub host_down_bps: f64,
    /// Round trip between two hosts, and between a host and the scheduler.
    pub host_rtt: f64,
    pub origin_bps: f64,
    /// Round trip between a host and the origin.
    pub origin_rtt: f64,
    /// Machine-wide bytes per second all receivers together can process (one machine).
    pub cpu_bps: Option<f64>,
    pub max_uploads: u32,
    pub max_wait: f64,
    /// The scheduler's `origin_timeout` (its default unless a what-if asks otherwise).
    pub origin_timeout: f64,
    pub seed: u64,
}

impl Setup {
    pub fn image_bytes(&self) -> u64 {
        self.layers.iter().sum()
    }
}

/// What one simulation measured.
#[derive(Debug)]
pub struct Outcomes {
    /// Each node's completion time, seconds from the start, sorted.
    pub done: Vec<f64>,
    pub origin_bytes: u64,
    pub decide_ns: Vec<u32>,
    pub announce_ns: Vec<u32>,
    pub lookups: Lookups,
    pub events: u64,
    pub wall: Duration,
}

/// How the scheduler answered.
#[derive(Debug, Default)]
pub struct Lookups {
    pub peers: u64,
    pub origin: u64,
    pub wait: u64,
    /// Rounds over remembered whole-blob holders without asking.
    pub remembered: u64,
    pub busy: u64,
    /// Runs that went to the origin after resting or waiting too long.
    pub gave_up_waiting: u64,
    /// Runs that went to the origin after `FRUITLESS_ROUNDS` rounds from peers that
    /// had none of what they were asked for.
    pub fruitless: u64,
}

struct Chunk {
    blob: u32,
    start: u64,
    end: u64,
    file: u32,
}

struct Agent {
    id: HostId,
    /// Chunks held, by global index.
    has: Vec<bool>,
    /// Chunks in flight in this node's own runs.
    inflight: Vec<bool>,
    /// Read: position (in this node's order) of the first chunk not yet landed, and of
    /// the next to start. All: `next` is the next chunk (blob order) to consider.
    read_at: usize,
    next: usize,
    /// Landed positions at or after `read_at` (in-order bookkeeping).
    landed_ahead: Vec<bool>,
    landed: usize,
    first_chunk: usize,
    runs: usize,
    uploads: u32,
    /// Per blob: remembered whole-blob holders (the next run's first first) and when.
    holders: Vec<Option<(Vec<u32>, f64)>>,
    done: Option<f64>,
}

/// One slice of a round: a stream from one peer.
struct Slice {
    peer: u32,
    /// Indices into the run's chunks, in order, and how far the stream got.
    items: Vec<usize>,
    at: usize,
    got: Vec<usize>,
    missing: Vec<usize>,
    request_at: f64,
}

struct Run {
    /// Unique over the simulation (slots are reused): stale keep-alives are dropped.
    id: u64,
    host: u32,
    chunks: Vec<u32>,
    got: Vec<bool>,
    started: f64,
    /// When the run last made progress (a round got something, or a Wait).
    progress: f64,
    rest: f64,
    fruitless: u32,
    named: Vec<u32>,
    whole: Vec<bool>,
    remembered: bool,
    /// The scheduler's answer on its way back.
    answer: Option<Answer>,
    // The round under way.
    abandoned: Vec<u32>,
    turn: usize,
    /// The stretch of missing chunks the round fetches, and how many it had.
    round_items: Vec<usize>,
    round_pending: usize,
    round_got: usize,
    only_busy: bool,
    asked: usize,
    slices: Vec<Slice>,
    open_slices: usize,
    // The origin step under way: the chunks it streams and how far it got.
    origin: Option<(Vec<usize>, usize, f64)>,
}

enum Answer {
    Peers,
    Origin,
    Wait(f64),
}

enum Kind {
    Heartbeat(u32),
    Answer(u32),
    AskAgain(u32),
    SliceArrive { run: u32, slice: u32 },
    SliceRefused { run: u32 },
    OriginArrive(u32),
    KeepAlive { run: u32, id: u64 },
    FlowDone { flow: u32, version: u32 },
    Announce { host: u32, chunks: Vec<u32> },
}

struct Event {
    t: f64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    /// Earliest first in a max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

pub struct World {
    setup: Setup,
    base: Instant,
    swarm: Swarm,
    net: Net,
    chunks: Vec<Chunk>,
    blobs: Vec<BlobDigest>,
    agents: Vec<Agent>,
    runs: Vec<Option<Run>>,
    free_runs: Vec<u32>,
    run_ids: u64,
    queue: BinaryHeap<Event>,
    seq: u64,
    events: u64,
    finishes: Vec<Finish>,
    decide_ns: Vec<u32>,
    announce_ns: Vec<u32>,
    lookups: Lookups,
    remaining: usize,
}

impl World {
    pub fn new(setup: Setup) -> Self {
        let base = Instant::now();
        let mut chunks = Vec::new();
        let mut file = 0u32;
        let mut file_firsts = Vec::new();
        for (b, &size) in setup.layers.iter().enumerate() {
            let mut file_start = 0;
            while file_start < size {
                let file_end = (file_start + setup.file_bytes).min(size);
                file_firsts.push(chunks.len());
                let mut start = file_start;
                while start < file_end {
                    let end = (start + setup.chunk_bytes).min(file_end);
                    chunks.push(Chunk {
                        blob: b as u32,
                        start,
                        end,
                        file,
                    });
                    start = end;
                }
                file += 1;
                file_start = file_end;
            }
        }
        let blobs: Vec<BlobDigest> = (0..setup.layers.len())
            .map(|b| BlobDigest(format!("sha256:{b:064x}")))
            .collect();
        let mut swarm = Swarm::new(SwarmConfig {
            origin_timeout: Duration::from_secs_f64(setup.origin_timeout),
            ..SwarmConfig::default()
        });
        let mut rng = tessera_benches::Rng::new(setup.seed);
        let mut agents = Vec::with_capacity(setup.nodes);
        let mut queue = BinaryHeap::new();
        let mut seq = 0;
        for k in 0..setup.nodes {
            let id = HostId(format!("h{k}"));
            let address: SocketAddr =
                SocketAddr::from(([10, (k >> 16) as u8, (k >> 8) as u8, k as u8], 7081));
            swarm.register(
                Host {
                    id: id.clone(),
                    address,
                    labels: Default::default(),
                    upload_limit_bps: None,
                    max_uploads: setup.max_uploads,
                },
                base,
            );
            let first_chunk = match setup.pull {
                Pull::Read { .. } => file_firsts[k % file_firsts.len()],
                // Every node pulls in blob order, as `fetch_all` is handed the chunks.
                // `fetch_all` in a swarm: from a random point of the list (blob
                // order), wrapping around.
                Pull::All { .. } => rng.below(chunks.len() as u64) as usize,
            };
            agents.push(Agent {
                id,
                has: vec![false; chunks.len()],
                inflight: vec![false; chunks.len()],
                read_at: 0,
                next: 0,
                landed_ahead: vec![false; chunks.len()],
                landed: 0,
                first_chunk,
                runs: 0,
                uploads: 0,
                holders: vec![None; setup.layers.len()],
                done: None,
            });
            seq += 1;
            queue.push(Event {
                t: rng.unit() * HEARTBEAT_EVERY,
                seq,
                kind: Kind::Heartbeat(k as u32),
            });
        }
        let net = Net::new(
            setup.nodes,
            setup.host_up_bps,
            setup.host_down_bps,
            setup.origin_bps,
            setup.cpu_bps,
        );
        let remaining = setup.nodes;
        World {
            setup,
            base,
            swarm,
            net,
            chunks,
            blobs,
            agents,
            runs: Vec::new(),
            free_runs: Vec::new(),
            run_ids: 0,
            queue,
            seq,
            events: 0,
            finishes: Vec::new(),
            decide_ns: Vec::new(),
            announce_ns: Vec::new(),
            lookups: Lookups::default(),
            remaining,
        }
    }

    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t)
    }

    fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.queue.push(Event {
            t,
            seq: self.seq,
            kind,
        });
    }

    fn schedule_finishes(&mut self) {
        for (flow, version, t) in std::mem::take(&mut self.finishes) {
            self.push(t, Kind::FlowDone { flow, version });
        }
    }

    /// Runs until every node holds the whole image (or `horizon` seconds pass).
    pub fn run(mut self, horizon: f64) -> Outcomes {
        let wall = Instant::now();
        for h in 0..self.agents.len() as u32 {
            self.start_runs(h, 0.0);
        }
        while let Some(ev) = self.queue.pop() {
            if ev.t > horizon || self.remaining == 0 {
                break;
            }
            self.events += 1;
            let now = ev.t;
            match ev.kind {
                Kind::Heartbeat(h) => {
                    let a = &self.agents[h as usize];
                    let _ = self.swarm.heartbeat(&a.id, a.uploads, self.at(now));
                    self.push(now + HEARTBEAT_EVERY, Kind::Heartbeat(h));
                }
                Kind::Answer(r) => self.on_answer(r, now),
                Kind::AskAgain(r) => self.ask(r, now),
                Kind::SliceArrive { run, slice } => self.on_slice_arrive(run, slice, now),
                Kind::SliceRefused { run } => self.slice_ended(run, now),
                Kind::OriginArrive(r) => self.origin_next(r, now),
                Kind::KeepAlive { run, id } => self.keep_alive(run, id, now),
                Kind::FlowDone { flow, version } => {
                    if !self.net.is_current(flow, version) {
                        continue;
                    }
                    let tag = self.net.tag(flow);
                    self.net.finish(flow, now, &mut self.finishes);
                    self.schedule_finishes();
                    self.on_flow_done(tag / TAG_RUN, tag % TAG_RUN, now);
                }
                Kind::Announce { host, chunks } => self.announce(host, &chunks, now),
            }
        }
        let mut done: Vec<f64> = self
            .agents
            .iter()
            .map(|a| a.done.unwrap_or(f64::INFINITY))
            .collect();
        done.sort_by(f64::total_cmp);
        Outcomes {
            done,
            origin_bytes: self.net.origin_bytes,
            decide_ns: self.decide_ns,
            announce_ns: self.announce_ns,
            lookups: self.lookups,
            events: self.events,
            wall: wall.elapsed(),
        }
    }

    fn fetch(&self, r: u32) -> &Run {
        match self.runs[r as usize].as_ref() {
            Some(run) => run,
            None => unreachable!("run {r} is not live"),
        }
    }

    fn fetch_mut(&mut self, r: u32) -> &mut Run {
        match self.runs[r as usize].as_mut() {
            Some(run) => run,
            None => unreachable!("run {r} is not live"),
        }
    }

    fn chunk_len(&self, chunk: u32) -> u64 {
        let c = &self.chunks[chunk as usize];
        c.end - c.start
    }

    fn chunk_at(&self, agent: &Agent, pos: usize) -> u32 {
        ((agent.first_chunk + pos) % self.chunks.len()) as u32
    }

    fn blob_of(&self, r: u32) -> usize {
        self.chunks[self.fetch(r).chunks[0] as usize].blob as usize
    }

    /// Indices (into the run's chunks) still missing.
    fn pending(&self, r: u32) -> Vec<usize> {
        let run = self.fetch(r);
        (0..run.chunks.len()).filter(|&i| !run.got[i]).collect()
    }

    /// The first stretch of consecutive missing chunks: what `from_peers` asks for
    /// and fetches from peers at a time.
    fn stretch(&self, r: u32) -> Vec<usize> {
        let missing = self.pending(r);
        missing
            .iter()
            .enumerate()
            .take_while(|&(k, &i)| i == missing[0] + k)
            .map(|(_, &i)| i)
            .collect()
    }

    /// The blob range spanned by these of the run's chunks.
    fn span(&self, r: u32, items: &[usize]) -> ByteRange {
        let run = self.fetch(r);
        let (mut start, mut end) = (u64::MAX, 0);
        for &i in items {
            let c = &self.chunks[run.chunks[i] as usize];
            start = start.min(c.start);
            end = end.max(c.end);
        }
        ByteRange { start, end }
    }

    /// Starts the runs the pull allows now.
    fn start_runs(&mut self, h: u32, now: f64) {
        match self.setup.pull {
            Pull::Read { window_bytes } => {
                let window = (window_bytes / self.setup.chunk_bytes).max(1) as usize;
                loop {
                    let a = &self.agents[h as usize];
                    if a.next >= self.chunks.len() || a.next >= a.read_at + window {
                        return;
                    }
                    let reading = self.chunks[self.chunk_at(a, a.read_at) as usize].file;
                    let chunk = self.chunk_at(a, a.next);
                    if self.chunks[chunk as usize].file != reading {
                        return;
                    }
                    self.agents[h as usize].next += 1;
                    self.new_run(h, vec![chunk], now);
                }
            }
            Pull::All {
                stream_bytes,
                concurrency,
            } => loop {
                // `fetch_all`: a missing chunk leads a run of the contiguous missing
                // chunks after it, of its blob, within `stream_bytes`
                // (`plan_run_up_to`); at most `concurrency` runs at once.
                let a = &self.agents[h as usize];
                if a.runs >= concurrency.max(1) || a.next >= self.chunks.len() {
                    return;
                }
                let first = self.chunk_at(a, a.next) as usize;
                if a.has[first] || a.inflight[first] {
                    self.agents[h as usize].next += 1;
                    continue;
                }
                let c0 = &self.chunks[first];
                let mut run = vec![first as u32];
                let mut k = first + 1;
                while k < self.chunks.len() {
                    let c = &self.chunks[k];
                    if c.blob != c0.blob
                        || c.end - c0.start > stream_bytes
                        || a.has[k]
                        || a.inflight[k]
                    {
                        break;
                    }
                    run.push(k as u32);
                    k += 1;
                }
                self.agents[h as usize].next += run.len();
                self.new_run(h, run, now);
            },
        }
    }

    fn new_run(&mut self, h: u32, chunks: Vec<u32>, now: f64) {
        let a = &mut self.agents[h as usize];
        a.runs += 1;
        for &c in &chunks {
            a.inflight[c as usize] = true;
        }
        self.run_ids += 1;
        let run = Run {
            id: self.run_ids,
            host: h,
            got: vec![false; chunks.len()],
            chunks,
            started: now,
            progress: now,
            rest: BUSY_PAUSE,
            fruitless: 0,
            named: Vec::new(),
            whole: Vec::new(),
            remembered: false,
            answer: None,
            abandoned: Vec::new(),
            turn: 0,
            round_items: Vec::new(),
            round_pending: 0,
            round_got: 0,
            only_busy: true,
            asked: 0,
            slices: Vec::new(),
            open_slices: 0,
            origin: None,
        };
        let r = match self.free_runs.pop() {
            Some(r) => {
                self.runs[r as usize] = Some(run);
                r
            }
            None => {
                self.runs.push(Some(run));
                (self.runs.len() - 1) as u32
            }
        };
        self.ask(r, now);
    }

    /// The top of `from_peers`' loop: done, remembered holders, or the scheduler.
    fn ask(&mut self, r: u32, now: f64) {
        let pending = self.stretch(r);
        if pending.is_empty() {
            self.end_run(r, now);
            return;
        }
        let (h, blob) = (self.fetch(r).host, self.blob_of(r));
        let remembered = match &mut self.agents[h as usize].holders[blob] {
            Some((named, at)) if now - *at < HOLDERS_FRESH => {
                let these = named.clone();
                named.rotate_left(1);
                Some(these)
            }
            _ => None,
        };
        if let Some(named) = remembered {
            self.lookups.remembered += 1;
            let whole = vec![true; named.len()];
            let run = self.fetch_mut(r);
            run.remembered = true;
            run.named = named;
            run.whole = whole;
            run.answer = Some(Answer::Peers);
            self.on_answer(r, now);
            return;
        }
        let find = FindPeers {
            host: self.agents[h as usize].id.clone(),
            blob: self.blobs[blob].clone(),
            range: self.span(r, &pending),
        };
        let at = self.at(now);
        let t0 = Instant::now();
        let decision = self.swarm.find_peers(&find, at);
        self.decide_ns.push(t0.elapsed().as_nanos() as u32);
        let answer = match decision {
            Ok(Decision::Peers(peers)) => {
                self.lookups.peers += 1;
                let named: Vec<u32> = peers.iter().map(|(id, _, _)| host_index(id)).collect();
                let whole: Vec<bool> = peers.iter().map(|p| p.2).collect();
                let run = self.fetch_mut(r);
                run.named = named;
                run.whole = whole;
                Answer::Peers
            }
            Ok(Decision::Wait(d)) => {
                self.lookups.wait += 1;
                Answer::Wait(d.as_secs_f64())
            }
            Ok(Decision::Origin) | Err(_) => {
                self.lookups.origin += 1;
                Answer::Origin
            }
        };
        let rtt = self.setup.host_rtt;
        let run = self.fetch_mut(r);
        run.remembered = false;
        run.answer = Some(answer);
        self.push(now + rtt, Kind::Answer(r));
    }

    fn on_answer(&mut self, r: u32, now: f64) {
        let Some(answer) = self.fetch_mut(r).answer.take() else {
            return;
        };
        match answer {
            Answer::Origin => self.fetch_from_origin(r, now),
            Answer::Wait(pause) => {
                let run = self.fetch(r);
                if now - run.started + pause > self.setup.max_wait * WAIT_PATIENCE {
                    self.lookups.gave_up_waiting += 1;
                    self.fetch_from_origin(r, now);
                } else {
                    self.fetch_mut(r).progress = now + pause;
                    self.push(now + pause, Kind::AskAgain(r));
                }
            }
            Answer::Peers => {
                let run = self.fetch(r);
                if !run.remembered {
                    let (h, blob) = (run.host, self.blob_of(r));
                    let mut whole: Vec<u32> = run
                        .named
                        .iter()
                        .zip(&run.whole)
                        .filter(|(_, w)| **w)
                        .map(|(p, _)| *p)
                        .collect();
                    // `remember_holders`: the next run starts after this one's first.
                    if !whole.is_empty() {
                        whole.rotate_left(1);
                    }
                    self.agents[h as usize].holders[blob] = if whole.is_empty() {
                        None
                    } else {
                        Some((whole, now))
                    };
                }
                let stretch = self.stretch(r);
                let run = self.fetch_mut(r);
                run.abandoned.clear();
                run.turn = 0;
                run.round_pending = stretch.len();
                run.round_items = stretch;
                run.round_got = 0;
                run.only_busy = true;
                run.asked = 0;
                self.next_turn(r, now);
            }
        }
    }

    /// The next turn of a round (`from_these_peers`): slices to the usable peers, or
    /// the round's end.
    fn next_turn(&mut self, r: u32, now: f64) {
        // The round's stretch, what of it is still missing.
        let pending: Vec<usize> = {
            let run = self.fetch(r);
            run.round_items
                .iter()
                .copied()
                .filter(|&i| !run.got[i])
                .collect()
        };
        let run = self.fetch(r);
        let usable: Vec<u32> = run
            .named
            .iter()
            .copied()
            .filter(|p| !run.abandoned.contains(p))
            .collect();
        if run.turn >= run.named.len() || pending.is_empty() || usable.is_empty() {
            self.round_ended(r, now);
            return;
        }
        let parts = usable.len().min(PARALLEL_PEERS).min(pending.len());
        let turn = run.turn;
        let cuts = self.slices(r, &pending, parts);
        let request_at = now;
        let slices: Vec<Slice> = cuts
            .into_iter()
            .enumerate()
            .map(|(n, items)| Slice {
                peer: usable[(n + turn) % usable.len()],
                items,
                at: 0,
                got: Vec::new(),
                missing: Vec::new(),
                request_at,
            })
            .collect();
        let n = slices.len();
        let run = self.fetch_mut(r);
        run.turn += 1;
        run.asked += n;
        run.open_slices = n;
        run.slices = slices;
        for s in 0..n as u32 {
            self.push(
                now + self.setup.host_rtt / 2.0,
                Kind::SliceArrive { run: r, slice: s },
            );
        }
    }

    /// `peers::slices`: `pending` cut into `parts` contiguous slices of about equal
    /// bytes.
    fn slices(&self, r: u32, pending: &[usize], parts: usize) -> Vec<Vec<usize>> {
        let run = self.fetch(r);
        let len = |i: usize| self.chunk_len(run.chunks[i]);
        let total: u64 = pending.iter().map(|&i| len(i)).sum();
        let share = total.div_ceil(parts.max(1) as u64).max(1);
        let mut out: Vec<Vec<usize>> = vec![Vec::new()];
        let mut bytes = 0u64;
        for &i in pending {
            let last = out.len() - 1;
            if bytes >= share * (last as u64 + 1) && out.len() < parts {
                out.push(Vec::new());
            }
            if let Some(slice) = out.last_mut() {
                slice.push(i);
            }
            bytes += len(i);
        }
        out.retain(|s| !s.is_empty());
        out
    }

    fn on_slice_arrive(&mut self, r: u32, s: u32, now: f64) {
        let peer = self.fetch(r).slices[s as usize].peer;
        if self.agents[peer as usize].uploads >= self.setup.max_uploads {
            self.lookups.busy += 1;
            let run = self.fetch_mut(r);
            run.abandoned.push(peer);
            self.push(
                now + self.setup.host_rtt / 2.0,
                Kind::SliceRefused { run: r },
            );
            return;
        }
        self.agents[peer as usize].uploads += 1;
        self.fetch_mut(r).only_busy = false;
        self.stream_next(r, s, now);
    }

    /// The peer sends the slice's next chunk it holds, skipping those it lacks; at the
    /// stream's end the slice is reported and announced.
    fn stream_next(&mut self, r: u32, s: u32, now: f64) {
        loop {
            let run = self.fetch(r);
            let slice = &run.slices[s as usize];
            let Some(&i) = slice.items.get(slice.at) else {
                break;
            };
            let chunk = run.chunks[i];
            let (peer, host) = (slice.peer, run.host);
            if self.agents[peer as usize].has[chunk as usize] {
                let bytes = self.chunk_len(chunk);
                self.net.start(
                    From::Host(peer),
                    host,
                    bytes,
                    r * TAG_RUN + s,
                    now,
                    &mut self.finishes,
                );
                self.schedule_finishes();
                return;
            }
            let slice = &mut self.fetch_mut(r).slices[s as usize];
            slice.missing.push(i);
            slice.at += 1;
        }
        // The stream ended: the upload slot is free, the transfer reported, the
        // slice's chunks announced (a round trip's half later at the scheduler).
        let (host, peer, got, missing, request_at, blob) = {
            let run = self.fetch(r);
            let slice = &run.slices[s as usize];
            (
                run.host,
                slice.peer,
                slice.got.clone(),
                slice.missing.clone(),
                slice.request_at,
                self.blob_of(r),
            )
        };
        self.agents[peer as usize].uploads -= 1;
        let mut transfers = Vec::new();
        if !got.is_empty() {
            let bytes = got
                .iter()
                .map(|&i| self.chunk_len(self.fetch(r).chunks[i]))
                .sum();
            transfers.push(Transfer {
                peer: Some(self.agents[peer as usize].id.clone()),
                blob: self.blobs[blob].clone(),
                range: self.span(r, &got),
                bytes,
                duration_us: ((now - request_at) * 1e6).max(1.0) as u64,
                outcome: Outcome::Ok,
            });
        }
        for &i in &missing {
            transfers.push(Transfer {
                peer: Some(self.agents[peer as usize].id.clone()),
                blob: self.blobs[blob].clone(),
                range: self.span(r, &[i]),
                bytes: 0,
                duration_us: 1,
                outcome: Outcome::NotFound,
            });
        }
        let (me, at) = (self.agents[host as usize].id.clone(), self.at(now));
        let _ = self.swarm.report(&me, &transfers, at);
        if !got.is_empty() {
            let chunks = got.iter().map(|&i| self.fetch(r).chunks[i]).collect();
            self.push(
                now + self.setup.host_rtt / 2.0,
                Kind::Announce { host, chunks },
            );
        }
        self.slice_ended(r, now);
    }

    fn slice_ended(&mut self, r: u32, now: f64) {
        let run = self.fetch_mut(r);
        run.open_slices -= 1;
        if run.open_slices == 0 {
            self.next_turn(r, now);
        }
    }

    /// After a round: `from_peers`' rules (see the module docs).
    fn round_ended(&mut self, r: u32, now: f64) {
        let (h, blob) = (self.fetch(r).host, self.blob_of(r));
        let run = self.fetch(r);
        if run.remembered && run.round_got < run.round_pending {
            self.agents[h as usize].holders[blob] = None;
            self.ask(r, now);
            return;
        }
        let max_wait = self.setup.max_wait;
        let run = self.fetch_mut(r);
        let only_busy = run.only_busy && run.asked > 0 && run.round_got == 0;
        if run.round_got > 0 {
            run.progress = now;
            run.rest = BUSY_PAUSE;
            self.ask(r, now);
            return;
        }
        if only_busy {
            let rest = run.rest;
            if now - run.progress + rest > max_wait {
                self.lookups.gave_up_waiting += 1;
                self.fetch_from_origin(r, now);
                return;
            }
            run.rest = (rest * 2.0).min(BUSY_PAUSE_MAX);
            self.push(now + rest, Kind::AskAgain(r));
            return;
        }
        run.fruitless += 1;
        if run.fruitless >= FRUITLESS_ROUNDS {
            self.lookups.fruitless += 1;
            self.fetch_from_origin(r, now);
        } else {
            self.ask(r, now);
        }
    }

    /// The origin step: one request for the missing chunks, streamed in order.
    fn fetch_from_origin(&mut self, r: u32, now: f64) {
        let pending = self.pending(r);
        if pending.is_empty() {
            self.end_run(r, now);
            return;
        }
        let id = self.fetch(r).id;
        self.fetch_mut(r).origin = Some((pending, 0, now));
        let delay = (self.setup.host_rtt + self.setup.origin_rtt) / 2.0;
        self.push(now + delay, Kind::OriginArrive(r));
        self.push(now + FLIGHT_KEEPALIVE, Kind::KeepAlive { run: r, id });
    }

    fn origin_next(&mut self, r: u32, now: f64) {
        let run = self.fetch(r);
        let Some((items, at, request_at)) = run.origin.as_ref() else {
            return;
        };
        if let Some(&i) = items.get(*at) {
            let (host, chunk) = (run.host, run.chunks[i]);
            let bytes = self.chunk_len(chunk);
            self.net.start(
                From::Origin,
                host,
                bytes,
                r * TAG_RUN + ORIGIN_SLICE,
                now,
                &mut self.finishes,
            );
            self.schedule_finishes();
            return;
        }
        // The request is over: reported (each chunk was announced as it landed).
        let (items, request_at, host, blob) =
            (items.clone(), *request_at, run.host, self.blob_of(r));
        let bytes = items
            .iter()
            .map(|&i| self.chunk_len(self.fetch(r).chunks[i]))
            .sum();
        let t = Transfer {
            peer: None,
            blob: self.blobs[blob].clone(),
            range: self.span(r, &items),
            bytes,
            duration_us: ((now - request_at) * 1e6).max(1.0) as u64,
            outcome: Outcome::Ok,
        };
        let (me, at) = (self.agents[host as usize].id.clone(), self.at(now));
        let _ = self.swarm.report(&me, &[t], at);
        self.end_run(r, now);
    }

    /// `run::FLIGHT_KEEPALIVE`: a run streaming from the origin asks again for what it
    /// fetches (the answer is not used).
    fn keep_alive(&mut self, r: u32, id: u64, now: f64) {
        let Some(run) = self.runs[r as usize].as_ref() else {
            return;
        };
        let Some((items, _, _)) = run.origin.as_ref() else {
            return;
        };
        if run.id != id {
            return;
        }
        let items = items.clone();
        let find = FindPeers {
            host: self.agents[run.host as usize].id.clone(),
            blob: self.blobs[self.blob_of(r)].clone(),
            range: self.span(r, &items),
        };
        let at = self.at(now);
        let t0 = Instant::now();
        let _ = self.swarm.find_peers(&find, at);
        self.decide_ns.push(t0.elapsed().as_nanos() as u32);
        self.push(now + FLIGHT_KEEPALIVE, Kind::KeepAlive { run: r, id });
    }

    fn on_flow_done(&mut self, r: u32, s: u32, now: f64) {
        if s == ORIGIN_SLICE {
            let Some((items, at, _)) = self.fetch_mut(r).origin.as_mut() else {
                return;
            };
            let i = items[*at];
            *at += 1;
            self.land(r, i, now);
            // `origin::announce_kept`: each chunk announced as soon as it is stored.
            let (host, chunk) = (self.fetch(r).host, self.fetch(r).chunks[i]);
            self.push(
                now + self.setup.host_rtt / 2.0,
                Kind::Announce {
                    host,
                    chunks: vec![chunk],
                },
            );
            self.origin_next(r, now);
            return;
        }
        let slice = &mut self.fetch_mut(r).slices[s as usize];
        let i = slice.items[slice.at];
        slice.at += 1;
        slice.got.push(i);
        self.fetch_mut(r).round_got += 1;
        self.land(r, i, now);
        self.stream_next(r, s, now);
    }

    /// The run's `i`-th chunk is here, verified and stored.
    fn land(&mut self, r: u32, i: usize, now: f64) {
        let run = self.fetch_mut(r);
        run.got[i] = true;
        let (h, chunk) = (run.host, run.chunks[i]);
        let total = self.chunks.len();
        let a = &mut self.agents[h as usize];
        a.has[chunk as usize] = true;
        a.inflight[chunk as usize] = false;
        a.landed += 1;
        let pos = (chunk as usize + total - a.first_chunk) % total;
        a.landed_ahead[pos] = true;
        while a.read_at < total && a.landed_ahead[a.read_at] {
            a.read_at += 1;
        }
        if a.landed == total {
            a.done = Some(now);
            self.remaining -= 1;
        }
    }

    fn end_run(&mut self, r: u32, now: f64) {
        let Some(run) = self.runs[r as usize].take() else {
            return;
        };
        self.free_runs.push(r);
        self.agents[run.host as usize].runs -= 1;
        self.start_runs(run.host, now);
    }

    fn announce(&mut self, host: u32, chunks: &[u32], now: f64) {
        let blob = self.chunks[chunks[0] as usize].blob as usize;
        let announce = Announce {
            host: self.agents[host as usize].id.clone(),
            held: vec![BlobRanges {
                blob: self.blobs[blob].clone(),
                ranges: chunks
                    .iter()
                    .map(|&c| {
                        let c = &self.chunks[c as usize];
                        ByteRange {
                            start: c.start,
                            end: c.end,
                        }
                    })
                    .collect(),
                size: Some(self.setup.layers[blob]),
            }],
            dropped: vec![],
            full: false,
            images: vec![],
        };
        let at = self.at(now);
        let t0 = Instant::now();
        let _ = self.swarm.announce(announce, at);
        self.announce_ns.push(t0.elapsed().as_nanos() as u32);
    }
}

/// "h{k}" → k.
fn host_index(id: &HostId) -> u32 {
    id.0[1..].parse().unwrap_or(0)
}
