//! The scheduler's picture of the swarm, in memory only: hosts with their leases, what
//! each holds (byte ranges of blobs), and how transfers from each went. A restarted
//! scheduler starts empty; agents re-register and re-announce when their heartbeat is
//! answered with "re-register".
//!
//! Sized for large swarms: hosts and blobs are interned as small numbers, so each
//! holding (a host's ranges of one blob) costs about a hundred bytes — 1.1 GiB for
//! 10,000 hosts × 1,000 blobs — and a lookup ranks a bounded sample of a blob's holders
//! (starting at a rotating place) instead of all of them. Forgetting a host touches
//! only the blobs it held.
//!
//! All methods take `now`, so leases, waits and penalties are tested without sleeping.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use serde::Serialize;
use std::time::{Duration, Instant};

use tessera_proto::domain::{
    Announce, BlobDigest, ByteRange, FindPeers, Host, HostId, Outcome, Transfer,
};

/// Tunables of the swarm.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// How long a registration lasts without a heartbeat.
    pub lease: Duration,
    /// Hosts sent to the origin at once for overlapping ranges nobody holds. One keeps
    /// origin egress at about one copy of the image however many hosts pull it.
    pub origin_fetchers: usize,
    /// How long the others are told to wait before asking again.
    pub wait: Duration,
    /// An origin fetch not followed by an announcement within this long is presumed
    /// failed: more hosts may go to the origin.
    pub origin_timeout: Duration,
    /// Peers returned per answer.
    pub peers_returned: usize,
    /// Usable holders ranked per answer (a sample: ranking every holder of a hot blob
    /// in a 10,000-host swarm would make every lookup slow).
    pub sample: usize,
    /// Verification failures after which a host is no longer offered as a peer.
    pub verification_failure_limit: u32,
    /// Consecutive transfer failures after which a host is rested for `rest`.
    pub failure_limit: u32,
    pub rest: Duration,
}

impl Default for SwarmConfig {
    fn default() -> Self {
        SwarmConfig {
            lease: Duration::from_secs(30),
            origin_fetchers: 1,
            wait: Duration::from_millis(200),
            origin_timeout: Duration::from_secs(10),
            peers_returned: 4,
            sample: 32,
            verification_failure_limit: 2,
            failure_limit: 3,
            rest: Duration::from_secs(30),
        }
    }
}

/// A host's slot in [`Swarm::slots`].
type Slot = u32;
/// A blob's index in [`Swarm::blobs`].
type BlobIx = u32;

#[derive(Debug)]
struct HostState {
    host: Host,
    expires: Instant,
    active_uploads: u32,
    /// Times this host was offered first since its last heartbeat: spreads a hot range
    /// over holders instead of sending everyone to the best one.
    offered: u32,
    /// Recent upload speed in bytes per second (moving average), from reports.
    speed: f64,
    successes: u64,
    consecutive_failures: u32,
    verification_failures: u32,
    /// Transfers from this host that failed (any way), for its success rate.
    failures: u64,
    /// When the host (re-)registered.
    registered: Instant,
    /// Not offered as a peer before this instant.
    resting_until: Option<Instant>,
    /// Blobs this host holds ranges of or fetches from the origin: what to clean up
    /// when it is forgotten.
    blobs: Vec<BlobIx>,
    /// An administrator is draining it (before maintenance): not offered as a peer
    /// while this registration lasts; uploads under way finish.
    draining: bool,
    /// Bytes of blobs it announced holding, kept as announcements change it (the
    /// admin's host list must not walk every holding of every host).
    bytes_held: u64,
}

/// An origin fetch under way.
#[derive(Debug, Clone)]
struct Flight {
    range: ByteRange,
    host: Slot,
    started: Instant,
}

#[derive(Debug)]
struct BlobState {
    /// Holders with their merged, sorted ranges; `position` finds a holder's entry.
    holders: Vec<(Slot, Vec<ByteRange>)>,
    position: HashMap<Slot, usize>,
    flights: Vec<Flight>,
    /// The whole blob's size, once an announcer said.
    size: Option<u64>,
}

impl BlobState {
    fn remove_holder(&mut self, slot: Slot) {
        if let Some(i) = self.position.remove(&slot) {
            self.holders.swap_remove(i);
            if let Some((moved, _)) = self.holders.get(i) {
                self.position.insert(*moved, i);
            }
        }
    }
}

/// The scheduler's answer to "who has this range".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Fetch from these, in order.
    Peers(Vec<(HostId, SocketAddr)>),
    /// Nobody holds it: this host is one of the few to fetch it from the origin.
    Origin,
    /// Others are fetching it from the origin: ask again after this long.
    Wait(Duration),
}

/// A request from a host the swarm does not know (never registered, or its lease
/// expired): the agent must register again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host {0} is not registered (lease expired or scheduler restarted): register again")]
pub struct UnknownHost(pub String);

/// Hosts, what they hold, and how they served.
#[derive(Debug, Default)]
pub struct Swarm {
    config: SwarmConfig,
    ids: HashMap<HostId, Slot>,
    slots: Vec<Option<HostState>>,
    free_slots: Vec<Slot>,
    blob_ids: HashMap<BlobDigest, BlobIx>,
    blobs: Vec<BlobState>,
    /// Moves where each lookup starts sampling holders.
    cursor: u64,
    /// Hosts an administrator blocked: never offered as peers (the admin store keeps
    /// the list across restarts and sets it here).
    blocked: HashSet<HostId>,
    counters: Counters,
    /// Images hosts said they use, for the admin's view.
    images: HashMap<String, ImageState>,
}

/// An image some hosts use.
#[derive(Debug, Default)]
struct ImageState {
    blobs: Vec<BlobDigest>,
    users: HashSet<Slot>,
}

/// An image as the admin API shows it. With several replicas, each knows only the
/// blobs placed on it, so completeness is counted over `blobs_known_here`.
#[derive(Debug, Clone, Serialize)]
pub struct ImageView {
    pub image: String,
    pub blobs: usize,
    pub blobs_known_here: usize,
    /// Hosts that use it (mounted or preheated it).
    pub hosts: usize,
    /// Hosts holding every blob known here whole.
    pub complete_hosts: usize,
    /// The sum of the blobs' sizes, when all are known here.
    pub bytes: Option<u64>,
}

/// What happened since the scheduler started, for the admin API and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Bytes agents reported fetching from peers, and from the origin.
    pub peer_bytes: u64,
    pub origin_bytes: u64,
    /// Transfers reported as failing verification.
    pub verification_failures: u64,
    /// Other failed transfers (timeouts, connections, not found…).
    pub failed_transfers: u64,
    /// Lookups answered with peers, with the origin, with a wait.
    pub lookups_peers: u64,
    pub lookups_origin: u64,
    pub lookups_wait: u64,
}

/// A host as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HostView {
    pub id: String,
    pub address: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Milliseconds since the host (re-)registered, and since its last heartbeat.
    pub registered_ms_ago: u64,
    pub last_seen_ms_ago: u64,
    pub blobs_held: usize,
    /// Bytes of blobs the host announced holding.
    pub bytes_held: u64,
    pub active_uploads: u32,
    pub max_uploads: u32,
    /// Recent upload speed to peers (bytes/s), from reports.
    pub upload_speed_bps: u64,
    pub successes: u64,
    pub failures: u64,
    /// successes / (successes + failures); `null` before any transfer.
    pub success_rate: Option<f64>,
    pub verification_failures: u32,
    /// Not offered as a peer now: resting after failures, excluded after verification
    /// failures, or blocked.
    pub resting: bool,
    pub excluded: bool,
    pub blocked: bool,
    /// Being drained by an administrator until it registers again.
    pub draining: bool,
}

/// A blob as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BlobView {
    pub blob: String,
    pub holders: usize,
    /// The most bytes of it one holder announced, and the sum over holders.
    pub max_bytes_held: u64,
    pub total_bytes_held: u64,
    /// Its size, when an announcer knew it; then how many holders hold all of it.
    pub size: Option<u64>,
    pub complete_holders: usize,
    /// Origin fetches of it under way.
    pub origin_fetches: usize,
}

/// The swarm in numbers.
#[derive(Debug, Clone, Serialize)]
pub struct SwarmStats {
    pub hosts: usize,
    pub blobs: usize,
    pub blocked_hosts: usize,
    pub active_origin_fetches: usize,
    pub active_uploads: u64,
    #[serde(flatten)]
    pub counters: Counters,
    /// peer bytes / (peer + origin bytes): the share of data the swarm kept off the
    /// registry; `null` before any transfer.
    pub origin_offload_ratio: Option<f64>,
}

fn merge(ranges: &mut Vec<ByteRange>) {
    ranges.sort_unstable();
    let mut out: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    *ranges = out;
}

fn overlaps(a: ByteRange, b: ByteRange) -> bool {
    a.start < b.end && b.start < a.end
}

/// Bytes of `want` that `ranges` (merged, sorted) hold.
fn covered(ranges: &[ByteRange], want: ByteRange) -> u64 {
    ranges
        .iter()
        .skip(ranges.partition_point(|r| r.end <= want.start))
        .take_while(|r| r.start < want.end)
        .map(|r| r.end.min(want.end) - r.start.max(want.start))
        .sum()
}

#[cfg(test)]
fn covers(ranges: &[ByteRange], want: ByteRange) -> bool {
    covered(ranges, want) == want.end - want.start
}

fn subtract(ranges: &mut Vec<ByteRange>, gone: ByteRange) {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for r in ranges.drain(..) {
        if r.end <= gone.start || r.start >= gone.end {
            out.push(r);
            continue;
        }
        if r.start < gone.start {
            out.push(ByteRange {
                start: r.start,
                end: gone.start,
            });
        }
        if r.end > gone.end {
            out.push(ByteRange {
                start: gone.end,
                end: r.end,
            });
        }
    }
    *ranges = out;
}

impl Swarm {
    pub fn new(config: SwarmConfig) -> Self {
        Swarm {
            config,
            ..Swarm::default()
        }
    }

    pub fn host_count(&self) -> usize {
        self.ids.len()
    }

    /// Joins (or re-joins, keeping nothing of before) the swarm; returns the lease.
    pub fn register(&mut self, host: Host, now: Instant) -> Duration {
        let id = host.id.clone();
        self.forget(&id);
        let state = HostState {
            host,
            expires: now + self.config.lease,
            active_uploads: 0,
            offered: 0,
            speed: 0.0,
            successes: 0,
            consecutive_failures: 0,
            verification_failures: 0,
            failures: 0,
            registered: now,
            resting_until: None,
            blobs: Vec::new(),
            draining: false,
            bytes_held: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(state);
                slot
            }
            None => {
                self.slots.push(Some(state));
                (self.slots.len() - 1) as Slot
            }
        };
        self.ids.insert(id, slot);
        self.config.lease
    }

    /// Renews a lease and records the host's upload load.
    pub fn heartbeat(
        &mut self,
        id: &HostId,
        active_uploads: u32,
        now: Instant,
    ) -> Result<Duration, UnknownHost> {
        let lease = self.config.lease;
        let slot = self.live_slot(id, now)?;
        let h = self.state_mut(slot);
        h.expires = now + lease;
        h.active_uploads = active_uploads;
        h.offered = 0;
        Ok(lease)
    }

    fn live_slot(&self, id: &HostId, now: Instant) -> Result<Slot, UnknownHost> {
        match self.ids.get(id) {
            Some(&slot) if self.state(slot).is_some_and(|h| h.expires > now) => Ok(slot),
            _ => Err(UnknownHost(id.0.clone())),
        }
    }

    fn state(&self, slot: Slot) -> Option<&HostState> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    /// The state of a slot known to be live (callers hold it from `live_slot`).
    fn state_mut(&mut self, slot: Slot) -> &mut HostState {
        match self.slots.get_mut(slot as usize).and_then(Option::as_mut) {
            Some(h) => h,
            None => unreachable!("slot {slot} of a live host is empty"),
        }
    }

    /// The blob's index, interning it (and noting that `slot` has a stake in it).
    fn blob_ix(&mut self, digest: &BlobDigest, slot: Slot) -> BlobIx {
        let ix = match self.blob_ids.get(digest) {
            Some(&ix) => ix,
            None => {
                let ix = self.blobs.len() as BlobIx;
                self.blobs.push(BlobState {
                    holders: Vec::new(),
                    position: HashMap::new(),
                    flights: Vec::new(),
                    size: None,
                });
                self.blob_ids.insert(digest.clone(), ix);
                ix
            }
        };
        let h = self.state_mut(slot);
        if !h.blobs.contains(&ix) {
            h.blobs.push(ix);
        }
        ix
    }

    /// Records what a host holds (adding, or replacing with `full`) and no longer holds.
    /// Its origin fetches of ranges it now announces are over.
    pub fn announce(&mut self, a: Announce, now: Instant) -> Result<(), UnknownHost> {
        let slot = self.live_slot(&a.host, now)?;
        if a.full {
            for ix in std::mem::take(&mut self.state_mut(slot).blobs) {
                let blob = &mut self.blobs[ix as usize];
                blob.remove_holder(slot);
                blob.flights.retain(|f| f.host != slot);
            }
            self.state_mut(slot).bytes_held = 0;
            self.stop_using_images(slot);
        }
        let span = |ranges: &[ByteRange]| ranges.iter().map(|r| r.end - r.start).sum::<u64>();
        let (mut added, mut removed) = (0u64, 0u64);
        for image in a.images {
            let state = self.images.entry(image.image).or_default();
            state.blobs = image.blobs;
            state.users.insert(slot);
        }
        for held in a.held {
            let ix = self.blob_ix(&held.blob, slot);
            let blob = &mut self.blobs[ix as usize];
            if held.size.is_some() {
                blob.size = held.size;
            }
            let i = match blob.position.get(&slot) {
                Some(&i) => i,
                None => {
                    blob.holders.push((slot, Vec::new()));
                    blob.position.insert(slot, blob.holders.len() - 1);
                    blob.holders.len() - 1
                }
            };
            let ranges = &mut blob.holders[i].1;
            let before = span(ranges);
            ranges.extend(held.ranges);
            merge(ranges);
            added += span(ranges) - before;
            // Any part announced ends the flight: others now get this host for that
            // part and ask again for the rest (going to the origin if nobody has it).
            let ranges = ranges.clone();
            blob.flights
                .retain(|f| f.host != slot || !ranges.iter().any(|r| overlaps(*r, f.range)));
        }
        for dropped in a.dropped {
            if let Some(&ix) = self.blob_ids.get(&dropped.blob) {
                let blob = &mut self.blobs[ix as usize];
                if let Some(&i) = blob.position.get(&slot) {
                    let before = span(&blob.holders[i].1);
                    for r in dropped.ranges {
                        subtract(&mut blob.holders[i].1, r);
                    }
                    removed += before - span(&blob.holders[i].1);
                }
            }
        }
        let h = self.state_mut(slot);
        h.bytes_held = (h.bytes_held + added).saturating_sub(removed);
        Ok(())
    }

    /// Who should serve `f.range` of `f.blob` to `f.host`: holders of it (those holding
    /// all of it first, then by score), or — when nobody holds any of it — the origin
    /// for a few hosts and a short wait for the rest.
    pub fn find_peers(&mut self, f: &FindPeers, now: Instant) -> Result<Decision, UnknownHost> {
        let decision = self.decide(f, now)?;
        let c = &mut self.counters;
        match decision {
            Decision::Peers(_) => c.lookups_peers += 1,
            Decision::Origin => c.lookups_origin += 1,
            Decision::Wait(_) => c.lookups_wait += 1,
        }
        Ok(decision)
    }

    fn decide(&mut self, f: &FindPeers, now: Instant) -> Result<Decision, UnknownHost> {
        let me = self.live_slot(&f.host, now)?;
        let zone = self.state_mut(me).host.labels.get("zone").cloned();
        let ix = self.blob_ix(&f.blob, me);
        self.cursor = self.cursor.wrapping_add(1);
        let (config, cursor) = (&self.config, self.cursor);
        let blob = &self.blobs[ix as usize];
        let want = f.range.end - f.range.start;
        let n = blob.holders.len();
        // A sample of usable holders, starting somewhere new each time; stop early once
        // it holds `sample` hosts, or after looking at a bounded number of entries.
        let start = if n == 0 {
            0
        } else {
            (cursor.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n as u64) as usize
        };
        let mut candidates: Vec<(bool, f64, Slot)> = Vec::new();
        for k in 0..n.min(config.sample * 16) {
            let (slot, ranges) = &blob.holders[(start + k) % n];
            if *slot == me {
                continue;
            }
            let held = covered(ranges, f.range);
            if held == 0 {
                continue;
            }
            let Some(h) = self.slots.get(*slot as usize).and_then(Option::as_ref) else {
                continue;
            };
            let usable = h.expires > now
                && h.verification_failures < config.verification_failure_limit
                && h.resting_until.is_none_or(|t| t <= now)
                && !h.draining
                && !self.blocked.contains(&h.host.id);
            if usable {
                candidates.push((held == want, score(h, zone.as_deref()), *slot));
                if candidates.len() >= config.sample {
                    break;
                }
            }
        }
        if !candidates.is_empty() {
            candidates.sort_by(|a, b| {
                b.0.cmp(&a.0)
                    .then_with(|| b.1.total_cmp(&a.1))
                    .then_with(|| a.2.cmp(&b.2))
            });
            candidates.truncate(config.peers_returned);
            self.state_mut(candidates[0].2).offered += 1;
            let peers = candidates
                .iter()
                .filter_map(|(_, _, slot)| self.state(*slot))
                .map(|h| (h.host.id.clone(), h.host.address))
                .collect();
            return Ok(Decision::Peers(peers));
        }
        // Nobody holds any of it: only a few go to the origin; the others wait for them.
        let (fetchers, timeout, wait) =
            (config.origin_fetchers, config.origin_timeout, config.wait);
        let blob = &mut self.blobs[ix as usize];
        blob.flights
            .retain(|fl| now.duration_since(fl.started) <= timeout);
        // Asking again keeps one's own flight alive: an agent streaming a whole large
        // blob from the origin (the registry mirror) asks every few seconds.
        if let Some(mine) = blob
            .flights
            .iter_mut()
            .find(|fl| fl.host == me && overlaps(fl.range, f.range))
        {
            mine.started = now;
            return Ok(Decision::Origin);
        }
        let mut others: Vec<Slot> = Vec::new();
        for fl in blob.flights.iter().filter(|fl| overlaps(fl.range, f.range)) {
            if !others.contains(&fl.host) {
                others.push(fl.host);
            }
        }
        if others.len() < fetchers {
            blob.flights.push(Flight {
                range: f.range,
                host: me,
                started: now,
            });
            return Ok(Decision::Origin);
        }
        Ok(Decision::Wait(wait))
    }

    /// Learns from transfers: speeds and successes raise a peer, failures rest it, and
    /// verification failures exclude it. A failed origin fetch ends the reporter's
    /// flight so another host may try.
    pub fn report(
        &mut self,
        reporter: &HostId,
        transfers: &[Transfer],
        now: Instant,
    ) -> Result<(), UnknownHost> {
        let me = self.live_slot(reporter, now)?;
        for t in transfers {
            let c = &mut self.counters;
            match (t.outcome, &t.peer) {
                (Outcome::Ok, Some(_)) => c.peer_bytes += t.bytes,
                (Outcome::Ok, None) => c.origin_bytes += t.bytes,
                (Outcome::VerificationFailed, _) => c.verification_failures += 1,
                _ => c.failed_transfers += 1,
            }
            let Some(peer) = &t.peer else {
                if t.outcome != Outcome::Ok {
                    if let Some(&ix) = self.blob_ids.get(&t.blob) {
                        self.blobs[ix as usize]
                            .flights
                            .retain(|f| f.host != me || !overlaps(f.range, t.range));
                    }
                }
                continue;
            };
            let Some(&slot) = self.ids.get(peer) else {
                continue;
            };
            let (limit, rest) = (self.config.failure_limit, self.config.rest);
            let p = self.state_mut(slot);
            match t.outcome {
                Outcome::Ok => {
                    p.successes += 1;
                    p.consecutive_failures = 0;
                    if t.duration_us > 0 {
                        let speed = t.bytes as f64 / (t.duration_us as f64 / 1e6);
                        p.speed = if p.speed == 0.0 {
                            speed
                        } else {
                            0.8 * p.speed + 0.2 * speed
                        };
                    }
                }
                Outcome::VerificationFailed => {
                    p.verification_failures += 1;
                    p.failures += 1;
                    tracing::warn!(peer = %peer.0, reporter = %reporter.0, "peer served bytes that failed verification");
                }
                Outcome::NotFound => {
                    // It no longer holds the range: forget that it did.
                    if let Some(&ix) = self.blob_ids.get(&t.blob) {
                        let blob = &mut self.blobs[ix as usize];
                        if let Some(&i) = blob.position.get(&slot) {
                            subtract(&mut blob.holders[i].1, t.range);
                        }
                    }
                }
                Outcome::Timeout | Outcome::Connection | Outcome::Other => {
                    p.failures += 1;
                    p.consecutive_failures += 1;
                    if p.consecutive_failures >= limit {
                        p.resting_until = Some(now + rest);
                        p.consecutive_failures = 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// Blocks (or unblocks) a host: a blocked host is never offered as a peer. Hosts
    /// need not be registered (the blocklist outlives them).
    pub fn set_blocked(&mut self, id: &HostId, blocked: bool) {
        if blocked {
            self.blocked.insert(id.clone());
        } else {
            self.blocked.remove(id);
        }
    }

    /// Drains (or stops draining) a registered host: while draining it is not offered
    /// as a peer, and its uploads under way run down (`active_uploads` in its view).
    /// Registering again (after maintenance) ends it.
    pub fn set_draining(
        &mut self,
        id: &HostId,
        draining: bool,
        now: Instant,
    ) -> Result<(), UnknownHost> {
        let slot = self.live_slot(id, now)?;
        self.state_mut(slot).draining = draining;
        Ok(())
    }

    pub fn is_registered(&self, id: &HostId, now: Instant) -> bool {
        self.live_slot(id, now).is_ok()
    }

    /// Every live host, sorted by id.
    pub fn hosts(&self, now: Instant) -> Vec<HostView> {
        let mut out: Vec<HostView> = self
            .ids
            .values()
            .filter_map(|&slot| self.state(slot))
            .filter(|h| h.expires > now)
            .map(|h| self.host_view(h, now))
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    pub fn host(&self, id: &HostId, now: Instant) -> Option<HostView> {
        let slot = self.live_slot(id, now).ok()?;
        self.state(slot).map(|h| self.host_view(h, now))
    }

    fn host_view(&self, h: &HostState, now: Instant) -> HostView {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let remaining = h.expires.saturating_duration_since(now);
        let transfers = h.successes + h.failures;
        HostView {
            id: h.host.id.0.clone(),
            address: h.host.address.to_string(),
            labels: h.host.labels.clone(),
            registered_ms_ago: ms(now.saturating_duration_since(h.registered)),
            last_seen_ms_ago: ms(self.config.lease.saturating_sub(remaining)),
            blobs_held: h.blobs.len(),
            bytes_held: h.bytes_held,
            active_uploads: h.active_uploads,
            max_uploads: h.host.max_uploads,
            upload_speed_bps: h.speed as u64,
            successes: h.successes,
            failures: h.failures,
            success_rate: (transfers > 0).then(|| h.successes as f64 / transfers as f64),
            verification_failures: h.verification_failures,
            resting: h.resting_until.is_some_and(|t| t > now),
            excluded: h.verification_failures >= self.config.verification_failure_limit,
            blocked: self.blocked.contains(&h.host.id),
            draining: h.draining,
        }
    }

    /// Every blob somebody holds or fetches, most held first.
    pub fn blobs(&self) -> Vec<BlobView> {
        let mut out: Vec<BlobView> = self
            .blob_ids
            .iter()
            .map(|(digest, &ix)| {
                let blob = &self.blobs[ix as usize];
                let held: Vec<u64> = blob
                    .holders
                    .iter()
                    .map(|(_, ranges)| ranges.iter().map(|r| r.end - r.start).sum())
                    .collect();
                BlobView {
                    blob: digest.0.clone(),
                    holders: held.iter().filter(|&&b| b > 0).count(),
                    max_bytes_held: held.iter().copied().max().unwrap_or(0),
                    total_bytes_held: held.iter().sum(),
                    size: blob.size,
                    complete_holders: blob
                        .holders
                        .iter()
                        .filter(|(slot, _)| self.holds_whole(ix, *slot))
                        .count(),
                    origin_fetches: blob.flights.len(),
                }
            })
            .filter(|b| b.holders > 0 || b.origin_fetches > 0)
            .collect();
        out.sort_by(|a, b| b.holders.cmp(&a.holders).then_with(|| a.blob.cmp(&b.blob)));
        out
    }

    pub fn stats(&self, now: Instant) -> SwarmStats {
        let live: Vec<&HostState> = self
            .ids
            .values()
            .filter_map(|&slot| self.state(slot))
            .filter(|h| h.expires > now)
            .collect();
        let c = self.counters;
        let moved = c.peer_bytes + c.origin_bytes;
        SwarmStats {
            hosts: live.len(),
            blobs: self
                .blobs
                .iter()
                .filter(|b| !b.holders.is_empty() || !b.flights.is_empty())
                .count(),
            blocked_hosts: self.blocked.len(),
            active_origin_fetches: self.blobs.iter().map(|b| b.flights.len()).sum(),
            active_uploads: live.iter().map(|h| u64::from(h.active_uploads)).sum(),
            counters: c,
            origin_offload_ratio: (moved > 0).then(|| c.peer_bytes as f64 / moved as f64),
        }
    }

    /// Leaves: the host and what it held are forgotten.
    pub fn leave(&mut self, id: &HostId) {
        self.forget(id);
    }

    /// Forgets hosts whose lease ran out.
    pub fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<HostId> = self
            .ids
            .iter()
            .filter(|(_, &slot)| self.state(slot).is_none_or(|h| h.expires <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.forget(id);
        }
        expired.len()
    }

    /// Removes a host and everything it held or was fetching: only its own blobs.
    fn forget(&mut self, id: &HostId) {
        let Some(slot) = self.ids.remove(id) else {
            return;
        };
        let Some(state) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        for ix in state.blobs {
            let blob = &mut self.blobs[ix as usize];
            blob.remove_holder(slot);
            blob.flights.retain(|f| f.host != slot);
        }
        self.stop_using_images(slot);
        self.free_slots.push(slot);
    }

    /// `slot` no longer uses any image; images nobody uses are forgotten.
    fn stop_using_images(&mut self, slot: Slot) {
        self.images.retain(|_, image| {
            image.users.remove(&slot);
            !image.users.is_empty()
        });
    }

    /// Whether `slot` holds all of blob `ix` (its size known).
    fn holds_whole(&self, ix: BlobIx, slot: Slot) -> bool {
        let blob = &self.blobs[ix as usize];
        let (Some(size), Some(&i)) = (blob.size, blob.position.get(&slot)) else {
            return false;
        };
        blob.holders[i]
            .1
            .first()
            .is_some_and(|r| r.start == 0 && r.end >= size)
    }

    /// Every image hosts use, most used first.
    pub fn images(&self) -> Vec<ImageView> {
        let mut out: Vec<ImageView> = self
            .images
            .iter()
            .map(|(name, image)| {
                let known: Vec<BlobIx> = image
                    .blobs
                    .iter()
                    .filter_map(|b| self.blob_ids.get(b).copied())
                    .collect();
                let sizes: Option<Vec<u64>> = known
                    .iter()
                    .map(|&ix| self.blobs[ix as usize].size)
                    .collect();
                ImageView {
                    image: name.clone(),
                    blobs: image.blobs.len(),
                    blobs_known_here: known.len(),
                    hosts: image.users.len(),
                    complete_hosts: image
                        .users
                        .iter()
                        .filter(|&&slot| {
                            !known.is_empty() && known.iter().all(|&ix| self.holds_whole(ix, slot))
                        })
                        .count(),
                    bytes: sizes
                        .filter(|_| known.len() == image.blobs.len())
                        .map(|s| s.iter().sum()),
                }
            })
            .collect();
        out.sort_by(|a, b| b.hosts.cmp(&a.hosts).then_with(|| a.image.cmp(&b.image)));
        out
    }
}

/// Higher is better: same zone, spare upload slots, fast, reliable, not just offered.
fn score(h: &HostState, zone: Option<&str>) -> f64 {
    let same_zone = zone.is_some() && h.host.labels.get("zone").map(String::as_str) == zone;
    let free = f64::from(h.host.max_uploads.saturating_sub(h.active_uploads))
        / f64::from(h.host.max_uploads.max(1));
    let speed = (h.speed / 1e6).min(1000.0).ln_1p() / 1000f64.ln_1p();
    let reliability = 1.0 / (1.0 + f64::from(h.consecutive_failures));
    let recently_offered = f64::from(h.offered);
    (if same_zone { 2.0 } else { 0.0 }) + free + speed + reliability - 0.5 * recently_offered
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tessera_proto::domain::BlobRanges;

    fn host(id: &str, zone: &str) -> Host {
        Host {
            id: HostId(id.into()),
            address: format!("10.0.0.{}:7070", id.len()).parse().unwrap(),
            labels: BTreeMap::from([("zone".to_string(), zone.to_string())]),
            upload_limit_bps: None,
            max_uploads: 4,
        }
    }

    fn blob() -> BlobDigest {
        BlobDigest(format!("sha256:{}", "a".repeat(64)))
    }

    fn find(id: &str, start: u64, end: u64) -> FindPeers {
        FindPeers {
            host: HostId(id.into()),
            blob: blob(),
            range: ByteRange { start, end },
        }
    }

    fn announce(s: &mut Swarm, id: &str, start: u64, end: u64, now: Instant) {
        s.announce(
            Announce {
                host: HostId(id.into()),
                held: vec![BlobRanges {
                    blob: blob(),
                    ranges: vec![ByteRange { start, end }],
                    size: None,
                }],
                dropped: vec![],
                full: false,
                images: vec![],
            },
            now,
        )
        .unwrap();
    }

    #[test]
    fn images_and_whole_holders_are_counted() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["a", "b"] {
            s.register(host(id, "z"), now);
        }
        let sized = |id: &str, end: u64| Announce {
            host: HostId(id.into()),
            held: vec![BlobRanges {
                blob: blob(),
                ranges: vec![ByteRange { start: 0, end }],
                size: Some(1000),
            }],
            dropped: vec![],
            full: false,
            images: vec![tessera_proto::domain::ImageBlobs {
                image: "reg/app@sha256:1".into(),
                blobs: vec![blob()],
            }],
        };
        s.announce(sized("a", 1000), now).unwrap();
        s.announce(sized("b", 400), now).unwrap();
        let blobs = s.blobs();
        assert_eq!((blobs[0].size, blobs[0].complete_holders), (Some(1000), 1));
        let images = s.images();
        assert_eq!(images.len(), 1);
        assert_eq!(
            (images[0].hosts, images[0].complete_hosts, images[0].bytes),
            (2, 1, Some(1000))
        );
        let held = |s: &Swarm, id: &str| s.host(&HostId(id.into()), now).unwrap().bytes_held;
        assert_eq!((held(&s, "a"), held(&s, "b")), (1000, 400));
        // Kept as announcements change: more (overlapping), dropped, replaced in full.
        s.announce(sized("b", 600), now).unwrap();
        assert_eq!(held(&s, "b"), 600);
        let mut drop_some = sized("b", 0);
        drop_some.held.clear();
        drop_some.dropped = vec![BlobRanges {
            blob: blob(),
            ranges: vec![ByteRange {
                start: 100,
                end: 200,
            }],
            size: None,
        }];
        s.announce(drop_some, now).unwrap();
        assert_eq!(held(&s, "b"), 500);
        let mut full = sized("b", 300);
        full.full = true;
        s.announce(full, now).unwrap();
        assert_eq!(held(&s, "b"), 300);
        s.leave(&HostId("a".into()));
        s.leave(&HostId("b".into()));
        assert!(s.images().is_empty());
    }

    #[test]
    fn origin_single_flight_then_peers() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for i in 0..10 {
            s.register(host(&format!("h{i}"), "a"), now);
        }
        let decisions: Vec<Decision> = (0..10)
            .map(|i| s.find_peers(&find(&format!("h{i}"), 0, 100), now).unwrap())
            .collect();
        let origin = decisions.iter().filter(|d| **d == Decision::Origin).count();
        assert_eq!(origin, 1, "{decisions:?}");
        assert!(
            decisions
                .iter()
                .filter(|d| matches!(d, Decision::Wait(_)))
                .count()
                == 9
        );
        // The first fetcher announces: everyone else is sent to it.
        announce(&mut s, "h0", 0, 4096, now);
        match s.find_peers(&find("h5", 0, 100), now).unwrap() {
            Decision::Peers(p) => assert_eq!(p[0].0, HostId("h0".into())),
            d => panic!("{d:?}"),
        }
        // A partial holder is offered for what it has (the agent asks again for the
        // rest); a range nobody holds any of goes to the origin.
        match s.find_peers(&find("h5", 4000, 5000), now).unwrap() {
            Decision::Peers(p) => assert_eq!(p[0].0, HostId("h0".into())),
            d => panic!("{d:?}"),
        }
        assert_eq!(
            s.find_peers(&find("h5", 4096, 5000), now).unwrap(),
            Decision::Origin
        );
    }

    #[test]
    fn asking_again_keeps_an_origin_flight_alive() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for i in 0..2 {
            s.register(host(&format!("h{i}"), "a"), now);
        }
        assert_eq!(
            s.find_peers(&find("h0", 0, 100), now).unwrap(),
            Decision::Origin
        );
        // h0 streams a large blob for 40 s, asking again every 5 s: h1 keeps waiting.
        for step in 1..=8 {
            let t = now + Duration::from_secs(5 * step);
            for i in 0..2 {
                s.heartbeat(&HostId(format!("h{i}")), 0, t).unwrap();
            }
            assert_eq!(
                s.find_peers(&find("h0", 0, 100), t).unwrap(),
                Decision::Origin
            );
            assert!(matches!(
                s.find_peers(&find("h1", 0, 100), t).unwrap(),
                Decision::Wait(_)
            ));
        }
        // Once h0 stops asking, its flight times out and h1 may go.
        let t = now + Duration::from_secs(40 + 11);
        s.heartbeat(&HostId("h1".into()), 0, t).unwrap();
        assert_eq!(
            s.find_peers(&find("h1", 0, 100), t).unwrap(),
            Decision::Origin
        );
    }

    #[test]
    fn overlapping_ranges_share_one_origin_fetch() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for i in 0..4 {
            s.register(host(&format!("h{i}"), "a"), now);
        }
        // Runs start and end at different chunks on different hosts.
        assert_eq!(
            s.find_peers(&find("h0", 0, 1000), now).unwrap(),
            Decision::Origin
        );
        for (id, start, end) in [("h1", 500, 1500), ("h2", 900, 1000), ("h3", 0, 10)] {
            assert!(
                matches!(
                    s.find_peers(&find(id, start, end), now).unwrap(),
                    Decision::Wait(_)
                ),
                "{id} was not told to wait"
            );
        }
        // Asking again, the fetcher is still the fetcher.
        assert_eq!(
            s.find_peers(&find("h0", 0, 1000), now).unwrap(),
            Decision::Origin
        );
        // A range beyond every flight goes to the origin at once.
        assert_eq!(
            s.find_peers(&find("h1", 1000, 1500), now).unwrap(),
            Decision::Origin
        );
        // The fetch fails and is reported: the next asker may go to the origin.
        let failed = Transfer {
            peer: None,
            blob: blob(),
            range: ByteRange {
                start: 0,
                end: 1000,
            },
            bytes: 0,
            duration_us: 5,
            outcome: Outcome::Connection,
        };
        s.report(&HostId("h0".into()), &[failed], now).unwrap();
        assert_eq!(
            s.find_peers(&find("h2", 900, 1000), now).unwrap(),
            Decision::Origin
        );
        // h2 announces: its flight ends and h3 is sent to it for the part it holds.
        announce(&mut s, "h2", 900, 1000, now);
        match s.find_peers(&find("h3", 0, 1000), now).unwrap() {
            Decision::Peers(p) => assert_eq!(p[0].0, HostId("h2".into())),
            d => panic!("{d:?}"),
        }
        // A flight whose host went silent times out.
        let later = now + Duration::from_secs(11);
        for i in 0..4 {
            s.heartbeat(&HostId(format!("h{i}")), 0, later).unwrap();
        }
        assert_eq!(
            s.find_peers(&find("h3", 1000, 1500), later).unwrap(),
            Decision::Origin
        );
    }

    #[test]
    fn a_hot_range_is_spread_over_its_holders() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for i in 0..14 {
            s.register(host(&format!("h{i:02}"), "a"), now);
        }
        for i in 0..4 {
            announce(&mut s, &format!("h{i:02}"), 0, 1 << 20, now);
        }
        let mut firsts = HashMap::new();
        for i in 4..14 {
            let Decision::Peers(p) = s
                .find_peers(&find(&format!("h{i:02}"), 0, 4096), now)
                .unwrap()
            else {
                panic!()
            };
            *firsts.entry(p[0].0.clone()).or_insert(0) += 1;
        }
        assert_eq!(
            firsts.len(),
            4,
            "10 askers were not spread over 4 holders: {firsts:?}"
        );
        assert!(firsts.values().all(|&n| n <= 3), "{firsts:?}");
    }

    #[test]
    fn forgetting_a_host_forgets_its_holdings_and_slots_are_reused() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["a", "b", "c"] {
            s.register(host(id, "z"), now);
        }
        announce(&mut s, "a", 0, 100, now);
        s.leave(&HostId("a".into()));
        // "d" takes a's slot: it must not inherit a's holdings.
        s.register(host("d", "z"), now);
        assert_eq!(
            s.find_peers(&find("b", 0, 100), now).unwrap(),
            Decision::Origin
        );
        assert!(matches!(
            s.find_peers(&find("d", 0, 100), now).unwrap(),
            Decision::Wait(_)
        ));
        // Re-registering replaces the host and its holdings: nobody holds the range.
        announce(&mut s, "b", 0, 100, now);
        s.register(host("b", "z"), now);
        assert_eq!(
            s.find_peers(&find("c", 0, 100), now).unwrap(),
            Decision::Origin
        );
        assert_eq!(s.host_count(), 3);
    }

    #[test]
    fn load_spreads_and_zones_come_first() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for (id, zone) in [("p1", "a"), ("p2", "a"), ("p3", "b"), ("me", "a")] {
            s.register(host(id, zone), now);
        }
        for p in ["p1", "p2", "p3"] {
            announce(&mut s, p, 0, 100, now);
        }
        let mut firsts = HashSet::new();
        for _ in 0..6 {
            let Decision::Peers(p) = s.find_peers(&find("me", 0, 100), now).unwrap() else {
                panic!()
            };
            assert_ne!(
                p.iter().position(|x| x.0 .0 == "p3"),
                Some(0),
                "another zone came first"
            );
            firsts.insert(p[0].0.clone());
        }
        assert_eq!(
            firsts.len(),
            2,
            "the hot range always went to the same peer: {firsts:?}"
        );
    }

    #[test]
    fn bad_peers_are_excluded_and_leases_expire() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["bad", "good", "me"] {
            s.register(host(id, "a"), now);
        }
        announce(&mut s, "bad", 0, 100, now);
        announce(&mut s, "good", 0, 100, now);
        let failed = Transfer {
            peer: Some(HostId("bad".into())),
            blob: blob(),
            range: ByteRange { start: 0, end: 100 },
            bytes: 100,
            duration_us: 10,
            outcome: Outcome::VerificationFailed,
        };
        s.report(&HostId("me".into()), &[failed.clone(), failed], now)
            .unwrap();
        for _ in 0..3 {
            let Decision::Peers(p) = s.find_peers(&find("me", 0, 100), now).unwrap() else {
                panic!()
            };
            assert!(p.iter().all(|x| x.0 .0 != "bad"), "{p:?}");
        }
        // Leases: without heartbeats, hosts are forgotten; a heartbeat then says re-register.
        let later = now + Duration::from_secs(31);
        assert_eq!(s.expire(later), 3);
        assert!(s.heartbeat(&HostId("good".into()), 0, later).is_err());
        assert_eq!(s.host_count(), 0);
    }

    #[test]
    fn ranges_merge_and_subtract() {
        let mut r = vec![
            ByteRange { start: 10, end: 20 },
            ByteRange { start: 0, end: 10 },
            ByteRange { start: 30, end: 40 },
        ];
        merge(&mut r);
        assert_eq!(
            r,
            [
                ByteRange { start: 0, end: 20 },
                ByteRange { start: 30, end: 40 }
            ]
        );
        assert!(covers(&r, ByteRange { start: 5, end: 20 }));
        assert!(!covers(&r, ByteRange { start: 15, end: 35 }));
        subtract(&mut r, ByteRange { start: 5, end: 35 });
        assert_eq!(
            r,
            [
                ByteRange { start: 0, end: 5 },
                ByteRange { start: 35, end: 40 }
            ]
        );
    }
}
