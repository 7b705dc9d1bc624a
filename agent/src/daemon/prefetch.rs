//! Prefetch after a mount: the chunks the mount request named first (a checkpoint's
//! working set), an index's checkpoint windows, the image's prefetch list (and, for
//! `all`, every other chunk in blob order) through the fetcher at a bounded
//! concurrency, in the background, so on-demand reads are never queued behind it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::mounted::MountedImage;
use crate::config::Prefetch;
use crate::fetch::{Fetcher, Wanted};

/// Fetches `first` (chunks the image does not have are left out), then, unless `mode`
/// is `none`, an index's windows and the image's prefetch list (and, for `all`, every
/// other chunk, in blob order — in a swarm from a random chunk on, wrapping around),
/// with at most `concurrency` chunks at a time, so on-demand reads keep going.
pub(super) async fn prefetch_image(
    fetcher: Arc<Fetcher>,
    image: Arc<MountedImage>,
    mode: Prefetch,
    first: Vec<u32>,
    concurrency: usize,
) {
    let started = Instant::now();
    let b = &image.chunks.bootstrap;
    let mut seen = HashSet::new();
    let mut chunks: Vec<u32> = first
        .into_iter()
        .filter(|c| *c < b.chunk_count() && seen.insert(*c))
        .collect();
    let working_set = chunks.len();
    if mode == Prefetch::None {
        return fetch_chunks(&fetcher, &image, chunks, working_set, concurrency, started).await;
    }
    // An index's checkpoint windows first (format.md §17): every read that goes to
    // the origin needs one, and they are a small blob fetched in a few requests.
    for cp in 0..b.checkpoint_count() {
        if let Some(window) = b.checkpoint(cp).ok().and_then(|c| c.window_chunk) {
            if seen.insert(window) {
                chunks.push(window);
            }
        }
    }
    if let Ok(entries) = b.prefetch() {
        for e in entries {
            let Ok(inode) = b.inode(e.ino) else { continue };
            let Ok(pieces) = b.file_chunks(&inode) else {
                continue;
            };
            chunks.extend(
                pieces
                    .iter()
                    .filter_map(|p| p.chunk)
                    .filter(|c| seen.insert(*c)),
            );
        }
    }
    if mode == Prefetch::All {
        let mut rest: Vec<(u32, u64, u32)> = (0..b.chunk_count())
            .filter(|c| !seen.contains(c))
            .filter_map(|c| {
                b.chunk(c)
                    .ok()
                    .map(|i| (i.blob_index, i.compressed_offset, c))
            })
            .collect();
        rest.sort_unstable();
        fetcher.start_anywhere(&mut rest);
        chunks.extend(rest.into_iter().map(|(_, _, c)| c));
    }
    fetch_chunks(&fetcher, &image, chunks, working_set, concurrency, started).await;
}

async fn fetch_chunks(
    fetcher: &Arc<Fetcher>,
    image: &MountedImage,
    chunks: Vec<u32>,
    working_set: usize,
    concurrency: usize,
    started: Instant,
) {
    let total = chunks.len();
    let mut failed = 0usize;
    let units: Vec<_> = chunks
        .into_iter()
        .filter_map(|c| image.chunks.unit(c).ok())
        .collect();
    let wanted: Arc<dyn Wanted> = image.chunks.clone();
    fetcher
        .fetch_all(&wanted, units, concurrency, |_, outcome| {
            failed += usize::from(outcome.is_err());
        })
        .await;
    tracing::info!(
        image = %image.chunks.reference,
        chunks = total,
        working_set,
        failed,
        seconds = started.elapsed().as_secs_f64(),
        "prefetch done"
    );
}
