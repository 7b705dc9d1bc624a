//! What `tessera status` shows: the agent's [`Status`] (uptime, cache, bytes by
//! source, swarm, mirror) and each mount's [`MountStatus`] (its pull summary, as a
//! line people read and as JSON).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::lifecycle::Mount;
use super::Agent;
use crate::fetch::PullSummary;
use crate::mirror::MirrorStatus;

/// What `tessera status` shows.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub uptime_seconds: f64,
    pub mounts: Vec<MountStatus>,
    pub cache: crate::cache::CacheStats,
    /// Uncompressed bytes the current mounts got, by source.
    pub bytes_by_source: HashMap<String, u64>,
    /// P2P, when on.
    #[serde(default)]
    pub swarm: Option<SwarmStatus>,
    /// The registry mirror, when on.
    #[serde(default)]
    pub mirror: Option<MirrorStatus>,
}

/// This agent in the swarm.
#[derive(Debug, Serialize, Deserialize)]
pub struct SwarmStatus {
    pub host_id: String,
    /// Whether the scheduler currently knows this agent (if not, chunks come from the
    /// origin until it re-registers).
    pub registered: bool,
    /// Scheduler replicas that know this agent, of those configured.
    #[serde(default)]
    pub schedulers_registered: usize,
    #[serde(default)]
    pub schedulers: usize,
    pub uploads_active: usize,
    pub uploaded_bytes: u64,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        writeln!(f, "agent up {:.0} s", self.uptime_seconds)?;
        writeln!(
            f,
            "cache      {} chunks, {:.1} of {:.1} MiB ({:.1} MiB pinned by mounts); {} hits, {} misses, {} evictions",
            self.cache.entries,
            mib(self.cache.bytes),
            mib(self.cache.capacity),
            mib(self.cache.pinned_bytes),
            self.cache.hits,
            self.cache.misses,
            self.cache.evictions
        )?;
        if self.cache.pinned_over_capacity {
            writeln!(
                f,
                "cache      OVER CAPACITY: the chunks of mounted images alone exceed it; they are kept (raise cache_capacity)"
            )?;
        }
        if self.cache.degraded {
            writeln!(
                f,
                "cache      DEGRADED: its disk is full; chunks are served without being cached until space returns"
            )?;
        }
        let mut sources: Vec<_> = self.bytes_by_source.iter().collect();
        sources.sort();
        for (source, bytes) in sources {
            writeln!(f, "bytes      {:.1} MiB from {source}", mib(*bytes))?;
        }
        if self.mounts.is_empty() {
            writeln!(f, "no mounts")?;
        }
        if let Some(s) = &self.swarm {
            writeln!(
                f,
                "swarm      {} as {}; {} uploads now, {:.1} MiB served to peers",
                if !s.registered {
                    "NOT registered (origin only until the scheduler answers)".to_string()
                } else if s.schedulers > 1 {
                    format!(
                        "registered with {} of {} scheduler replicas",
                        s.schedulers_registered, s.schedulers
                    )
                } else {
                    "registered".to_string()
                },
                s.host_id,
                s.uploads_active,
                mib(s.uploaded_bytes)
            )?;
        }
        if let Some(m) = &self.mirror {
            let mut sources: Vec<_> = m.bytes_by_source.iter().collect();
            sources.sort();
            let sources: Vec<String> = sources
                .into_iter()
                .map(|(s, b)| format!("{:.1} MiB from {s}", mib(*b)))
                .collect();
            writeln!(
                f,
                "mirror     {} requests; blobs: {}; {} responses cut off (bad digest)",
                m.requests,
                sources.join(", "),
                m.aborted_responses
            )?;
        }
        for m in &self.mounts {
            writeln!(f, "mount      {m}")?;
        }
        Ok(())
    }
}

/// One mount in `tessera status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountStatus {
    pub image: String,
    pub digest: String,
    pub mountpoint: PathBuf,
    /// Seconds since the epoch.
    pub mounted_at: u64,
    pub mount_seconds: f64,
    pub first_byte_seconds: Option<f64>,
    /// Reads that waited longer than `fetch.slow_read_ms`.
    #[serde(default)]
    pub slow_reads: u64,
    /// Bytes the workload read through the mount.
    pub bytes_read: u64,
    pub reads: u64,
    pub pull: PullSummary,
    /// Origin bytes per second since the mount.
    pub origin_mib_per_s: f64,
}

impl std::fmt::Display for MountStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        write!(
            f,
            "image {} at {}: {:.1} MiB read, {:.1} MiB fetched from origin ({:.1} MiB on the wire, {:.1} MiB/s), {:.1} MiB from peers, {:.1} MiB from cache; mounted in {:.0} ms",
            self.image,
            self.mountpoint.display(),
            mib(self.bytes_read),
            mib(self.pull.origin_bytes),
            mib(self.pull.origin_wire_bytes),
            self.origin_mib_per_s,
            mib(self.pull.peer_bytes),
            mib(self.pull.cache_bytes),
            self.mount_seconds * 1000.0
        )?;
        if let Some(t) = self.first_byte_seconds {
            write!(f, "; first byte {:.0} ms", t * 1000.0)?;
        }
        if self.slow_reads > 0 {
            write!(f, "; {} slow reads", self.slow_reads)?;
        }
        if self.pull.verification_failures > 0 {
            write!(
                f,
                "; {} chunks failed verification",
                self.pull.verification_failures
            )?;
        }
        Ok(())
    }
}

impl Mount {
    pub fn status(&self) -> MountStatus {
        let pull = self.image.chunks.stats.summary();
        let since = self
            .mounted_at
            .elapsed()
            .unwrap_or_default()
            .as_secs_f64()
            .max(0.001);
        MountStatus {
            image: self.image.requested.clone(),
            digest: self.image.digest.clone(),
            mountpoint: self.mountpoint.clone(),
            mounted_at: self
                .mounted_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
            mount_seconds: self.mount_seconds,
            first_byte_seconds: self.image.first_byte.get().map(Duration::as_secs_f64),
            slow_reads: self.image.slow_reads.load(Ordering::Relaxed),
            bytes_read: self.image.bytes_read.load(Ordering::Relaxed),
            reads: self.image.reads.load(Ordering::Relaxed),
            origin_mib_per_s: pull.origin_wire_bytes as f64 / f64::from(1 << 20) / since,
            pull,
        }
    }
}

impl Agent {
    /// What `tessera status` shows now.
    pub fn status(&self) -> Status {
        let mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
        let mut list: Vec<MountStatus> = mounts.values().map(|m| m.status()).collect();
        list.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
        let mut bytes_by_source = HashMap::new();
        for m in &list {
            *bytes_by_source.entry("cache".to_string()).or_insert(0) += m.pull.cache_bytes;
            *bytes_by_source.entry("origin".to_string()).or_insert(0) += m.pull.origin_bytes;
            *bytes_by_source.entry("peer".to_string()).or_insert(0) += m.pull.peer_bytes;
        }
        Status {
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            mounts: list,
            cache: self.cache.stats(),
            bytes_by_source,
            swarm: self.network.as_ref().map(|n| {
                let (schedulers_registered, schedulers) = n.replicas_registered();
                SwarmStatus {
                    host_id: n.host_id().to_string(),
                    registered: n.registered(),
                    schedulers_registered,
                    schedulers,
                    uploads_active: n.server().active_uploads(),
                    uploaded_bytes: n.server().uploaded_bytes(),
                }
            }),
            mirror: self.mirror.as_ref().map(|m| m.status()),
        }
    }
}
