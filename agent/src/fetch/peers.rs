//! The peer step of a run, one policy for image chunks and mirror pieces. The leader
//! asks the scheduler who holds what is still missing, and:
//!
//! - **Peers**: the run is cut into up to [`PARALLEL_PEERS`] slices fetched from
//!   different peers at once; what a peer did not have, or could not give in time, is
//!   asked of the next peer in the following round. Every unit is verified on arrival
//!   (a peer is never trusted); a peer that sends bad bytes, stalls past
//!   `p2p.peer_timeout_ms` or drops the connection is abandoned for this run and
//!   reported, so the scheduler stops offering it.
//! - **Busy**: when every peer asked was merely serving its maximum of uploads, the
//!   leader rests (0.1 s, doubling to [`BUSY_PAUSE_MAX`]) and asks again: right after a
//!   blob completes one holder serves a whole swarm, and waiting for it is cheaper than
//!   the origin, the one link every node shares (with 20 nodes on 2 cores, giving up
//!   after 3 s sent the registry 4.2x the image).
//! - **Wait**: another agent is fetching the range from the origin; ask again shortly.
//!   The scheduler answers Wait only while that fetch shows signs of life (its fetcher
//!   asks again every [`FLIGHT_KEEPALIVE`](super::run::FLIGHT_KEEPALIVE) while it
//!   streams, and a flight not renewed within `origin_timeout` is presumed failed), so a
//!   slow origin fetch that is still moving is waited for rather than fetched again by
//!   every waiter (the swarm simulation, benches/sim.rs: a fixed 20 s bound sent the
//!   origin 8.8x the image at 1,000 nodes behind a 200 Mbit/s registry). A run waits
//!   at most [`WAIT_PATIENCE`] times `p2p.max_wait_secs` in all.
//! - Rests between busy rounds last at most `p2p.max_wait_secs` *since the run last
//!   made progress* (a unit landed, or a Wait vouched for a live origin fetch); then,
//!   or when told to, or after [`FRUITLESS_ROUNDS`] rounds in which peers failed, the
//!   origin.
//! - **Remembered holders** (of a whole blob, named by the scheduler in the last
//!   [`HOLDERS_FRESH`]) are asked starting from a different one each run, so the runs
//!   of one node, and the nodes that were all named the same early holders, spread over
//!   them instead of all asking the first (the simulation's Kraken set-up: 274,000 Busy
//!   answers with every run starting at the same holder).
//! - Each slice's verified units are announced as soon as that slice ends, not after
//!   every slice of the round: a slow slice does not hold back what the others got.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rafs_format::chunk::Compression;
use tessera_proto::domain::{ChunkEncoding, HostId, Peer, PeerChoice};
use tessera_proto::pb;
use tessera_proto::ranges::merge;

use super::run::{span, Check, Planned};
use super::seams::Peers;
use super::unit::{Unit, Wanted};
use super::{Fetcher, Outcome, Source};
use crate::peer::network::PeerFailure;

/// Peers a run is fetched from at once.
pub const PARALLEL_PEERS: usize = 4;

/// Rounds in which peers failed (not merely busy) before the origin is used instead.
const FRUITLESS_ROUNDS: u32 = 2;

/// Units of one slice verified and stored at once while the stream goes on.
const CHECKS_IN_FLIGHT: usize = 4;

/// Longest pause between two rounds of asking peers that were all busy.
pub const BUSY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The first such pause.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// How long the holders of a whole blob the scheduler named are asked again for other
/// runs of that blob without asking the scheduler (a run they fail forgets them sooner).
pub const HOLDERS_FRESH: Duration = Duration::from_secs(5);

/// A run waits for other agents' origin fetches (Wait answers, each vouching for a
/// fetch still alive) at most this many times `p2p.max_wait_secs` in all: a bound for a
/// scheduler that would answer Wait for ever, not the policy.
pub const WAIT_PATIENCE: u32 = 15;

/// What one peer gave for one slice of a run.
struct Slice {
    peer: Peer,
    /// Run indices it gave, verified and already answered.
    got: Vec<(usize, super::Fetched)>,
    failure: Option<PeerFailure>,
}

/// How a round over the peers the scheduler named went.
struct Round {
    got: usize,
    /// Nothing was had and every peer asked was busy.
    only_busy: bool,
}

/// Cuts `pending` (run indices in blob order) into `parts` contiguous slices of about
/// equal stored bytes.
fn slices(run: &[Planned], pending: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let total: u64 = pending
        .iter()
        .map(|&i| u64::from(run[i].unit.stored_size))
        .sum();
    let share = total.div_ceil(parts.max(1) as u64).max(1);
    let mut out: Vec<Vec<usize>> = vec![Vec::new()];
    let mut bytes = 0u64;
    for &i in pending {
        let last = out.len() - 1;
        if bytes >= share * (last as u64 + 1) && out.len() < parts {
            out.push(Vec::new());
        }
        if let Some(slice) = out.last_mut() {
            slice.push(i);
        }
        bytes += u64::from(run[i].unit.stored_size);
    }
    out.retain(|s| !s.is_empty());
    out
}

impl Fetcher {
    /// Fills `outcomes` with what peers can give of the run (see the module docs).
    pub(super) async fn from_peers(
        self: &Arc<Self>,
        peers: &dyn Peers,
        wanted: &Arc<dyn Wanted>,
        run: &Arc<[Planned]>,
        outcomes: &mut [Option<Outcome>],
    ) {
        let Some(first) = run.first() else { return };
        let blob = wanted.blob(&first.unit).to_string();
        let started = Instant::now();
        // When the run last made progress: a unit landed, or the scheduler vouched for
        // a live origin fetch of it.
        let mut progress = started;
        let mut fruitless = 0;
        let mut rest = BUSY_PAUSE;
        let rested_too_long =
            |progress: Instant, pause: Duration| progress.elapsed() + pause > peers.max_wait();
        loop {
            let missing: Vec<usize> = (0..run.len()).filter(|&i| outcomes[i].is_none()).collect();
            if missing.is_empty() {
                return;
            }
            // One stretch of consecutive missing units at a time: asked for the span of
            // units with holes in it (what a round got), the scheduler may name holders
            // of the hole only, who have none of what is missing, and after two such
            // rounds the run goes to the origin without a flight of its own (the swarm
            // simulation, Kraken's set-up: 63 runs at 1,000 nodes, 1.06x the image).
            let pending: Vec<usize> = missing
                .iter()
                .enumerate()
                .take_while(|&(k, &i)| i == missing[0] + k)
                .map(|(_, &i)| i)
                .collect();
            let range = span(pending.iter().map(|&i| &run[i].unit));
            let known = self.known_holders(&blob).filter(|_| peers.member());
            let remembered = known.is_some();
            let choice = match known {
                Some(holders) => Some(PeerChoice::Peers(holders)),
                None => peers.find(&blob, range).await,
            };
            if let (Some(PeerChoice::Peers(named)), false) = (&choice, remembered) {
                self.remember_holders(&blob, named);
            }
            match choice {
                None | Some(PeerChoice::Origin) => return,
                Some(PeerChoice::Wait(pause)) => {
                    if started.elapsed() + pause > peers.max_wait() * WAIT_PATIENCE {
                        tracing::warn!(blob, start = range.0, end = range.1, "waited too long for other agents' origin fetch; fetching from the origin");
                        return;
                    }
                    tokio::time::sleep(pause).await;
                    progress = Instant::now();
                }
                Some(PeerChoice::Peers(named)) => {
                    let round = self
                        .from_these_peers(peers, wanted, &blob, run, &pending, named, outcomes)
                        .await;
                    if remembered && round.got < pending.len() {
                        // They no longer hold it all, or failed: ask the scheduler.
                        self.forget_holders(&blob);
                        continue;
                    }
                    if round.got > 0 {
                        progress = Instant::now();
                        rest = BUSY_PAUSE;
                        continue;
                    }
                    if round.only_busy {
                        if rested_too_long(progress, rest) {
                            tracing::warn!(
                                blob,
                                start = range.0,
                                end = range.1,
                                "every holder stayed busy; fetching from the origin"
                            );
                            return;
                        }
                        tokio::time::sleep(rest).await;
                        rest = (rest * 2).min(BUSY_PAUSE_MAX);
                        continue;
                    }
                    fruitless += 1;
                    if fruitless >= FRUITLESS_ROUNDS {
                        return;
                    }
                }
            }
        }
    }

    /// The whole-blob holders of `blob` the scheduler named lately, if any; each call
    /// starts the list at the next of them (see the module docs).
    pub(super) fn known_holders(&self, blob: &str) -> Option<Vec<Peer>> {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        match holders.get_mut(blob) {
            Some((named, at)) if at.elapsed() < HOLDERS_FRESH => {
                let these = named.clone();
                named.rotate_left(1);
                Some(these)
            }
            Some(_) => {
                holders.remove(blob);
                None
            }
            None => None,
        }
    }

    /// Keeps those of `named` that hold the whole blob, to ask them for its next runs,
    /// the next run starting after the first (this run's).
    fn remember_holders(&self, blob: &str, named: &[Peer]) {
        let mut whole: Vec<Peer> = named.iter().filter(|p| p.whole_blob).cloned().collect();
        if !whole.is_empty() {
            whole.rotate_left(1);
        }
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        if whole.is_empty() {
            holders.remove(blob);
        } else {
            holders.insert(blob.to_string(), (whole, Instant::now()));
        }
    }

    fn forget_holders(&self, blob: &str) {
        self.holders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(blob);
    }

    /// Fetches `pending` units of the run from `named`, in parallel slices, rotating
    /// slices over the peers still usable until nothing is left or no peer is.
    #[allow(clippy::too_many_arguments)]
    async fn from_these_peers(
        self: &Arc<Self>,
        peers: &dyn Peers,
        wanted: &Arc<dyn Wanted>,
        blob: &str,
        run: &Arc<[Planned]>,
        pending: &[usize],
        named: Vec<Peer>,
        outcomes: &mut [Option<Outcome>],
    ) -> Round {
        let mut abandoned: HashSet<HostId> = HashSet::new();
        let mut round = Round {
            got: 0,
            only_busy: true,
        };
        let mut asked = 0;
        for turn in 0..named.len() {
            let pending: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&i| outcomes[i].is_none())
                .collect();
            let usable: Vec<&Peer> = named
                .iter()
                .filter(|p| !abandoned.contains(&p.id))
                .collect();
            if pending.is_empty() || usable.is_empty() {
                break;
            }
            let parts = usable.len().min(PARALLEL_PEERS).min(pending.len());
            let mut slices_out = Vec::new();
            for (n, slice) in slices(run, &pending, parts).into_iter().enumerate() {
                let peer = usable[(n + turn) % usable.len()].clone();
                slices_out.push(self.from_one_peer(peers, wanted, blob, run, peer, slice));
            }
            asked += slices_out.len();
            for slice in join_all(slices_out).await {
                match slice.failure {
                    Some(PeerFailure::Busy) => {
                        abandoned.insert(slice.peer.id.clone());
                    }
                    // This node could not prove access to a restricted image: the next
                    // peer, or the origin (which asks the registry), as for a failure,
                    // but nothing went wrong with the peer.
                    Some(PeerFailure::Refused) => {
                        round.only_busy = false;
                        abandoned.insert(slice.peer.id.clone());
                    }
                    Some(failure) => {
                        round.only_busy = false;
                        abandoned.insert(slice.peer.id.clone());
                        let verification = failure == PeerFailure::VerificationFailed;
                        self.count_failure(wanted.as_ref(), Source::Peer, verification);
                    }
                    None => round.only_busy = false,
                }
                for (i, got) in slice.got {
                    round.got += 1;
                    outcomes[i] = Some(Ok(got));
                }
            }
        }
        round.only_busy &= asked > 0 && round.got == 0;
        round
    }

    /// Streams one slice from one peer, verifying (and answering) each unit on arrival,
    /// and reports how it went: what it served; what it did not have; how it failed.
    async fn from_one_peer(
        self: &Arc<Self>,
        peers: &dyn Peers,
        wanted: &Arc<dyn Wanted>,
        blob: &str,
        run: &Arc<[Planned]>,
        peer: Peer,
        wanted_here: Vec<usize>,
    ) -> Slice {
        let started = Instant::now();
        let mut got: Vec<(usize, super::Fetched)> = Vec::new();
        let mut failure = None;
        let Some(&first) = wanted_here.first() else {
            return Slice { peer, got, failure };
        };
        let algo = run[first].unit.key.algo;
        let digests = wanted_here
            .iter()
            .map(|&i| run[i].unit.key.digest)
            .collect();
        // A stall allowance sized for about 1 MiB per unit (mirror pieces are larger).
        let largest = wanted_here
            .iter()
            .map(|&i| run[i].unit.size)
            .max()
            .unwrap_or(0);
        let stall = peers.peer_timeout() * (largest >> 20).max(1);
        // Units being checked (verified, stored, answered) on the blocking pool while
        // the next ones arrive: reading waits for a check only when
        // `CHECKS_IN_FLIGHT` are under way, so a peer's stream is never stalled behind
        // the disk.
        let mut checks: VecDeque<(usize, Check)> = VecDeque::new();
        let mut taken: HashSet<usize> = HashSet::new();
        match peers.open(&peer, blob, algo, digests).await {
            Err(f) => failure = Some(f),
            Ok(mut stream) => loop {
                let chunk = match tokio::time::timeout(stall, stream.next()).await {
                    Err(_) => {
                        failure = Some(PeerFailure::Timeout);
                        break;
                    }
                    Ok(Err(f)) => {
                        failure = Some(f);
                        break;
                    }
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(chunk))) => chunk,
                };
                // Peers answer in request order, skipping what they lack.
                let Some(&i) = wanted_here
                    .iter()
                    .find(|&&i| run[i].unit.key.digest == chunk.digest && !taken.contains(&i))
                else {
                    failure = Some(PeerFailure::Protocol);
                    break;
                };
                taken.insert(i);
                let (this, wanted_c, run_c) = (self.clone(), wanted.clone(), run.clone());
                checks.push_back((
                    i,
                    super::started_blocking(move || {
                        this.verify_and_keep(
                            wanted_c.as_ref(),
                            &run_c[i],
                            &chunk.data,
                            match chunk.encoding {
                                ChunkEncoding::Plain => Compression::None,
                                ChunkEncoding::Zstd => Compression::Zstd,
                            },
                            Source::Peer,
                            started,
                        )
                    }),
                ));
                // Collect what is done; wait only when too many are under way.
                while checks
                    .front()
                    .is_some_and(|(_, c)| c.is_finished() || checks.len() > CHECKS_IN_FLIGHT)
                {
                    let Some((i, check)) = checks.pop_front() else {
                        break;
                    };
                    if let Err(f) = collect(check.await, i, &peer, blob, run, &mut got) {
                        failure.get_or_insert(f);
                    }
                }
                if failure.is_some() {
                    break;
                }
            },
        }
        // Checks already under way finish either way: a unit verified is a unit had.
        for (i, check) in checks {
            if let Err(f) = collect(check.await, i, &peer, blob, run, &mut got) {
                failure.get_or_insert(f);
            }
        }
        // Announced as this slice ends, whatever the round's other slices are doing.
        let held = got
            .iter()
            .filter(|(_, f)| f.newly_stored)
            .map(|(i, _)| (run[*i].unit.key, run[*i].unit.range()))
            .collect();
        self.announce(wanted.as_ref(), blob, held);
        let elapsed = started.elapsed();
        let units = |have: bool| -> Vec<&Unit> {
            wanted_here
                .iter()
                .filter(|&&i| got.iter().any(|(g, _)| *g == i) == have)
                .map(|&i| &run[i].unit)
                .collect()
        };
        if !got.is_empty() {
            let bytes = got.iter().map(|(_, f)| f.data.len() as u64).sum();
            peers.report(
                Some(&peer),
                blob,
                span(units(true)),
                bytes,
                elapsed,
                pb::Outcome::Ok,
            );
        }
        match failure {
            Some(PeerFailure::Busy) => {}
            Some(PeerFailure::Refused) => {
                tracing::debug!(peer = %peer.id.0, blob, "a peer refused chunks of a restricted image: no proof of access it accepts");
            }
            Some(f) => {
                tracing::warn!(peer = %peer.id.0, address = %peer.address, failure = ?f, "abandoned a peer for this run");
                peers.report(
                    Some(&peer),
                    blob,
                    span(units(false)),
                    0,
                    elapsed,
                    f.outcome(),
                );
            }
            // A clean end without everything: the peer no longer holds the rest. Said
            // per stretch of missing units, not as one span: the scheduler takes these
            // ranges off the peer, and units it did send may lie between them.
            None if got.len() < wanted_here.len() => {
                let mut missing: Vec<(u64, u64)> =
                    units(false).into_iter().map(Unit::range).collect();
                merge(&mut missing);
                for range in missing {
                    peers.report(Some(&peer), blob, range, 0, elapsed, pb::Outcome::NotFound);
                }
            }
            None => {}
        }
        Slice { peer, got, failure }
    }
}

/// Takes a finished check's result into `got`; a unit that failed verification (or a
/// check that never finished) fails the peer.
fn collect(
    joined: Result<Result<super::Fetched, String>, tokio::task::JoinError>,
    i: usize,
    peer: &Peer,
    blob: &str,
    run: &[Planned],
    got: &mut Vec<(usize, super::Fetched)>,
) -> Result<(), PeerFailure> {
    match joined {
        Ok(Ok(fetched)) => {
            got.push((i, fetched));
            Ok(())
        }
        Ok(Err(reason)) => {
            tracing::error!(
                peer = %peer.id.0,
                address = %peer.address,
                blob,
                chunk = run[i].unit.index,
                reason,
                "chunk from a peer failed verification; discarded, peer reported"
            );
            Err(PeerFailure::VerificationFailed)
        }
        Err(_) => Err(PeerFailure::Connection),
    }
}

/// Runs the slices of a round at once (they borrow the leader's state, so they are
/// polled together here rather than spawned).
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, fut) in out.iter_mut().zip(pinned.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ChunkKey;
    use rafs_format::chunk::DigestAlgo;

    #[test]
    fn slices_are_contiguous_and_balanced() {
        let run: Vec<Planned> = (0..10u32)
            .map(|i| Planned {
                unit: Unit {
                    key: ChunkKey {
                        algo: DigestAlgo::Sha256,
                        digest: [0; 32],
                    },
                    index: i,
                    blob: 0,
                    offset: u64::from(i) * 100,
                    stored_size: 100,
                    compression: Compression::None,
                    size: 100,
                    span: None,
                },
                done: tokio::sync::watch::channel(None).0,
            })
            .collect();
        let pending: Vec<usize> = (0..10).collect();
        let parts = slices(&run, &pending, 4);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts.concat(), pending);
        assert!(
            parts.iter().all(|p| p.len() >= 2 && p.len() <= 3),
            "{parts:?}"
        );
        assert_eq!(slices(&run, &pending[..1], 4), vec![vec![0]]);
        assert_eq!(span(run.iter().map(|p| &p.unit)), (0, 1000));
    }
}
