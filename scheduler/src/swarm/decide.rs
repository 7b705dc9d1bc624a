//! The answer to "who has this range": usable holders of it ranked (those holding all
//! of it first, then same zone, spare upload slots, speed, reliability, and not the one
//! just offered to everyone), or, when nobody holds any of it, origin single flight: a
//! few hosts go to the origin and the rest are told to wait and ask again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tessera_proto::domain::{ByteRange, FindPeers, HostId};
use tessera_proto::ranges::{covered, overlaps};

use super::{BlobIx, Flight, HostState, Slot, Swarm, UnknownHost};

/// The scheduler's answer to "who has this range".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Fetch from these, in order; each with whether it holds the whole blob.
    Peers(Vec<(HostId, SocketAddr, bool)>),
    /// Nobody holds it: this host is one of the few to fetch it from the origin.
    Origin,
    /// Others are fetching it from the origin: ask again after this long.
    Wait(Duration),
}

impl Swarm {
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
        let candidates = self.rank_holders(ix, me, f.range, zone.as_deref(), now);
        let Some(&first) = candidates.first() else {
            return Ok(self.origin_or_wait(ix, me, f.range, now));
        };
        self.state_mut(first).offered += 1;
        let peers = candidates
            .iter()
            .filter_map(|&slot| {
                let whole = self.holds_whole(ix, slot);
                self.state(slot)
                    .map(|h| (h.host.id.clone(), h.host.address, whole))
            })
            .collect();
        Ok(Decision::Peers(peers))
    }

    /// The best usable holders of any of `range` of blob `ix` for `me`, best first, at
    /// most `peers_returned`; ranked from a sample that starts somewhere new each time
    /// and stops once it holds `sample` hosts, or after a bounded number of entries once
    /// it holds any (with none yet, it looks on: "nobody holds it" must be true).
    fn rank_holders(
        &self,
        ix: BlobIx,
        me: Slot,
        range: ByteRange,
        zone: Option<&str>,
        now: Instant,
    ) -> Vec<Slot> {
        let config = &self.config;
        let blob = &self.blobs[ix as usize];
        let want = range.end - range.start;
        let n = blob.holders.len();
        let start = if n == 0 {
            0
        } else {
            (self.cursor.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n as u64) as usize
        };
        let mut candidates: Vec<(bool, f64, Slot)> = Vec::new();
        // Holders resting after failures: offered only when no other holder is usable.
        let mut resting: Vec<(bool, f64, Slot)> = Vec::new();
        // The bound applies once a usable holder is found: a range few hosts hold, in a
        // blob many hold parts of, is found wherever it sits in the list rather than
        // sent to the origin again (the swarm simulation, benches/sim.rs, showed the
        // bounded scan missing rare holders and the origin sending 24x the image).
        for k in 0..n {
            if k >= config.sample * 16 && !candidates.is_empty() {
                break;
            }
            let holding = &blob.holders[(start + k) % n];
            let slot = &holding.slot;
            if *slot == me {
                continue;
            }
            let held = covered(&holding.ranges, range);
            if held == 0 {
                continue;
            }
            let Some(h) = self.state(*slot) else {
                continue;
            };
            let usable = h.expires > now
                && h.verification_failures < config.verification_failure_limit
                && !h.draining
                && !self.blocked.contains(&h.host.id);
            if !usable {
                continue;
            }
            let ranked = (held == want, score(h, zone), *slot);
            if h.resting_until.is_some_and(|t| t > now) {
                if resting.len() < config.peers_returned {
                    resting.push(ranked);
                }
                continue;
            }
            candidates.push(ranked);
            if candidates.len() >= config.sample {
                break;
            }
        }
        // A holder rests after timeouts (a stall, often a starved machine, not a lie):
        // while another serves it is skipped, but when only resting holders have the
        // range they are offered again. Otherwise every asker goes to the origin, the
        // one link the whole swarm shares: 20 nodes pulling through their mirrors sent
        // the registry 1.7x the image when the sole holder of a blob was rested. The
        // agent gives up on a peer that fails again and fetches from the origin then.
        if candidates.is_empty() {
            candidates = resting;
        }
        candidates.sort_by(|a, b| {
            b.0.cmp(&a.0)
                .then_with(|| b.1.total_cmp(&a.1))
                .then_with(|| a.2.cmp(&b.2))
        });
        candidates.truncate(config.peers_returned);
        candidates.into_iter().map(|(_, _, slot)| slot).collect()
    }

    /// Nobody holds any of `range` (or every holder is excluded): only a few hosts go to the origin; the others wait
    /// for them. Flights older than `origin_timeout` are presumed failed.
    fn origin_or_wait(&mut self, ix: BlobIx, me: Slot, range: ByteRange, now: Instant) -> Decision {
        let (fetchers, timeout, wait) = (
            self.config.origin_fetchers,
            self.config.origin_timeout,
            self.config.wait,
        );
        let blob = &mut self.blobs[ix as usize];
        blob.flights
            .retain(|fl| now.duration_since(fl.started) <= timeout);
        // Asking again keeps one's own flight alive: an agent streaming a whole large
        // blob from the origin (the registry mirror) asks every few seconds.
        if let Some(mine) = blob
            .flights
            .iter_mut()
            .find(|fl| fl.host == me && overlaps(fl.range, range))
        {
            mine.started = now;
            return Decision::Origin;
        }
        let mut others: Vec<Slot> = Vec::new();
        for fl in blob.flights.iter().filter(|fl| overlaps(fl.range, range)) {
            if !others.contains(&fl.host) {
                others.push(fl.host);
            }
        }
        if others.len() < fetchers {
            blob.flights.push(Flight {
                range,
                host: me,
                started: now,
            });
            return Decision::Origin;
        }
        Decision::Wait(wait)
    }
}

/// Higher is better: same zone, spare upload slots, fast, reliable (a peer that lacked
/// what it was said to hold counts as unreliable until its next full announcement),
/// not just offered.
fn score(h: &HostState, zone: Option<&str>) -> f64 {
    let same_zone = zone.is_some() && h.host.labels.get("zone").map(String::as_str) == zone;
    let free = f64::from(h.host.max_uploads.saturating_sub(h.active_uploads))
        / f64::from(h.host.max_uploads.max(1));
    let speed = (h.speed / 1e6).min(1000.0).ln_1p() / 1000f64.ln_1p();
    let reliability = 1.0 / (1.0 + f64::from(h.consecutive_failures) + f64::from(h.misses));
    let recently_offered = f64::from(h.offered);
    (if same_zone { 2.0 } else { 0.0 }) + free + speed + reliability - 0.5 * recently_offered
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use tessera_proto::domain::{Outcome, Transfer};

    use super::super::testing::{announce, blob, find, host};
    use super::super::SwarmConfig;
    use super::*;

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

    /// An origin fetcher announcing the first part of its flight ends the flight for
    /// that part only: the rest is still on its way, so others wait for it rather than
    /// fetching it from the origin too.
    #[test]
    fn announcing_part_of_a_flight_keeps_the_rest_in_flight() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["a", "b", "c"] {
            s.register(host(id, "z"), now);
        }
        assert_eq!(
            s.find_peers(&find("a", 0, 400), now).unwrap(),
            Decision::Origin
        );
        announce(&mut s, "a", 0, 100, now);
        match s.find_peers(&find("b", 0, 100), now).unwrap() {
            Decision::Peers(p) => assert_eq!(p[0].0, HostId("a".into())),
            d => panic!("{d:?}"),
        }
        assert!(
            matches!(
                s.find_peers(&find("b", 200, 300), now).unwrap(),
                Decision::Wait(_)
            ),
            "the rest of a's flight was given to another fetcher"
        );
        // A part announced in the middle leaves both sides in flight.
        announce(&mut s, "a", 200, 300, now);
        for (start, end) in [(100, 200), (300, 400)] {
            assert!(
                matches!(
                    s.find_peers(&find("c", start, end), now).unwrap(),
                    Decision::Wait(_)
                ),
                "{start}..{end}"
            );
        }
        // Beyond the flight nobody fetches: the origin.
        assert_eq!(
            s.find_peers(&find("c", 400, 500), now).unwrap(),
            Decision::Origin
        );
    }

    /// A sole holder rested after timeouts is still offered (rather than sending every
    /// asker to the origin); with another holder about, the resting one is skipped.
    #[test]
    fn a_resting_sole_holder_is_offered_rather_than_the_origin() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for id in ["seed", "me", "other"] {
            s.register(host(id, "z"), now);
        }
        announce(&mut s, "seed", 0, 1000, now);
        let stalled = Transfer {
            peer: Some(HostId("seed".into())),
            blob: blob(),
            range: ByteRange { start: 0, end: 100 },
            bytes: 0,
            duration_us: 10,
            outcome: Outcome::Timeout,
        };
        s.report(&HostId("me".into()), &vec![stalled; 3], now)
            .unwrap();
        for _ in 0..3 {
            match s.find_peers(&find("me", 0, 100), now).unwrap() {
                Decision::Peers(p) => assert_eq!(p[0].0, HostId("seed".into())),
                d => panic!("the resting sole holder was not offered: {d:?}"),
            }
        }
        announce(&mut s, "other", 0, 1000, now);
        match s.find_peers(&find("me", 0, 100), now).unwrap() {
            Decision::Peers(p) => assert_eq!(
                p.iter().map(|x| x.0 .0.as_str()).collect::<Vec<_>>(),
                ["other"]
            ),
            d => panic!("{d:?}"),
        }
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

    /// A range one host holds, in a blob 2,000 others hold other parts of, is found
    /// every time, not missed by the bounded scan and sent to the origin.
    #[test]
    fn a_rare_holder_among_many_partial_holders_is_found() {
        let now = Instant::now();
        let mut s = Swarm::new(SwarmConfig::default());
        for i in 0..2000 {
            let id = format!("p{i}");
            s.register(host(&id, "a"), now);
            announce(&mut s, &id, 0, 1 << 20, now);
        }
        s.register(host("rare", "a"), now);
        announce(&mut s, "rare", 5 << 20, 6 << 20, now);
        s.register(host("me", "a"), now);
        for _ in 0..8 {
            match s.find_peers(&find("me", 5 << 20, 6 << 20), now).unwrap() {
                Decision::Peers(p) => assert_eq!(p[0].0, HostId("rare".into())),
                d => panic!("the rare holder was missed: {d:?}"),
            }
        }
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
}
