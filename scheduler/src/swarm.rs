//! The scheduler's picture of the swarm, in memory only: hosts with their leases, what
//! each holds (byte ranges of blobs), and how transfers from each went. A restarted
//! scheduler starts empty; agents re-register and re-announce when their heartbeat is
//! answered with "re-register".
//!
//! All methods take `now`, so leases, waits and penalties are tested without sleeping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tessera_proto::domain::{
    Announce, BlobDigest, ByteRange, FindPeers, Host, HostId, Outcome, Transfer,
};

/// Tunables of the swarm.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// How long a registration lasts without a heartbeat.
    pub lease: Duration,
    /// Hosts sent to the origin for the same range while nobody holds it.
    pub origin_fetchers: usize,
    /// How long the others are told to wait before asking again.
    pub wait: Duration,
    /// An origin fetch not followed by an announcement within this long is presumed
    /// failed: more hosts may go to the origin.
    pub origin_timeout: Duration,
    /// Peers returned per answer.
    pub peers_returned: usize,
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
            origin_fetchers: 2,
            wait: Duration::from_millis(200),
            origin_timeout: Duration::from_secs(20),
            peers_returned: 4,
            verification_failure_limit: 2,
            failure_limit: 3,
            rest: Duration::from_secs(30),
        }
    }
}

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
    /// Not offered as a peer before this instant.
    resting_until: Option<Instant>,
}

/// Origin fetches under way for one range.
#[derive(Debug)]
struct OriginFetch {
    hosts: Vec<HostId>,
    started: Instant,
}

#[derive(Debug, Default)]
struct BlobState {
    /// Merged, sorted ranges each host holds.
    holders: HashMap<HostId, Vec<ByteRange>>,
    origin: HashMap<ByteRange, OriginFetch>,
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
    hosts: HashMap<HostId, HostState>,
    blobs: HashMap<BlobDigest, BlobState>,
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

fn covers(ranges: &[ByteRange], want: ByteRange) -> bool {
    // Merged and sorted: the covering range, if any, is the last starting at or before.
    let i = ranges.partition_point(|r| r.start <= want.start);
    i > 0 && ranges[i - 1].end >= want.end
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
        self.hosts.len()
    }

    /// Joins (or re-joins, keeping nothing of before) the swarm; returns the lease.
    pub fn register(&mut self, host: Host, now: Instant) -> Duration {
        let id = host.id.clone();
        self.forget(&id);
        self.hosts.insert(
            id,
            HostState {
                host,
                expires: now + self.config.lease,
                active_uploads: 0,
                offered: 0,
                speed: 0.0,
                successes: 0,
                consecutive_failures: 0,
                verification_failures: 0,
                resting_until: None,
            },
        );
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
        let h = self.live_host(id, now)?;
        h.expires = now + lease;
        h.active_uploads = active_uploads;
        h.offered = 0;
        Ok(lease)
    }

    fn live_host(&mut self, id: &HostId, now: Instant) -> Result<&mut HostState, UnknownHost> {
        match self.hosts.get_mut(id) {
            Some(h) if h.expires > now => Ok(h),
            _ => Err(UnknownHost(id.0.clone())),
        }
    }

    /// Records what a host holds (adding, or replacing with `full`) and no longer holds.
    pub fn announce(&mut self, a: Announce, now: Instant) -> Result<(), UnknownHost> {
        self.live_host(&a.host, now)?;
        if a.full {
            for blob in self.blobs.values_mut() {
                blob.holders.remove(&a.host);
            }
        }
        for held in a.held {
            let blob = self.blobs.entry(held.blob).or_default();
            let ranges = blob.holders.entry(a.host.clone()).or_default();
            ranges.extend(held.ranges);
            merge(ranges);
        }
        for dropped in a.dropped {
            if let Some(blob) = self.blobs.get_mut(&dropped.blob) {
                if let Some(ranges) = blob.holders.get_mut(&a.host) {
                    for r in dropped.ranges {
                        subtract(ranges, r);
                    }
                }
            }
        }
        Ok(())
    }

    /// Who should serve `f.range` of `f.blob` to `f.host`.
    pub fn find_peers(&mut self, f: &FindPeers, now: Instant) -> Result<Decision, UnknownHost> {
        let zone = self
            .live_host(&f.host, now)?
            .host
            .labels
            .get("zone")
            .cloned();
        let config = self.config.clone();
        let blob = self.blobs.entry(f.blob.clone()).or_default();
        let mut candidates: Vec<(f64, HostId, SocketAddr)> = blob
            .holders
            .iter()
            .filter(|(id, ranges)| **id != f.host && covers(ranges, f.range))
            .filter_map(|(id, _)| {
                let h = self.hosts.get(id)?;
                let usable = h.expires > now
                    && h.verification_failures < config.verification_failure_limit
                    && h.resting_until.is_none_or(|t| t <= now);
                usable.then(|| (score(h, zone.as_deref()), id.clone(), h.host.address))
            })
            .collect();
        if !candidates.is_empty() {
            blob.origin.remove(&f.range);
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            candidates.truncate(config.peers_returned);
            if let Some(first) = self.hosts.get_mut(&candidates[0].1) {
                first.offered += 1;
            }
            return Ok(Decision::Peers(
                candidates
                    .into_iter()
                    .map(|(_, id, addr)| (id, addr))
                    .collect(),
            ));
        }
        // Nobody holds it: only a few go to the origin; the others wait for them.
        let fetch = blob.origin.entry(f.range).or_insert(OriginFetch {
            hosts: Vec::new(),
            started: now,
        });
        if now.duration_since(fetch.started) > config.origin_timeout {
            fetch.hosts.clear();
            fetch.started = now;
        }
        if fetch.hosts.contains(&f.host) || fetch.hosts.len() < config.origin_fetchers {
            if !fetch.hosts.contains(&f.host) {
                fetch.hosts.push(f.host.clone());
            }
            return Ok(Decision::Origin);
        }
        Ok(Decision::Wait(config.wait))
    }

    /// Learns from transfers: speeds and successes raise a peer, failures rest it, and
    /// verification failures exclude it.
    pub fn report(
        &mut self,
        reporter: &HostId,
        transfers: &[Transfer],
        now: Instant,
    ) -> Result<(), UnknownHost> {
        self.live_host(reporter, now)?;
        for t in transfers {
            let Some(peer) = t.peer.as_ref().and_then(|p| self.hosts.get_mut(p)) else {
                continue;
            };
            match t.outcome {
                Outcome::Ok => {
                    peer.successes += 1;
                    peer.consecutive_failures = 0;
                    if t.duration_us > 0 {
                        let speed = t.bytes as f64 / (t.duration_us as f64 / 1e6);
                        peer.speed = if peer.speed == 0.0 {
                            speed
                        } else {
                            0.8 * peer.speed + 0.2 * speed
                        };
                    }
                }
                Outcome::VerificationFailed => {
                    peer.verification_failures += 1;
                    tracing::warn!(peer = %peer.host.id.0, reporter = %reporter.0, "peer served bytes that failed verification");
                }
                Outcome::NotFound => {
                    // It no longer holds the range: forget that it did.
                    if let Some(blob) = self.blobs.get_mut(&t.blob) {
                        if let Some(ranges) = blob.holders.get_mut(&peer.host.id) {
                            subtract(ranges, t.range);
                        }
                    }
                }
                Outcome::Timeout | Outcome::Connection | Outcome::Other => {
                    peer.consecutive_failures += 1;
                    if peer.consecutive_failures >= self.config.failure_limit {
                        peer.resting_until = Some(now + self.config.rest);
                        peer.consecutive_failures = 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// Leaves: the host and what it held are forgotten.
    pub fn leave(&mut self, id: &HostId) {
        self.forget(id);
    }

    /// Forgets hosts whose lease ran out.
    pub fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<HostId> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.forget(id);
        }
        expired.len()
    }

    fn forget(&mut self, id: &HostId) {
        self.hosts.remove(id);
        for blob in self.blobs.values_mut() {
            blob.holders.remove(id);
            for fetch in blob.origin.values_mut() {
                fetch.hosts.retain(|h| h != id);
            }
        }
        self.blobs
            .retain(|_, b| !b.holders.is_empty() || !b.origin.is_empty());
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
                }],
                dropped: vec![],
                full: false,
            },
            now,
        )
        .unwrap();
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
        assert_eq!(origin, 2, "{decisions:?}");
        assert!(
            decisions
                .iter()
                .filter(|d| matches!(d, Decision::Wait(_)))
                .count()
                == 8
        );
        // The first fetcher announces: everyone else is sent to it.
        announce(&mut s, "h0", 0, 4096, now);
        match s.find_peers(&find("h5", 0, 100), now).unwrap() {
            Decision::Peers(p) => assert_eq!(p[0].0, HostId("h0".into())),
            d => panic!("{d:?}"),
        }
        // A range nobody fully holds is not served by a partial holder.
        assert_eq!(
            s.find_peers(&find("h5", 4000, 5000), now).unwrap(),
            Decision::Origin
        );
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
        let mut firsts = std::collections::HashSet::new();
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
