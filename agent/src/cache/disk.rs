//! The disk-usage watermarks: the cache's filesystem is often shared (the node's root
//! disk, the kubelet's images, logs), so besides its own byte capacity the cache gives
//! up chunks when the filesystem as a whole fills. Above `high` percent used it evicts
//! unpinned chunks, least recently used first, until usage is below `low` percent (or
//! nothing unpinned is left: then a full disk is met by the degraded mode, see the
//! module docs of `cache`).
//!
//! Usage is asked of the filesystem (`statvfs`) every [`CHECK_BYTES`] written or
//! [`CHECK_EVERY`] (whichever comes first; never a syscall per chunk) and by the
//! daemon's upkeep, which also catches other tenants filling the disk.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ChunkCache;
use crate::{Error, Result};

/// Usage is checked after this many bytes were written to the cache…
const CHECK_BYTES: u64 = 64 << 20;
/// …or when a put comes this long after the last check.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// At most one warning this often while usage stays above `high` with nothing to evict.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// How full a filesystem is, as `df` counts: `used` of `size` bytes, where `size` is
/// what is used plus what unprivileged writers may still use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    pub used: u64,
    pub size: u64,
}

impl DiskUsage {
    pub fn percent(&self) -> f64 {
        if self.size == 0 {
            return 0.0;
        }
        self.used as f64 * 100.0 / self.size as f64
    }
}

/// Where the cache learns how full its filesystem is: `statvfs` on its directory;
/// tests give a fake.
pub trait DiskSpace: Send + Sync {
    fn usage(&self) -> io::Result<DiskUsage>;
}

/// The filesystem holding `0`, by `statvfs`.
struct Statvfs(PathBuf);

impl DiskSpace for Statvfs {
    fn usage(&self) -> io::Result<DiskUsage> {
        let st = rustix::fs::statvfs(&self.0)?;
        let block = st.f_frsize.max(1);
        let used = st.f_blocks.saturating_sub(st.f_bfree) * block;
        Ok(DiskUsage {
            used,
            size: used + st.f_bavail * block,
        })
    }
}

/// The watermarks, in percent of the filesystem used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermarks {
    pub high_percent: u8,
    pub low_percent: u8,
}

/// The watermarks and what checking them needs.
pub(super) struct DiskWatch {
    marks: Watermarks,
    source: Box<dyn DiskSpace>,
    /// Bytes put since the last check.
    written: AtomicU64,
    /// When the last check was.
    checked: Mutex<Instant>,
    /// When the last "above high, nothing to evict" warning was.
    warned: Mutex<Option<Instant>>,
}

impl ChunkCache {
    /// Sets the watermarks on the cache filesystem's usage (see `disk.rs`), measured by
    /// `statvfs` on the cache's directory, or by `source` when given (tests).
    pub fn with_watermarks(
        mut self,
        marks: Watermarks,
        source: Option<Box<dyn DiskSpace>>,
    ) -> Self {
        let source = source.unwrap_or_else(|| Box::new(Statvfs(self.data_dir.clone())));
        self.disk = Some(DiskWatch {
            marks,
            source,
            written: AtomicU64::new(0),
            checked: Mutex::new(Instant::now()),
            warned: Mutex::new(None),
        });
        self
    }

    pub fn watermarks(&self) -> Option<Watermarks> {
        self.disk.as_ref().map(|d| d.marks)
    }

    /// The cache filesystem's usage now; `None` without watermarks.
    pub fn disk_usage(&self) -> Option<DiskUsage> {
        self.disk.as_ref().and_then(|d| d.source.usage().ok())
    }

    /// Counts `size` bytes put, and checks the watermarks when due. A failed check is
    /// logged, not returned: the chunk was stored all the same.
    pub(super) fn written(&self, size: u64) {
        let Some(disk) = &self.disk else {
            return;
        };
        let written = disk.written.fetch_add(size, Relaxed) + size;
        let due = written >= CHECK_BYTES || {
            let checked = disk.checked.lock().unwrap_or_else(PoisonError::into_inner);
            checked.elapsed() >= CHECK_EVERY
        };
        if due {
            if let Err(e) = self.keep_watermarks() {
                tracing::warn!(error = %e, "could not keep the cache filesystem's watermarks");
            }
        }
    }

    /// Checks the filesystem's usage and, above the high watermark, evicts unpinned
    /// chunks (least recently used first) until it is below the low one or none is
    /// left. Returns the usage found first (`None` without watermarks).
    pub fn keep_watermarks(&self) -> Result<Option<DiskUsage>> {
        let Some(disk) = &self.disk else {
            return Ok(None);
        };
        disk.written.store(0, Relaxed);
        *disk.checked.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        let usage = disk
            .source
            .usage()
            .map_err(|e| Error::io("measure the filesystem of", &self.data_dir, e))?;
        if usage.percent() < f64::from(disk.marks.high_percent) {
            return Ok(Some(usage));
        }
        let low = (u128::from(usage.size) * u128::from(disk.marks.low_percent) / 100) as u64;
        let excess = usage.used.saturating_sub(low);
        let bytes = self.bytes.load(Relaxed);
        if self.evictable() {
            tracing::info!(
                used_percent = format!("{:.1}", usage.percent()),
                high = disk.marks.high_percent,
                low = disk.marks.low_percent,
                freeing = excess,
                "the cache filesystem is above its high watermark: evicting unpinned chunks"
            );
            self.evict_to(bytes.saturating_sub(excess))?;
        }
        if !self.evictable() && excess > bytes.saturating_sub(self.bytes.load(Relaxed)) {
            let mut warned = disk.warned.lock().unwrap_or_else(PoisonError::into_inner);
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                *warned = Some(Instant::now());
                tracing::warn!(
                    dir = %self.data_dir.display(),
                    pinned_bytes = self.pinned_bytes(),
                    "the cache filesystem stays above its high watermark with nothing unpinned left to evict (free space on that disk)"
                );
            }
        }
        Ok(Some(usage))
    }
}
