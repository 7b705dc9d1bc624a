//! What the cache holds and for whom: `tessera cache usage` (bytes, pins per mounted
//! image, the filesystem against its watermarks), `tessera cache prune`, and the bytes
//! a mounted image holds in the cache (the snapshotter's `Usage` of a lazy snapshot).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Agent;
use crate::cache::{DiskUsage, PinnedSet, Watermarks};
use crate::fetch::blocking;
use crate::{Error, Result};

/// What `tessera cache usage` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheUsage {
    pub bytes: u64,
    pub entries: u64,
    pub capacity: u64,
    /// Bytes of cached chunks that mounted images pin (never evicted while mounted).
    pub pinned_bytes: u64,
    /// Pinned chunks alone exceed the capacity (the cache holds more than it should).
    pub pinned_over_capacity: bool,
    /// The disk is full: chunks are served without being cached.
    pub degraded: bool,
    /// Each mount's pin: its image, mountpoint and what it holds in the cache.
    pub pinned: Vec<PinnedSet>,
    /// The cache filesystem's usage, and the watermarks (`None`: off).
    pub disk: Option<DiskUsage>,
    pub watermarks: Option<Watermarks>,
}

/// What `tessera cache prune` evicted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    pub evicted_chunks: u64,
    pub evicted_bytes: u64,
    /// What the cache holds after, and how much of it is pinned.
    pub bytes: u64,
    pub pinned_bytes: u64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

impl std::fmt::Display for CacheUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "cache      {} chunks, {:.1} of {:.1} MiB; {:.1} MiB pinned by {} mounts",
            self.entries,
            mib(self.bytes),
            mib(self.capacity),
            mib(self.pinned_bytes),
            self.pinned.len()
        )?;
        if self.pinned_over_capacity {
            writeln!(f, "cache      OVER CAPACITY: mounted images alone need more than the capacity (raise cache_capacity)")?;
        }
        if self.degraded {
            writeln!(
                f,
                "cache      DEGRADED: its disk is full; chunks are served without being cached"
            )?;
        }
        match (&self.disk, &self.watermarks) {
            (Some(disk), Some(marks)) => writeln!(
                f,
                "disk       {:.1}% used ({:.1} of {:.1} MiB); evicting above {}% down to {}%",
                disk.percent(),
                mib(disk.used),
                mib(disk.size),
                marks.high_percent,
                marks.low_percent
            )?,
            _ => writeln!(
                f,
                "disk       no watermarks (cache_disk_high_percent = 100)"
            )?,
        }
        for set in &self.pinned {
            writeln!(
                f,
                "pinned     {}: {:.1} MiB cached ({} of {} chunks)",
                set.label,
                mib(set.cached_bytes),
                set.cached_chunks,
                set.chunks
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Display for PruneReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pruned {} chunks ({:.1} MiB); the cache holds {:.1} MiB, {:.1} MiB of it pinned by mounted images",
            self.evicted_chunks,
            mib(self.evicted_bytes),
            mib(self.bytes),
            mib(self.pinned_bytes)
        )
    }
}

fn stopped(_: crate::ChunkFailure) -> Error {
    Error::Agent("the agent is stopping".into())
}

impl Agent {
    pub(super) async fn cache_usage(&self) -> Result<CacheUsage> {
        let cache = self.cache.clone();
        // Counting each mount's cached chunks reads the index once per chunk.
        blocking(move || {
            let stats = cache.stats();
            CacheUsage {
                bytes: stats.bytes,
                entries: stats.entries,
                capacity: stats.capacity,
                pinned_bytes: stats.pinned_bytes,
                pinned_over_capacity: stats.pinned_over_capacity,
                degraded: stats.degraded,
                pinned: cache.pinned_sets(),
                disk: cache.disk_usage(),
                watermarks: cache.watermarks(),
            }
        })
        .await
        .map_err(stopped)
    }

    /// Evicts every chunk no mount pins, or down to `keep` bytes.
    pub(super) async fn cache_prune(&self, keep: Option<u64>) -> Result<PruneReport> {
        let cache = self.cache.clone();
        let (evicted_chunks, evicted_bytes) = blocking(move || cache.prune(keep.unwrap_or(0)))
            .await
            .map_err(stopped)??;
        let stats = self.cache.stats();
        let report = PruneReport {
            evicted_chunks,
            evicted_bytes,
            bytes: stats.bytes,
            pinned_bytes: stats.pinned_bytes,
        };
        tracing::info!("{report}");
        Ok(report)
    }

    /// Bytes of the chunks of the image mounted at `mountpoint` that the cache holds
    /// now; `None` if nothing of this agent is mounted there.
    pub async fn mounted_bytes(self: &Arc<Self>, mountpoint: &Path) -> Option<u64> {
        let key = Self::canonical(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let keys = {
            let mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
            mounts.get(&key)?.pinned_keys()?
        };
        let cache = self.cache.clone();
        blocking(move || cache.cached_bytes(&keys)).await.ok()
    }
}
