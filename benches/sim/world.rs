//! The discrete-event model: N agents fetching one image through the scheduler's real
//! [`Swarm`], peers and an origin over [`Net`].
//!
//! Each agent behaves as the real agent's fetch path does for a read of every file
//! (agent/src/fetch: `run.rs`, `peers.rs`, `origin.rs`, `readahead.rs`):
//!
//! - **Order.** Node k reads the image's files starting at the k-th, each file from
//!   its first chunk on (the swarm benchmark's reader). While it reads a file,
//!   read-ahead keeps the next chunks of the same file, up to `window` bytes, in flight.
//! - **Runs of one chunk.** `fetch.merge_bytes` (256 KiB) is less than a chunk, so
//!   every read or read-ahead miss leads a run of exactly one chunk; `PARALLEL_PEERS`
//!   slices of a one-chunk run are one slice.
//! - **Peers.** The run asks the scheduler (`find_peers`, one round trip) unless it
//!   remembers holders of the whole blob named in the last `HOLDERS_FRESH` (5 s). It
//!   asks the named peers in turn (the agent's `(n + turn) % usable` rotation over those
//!   not yet abandoned); a peer serving `max_uploads` answers Busy. A round where every
//!   peer was busy rests 0.1 s, doubling to 1 s, then asks again; a round from
//!   remembered holders that got nothing forgets them and asks the scheduler.
//! - **Wait** sleeps the scheduler's pause and asks again; **Origin** fetches the run
//!   from the origin; waits and rests of one run together longer than `max_wait`
//!   (`p2p.max_wait_secs`, 20 s) go to the origin without asking.
//! - **After a chunk lands** it is announced (incremental, `full: false`, with the
//!   blob's size) half a round trip later, and each transfer is reported (`report`).
//!   Heartbeats every 10 s (a third of the 30 s lease) carry the host's uploads and
//!   reset the scheduler's spreading counter.
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
/// A third of the scheduler's default 30 s lease, as `membership::keep_member` beats.
const HEARTBEAT_EVERY: f64 = 10.0;

/// One simulated set-up.
#[derive(Debug, Clone)]
pub struct Setup {
    pub name: String,
    pub nodes: usize,
    /// Each blob's (layer's) size in bytes.
    pub layers: Vec<u64>,
    pub file_bytes: u64,
    pub chunk_bytes: u64,
    /// Read-ahead: bytes of the file being read kept in flight.
    pub window_bytes: u64,
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
    /// Runs fetched from remembered whole-blob holders without asking.
    pub remembered: u64,
    pub busy: u64,
    /// Runs that went to the origin after waiting `max_wait`.
    pub gave_up_waiting: u64,
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
    /// Position (in this node's order) of the first chunk not yet landed, and of the
    /// next to start.
    read_at: usize,
    next: usize,
    /// Landed positions at or after `read_at` (in-order bookkeeping).
    landed_ahead: Vec<bool>,
    landed: usize,
    first_chunk: usize,
    uploads: u32,
    holders: Vec<Option<(Vec<u32>, f64)>>,
    done: Option<f64>,
}

struct Run {
    host: u32,
    chunk: u32,
    started: f64,
    rest: f64,
    fruitless: u32,
    named: Vec<u32>,
    whole: Vec<bool>,
    abandoned: Vec<u32>,
    turn: usize,
    remembered: bool,
    only_busy: bool,
    /// The scheduler's answer on its way back.
    answer: Option<Answer>,
    /// When the request that is answering was sent (for the transfer's report).
    request_at: f64,
    /// The peer streaming the chunk, once one does.
    serving: Option<u32>,
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
    PeerArrive { run: u32, peer: u32 },
    PeerRefused { run: u32, peer: u32, busy: bool },
    OriginArrive(u32),
    FlowDone { flow: u32, version: u32 },
    Announce { host: u32, chunk: u32 },
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
    queue: BinaryHeap<Event>,
    seq: u64,
    events: u64,
    finishes: Vec<Finish>,
    decide_ns: Vec<u32>,
    announce_ns: Vec<u32>,
    lookups: Lookups,
    window: usize,
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
            agents.push(Agent {
                id,
                has: vec![false; chunks.len()],
                read_at: 0,
                next: 0,
                landed_ahead: vec![false; chunks.len()],
                landed: 0,
                first_chunk: file_firsts[k % file_firsts.len()],
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
        let window = (setup.window_bytes / setup.chunk_bytes).max(1) as usize;
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
            queue,
            seq,
            events: 0,
            finishes: Vec::new(),
            decide_ns: Vec::new(),
            announce_ns: Vec::new(),
            lookups: Lookups::default(),
            window,
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
        let mut remaining = self.agents.len();
        while let Some(ev) = self.queue.pop() {
            if ev.t > horizon || remaining == 0 {
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
                Kind::PeerArrive { run, peer } => self.on_peer_arrive(run, peer, now),
                Kind::PeerRefused { run, peer, busy } => {
                    let Some(state) = self.runs[run as usize].as_mut() else {
                        continue;
                    };
                    state.abandoned.push(peer);
                    if !busy {
                        state.only_busy = false;
                    }
                    self.next_turn(run, now);
                }
                Kind::OriginArrive(r) => {
                    let host = self.fetch(r).host;
                    let bytes = self.chunk_len(self.fetch(r).chunk);
                    self.net
                        .start(From::Origin, host, bytes, r, now, &mut self.finishes);
                    self.schedule_finishes();
                }
                Kind::FlowDone { flow, version } => {
                    if !self.net.is_current(flow, version) {
                        continue;
                    }
                    let r = self.net.tag(flow);
                    self.net.finish(flow, now, &mut self.finishes);
                    self.schedule_finishes();
                    if self.on_landed(r, now) {
                        remaining -= 1;
                    }
                }
                Kind::Announce { host, chunk } => {
                    let c = &self.chunks[chunk as usize];
                    let blob = c.blob as usize;
                    let announce = Announce {
                        host: self.agents[host as usize].id.clone(),
                        held: vec![BlobRanges {
                            blob: self.blobs[blob].clone(),
                            ranges: vec![ByteRange {
                                start: c.start,
                                end: c.end,
                            }],
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

    /// Starts the runs read-ahead allows: positions within `window` of the read
    /// position and in the file being read.
    fn start_runs(&mut self, h: u32, now: f64) {
        loop {
            let a = &self.agents[h as usize];
            if a.next >= self.chunks.len() || a.next >= a.read_at + self.window {
                return;
            }
            let reading = self.chunks[self.chunk_at(a, a.read_at) as usize].file;
            let chunk = self.chunk_at(a, a.next);
            if self.chunks[chunk as usize].file != reading {
                return;
            }
            self.agents[h as usize].next += 1;
            let run = Run {
                host: h,
                chunk,
                started: now,
                rest: BUSY_PAUSE,
                fruitless: 0,
                named: Vec::new(),
                whole: Vec::new(),
                abandoned: Vec::new(),
                turn: 0,
                remembered: false,
                only_busy: true,
                answer: None,
                request_at: now,
                serving: None,
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
    }

    /// The top of the agent's peer loop: remembered holders, or the scheduler.
    fn ask(&mut self, r: u32, now: f64) {
        let (h, chunk) = (self.fetch(r).host, self.fetch(r).chunk);
        let blob = self.chunks[chunk as usize].blob as usize;
        let remembered = match &self.agents[h as usize].holders[blob] {
            Some((named, at)) if now - at < HOLDERS_FRESH => Some(named.clone()),
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
        let c = &self.chunks[chunk as usize];
        let find = FindPeers {
            host: self.agents[h as usize].id.clone(),
            blob: self.blobs[blob].clone(),
            range: ByteRange {
                start: c.start,
                end: c.end,
            },
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
        run.request_at = now;
        self.push(now + rtt, Kind::Answer(r));
    }

    fn waited_too_long(&self, r: u32, pause: f64, now: f64) -> bool {
        now - self.fetch(r).started + pause > self.setup.max_wait
    }

    fn on_answer(&mut self, r: u32, now: f64) {
        let Some(answer) = self.fetch_mut(r).answer.take() else {
            return;
        };
        match answer {
            Answer::Origin => self.fetch_from_origin(r, now),
            Answer::Wait(pause) => {
                if self.waited_too_long(r, pause, now) {
                    self.lookups.gave_up_waiting += 1;
                    self.fetch_from_origin(r, now);
                } else {
                    self.push(now + pause, Kind::AskAgain(r));
                }
            }
            Answer::Peers => {
                let run = self.fetch(r);
                if !run.remembered {
                    let (h, blob) = (run.host, self.chunks[run.chunk as usize].blob as usize);
                    let whole: Vec<u32> = run
                        .named
                        .iter()
                        .zip(&run.whole)
                        .filter(|(_, w)| **w)
                        .map(|(p, _)| *p)
                        .collect();
                    self.agents[h as usize].holders[blob] = if whole.is_empty() {
                        None
                    } else {
                        Some((whole, now))
                    };
                }
                let run = self.fetch_mut(r);
                run.abandoned.clear();
                run.turn = 0;
                run.only_busy = true;
                self.next_turn(r, now);
            }
        }
    }

    /// The next turn of a round over the named peers, or the round's end.
    fn next_turn(&mut self, r: u32, now: f64) {
        let run = self.fetch(r);
        let usable: Vec<u32> = run
            .named
            .iter()
            .copied()
            .filter(|p| !run.abandoned.contains(p))
            .collect();
        if run.turn < run.named.len() && !usable.is_empty() {
            let peer = usable[run.turn % usable.len()];
            self.fetch_mut(r).turn += 1;
            self.push(
                now + self.setup.host_rtt / 2.0,
                Kind::PeerArrive { run: r, peer },
            );
            return;
        }
        // The round got nothing (a success lands the run instead).
        let (h, blob, remembered, only_busy, asked) = {
            let run = self.fetch(r);
            (
                run.host,
                self.chunks[run.chunk as usize].blob as usize,
                run.remembered,
                run.only_busy,
                run.turn > 0,
            )
        };
        if remembered {
            self.agents[h as usize].holders[blob] = None;
            self.ask(r, now);
            return;
        }
        if only_busy && asked {
            let rest = self.fetch(r).rest;
            if self.waited_too_long(r, rest, now) {
                self.lookups.gave_up_waiting += 1;
                self.fetch_from_origin(r, now);
                return;
            }
            let run = self.fetch_mut(r);
            run.rest = (rest * 2.0).min(BUSY_PAUSE_MAX);
            self.push(now + rest, Kind::AskAgain(r));
            return;
        }
        let run = self.fetch_mut(r);
        run.fruitless += 1;
        if run.fruitless >= FRUITLESS_ROUNDS {
            self.fetch_from_origin(r, now);
        } else {
            self.ask(r, now);
        }
    }

    fn on_peer_arrive(&mut self, r: u32, peer: u32, now: f64) {
        let (h, chunk) = (self.fetch(r).host, self.fetch(r).chunk);
        let p = &self.agents[peer as usize];
        let back = now + self.setup.host_rtt / 2.0;
        if p.uploads >= self.setup.max_uploads {
            self.lookups.busy += 1;
            self.push(
                back,
                Kind::PeerRefused {
                    run: r,
                    peer,
                    busy: true,
                },
            );
            return;
        }
        if !p.has[chunk as usize] {
            // The scheduler named a holder of another part of the range: "not found".
            let c = &self.chunks[chunk as usize];
            let t = Transfer {
                peer: Some(p.id.clone()),
                blob: self.blobs[c.blob as usize].clone(),
                range: ByteRange {
                    start: c.start,
                    end: c.end,
                },
                bytes: 0,
                duration_us: 1,
                outcome: Outcome::NotFound,
            };
            let (me, at) = (self.agents[h as usize].id.clone(), self.at(back));
            let _ = self.swarm.report(&me, &[t], at);
            self.push(
                back,
                Kind::PeerRefused {
                    run: r,
                    peer,
                    busy: false,
                },
            );
            return;
        }
        self.agents[peer as usize].uploads += 1;
        let bytes = self.chunk_len(chunk);
        self.net
            .start(From::Host(peer), h, bytes, r, now, &mut self.finishes);
        self.schedule_finishes();
        let asked_at = now - self.setup.host_rtt / 2.0;
        let run = self.fetch_mut(r);
        run.serving = Some(peer);
        run.request_at = asked_at;
    }

    fn fetch_from_origin(&mut self, r: u32, now: f64) {
        self.fetch_mut(r).request_at = now;
        let delay = (self.setup.host_rtt + self.setup.origin_rtt) / 2.0;
        self.push(now + delay, Kind::OriginArrive(r));
    }

    /// A run's chunk landed; whether its node is now done.
    fn on_landed(&mut self, r: u32, now: f64) -> bool {
        let Some(run) = self.runs[r as usize].take() else {
            return false;
        };
        self.free_runs.push(r);
        let c = &self.chunks[run.chunk as usize];
        let from_peer = run.serving;
        if let Some(peer) = from_peer {
            self.agents[peer as usize].uploads -= 1;
        }
        let t = Transfer {
            peer: from_peer.map(|p| self.agents[p as usize].id.clone()),
            blob: self.blobs[c.blob as usize].clone(),
            range: ByteRange {
                start: c.start,
                end: c.end,
            },
            bytes: c.end - c.start,
            duration_us: ((now - run.request_at) * 1e6).max(1.0) as u64,
            outcome: Outcome::Ok,
        };
        let at = self.at(now);
        let me = self.agents[run.host as usize].id.clone();
        let _ = self.swarm.report(&me, &[t], at);
        self.push(
            now + self.setup.host_rtt / 2.0,
            Kind::Announce {
                host: run.host,
                chunk: run.chunk,
            },
        );
        let total = self.chunks.len();
        let first = self.agents[run.host as usize].first_chunk;
        let a = &mut self.agents[run.host as usize];
        a.has[run.chunk as usize] = true;
        a.landed += 1;
        let pos = (run.chunk as usize + total - first) % total;
        a.landed_ahead[pos] = true;
        while a.read_at < total && a.landed_ahead[a.read_at] {
            a.read_at += 1;
        }
        if a.landed == total {
            a.done = Some(now);
            return true;
        }
        self.start_runs(run.host, now);
        false
    }
}

/// "h{k}" → k.
fn host_index(id: &HostId) -> u32 {
    id.0[1..].parse().unwrap_or(0)
}
