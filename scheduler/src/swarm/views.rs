//! What the admin API sees of the swarm and the levers it pulls: views of hosts, blobs
//! and images, the counters since start and the totals, and the blocklist and drains
//! (hosts not offered as peers). Views are taken under the swarm's lock and
//! serialised without it.

use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_proto::domain::HostId;

use super::{BlobIx, HostState, Slot, Swarm, UnknownHost};

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
    /// Bytes of blobs the host holds as far as the scheduler knows: announced, less
    /// what it announced dropping and what it answered "not found" for. Summed from
    /// the same records as the blob view's figures.
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

impl Swarm {
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
        let slot = self.ids.get(&h.host.id).copied();
        let bytes_held = slot.map_or(0, |slot| {
            h.blobs
                .iter()
                .map(|&ix| self.blobs[ix as usize].bytes_of(slot))
                .sum()
        });
        HostView {
            id: h.host.id.0.clone(),
            address: h.host.address.to_string(),
            labels: h.host.labels.clone(),
            registered_ms_ago: ms(now.saturating_duration_since(h.registered)),
            last_seen_ms_ago: ms(self.config.lease.saturating_sub(remaining)),
            blobs_held: h.blobs.len(),
            bytes_held,
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
                let held: Vec<u64> = blob.holders.iter().map(|h| h.bytes).collect();
                BlobView {
                    blob: digest.0.clone(),
                    holders: held.iter().filter(|&&b| b > 0).count(),
                    max_bytes_held: held.iter().copied().max().unwrap_or(0),
                    total_bytes_held: held.iter().sum(),
                    size: blob.size,
                    complete_holders: blob
                        .holders
                        .iter()
                        .filter(|h| self.holds_whole(ix, h.slot))
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

    /// Whether `slot` holds all of blob `ix` (its size known).
    pub(super) fn holds_whole(&self, ix: BlobIx, slot: Slot) -> bool {
        let blob = &self.blobs[ix as usize];
        let (Some(size), Some(&i)) = (blob.size, blob.position.get(&slot)) else {
            return false;
        };
        blob.holders[i]
            .ranges
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

#[cfg(test)]
mod tests {
    use tessera_proto::domain::{Announce, BlobRanges, ByteRange};

    use super::super::testing::{blob, host};
    use super::super::SwarmConfig;
    use super::*;

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
}
