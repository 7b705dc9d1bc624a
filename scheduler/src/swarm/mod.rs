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
//!
//! This module holds the state and what changes it (register, heartbeat, announce,
//! report, leave, expire); `decide` answers "who has this range" (ranking holders,
//! origin single flight, waits); `views` is what the admin API sees and pulls (host,
//! blob and image views, counters, the blocklist and drains). The range arithmetic is
//! [`tessera_proto::ranges`].

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tessera_proto::domain::{Announce, BlobDigest, ByteRange, Host, HostId, Outcome, Transfer};
use tessera_proto::ranges::{merge, overlaps, subtract};

mod decide;
#[cfg(test)]
mod testing;
mod views;

pub use decide::Decision;
pub use views::{BlobView, Counters, HostView, ImageView, SwarmStats};

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
    /// "Not found" answers for ranges this scheduler said it held, since its last full
    /// announcement: it held less than it announced, so it ranks like a failing peer
    /// (its drops may still be on their way) until a full announcement makes its
    /// holdings true again.
    misses: u32,
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
}

/// An origin fetch under way.
#[derive(Debug, Clone)]
struct Flight {
    range: ByteRange,
    host: Slot,
    started: Instant,
}

/// What one host holds of one blob: the one record both the hosts view (bytes held)
/// and the blob view are derived from, so they cannot disagree.
#[derive(Debug)]
struct Holding {
    slot: Slot,
    /// Merged and sorted.
    ranges: Vec<ByteRange>,
    /// The bytes `ranges` span, kept with them by the methods below (the admin's host
    /// list must not walk every range of every holding).
    bytes: u64,
}

impl Holding {
    fn add(&mut self, ranges: impl IntoIterator<Item = ByteRange>) {
        self.ranges.extend(ranges);
        merge(&mut self.ranges);
        self.bytes = span(&self.ranges);
    }

    /// Takes `range` off; the bytes it held of it.
    fn subtract(&mut self, range: ByteRange) -> u64 {
        let before = self.bytes;
        subtract(&mut self.ranges, range);
        self.bytes = span(&self.ranges);
        before - self.bytes
    }
}

fn span(ranges: &[ByteRange]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

#[derive(Debug)]
struct BlobState {
    /// Holders with what they hold; `position` finds a holder's entry.
    holders: Vec<Holding>,
    position: HashMap<Slot, usize>,
    flights: Vec<Flight>,
    /// The whole blob's size, once an announcer said.
    size: Option<u64>,
}

impl BlobState {
    fn remove_holder(&mut self, slot: Slot) {
        if let Some(i) = self.position.remove(&slot) {
            self.holders.swap_remove(i);
            if let Some(moved) = self.holders.get(i) {
                self.position.insert(moved.slot, i);
            }
        }
    }

    fn holding_mut(&mut self, slot: Slot) -> Option<&mut Holding> {
        let i = *self.position.get(&slot)?;
        self.holders.get_mut(i)
    }

    /// The bytes `slot` holds of this blob.
    fn bytes_of(&self, slot: Slot) -> u64 {
        self.position
            .get(&slot)
            .and_then(|&i| self.holders.get(i))
            .map_or(0, |h| h.bytes)
    }
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
            misses: 0,
            registered: now,
            resting_until: None,
            blobs: Vec::new(),
            draining: false,
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
            // What it holds is true again: its earlier misses are not held against it.
            self.state_mut(slot).misses = 0;
            self.stop_using_images(slot);
        }
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
                    blob.holders.push(Holding {
                        slot,
                        ranges: Vec::new(),
                        bytes: 0,
                    });
                    blob.position.insert(slot, blob.holders.len() - 1);
                    blob.holders.len() - 1
                }
            };
            let holding = &mut blob.holders[i];
            holding.add(held.ranges);
            // What it announced of its flights is no longer in flight: others now get
            // this host for that part. The rest of a flight still is, and the
            // announcement shows it making progress, so its timeout starts again: an
            // agent announces each chunk of a long origin run as it lands, and ending
            // the whole flight at the first would send others to the origin for the
            // chunks still on their way.
            let ranges = holding.ranges.clone();
            let mut flights = Vec::with_capacity(blob.flights.len());
            for f in blob.flights.drain(..) {
                if f.host != slot || !ranges.iter().any(|r| overlaps(*r, f.range)) {
                    flights.push(f);
                    continue;
                }
                let mut rest = vec![f.range];
                for r in &ranges {
                    subtract(&mut rest, *r);
                }
                flights.extend(rest.into_iter().map(|range| Flight {
                    range,
                    host: slot,
                    started: now,
                }));
            }
            blob.flights = flights;
        }
        for dropped in a.dropped {
            if let Some(&ix) = self.blob_ids.get(&dropped.blob) {
                if let Some(holding) = self.blobs[ix as usize].holding_mut(slot) {
                    for r in dropped.ranges {
                        holding.subtract(r);
                    }
                }
            }
        }
        Ok(())
    }

    /// Learns from transfers: speeds and successes raise a peer, failures rest it, and
    /// verification failures exclude it. A "not found" for a range the peer was said
    /// to hold takes the range off it and counts as a failure and a miss (see
    /// `HostState::misses`). A failed origin fetch ends the reporter's flight so
    /// another host may try.
    pub fn report(
        &mut self,
        reporter: &HostId,
        transfers: &[Transfer],
        now: Instant,
    ) -> Result<(), UnknownHost> {
        let me = self.live_slot(reporter, now)?;
        // A stream that lacked several stretches is reported as several transfers: it
        // counts as one failure, as a failed stream does.
        let mut missed: Vec<Slot> = Vec::new();
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
                    // It no longer holds the range: forget that it did. If it had not
                    // said so itself (its drops not announced, or lost), the asker
                    // paid a round trip for nothing: rank it like a failing peer.
                    let had = self
                        .blob_ids
                        .get(&t.blob)
                        .and_then(|&ix| self.blobs[ix as usize].holding_mut(slot))
                        .map_or(0, |holding| holding.subtract(t.range));
                    if had > 0 && !missed.contains(&slot) {
                        missed.push(slot);
                        let p = self.state_mut(slot);
                        p.misses = p.misses.saturating_add(1);
                        p.failures += 1;
                        p.consecutive_failures += 1;
                        if p.consecutive_failures >= limit {
                            p.resting_until = Some(now + rest);
                            p.consecutive_failures = 0;
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

    pub fn is_registered(&self, id: &HostId, now: Instant) -> bool {
        self.live_slot(id, now).is_ok()
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
}

#[cfg(test)]
mod tests {
    use super::testing::{announce, blob, find, host};
    use super::*;

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
}

#[cfg(test)]
mod dropped_tests {
    use super::testing::{announce, blob, find, host};
    use super::*;

    fn not_found(peer: &str, start: u64, end: u64) -> Transfer {
        Transfer {
            peer: Some(HostId(peer.into())),
            blob: blob(),
            range: ByteRange { start, end },
            bytes: 0,
            duration_us: 10,
            outcome: Outcome::NotFound,
        }
    }

    fn bytes_held(s: &Swarm, id: &str, now: Instant) -> u64 {
        s.host(&HostId(id.into()), now).unwrap().bytes_held
    }

    fn first_peer(s: &mut Swarm, start: u64, end: u64, now: Instant) -> String {
        match s.find_peers(&find("me", start, end), now).unwrap() {
            Decision::Peers(p) => p[0].0 .0.clone(),
            d => panic!("{d:?}"),
        }
    }

    /// A "not found" answer for a range the scheduler said the peer held takes that
    /// range off the peer in the one record both views are derived from (the hosts
    /// view's bytes_held and the blob view agree), and down-ranks the peer until its
    /// next full announcement; a success in between does not lift it.
    #[test]
    fn not_found_shrinks_both_views_and_down_ranks_until_a_full_announce() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["a", "b", "me"] {
            s.register(host(id, "z"), now);
        }
        announce(&mut s, "a", 0, 1000, now);
        announce(&mut s, "b", 0, 1000, now);
        s.report(&HostId("me".into()), &[not_found("a", 0, 100)], now)
            .unwrap();
        assert_eq!(bytes_held(&s, "a", now), 900);
        let total: u64 = s.blobs().iter().map(|b| b.total_bytes_held).sum();
        assert_eq!(total, bytes_held(&s, "a", now) + bytes_held(&s, "b", now));

        // Both hold 500..600 whole: the peer that said "not found" comes second, even
        // after a success from it, lookup after lookup (heartbeats reset the spreading).
        let success = Transfer {
            outcome: Outcome::Ok,
            bytes: 100,
            range: ByteRange {
                start: 200,
                end: 300,
            },
            ..not_found("a", 0, 0)
        };
        s.report(&HostId("me".into()), &[success], now).unwrap();
        for step in 1..=3 {
            let t = now + Duration::from_secs(step);
            for id in ["a", "b", "me"] {
                s.heartbeat(&HostId(id.into()), 0, t).unwrap();
            }
            assert_eq!(first_peer(&mut s, 500, 600, t), "b", "lookup {step}");
        }

        // Its next full announcement ends it: a is ranked as before (b, offered last,
        // spreads the next lookup to a).
        let t = now + Duration::from_secs(4);
        for id in ["a", "b", "me"] {
            s.heartbeat(&HostId(id.into()), 0, t).unwrap();
        }
        s.announce(
            Announce {
                host: HostId("a".into()),
                held: vec![tessera_proto::domain::BlobRanges {
                    blob: blob(),
                    ranges: vec![ByteRange {
                        start: 0,
                        end: 1000,
                    }],
                    size: None,
                }],
                dropped: vec![],
                full: true,
                images: vec![],
            },
            t,
        )
        .unwrap();
        assert_eq!(bytes_held(&s, "a", t), 1000);
        let firsts: HashSet<String> = (0..2).map(|_| first_peer(&mut s, 500, 600, t)).collect();
        assert_eq!(firsts.len(), 2, "a was still down-ranked: {firsts:?}");
    }

    /// A "not found" for a range the peer had already announced as dropped is no
    /// fault of the peer: it is not down-ranked.
    #[test]
    fn not_found_for_an_announced_drop_is_not_held_against_the_peer() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["a", "b", "me"] {
            s.register(host(id, "z"), now);
        }
        announce(&mut s, "a", 0, 1000, now);
        announce(&mut s, "b", 0, 1000, now);
        s.announce(
            Announce {
                host: HostId("a".into()),
                held: vec![],
                dropped: vec![tessera_proto::domain::BlobRanges {
                    blob: blob(),
                    ranges: vec![ByteRange { start: 0, end: 100 }],
                    size: None,
                }],
                full: false,
                images: vec![],
            },
            now,
        )
        .unwrap();
        assert_eq!(bytes_held(&s, "a", now), 900);
        s.report(&HostId("me".into()), &[not_found("a", 0, 100)], now)
            .unwrap();
        let firsts: HashSet<String> = (0..2).map(|_| first_peer(&mut s, 500, 600, now)).collect();
        assert_eq!(firsts.len(), 2, "a was down-ranked: {firsts:?}");
    }
}
