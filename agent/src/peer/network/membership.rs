//! Membership: registering with each scheduler replica (with backoff while it cannot
//! be reached), keeping the lease with heartbeats (which carry this host's load and
//! preheat progress and bring back preheat jobs), noticing that a replica is lost
//! (its blobs re-announced to their next owner), and leaving at shutdown.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto::pb;
use tessera_proto::ranges::merge;

use super::announce::{images_pb, to_pb};
use super::Network;

impl Network {
    /// Replica `r` is gone or forgot us: off the ring until registered again. What this
    /// host holds of the blobs it owned is announced to their new owners.
    pub(super) fn lost(&self, r: usize, why: &str) {
        let replica = &self.replicas[r];
        replica.wake.notify_one();
        if !replica.registered.swap(false, Ordering::Relaxed) {
            return;
        }
        if !self.registered() {
            tracing::warn!(
                host = %self.host.id,
                scheduler = %replica.url,
                reason = why,
                "lost the scheduler; fetching from the origin until it is back"
            );
            return;
        }
        tracing::warn!(host = %self.host.id, scheduler = %replica.url, reason = why, "lost a scheduler replica; its blobs move to the next replica");
        let up = |i: usize| self.replicas[i].registered.load(Ordering::Relaxed);
        let mut woken = Vec::new();
        {
            let mut state = self.state();
            let state = &mut *state;
            for (blob, ranges) in &state.held {
                if self.ring.owner(blob, |i| i == r || up(i)) != Some(r) {
                    continue;
                }
                if let Some(to) = self.ring.owner(blob, up) {
                    let list = state.pending[to].held.entry(blob.clone()).or_default();
                    list.extend(ranges.iter().copied());
                    merge(list);
                    woken.push(to);
                }
            }
        }
        woken.sort_unstable();
        woken.dedup();
        for to in woken {
            self.replicas[to].wake.notify_one();
        }
    }

    pub(super) async fn membership(self: Arc<Self>, r: usize) {
        let replica = &self.replicas[r];
        let mut backoff = Duration::from_millis(200);
        let mut heartbeat_every = Duration::from_secs(10);
        let mut unreachable_logged = false;
        loop {
            if !replica.registered.load(Ordering::Relaxed) {
                match self.register(r).await {
                    Ok(lease) => {
                        heartbeat_every =
                            (lease / 3).clamp(Duration::from_millis(200), Duration::from_secs(10));
                        backoff = Duration::from_millis(200);
                        unreachable_logged = false;
                    }
                    Err(e) => {
                        if !unreachable_logged {
                            tracing::warn!(host = %self.host.id, scheduler = %replica.url, error = %e, "cannot register with the scheduler; retrying (its blobs go to other replicas, or the origin)");
                            unreachable_logged = true;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let beat = tokio::select! {
                _ = tokio::time::sleep(heartbeat_every) => true,
                _ = replica.wake.notified() => false,
            };
            if beat || replica.beat_now.swap(false, Ordering::Relaxed) {
                self.heartbeat(r).await;
            }
            if replica.registered.load(Ordering::Relaxed) {
                self.flush(r).await;
            }
        }
    }

    /// Registers with replica `r` and announces, in full, what this host holds of the
    /// blobs `r` owns once it is up.
    async fn register(&self, r: usize) -> Result<Duration, tonic::Status> {
        let replica = &self.replicas[r];
        let mut scheduler = replica.client.clone();
        let lease = scheduler
            .register(pb::RegisterRequest {
                host: Some(self.host.clone()),
            })
            .await?
            .into_inner()
            .lease_ms;
        let up = |i: usize| i == r || self.replicas[i].registered.load(Ordering::Relaxed);
        let (held, images) = {
            let mut state = self.state();
            state.pending[r].held.clear();
            state.pending[r].images.clear();
            let owned: HashMap<String, Vec<(u64, u64)>> = state
                .held
                .iter()
                .filter(|(blob, _)| self.ring.owner(blob, up) == Some(r))
                .map(|(b, ranges)| (b.clone(), ranges.clone()))
                .collect();
            (to_pb(&owned, &state.sizes), images_pb(&state.images))
        };
        scheduler
            .announce(pb::AnnounceRequest {
                host_id: self.host.id.clone(),
                held,
                full: true,
                dropped: Vec::new(),
                images,
            })
            .await?;
        replica.registered.store(true, Ordering::Relaxed);
        tracing::info!(host = %self.host.id, address = %self.host.address, scheduler = %replica.url, "joined the swarm");
        Ok(Duration::from_millis(lease.max(1)))
    }

    async fn heartbeat(&self, r: usize) {
        let replica = &self.replicas[r];
        let uploads = u32::try_from(self.server.active_uploads()).unwrap_or(u32::MAX);
        let preheats = self.preheats.all();
        let answer = replica
            .client
            .clone()
            .heartbeat(pb::HeartbeatRequest {
                host_id: self.host.id.clone(),
                active_uploads: uploads,
                upload_bps: 0,
                preheats,
            })
            .await;
        match answer {
            Ok(a) if a.get_ref().reregister => self.lost(r, "the scheduler asked to re-register"),
            Ok(a) => self.preheats.start(a.into_inner().preheats),
            Err(e) => self.lost(r, e.message()),
        }
    }

    /// Leaves the swarm (shutdown): the schedulers stop sending peers here at once
    /// rather than when the lease runs out.
    pub async fn leave(&self) {
        let leaving = self
            .replicas
            .iter()
            .filter(|r| r.registered.swap(false, Ordering::Relaxed));
        let calls = leaving.map(|r| {
            let mut client = r.client.clone();
            let host_id = self.host.id.clone();
            async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    client.leave(pb::LeaveRequest { host_id }),
                )
                .await;
            }
        });
        let mut all = tokio::task::JoinSet::new();
        for call in calls {
            all.spawn(call);
        }
        while all.join_next().await.is_some() {}
    }
}
