//! Membership: registering with each scheduler replica (with backoff while it cannot
//! be reached), keeping the lease with heartbeats (which carry this host's load and
//! preheat progress and bring back preheat jobs), noticing that a replica is lost
//! (its blobs re-announced to their next owner), and leaving at shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto::pb;
use tessera_proto::ranges::merge;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

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

    /// Keeps this host a member of replica `r` for as long as the agent runs (see
    /// [`keep_member`]).
    pub(super) async fn membership(self: Arc<Self>, r: usize) {
        keep_member(&Member { network: &self, r }).await;
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
            state.pending[r].dropped.clear();
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

    pub(super) async fn heartbeat(&self, r: usize) {
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

/// What the membership loop does with one scheduler replica: the swarm's network in
/// the agent, a recorder in the tests.
pub(super) trait Membership {
    fn registered(&self) -> bool;
    /// Registers (and announces in full); the lease granted.
    fn register(&self) -> impl Future<Output = Result<Duration, String>> + Send;
    fn heartbeat(&self) -> impl Future<Output = ()> + Send;
    /// Sends what is waiting to be announced.
    fn flush(&self) -> impl Future<Output = ()> + Send;
    /// Woken when there is something to announce, or the replica was lost.
    fn woken(&self) -> &Notify;
    /// Whether a heartbeat was asked for at once (e.g. preheat progress), clearing it.
    fn beat_now(&self) -> bool;
    fn unreachable(&self, error: &str);
}

/// The membership loop: registers (with backoff while the replica cannot be reached),
/// then heartbeats on a fixed schedule, a third of the lease, that announcements cannot
/// delay: a busy host (a start-up announcing every few milliseconds) renews its lease
/// like an idle one. Woken in between, it flushes announcements.
pub(super) async fn keep_member(m: &impl Membership) {
    let mut backoff = Duration::from_millis(200);
    let mut beats: Option<tokio::time::Interval> = None;
    let mut unreachable_logged = false;
    loop {
        if !m.registered() {
            match m.register().await {
                Ok(lease) => {
                    let every =
                        (lease / 3).clamp(Duration::from_millis(200), Duration::from_secs(10));
                    let mut schedule =
                        tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                    schedule.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    beats = Some(schedule);
                    backoff = Duration::from_millis(200);
                    unreachable_logged = false;
                }
                Err(e) => {
                    if !unreachable_logged {
                        m.unreachable(&e);
                        unreachable_logged = true;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let Some(schedule) = beats.as_mut() else {
            continue;
        };
        let beat = tokio::select! {
            _ = schedule.tick() => true,
            _ = m.woken().notified() => false,
        };
        if beat || m.beat_now() {
            m.heartbeat().await;
        }
        if m.registered() {
            m.flush().await;
        }
    }
}

/// Replica `r` of this host's network.
struct Member<'a> {
    network: &'a Arc<Network>,
    r: usize,
}

impl Membership for Member<'_> {
    fn registered(&self) -> bool {
        self.network.replicas[self.r]
            .registered
            .load(Ordering::Relaxed)
    }

    async fn register(&self) -> Result<Duration, String> {
        self.network
            .register(self.r)
            .await
            .map_err(|e| e.message().to_string())
    }

    async fn heartbeat(&self) {
        self.network.heartbeat(self.r).await;
    }

    async fn flush(&self) {
        self.network.flush(self.r).await;
    }

    fn woken(&self) -> &Notify {
        &self.network.replicas[self.r].wake
    }

    fn beat_now(&self) -> bool {
        self.network.replicas[self.r]
            .beat_now
            .swap(false, Ordering::Relaxed)
    }

    fn unreachable(&self, error: &str) {
        let replica = &self.network.replicas[self.r];
        tracing::warn!(host = %self.network.host.id, scheduler = %replica.url, error, "cannot register with the scheduler; retrying (its blobs go to other replicas, or the origin)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// A replica that grants `lease` and records when heartbeats came.
    struct Recorder {
        lease: Duration,
        registered: AtomicBool,
        beats: Mutex<Vec<Instant>>,
        wake: Notify,
    }

    impl Membership for Recorder {
        fn registered(&self) -> bool {
            self.registered.load(Ordering::Relaxed)
        }
        async fn register(&self) -> Result<Duration, String> {
            self.registered.store(true, Ordering::Relaxed);
            Ok(self.lease)
        }
        async fn heartbeat(&self) {
            self.beats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
        }
        async fn flush(&self) {}
        fn woken(&self) -> &Notify {
            &self.wake
        }
        fn beat_now(&self) -> bool {
            false
        }
        fn unreachable(&self, _: &str) {}
    }

    /// Announcements every 100 ms for ten lease periods: the lease is renewed within
    /// every period all the same (it used to restart the heartbeat timer each time).
    #[tokio::test(start_paused = true)]
    async fn announcements_do_not_delay_heartbeats() {
        let lease = Duration::from_secs(3);
        let member = Arc::new(Recorder {
            lease,
            registered: AtomicBool::new(false),
            beats: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        let started = Instant::now();
        let looping = {
            let member = member.clone();
            tokio::spawn(async move { keep_member(member.as_ref()).await })
        };
        let announcing = {
            let member = member.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    member.wake.notify_one();
                }
            })
        };
        tokio::time::sleep(lease * 10).await;
        looping.abort();
        announcing.abort();
        let beats = member
            .beats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut last = started;
        for beat in &beats {
            assert!(*beat - last < lease, "no heartbeat for {:?}", *beat - last);
            last = *beat;
        }
        assert!(
            Instant::now() - last < lease,
            "no heartbeat since {:?}",
            last - started
        );
        assert!(
            beats.len() >= 25,
            "{} heartbeats in ten leases",
            beats.len()
        );
    }
}
