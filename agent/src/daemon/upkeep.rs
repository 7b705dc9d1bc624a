//! The chunk cache's upkeep while the agent runs: checkpoints, so that what was cached
//! is trusted after a crash without being read again (see `cache`), the disk-usage
//! watermarks (checked here too, since other tenants of the disk fill it while the
//! cache writes nothing), and the background scrub, which re-verifies every cached
//! chunk at a bounded rate and drops what fails.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::cache::{ChunkCache, Verified};
use crate::config::ScrubConfig;
use crate::fetch::blocking;

/// A checkpoint this often while chunks are being stored: a crash costs at most this
/// much of the cache a verification at its next read.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(10);
/// The cache filesystem's usage is checked this often.
const WATERMARKS_EVERY: Duration = Duration::from_secs(5);

/// What a pass over the cache found (`tessera cache verify` prints it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Chunks read and checked against their digests.
    pub chunks: u64,
    pub bytes: u64,
    /// Chunks that failed and were dropped (fetched again when next read).
    pub dropped: u64,
    pub millis: u64,
}

/// Checkpoints and scrubs until the agent stops (the task is aborted).
pub(super) async fn run(cache: Arc<ChunkCache>, scrub: ScrubConfig) {
    tokio::join!(
        checkpoints(cache.clone()),
        watermarks(cache.clone()),
        scrubs(cache, scrub)
    );
}

async fn watermarks(cache: Arc<ChunkCache>) {
    if cache.watermarks().is_none() {
        return;
    }
    loop {
        tokio::time::sleep(WATERMARKS_EVERY).await;
        let cache = cache.clone();
        match blocking(move || cache.keep_watermarks()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not check the cache filesystem's usage")
            }
            Err(_) => return,
        }
    }
}

async fn checkpoints(cache: Arc<ChunkCache>) {
    let mut stored = cache.stats().stored_bytes;
    loop {
        tokio::time::sleep(CHECKPOINT_EVERY).await;
        let now = cache.stats().stored_bytes;
        if now == stored {
            continue;
        }
        stored = now;
        let cache = cache.clone();
        match blocking(move || cache.checkpoint()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not checkpoint the chunk cache"),
            Err(_) => return,
        }
    }
}

async fn scrubs(cache: Arc<ChunkCache>, scrub: ScrubConfig) {
    if scrub.bytes_per_sec == 0 {
        return;
    }
    let every = Duration::from_secs(scrub.every_hours.max(1) * 3600);
    loop {
        tokio::time::sleep(every).await;
        let report = verify_all(&cache, Some(scrub.bytes_per_sec)).await;
        tracing::info!(
            chunks = report.chunks,
            bytes = report.bytes,
            dropped = report.dropped,
            secs = report.millis / 1000,
            "chunk cache scrubbed"
        );
    }
}

/// Verifies every chunk cached now, least recently used first, reading at most `pace`
/// bytes a second (`None`: as fast as the disk goes), and drops those that fail.
pub(super) async fn verify_all(cache: &Arc<ChunkCache>, pace: Option<u64>) -> VerifyReport {
    let started = Instant::now();
    let mut report = VerifyReport::default();
    for key in cache.keys() {
        let one = cache.clone();
        match blocking(move || one.verify(&key)).await {
            Ok(Ok(Verified::Good(bytes))) => {
                report.chunks += 1;
                report.bytes += bytes;
            }
            Ok(Ok(Verified::Dropped)) => {
                report.chunks += 1;
                report.dropped += 1;
            }
            Ok(Ok(Verified::Absent)) => {}
            Ok(Err(e)) => {
                tracing::warn!(chunk = %key, error = %e, "could not verify a cached chunk")
            }
            Err(_) => break,
        }
        if let Some(rate) = pace.filter(|r| *r > 0) {
            let due = Duration::from_secs_f64(report.bytes as f64 / rate as f64);
            tokio::time::sleep_until(started + due).await;
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    report
}
