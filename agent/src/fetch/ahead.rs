//! Fetch-ahead from a peer that holds a whole blob: a listing's files, before they are
//! read.
//!
//! A start-up reads file after file, each a miss of its own, and from a peer each miss
//! costs a round trip and the peer's disk read before the first byte: about 2 ms, paid
//! hundreds of times, one after another. A program lists a directory before it reads
//! from it (an interpreter's import system does, to find modules), and convert lays out
//! a directory's files together, so the files a listing names are a few contiguous
//! stretches of the blob: fetched in runs of `fetch.stream_bytes` while the program is
//! still looking, they are on the node when it opens them. Only from a peer the
//! scheduler named lately as holding the whole blob: speculation costs the origin link,
//! the one every node shares, and a holder of the whole blob has every chunk asked for.
//! The reads join the same flights, so nothing is fetched twice.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::unit::{Unit, Wanted};
use super::Fetcher;

/// Runs fetched ahead at once, over all listings: the reader's own misses, which
/// cannot wait, keep the rest of the peer link.
pub(super) const AHEAD_RUNS: usize = 4;

/// Listings waiting for their fetch-ahead at most; later ones are not fetched ahead
/// (by the time their turn came the reader would be there first).
const AHEAD_QUEUED: usize = 32;

impl Fetcher {
    /// Fetches the missing units of `units` (the chunks of a listing's files, in any
    /// order; only looked at in a swarm) in the background on `runtime`, if a peer the scheduler named lately holds their
    /// whole blob (see the module docs). Returns how many units it queued: neither
    /// stored nor in flight.
    pub fn fetch_ahead(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        wanted: &Arc<dyn Wanted>,
        units: impl IntoIterator<Item = Unit>,
    ) -> usize {
        if self.peers.is_none() {
            return 0;
        }
        // Whether a whole-blob holder is known, asked once per blob.
        let mut held: HashMap<u32, bool> = HashMap::new();
        let mut units: Vec<Unit> = units
            .into_iter()
            .filter(|unit| {
                *held
                    .entry(unit.blob)
                    .or_insert_with(|| self.known_holders(wanted.blob(unit)).is_some())
            })
            .collect();
        {
            // A unit stays in flight until it is stored: neither, and it is missing.
            let flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            units
                .retain(|unit| !flights.contains_key(&unit.key) && !self.store.contains(&unit.key));
        }
        // In blob order, each once: the runs then start at the lowest offsets.
        units.sort_unstable_by_key(|u| (u.blob, u.offset));
        units.dedup_by_key(|u| u.key);
        if units.is_empty() {
            return 0;
        }
        if self.ahead_queued.fetch_add(1, Ordering::SeqCst) >= AHEAD_QUEUED {
            self.ahead_queued.fetch_sub(1, Ordering::SeqCst);
            return 0;
        }
        let queued = units.len();
        self.metrics.ahead_units.inc_by(queued as u64);
        let (fetcher, wanted) = (self.clone(), wanted.clone());
        runtime.spawn(async move {
            // The runs of every listing share AHEAD_RUNS; a closed semaphore (never)
            // would only skip the fetch.
            if let Ok(_turn) = fetcher.ahead_turns.acquire().await {
                fetcher.fetch_all(&wanted, units, 1, |_, _| {}).await;
            }
            fetcher.ahead_queued.fetch_sub(1, Ordering::SeqCst);
        });
        queued
    }
}
