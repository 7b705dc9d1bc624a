//! Many units with a bound on how many are fetched at once: the one loop behind a
//! mount's prefetch and a preheat job.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::unit::{Unit, Wanted};
use super::{Fetcher, Outcome};

impl Fetcher {
    /// Fetches every unit of `units` (in that order), at most `concurrency` at once,
    /// and hands each result to `done` as it comes (in completion order). On-demand
    /// reads are never held back by it: they join the same flights.
    pub async fn fetch_all(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        units: impl IntoIterator<Item = Unit>,
        concurrency: usize,
        mut done: impl FnMut(Unit, Outcome),
    ) {
        let mut tasks = JoinSet::new();
        for unit in units {
            while tasks.len() >= concurrency.max(1) {
                if let Some(Ok((unit, outcome))) = tasks.join_next().await {
                    done(unit, outcome);
                }
            }
            let (fetcher, wanted) = (self.clone(), wanted.clone());
            tasks.spawn(async move { (unit, fetcher.unit(&wanted, unit).await) });
        }
        while let Some(joined) = tasks.join_next().await {
            if let Ok((unit, outcome)) = joined {
                done(unit, outcome);
            }
        }
    }
}
