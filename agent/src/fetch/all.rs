//! Many units with a bound on how many runs are fetched at once: the one loop behind a
//! mount's prefetch and a preheat job.
//!
//! It streams: each missing unit it reaches leads a run of up to `fetch.stream_bytes`
//! (several times a reader's `merge_bytes`), so a prefetch list, which convert places
//! first in the blob, arrives in a few large requests. Every unit of a run is in flight
//! from the moment the run is planned: a read that needs one waits for the stream
//! instead of sending a request of its own, and the loop itself moves on to the next
//! run rather than waiting for a unit someone else is fetching.
//!
//! A whole image (a preheat, `prefetch = "all"` past the prefetch list) is led, in a
//! swarm, from a random point, wrapping around ([`Fetcher::start_anywhere`]): nodes
//! pulling the same image at once (a preheat of every node, a rollout) then start on
//! different chunks, each fetches a different part from the origin (the scheduler's
//! single flight keeps that to about one copy) and they have something to give each
//! other from the first second. In blob order they would all wait behind the first
//! node, its few holders answering Busy: in the swarm simulation (benches/sim.rs,
//! Kraken's set-up at 260 nodes) the pull took 104 s in blob order and 33 s from
//! random points. A prefetch list and a listing's files keep their order: what a
//! start-up reads first comes first.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::unit::{Unit, Wanted};
use super::{Fetcher, Outcome, Role};
use crate::ChunkFailure;

impl Fetcher {
    /// Fetches every unit of `units` (in that order), leading at most `concurrency`
    /// runs at once, each of units of `units` only, and hands each unit's result to
    /// `done` as it comes (in completion order; units already stored are done at once,
    /// without being read). On-demand reads are never held back by it: they join the
    /// same flights.
    pub async fn fetch_all(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        units: impl IntoIterator<Item = Unit>,
        concurrency: usize,
        mut done: impl FnMut(Unit, Result<(), ChunkFailure>),
    ) {
        let mut runs = JoinSet::new();
        let mut waits: JoinSet<(Unit, Result<(), ChunkFailure>)> = JoinSet::new();
        // Units of runs this call leads (by index): already waited for.
        let mut led = HashSet::new();
        let units: Vec<Unit> = units.into_iter().collect();
        let asked: HashSet<u32> = units.iter().map(|u| u.index).collect();
        for unit in units {
            while let Some(Ok((unit, result))) = waits.try_join_next() {
                done(unit, result);
            }
            if led.contains(&unit.index) {
                continue;
            }
            if self.store.contains(&unit.key) || self.in_memory(&unit).is_some() {
                done(unit, Ok(()));
                continue;
            }
            let role = {
                let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
                match flights.get(&unit.key) {
                    Some(rx) => Role::Wait(rx.clone()),
                    None if self.store.contains(&unit.key) => {
                        drop(flights);
                        done(unit, Ok(()));
                        continue;
                    }
                    None => Role::Lead(self.plan_run_up_to(
                        &mut flights,
                        wanted.as_ref(),
                        unit,
                        self.config.stream_bytes,
                        |next| asked.contains(&next.index),
                    )),
                }
            };
            match role {
                Role::Wait(rx) => {
                    let (fetcher, wanted) = (self.clone(), wanted.clone());
                    waits.spawn(async move {
                        let result = fetcher.outcome_of(rx, &wanted, unit).await;
                        (unit, result)
                    });
                }
                Role::Lead(run) => {
                    while runs.len() >= concurrency.max(1) {
                        runs.join_next().await;
                    }
                    for planned in run.iter() {
                        led.insert(planned.unit.index);
                        let (fetcher, wanted) = (self.clone(), wanted.clone());
                        let (rx, unit) = (planned.done.subscribe(), planned.unit);
                        waits.spawn(async move {
                            let result = fetcher.outcome_of(rx, &wanted, unit).await;
                            (unit, result)
                        });
                    }
                    runs.spawn(self.clone().lead(wanted.clone(), run));
                }
            }
        }
        while runs.join_next().await.is_some() {}
        while let Some(joined) = waits.join_next().await {
            if let Ok((unit, result)) = joined {
                done(unit, result);
            }
        }
    }

    /// What a flight answered for `unit`; a flight that ended without an answer (its
    /// leader went away) is tried again through the whole pipeline.
    async fn outcome_of(
        self: Arc<Self>,
        mut rx: tokio::sync::watch::Receiver<Option<Outcome>>,
        wanted: &Arc<dyn Wanted>,
        unit: Unit,
    ) -> Result<(), ChunkFailure> {
        let answered = match rx.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone(),
            Err(_) => None,
        };
        match answered {
            Some(outcome) => outcome.map(drop),
            None => self.unit(wanted, unit).await.map(drop),
        }
    }
}

impl Fetcher {
    /// In a swarm, turns `items` (a whole image's units, in blob order) to start at a
    /// random one, wrapping around (see the module docs); alone, leaves them as they
    /// are.
    pub fn start_anywhere<T>(&self, items: &mut [T]) {
        if self.peers.as_ref().is_some_and(|p| p.member()) && items.len() > 1 {
            items.rotate_left(random_below(items.len()));
        }
    }
}

/// A random number below `n` (> 0), from the standard library's per-process random
/// hash keys: no generator to seed or share.
pub(super) fn random_below(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(n);
    (h.finish() % n as u64) as usize
}
