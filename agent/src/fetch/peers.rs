//! The peer source of the chunk path. A leader with a run of missing chunks asks the
//! scheduler who holds them and then:
//!
//! - **Peers**: the run is cut into up to [`PARALLEL_PEERS`] slices fetched from
//!   different peers at once; what a peer did not have, or could not give in time, is
//!   asked of the next peer in the following round. Every chunk is verified on arrival
//!   (a peer is never trusted); a peer that sends bad bytes, stalls past
//!   `p2p.peer_timeout_ms` or drops the connection is abandoned for this run and
//!   reported, so the scheduler stops offering it.
//! - **Wait**: another agent is fetching the run from the origin; ask again shortly
//!   (at most `p2p.max_wait_secs` in all, then go to the origin).
//! - **Origin**, no answer, or no progress from any peer: the caller fetches what is
//!   still missing from the origin.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rafs_format::chunk::{decode_and_verify, Compression, DigestAlgo};
use rafs_format::reader::ChunkInfo;
use tessera_proto::domain::{ChunkData, HostId, Peer, PeerChoice};
use tessera_proto::pb;

use super::{blob_range, Fetcher, ImageChunks, Outcome, Planned, Source};
use crate::peer::network::PeerFailure;
use crate::peer::Network;

/// Peers a run is fetched from at once.
pub const PARALLEL_PEERS: usize = 4;

/// Rounds of "no peer gave anything" before the origin is used instead.
const FRUITLESS_ROUNDS: u32 = 2;

/// What one peer gave for one slice of a run.
struct Slice {
    peer: Peer,
    /// Verified chunks: (index in the run, uncompressed bytes).
    got: Vec<(usize, Vec<u8>)>,
    failure: Option<PeerFailure>,
    /// How long the peer took for what it gave.
    elapsed: Duration,
}

/// `[start, end)` of the blob spanned by these chunks of the run.
fn span<'a>(chunks: impl IntoIterator<Item = &'a ChunkInfo>) -> (u64, u64) {
    chunks
        .into_iter()
        .map(blob_range)
        .fold((u64::MAX, 0), |(s, e), (cs, ce)| (s.min(cs), e.max(ce)))
}

/// Cuts `pending` (run indices in blob order) into `parts` contiguous slices of about
/// equal compressed bytes.
fn slices(run: &[Planned], pending: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let total: u64 = pending
        .iter()
        .map(|&i| u64::from(run[i].info.compressed_size))
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
        bytes += u64::from(run[i].info.compressed_size);
    }
    out.retain(|s| !s.is_empty());
    out
}

impl Fetcher {
    /// Fills `outcomes` with what peers can give of the run (see the module docs).
    pub(super) async fn fetch_from_peers(
        &self,
        network: &Arc<Network>,
        image: &ImageChunks,
        run: &[Planned],
        outcomes: &mut [Option<Outcome>],
    ) {
        let Some(first) = run.first() else { return };
        let blob = image.blob_digests[first.info.blob_index as usize].clone();
        let started = Instant::now();
        let mut fruitless = 0;
        loop {
            let pending: Vec<usize> = (0..run.len()).filter(|&i| outcomes[i].is_none()).collect();
            if pending.is_empty() {
                return;
            }
            let range = span(pending.iter().map(|&i| &run[i].info));
            match network.find_peers(&blob, range).await {
                None | Some(PeerChoice::Origin) => return,
                Some(PeerChoice::Wait(wait)) => {
                    if started.elapsed() + wait > network.max_wait() {
                        tracing::warn!(blob, start = range.0, end = range.1, "waited too long for other agents' origin fetch; fetching from the origin");
                        return;
                    }
                    tokio::time::sleep(wait).await;
                }
                Some(PeerChoice::Peers(peers)) => {
                    let got = self
                        .fetch_from_these_peers(
                            network, image, &blob, run, &pending, peers, outcomes,
                        )
                        .await;
                    if got == 0 {
                        fruitless += 1;
                        if fruitless >= FRUITLESS_ROUNDS {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Fetches `pending` chunks of the run from `peers`, in parallel slices, rotating
    /// slices over the peers still usable until nothing is left or no peer is; returns
    /// how many chunks it got.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_from_these_peers(
        &self,
        network: &Arc<Network>,
        image: &ImageChunks,
        blob: &str,
        run: &[Planned],
        pending: &[usize],
        peers: Vec<Peer>,
        outcomes: &mut [Option<Outcome>],
    ) -> usize {
        let algo = image.bootstrap.digest_algo();
        let mut abandoned: HashSet<HostId> = HashSet::new();
        let mut got_total = 0;
        for round in 0..peers.len() {
            let pending: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&i| outcomes[i].is_none())
                .collect();
            let usable: Vec<&Peer> = peers
                .iter()
                .filter(|p| !abandoned.contains(&p.id))
                .collect();
            if pending.is_empty() || usable.is_empty() {
                break;
            }
            let parts = usable.len().min(PARALLEL_PEERS).min(pending.len());
            let mut tasks = tokio::task::JoinSet::new();
            for (n, slice) in slices(run, &pending, parts).into_iter().enumerate() {
                let peer = usable[(n + round) % usable.len()].clone();
                let wanted: Vec<(usize, ChunkInfo)> =
                    slice.into_iter().map(|i| (i, run[i].info)).collect();
                tasks.spawn(fetch_slice(
                    network.clone(),
                    peer,
                    blob.to_string(),
                    algo,
                    wanted,
                ));
            }
            while let Some(joined) = tasks.join_next().await {
                let Ok(slice) = joined else { continue };
                if let Some(failure) = slice.failure {
                    abandoned.insert(slice.peer.id.clone());
                    if failure != PeerFailure::Busy {
                        let verification = failure == PeerFailure::VerificationFailed;
                        self.count_failure(image, Source::Peer, verification);
                    }
                }
                let mut held = Vec::new();
                for (i, data) in slice.got {
                    if outcomes[i].is_some() {
                        continue;
                    }
                    let len = data.len() as u64;
                    image.stats.peer_bytes.fetch_add(len, Ordering::Relaxed);
                    image.stats.chunks_fetched.fetch_add(1, Ordering::Relaxed);
                    self.metrics.record(Source::Peer, len, slice.elapsed);
                    got_total += 1;
                    if self.accept(&run[i], data, &mut outcomes[i]) {
                        held.push(blob_range(&run[i].info));
                    }
                }
                network.held(blob, held);
            }
        }
        got_total
    }
}

/// Streams one slice from one peer, verifying each chunk on arrival, and reports how
/// it went (what it served; what it did not have; how it failed).
async fn fetch_slice(
    network: Arc<Network>,
    peer: Peer,
    blob: String,
    algo: DigestAlgo,
    wanted: Vec<(usize, ChunkInfo)>,
) -> Slice {
    let started = Instant::now();
    let mut got: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut failure = None;
    let digests = wanted.iter().map(|(_, c)| c.digest).collect();
    match network.fetch_chunks(&peer, algo, digests).await {
        Err(f) => failure = Some(f),
        Ok(mut stream) => loop {
            let message = match tokio::time::timeout(network.peer_timeout(), stream.message()).await
            {
                Err(_) => {
                    failure = Some(PeerFailure::Timeout);
                    break;
                }
                Ok(Err(status)) => {
                    failure = Some(crate::peer::network::failure_of(&status));
                    break;
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(m))) => m,
            };
            let Ok(chunk) = ChunkData::try_from(message) else {
                failure = Some(PeerFailure::Protocol);
                break;
            };
            // Peers answer in request order, skipping what they lack.
            let Some(&(i, info)) = wanted
                .iter()
                .find(|(i, c)| c.digest == chunk.digest && !got.iter().any(|(g, _)| g == i))
            else {
                failure = Some(PeerFailure::Protocol);
                break;
            };
            match decode_and_verify(
                &chunk.data,
                Compression::None,
                info.uncompressed_size,
                algo,
                &info.digest,
            ) {
                Ok(data) => got.push((i, data)),
                Err(reason) => {
                    tracing::error!(
                        peer = %peer.id.0,
                        address = %peer.address,
                        blob,
                        chunk = info.index,
                        reason,
                        "chunk from a peer failed verification; discarded, peer reported"
                    );
                    failure = Some(PeerFailure::VerificationFailed);
                    break;
                }
            }
        },
    }
    let elapsed = started.elapsed();
    if !got.is_empty() {
        let bytes = got.iter().map(|(_, d)| d.len() as u64).sum();
        let range = span(
            got.iter()
                .filter_map(|(i, _)| wanted.iter().find(|(w, _)| w == i).map(|(_, c)| c)),
        );
        network.report(Some(&peer), &blob, range, bytes, elapsed, pb::Outcome::Ok);
    }
    let missing = || {
        span(
            wanted
                .iter()
                .filter(|(i, _)| !got.iter().any(|(g, _)| g == i))
                .map(|(_, c)| c),
        )
    };
    match failure {
        Some(PeerFailure::Busy) => {}
        Some(f) => {
            tracing::warn!(peer = %peer.id.0, address = %peer.address, failure = ?f, "abandoned a peer for this run");
            network.report(Some(&peer), &blob, missing(), 0, elapsed, f.outcome());
        }
        // A clean end without everything: the peer no longer holds the rest.
        None if got.len() < wanted.len() => {
            network.report(
                Some(&peer),
                &blob,
                missing(),
                0,
                elapsed,
                pb::Outcome::NotFound,
            );
        }
        None => {}
    }
    Slice {
        peer,
        got,
        failure,
        elapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_contiguous_and_balanced() {
        let run: Vec<Planned> = (0..10u32)
            .map(|i| Planned {
                info: ChunkInfo {
                    index: i,
                    digest: [0; 32],
                    blob_index: 0,
                    compression: Compression::None,
                    compressed_offset: u64::from(i) * 100,
                    compressed_size: 100,
                    uncompressed_size: 100,
                },
                key: crate::cache::ChunkKey {
                    algo: DigestAlgo::Sha256,
                    digest: [0; 32],
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
        assert_eq!(span(run.iter().map(|p| &p.info)), (0, 1000));
    }
}
