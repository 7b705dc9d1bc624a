//! A leader's run: the units it fetches in one go, from peers first (when in a swarm)
//! and then the origin, each answered to its waiters as soon as it is verified.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use rafs_format::chunk::{decode_and_verify, Compression};
use tokio::sync::watch;

use super::unit::{Event, Fetched, Unit, Wanted};
use super::{Fetcher, Outcome, Source};
use crate::cache::ChunkKey;
use crate::ChunkFailure;

/// A unit's verification under way on the blocking pool ([`Fetcher::verify_and_keep`]),
/// joined by the peer and origin steps once their stream has moved on.
pub(super) type Check = tokio::task::JoinHandle<Result<Fetched, String>>;

/// The check of several units at once (the origin step's pieces), with the result of
/// each by its index in the run.
pub(super) type Checks = tokio::task::JoinHandle<Vec<(usize, Result<Fetched, String>)>>;

/// How often a run streaming from the origin asks the scheduler again for what it is
/// fetching, as the registry mirror does for a whole blob: the scheduler keeps an
/// origin flight alive while its fetcher asks (`origin_timeout` after the last ask), so
/// other agents keep waiting for a fetch that is slow but moving instead of fetching
/// the same bytes again (the swarm simulation: with a 200 Mbit/s registry shared by
/// hundreds of flights, one 1 MiB chunk takes longer than the 10 s timeout, and the
/// origin sent 1.78x the image at 100 nodes). A fetcher that dies stops asking, and
/// within `origin_timeout` another agent is sent to the origin.
pub const FLIGHT_KEEPALIVE: Duration = Duration::from_secs(3);

/// A unit a leader fetches, and where its waiters listen.
pub(super) struct Planned {
    pub unit: Unit,
    pub done: watch::Sender<Option<Outcome>>,
}

/// `[start, end)` of the blob spanned by these units.
pub(super) fn span<'a>(units: impl IntoIterator<Item = &'a Unit>) -> (u64, u64) {
    units
        .into_iter()
        .map(Unit::range)
        .fold((u64::MAX, 0), |(s, e), (us, ue)| (s.min(us), e.max(ue)))
}

impl Fetcher {
    /// Registers `first` and the contiguous missing units after it (within
    /// `merge_bytes`) as in flight, led by the caller.
    pub(super) fn plan_run(
        &self,
        flights: &mut HashMap<ChunkKey, watch::Receiver<Option<Outcome>>>,
        wanted: &dyn Wanted,
        first: Unit,
    ) -> Arc<[Planned]> {
        self.plan_run_up_to(flights, wanted, first, self.config.merge_bytes, |_| true)
    }

    /// [`plan_run`](Self::plan_run) within `max_bytes` instead, taking only units
    /// `may_join` accepts. Spans ([`Unit::span`]) overlap: one joins while it starts
    /// within the run's bytes, and spans the run cannot take (stored, in flight) are
    /// stepped over rather than ending it, since inflating passes them anyway.
    /// Spans the first brings at no cost ([`Wanted::along_with`]) join first.
    pub(super) fn plan_run_up_to(
        &self,
        flights: &mut HashMap<ChunkKey, watch::Receiver<Option<Outcome>>>,
        wanted: &dyn Wanted,
        first: Unit,
        max_bytes: u64,
        may_join: impl Fn(&Unit) -> bool,
    ) -> Arc<[Planned]> {
        let mut planned = vec![first];
        let takes = |planned: &[Unit], unit: &Unit| {
            may_join(unit)
                && !flights.contains_key(&unit.key)
                && !planned.iter().any(|u| u.key == unit.key)
                && !self.store.contains(&unit.key)
        };
        for unit in wanted.along_with(&first) {
            if takes(&planned, &unit) {
                planned.push(unit);
            }
        }
        // A span's own bytes start at its checkpoint, often far before its data: the
        // budget counts what the run adds after it.
        let budget_from = match first.span {
            Some(_) => first.range().1,
            None => first.offset,
        };
        let mut end = span(&planned).1;
        let mut last = first;
        while let Some(next) = wanted.next_in_blob(&last) {
            let next_end = next.range().1.max(end);
            if next.offset > end || next_end - budget_from > max_bytes {
                break;
            }
            if takes(&planned, &next) {
                end = next_end;
                planned.push(next);
            } else if next.span.is_none() {
                break;
            }
            last = next;
        }
        planned
            .into_iter()
            .map(|unit| {
                let (done, rx) = watch::channel(None);
                flights.insert(unit.key, rx);
                Planned { unit, done }
            })
            .collect()
    }

    /// Fetches a planned run: peers, then the origin for what is still missing; what
    /// no source gave is answered with the last failure.
    pub(super) async fn lead(self: Arc<Self>, wanted: Arc<dyn Wanted>, run: Arc<[Planned]>) {
        self.metrics.inflight.inc();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; run.len()];
        if let Some(peers) = self.peers.clone() {
            self.from_peers(peers.as_ref(), &wanted, &run, &mut outcomes)
                .await;
        }
        let last = self
            .from_origin_kept_alive(&wanted, &run, &mut outcomes)
            .await;
        self.metrics.inflight.dec();
        for (planned, outcome) in run.iter().zip(outcomes) {
            if outcome.is_none() && planned.done.borrow().is_none() {
                self.answer(
                    planned,
                    Err(ChunkFailure::Exhausted {
                        attempts: self.config.attempts,
                        last: last.clone(),
                    }),
                );
            }
        }
    }

    /// The origin step, asking the scheduler again every [`FLIGHT_KEEPALIVE`] for the
    /// units still missing while it streams (when in a swarm): the answer is not used.
    async fn from_origin_kept_alive(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        run: &Arc<[Planned]>,
        outcomes: &mut [Option<Outcome>],
    ) -> String {
        let pending: Vec<&Unit> = run
            .iter()
            .zip(outcomes.iter())
            .filter(|(_, o)| o.is_none())
            .map(|(p, _)| &p.unit)
            .collect();
        let (Some(peers), Some(first)) = (self.peers.clone(), pending.first()) else {
            return self.from_origin(wanted, run, outcomes).await;
        };
        if !peers.member() {
            return self.from_origin(wanted, run, outcomes).await;
        }
        let blob = wanted.blob(first).to_string();
        let range = span(pending);
        let keep_alive = async {
            loop {
                tokio::time::sleep(FLIGHT_KEEPALIVE).await;
                let _ = peers.find(&blob, range).await;
            }
        };
        tokio::select! {
            last = self.from_origin(wanted, run, outcomes) => last,
            () = keep_alive => String::new(),
        }
    }

    /// Ends a unit's flight without storing it (it failed, or another source has it),
    /// then answers everyone waiting: in that order, so a waiter that tries again finds
    /// no flight and leads a new one, instead of joining this one again.
    pub(super) fn answer(&self, planned: &Planned, outcome: Outcome) {
        self.land(planned);
        let _ = planned.done.send(Some(outcome));
    }

    /// Ends a unit's flight whose waiters were answered: later callers find it in the
    /// store (or fetch it again, if it could not be stored).
    fn land(&self, planned: &Planned) {
        self.flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&planned.unit.key);
        self.landings.notify_waiters();
    }

    /// Blocking: verifies a unit's bytes from `source` (stored with `compression`),
    /// then [`keep`](Self::keep)s it. On a mismatch the reason, and nobody is answered
    /// (the unit is fetched again elsewhere).
    pub(super) fn verify_and_keep(
        &self,
        wanted: &dyn Wanted,
        planned: &Planned,
        raw: &[u8],
        compression: Compression,
        source: Source,
        started: Instant,
    ) -> Result<Fetched, String> {
        let unit = &planned.unit;
        let data = decode_and_verify(raw, compression, unit.size, unit.key.algo, &unit.key.digest)?;
        Ok(self.keep(wanted, planned, data, source, started))
    }

    /// Blocking: answers a verified unit's waiters, then stores it. The waiters do not
    /// wait for the store (a file created and written): the bytes are verified, and
    /// until the store is done the unit stays in flight, so a caller coming meanwhile
    /// is answered from the flight rather than fetching it again. `newly_stored`:
    /// whether the store took it (the waiters were told `true`, that it is being
    /// stored).
    pub(super) fn keep(
        &self,
        wanted: &dyn Wanted,
        planned: &Planned,
        data: Vec<u8>,
        source: Source,
        started: Instant,
    ) -> Fetched {
        let unit = &planned.unit;
        let bytes = data.len() as u64;
        wanted.observe(Event::Got { source, bytes });
        self.metrics.record(source, bytes, started.elapsed());
        let data = Arc::new(data);
        let _ = planned.done.send(Some(Ok(Fetched {
            data: data.clone(),
            source,
            newly_stored: true,
        })));
        let newly_stored = match self.store.put(&unit.key, &data) {
            Ok(()) => true,
            // The cache says so itself, once a minute.
            Err(crate::Error::CacheDiskFull { .. }) => false,
            Err(e) => {
                // Served anyway; it will be fetched again next time.
                tracing::warn!(unit = %unit.key, error = %e, "could not cache a chunk");
                false
            }
        };
        self.land(planned);
        Fetched {
            data,
            source,
            newly_stored,
        }
    }

    /// Counts a failed request to `source`, or (with `verification`) bytes from it that
    /// failed verification, in the wanted's account and the metrics.
    pub(super) fn count_failure(&self, wanted: &dyn Wanted, source: Source, verification: bool) {
        let (event, family) = if verification {
            (
                Event::VerificationFailed(source),
                &self.metrics.verification_failures,
            )
        } else {
            (Event::FetchFailed(source), &self.metrics.errors)
        };
        wanted.observe(event);
        family.get_or_create(&source.label()).inc();
    }

    /// Reports verified units to the swarm when their kind may be offered at once.
    pub(super) fn announce(
        &self,
        wanted: &dyn Wanted,
        blob: &str,
        held: Vec<(ChunkKey, (u64, u64))>,
    ) {
        if let Some(peers) = &self.peers {
            if wanted.announce_at_once() && !held.is_empty() {
                peers.held(blob, held);
            }
        }
    }
}
