//! What this host tells the schedulers about data — the byte ranges it holds
//! (announced as chunks are verified, batched while a send is under way), the ranges
//! it no longer holds (chunks its cache dropped: at once when found corrupt or
//! removed, with the next send when evicted), blobs' sizes, the images it uses,
//! transfer reports — and what it asks them: who holds a range. Each blob is talked
//! about only to the replica that owns it on the ring.

use std::collections::HashMap;
use std::time::Duration;

use tessera_proto::domain::{Peer, PeerChoice};
use tessera_proto::pb;
use tessera_proto::ranges::{merge, subtract};

use super::{Network, Pending};
use crate::cache::{ChunkKey, DropCause};

impl Network {
    /// Sends replica `r` its pending announcements and reports.
    pub(super) async fn flush(&self, r: usize) {
        let (pending, held, dropped) = {
            let mut state = self.state();
            let pending = std::mem::take(&mut state.pending[r]);
            let held = to_pb(&pending.held, &state.sizes);
            let dropped = to_pb(&pending.dropped, &HashMap::new());
            (pending, held, dropped)
        };
        let mut scheduler = self.replicas[r].client.clone();
        if !held.is_empty() || !dropped.is_empty() || !pending.images.is_empty() {
            let sent = scheduler
                .announce(pb::AnnounceRequest {
                    host_id: self.host.id.clone(),
                    held,
                    full: false,
                    dropped,
                    images: images_pb(&pending.images),
                })
                .await;
            // Not lost: `held` has it (less what was dropped), and the full
            // announcement after re-registering sends it.
            if let Err(e) = sent {
                return self.lost(r, e.message());
            }
        }
        if !pending.reports.is_empty() {
            let sent = scheduler
                .report(pb::ReportRequest {
                    host_id: self.host.id.clone(),
                    transfers: pending.reports,
                })
                .await;
            if let Err(e) = sent {
                self.lost(r, e.message());
            }
        }
    }

    /// Records that this host now holds (verified, cached) these chunks at these
    /// ranges of `blob`; they are announced right away.
    pub fn held(&self, blob: &str, chunks: impl IntoIterator<Item = (ChunkKey, (u64, u64))>) {
        let owner = {
            let mut state = self.state();
            let mut new = Vec::new();
            for (key, range) in chunks.into_iter().filter(|(_, (s, e))| s < e) {
                let places = state.places.entry(key).or_default();
                if !places.iter().any(|(b, r)| b == blob && *r == range) {
                    places.push((blob.to_string(), range));
                }
                new.push(range);
            }
            if new.is_empty() {
                return;
            }
            let list = state.held.entry(blob.to_string()).or_default();
            list.extend(new.iter().copied());
            merge(list);
            // With no replica up, the full announcement at registration carries it.
            let Some(r) = self.owner(blob) else { return };
            let pending = &mut state.pending[r];
            // Held again since it was dropped: the scheduler applies drops last.
            if let Some(list) = pending.dropped.get_mut(blob) {
                for &range in &new {
                    subtract(list, range);
                }
                if list.is_empty() {
                    pending.dropped.remove(blob);
                }
            }
            let list = pending.held.entry(blob.to_string()).or_default();
            list.extend(new);
            merge(list);
            r
        };
        self.replicas[owner].wake.notify_one();
    }

    /// Records that the cache dropped these chunks: the ranges where they were
    /// announced are announced as dropped, so peers are no longer sent here for them —
    /// at once unless they were evicted (evictions come in bursts and go with the next
    /// send, at the latest the next heartbeat). Chunks never announced are ignored.
    pub fn dropped(&self, keys: &[ChunkKey], cause: DropCause) {
        let mut owners = Vec::new();
        {
            let mut state = self.state();
            let state = &mut *state;
            for key in keys {
                let Some(places) = state.places.remove(key) else {
                    continue;
                };
                for (blob, range) in places {
                    if let Some(list) = state.held.get_mut(&blob) {
                        subtract(list, range);
                        if list.is_empty() {
                            state.held.remove(&blob);
                        }
                    }
                    let Some(r) = self.owner(&blob) else { continue };
                    let pending: &mut Pending = &mut state.pending[r];
                    if let Some(list) = pending.held.get_mut(&blob) {
                        subtract(list, range);
                        if list.is_empty() {
                            pending.held.remove(&blob);
                        }
                    }
                    let list = pending.dropped.entry(blob).or_default();
                    list.push(range);
                    merge(list);
                    owners.push(r);
                }
            }
        }
        tracing::debug!(chunks = keys.len(), ?cause, "chunks left the cache");
        if cause == DropCause::Evicted {
            return;
        }
        owners.sort_unstable();
        owners.dedup();
        for r in owners {
            self.replicas[r].wake.notify_one();
        }
    }

    /// Records blobs' whole sizes, sent with their ranges from now on.
    pub fn blob_sizes(&self, sizes: impl IntoIterator<Item = (String, u64)>) {
        self.state().sizes.extend(sizes);
    }

    /// Records that this host uses `image`, made of `blobs`; every replica is told.
    pub fn uses_image(&self, image: &str, blobs: Vec<String>) {
        {
            let mut state = self.state();
            if state.images.get(image) == Some(&blobs) {
                return;
            }
            state.images.insert(image.to_string(), blobs.clone());
            for pending in &mut state.pending {
                pending.images.insert(image.to_string(), blobs.clone());
            }
        }
        for replica in &self.replicas {
            replica.wake.notify_one();
        }
    }

    /// Queues a transfer's outcome for the scheduler. `peer` is `None` for the origin.
    pub fn report(
        &self,
        peer: Option<&Peer>,
        blob: &str,
        range: (u64, u64),
        bytes: u64,
        duration: Duration,
        outcome: pb::Outcome,
    ) {
        if range.0 >= range.1 {
            return;
        }
        let Some(r) = self.owner(blob) else { return };
        self.state().pending[r].reports.push(pb::Transfer {
            peer_id: peer.map(|p| p.id.0.clone()).unwrap_or_default(),
            blob: blob.to_string(),
            range: Some(pb::ByteRange {
                start: range.0,
                end: range.1,
            }),
            bytes,
            duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
            outcome: outcome.into(),
        });
        self.replicas[r].wake.notify_one();
    }

    /// Asks who holds `[start, end)` of `blob` (the replica that owns it; if that one
    /// fails, the next). `None`: no usable answer (not registered, no replica
    /// reachable or answering sense) — use the origin.
    pub async fn find_peers(&self, blob: &str, range: (u64, u64)) -> Option<PeerChoice> {
        for _ in 0..self.replicas.len() {
            let r = self.owner(blob)?;
            let answer = self.replicas[r]
                .client
                .clone()
                .find_peers(pb::FindPeersRequest {
                    host_id: self.host.id.clone(),
                    blob: blob.to_string(),
                    range: Some(pb::ByteRange {
                        start: range.0,
                        end: range.1,
                    }),
                })
                .await;
            match answer {
                Ok(a) => match PeerChoice::try_from(a.into_inner()) {
                    Ok(choice) => return Some(choice),
                    Err(e) => {
                        tracing::warn!(error = %e, "the scheduler's answer is invalid; using the origin");
                        return None;
                    }
                },
                Err(e) => self.lost(r, e.message()),
            }
        }
        None
    }
}

/// Announced ranges, with each blob's size where known.
pub(super) fn to_pb(
    map: &HashMap<String, Vec<(u64, u64)>>,
    sizes: &HashMap<String, u64>,
) -> Vec<pb::BlobRanges> {
    map.iter()
        .map(|(blob, ranges)| pb::BlobRanges {
            blob: blob.clone(),
            ranges: ranges
                .iter()
                .map(|&(start, end)| pb::ByteRange { start, end })
                .collect(),
            size: sizes.get(blob).copied().unwrap_or(0),
        })
        .collect()
}

pub(super) fn images_pb(images: &HashMap<String, Vec<String>>) -> Vec<pb::ImageBlobs> {
    images
        .iter()
        .map(|(image, blobs)| pb::ImageBlobs {
            image: image.clone(),
            blobs: blobs.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use rafs_format::chunk::DigestAlgo;

    use super::*;
    use crate::cache::ChunkCache;
    use crate::config::P2pConfig;
    use crate::peer::server::UploadLimits;
    use crate::peer::PeerServer;

    /// A network with one replica it counts as registered (nothing is sent: the
    /// membership task is not started), and its cache's directory.
    fn network() -> (Arc<Network>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(ChunkCache::open(dir.path(), 1 << 20).unwrap());
        let server = PeerServer::new(
            cache,
            UploadLimits {
                max_uploads: 1,
                bytes_per_sec: None,
                corrupt: false,
                compress: false,
            },
        );
        let config = P2pConfig {
            scheduler: Some("http://127.0.0.1:9".into()),
            advertise: Some("127.0.0.1:7081".into()),
            ..P2pConfig::default()
        };
        let (preheats, _) = crate::peer::preheat::queue();
        let network = Network::new(&config, server, preheats).unwrap();
        network.replicas[0]
            .registered
            .store(true, Ordering::Relaxed);
        (network, dir)
    }

    fn key(n: u8) -> ChunkKey {
        ChunkKey {
            algo: DigestAlgo::Sha256,
            digest: [n; 32],
        }
    }

    /// Whether the replica's membership task was woken (taking the wake-up).
    async fn woken(network: &Network) -> bool {
        let wait = network.replicas[0].wake.notified();
        tokio::time::timeout(Duration::from_millis(10), wait)
            .await
            .is_ok()
    }

    /// Dropped chunks leave what is held (so the full announcement leaves them out)
    /// and are queued as dropped ranges where they were announced — at once when
    /// corrupt, quietly when evicted; held again, they are no longer queued as dropped;
    /// chunks never announced are ignored.
    #[tokio::test]
    async fn dropped_chunks_are_queued_where_they_were_announced() {
        let (n, _dir) = network();
        n.held("b1", [(key(1), (0, 10)), (key(2), (10, 20))]);
        n.held("b2", [(key(1), (100, 110))]);
        assert!(woken(&n).await);
        let queued = |n: &Network| {
            let state = n.state();
            let p = &state.pending[0];
            (state.held.clone(), p.held.clone(), p.dropped.clone())
        };
        let map = |pairs: &[(&str, Vec<(u64, u64)>)]| -> HashMap<String, Vec<(u64, u64)>> {
            pairs
                .iter()
                .map(|(b, r)| (b.to_string(), r.clone()))
                .collect()
        };

        n.dropped(&[key(1), key(9)], DropCause::Corrupt);
        assert!(woken(&n).await, "a corrupt chunk was not announced at once");
        let (held, pending, dropped) = queued(&n);
        assert_eq!(held, map(&[("b1", vec![(10, 20)])]));
        assert_eq!(pending, map(&[("b1", vec![(10, 20)])]));
        assert_eq!(
            dropped,
            map(&[("b1", vec![(0, 10)]), ("b2", vec![(100, 110)])])
        );

        n.held("b1", [(key(1), (0, 10))]);
        assert!(woken(&n).await);
        let (_, _, dropped) = queued(&n);
        assert_eq!(dropped, map(&[("b2", vec![(100, 110)])]));

        n.dropped(&[key(2)], DropCause::Evicted);
        assert!(!woken(&n).await, "an eviction woke the announcer");
        let (held, _, dropped) = queued(&n);
        assert_eq!(held, map(&[("b1", vec![(0, 10)])]));
        assert_eq!(
            dropped,
            map(&[("b1", vec![(10, 20)]), ("b2", vec![(100, 110)])])
        );
    }

    #[test]
    fn ranges_subtract() {
        let mut r = vec![(0, 10), (20, 30), (40, 50)];
        subtract(&mut r, (5, 25));
        assert_eq!(r, [(0, 5), (25, 30), (40, 50)]);
        subtract(&mut r, (40, 50));
        assert_eq!(r, [(0, 5), (25, 30)]);
    }

    /// The shared merge does what this module's own did (sorted, overlapping and
    /// touching ranges joined).
    #[test]
    fn ranges_merge() {
        let mut r = vec![(10, 20), (0, 5), (5, 8), (19, 30), (40, 50)];
        merge(&mut r);
        assert_eq!(r, [(0, 8), (10, 30), (40, 50)]);
    }
}
