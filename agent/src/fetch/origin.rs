//! The origin step of a run: one Range request over the run's missing units, each
//! verified (on the blocking pool), answered and announced to the swarm as soon as its
//! last byte is here;
//! units that failed are asked for again after a pause that doubles, up to
//! `fetch.attempts` requests.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tessera_proto::pb;

use std::collections::HashMap;

use rafs_format::gzip;
use tokio::task::JoinHandle;

use super::run::{Checks, Planned};
use super::span::pieces;
use super::unit::{Event, Wanted};
use super::{Fetcher, Outcome, Source};
use crate::ChunkFailure;

/// The pause before the origin is asked again: 400 ms, doubling, at most 6.4 s.
pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 << attempt.min(5))
}

impl Fetcher {
    /// Fetches the run's missing units from the origin; returns the last failure's
    /// reason (empty when nothing failed).
    pub(super) async fn from_origin(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        run: &Arc<[Planned]>,
        outcomes: &mut [Option<Outcome>],
    ) -> String {
        let mut last_error = String::new();
        for attempt in 0..self.config.attempts {
            let pending: Vec<usize> = (0..run.len()).filter(|&i| outcomes[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt)).await;
            }
            let (start, end) = super::run::span(pending.iter().map(|&i| &run[i].unit));
            let blob = wanted.blob(&run[pending[0]].unit).to_string();
            let started = Instant::now();
            // The pending units as pieces verified together, in the order their bytes
            // are complete: each is checked as soon as its last byte is here.
            let pieces = pieces(run, &pending);
            // Spans' checkpoints, their windows fetched meanwhile.
            let mut resumes: HashMap<u32, JoinHandle<Result<gzip::Checkpoint, String>>> = pieces
                .iter()
                .filter_map(|p| p.checkpoint.flatten())
                .map(|index| {
                    let (this, wanted) = (self.clone(), wanted.clone());
                    (
                        index,
                        tokio::spawn(async move { this.resume_at(&wanted, index).await }),
                    )
                })
                .collect();
            let mut looked_at = 0;
            // Each piece's check, with the result of each of its members.
            let mut checks: Vec<Checks> = Vec::new();
            // `arrived`: the run's bytes from `start` so far.
            let mut take = |arrived: &[u8]| {
                while let Some(piece) = pieces.get(looked_at) {
                    let from = (piece.range.0 - start) as usize;
                    let to = (piece.range.1 - start) as usize;
                    if arrived.len() < to {
                        break;
                    }
                    looked_at += 1;
                    let raw = arrived[from..to].to_vec();
                    let (this, wanted, run, piece) =
                        (self.clone(), wanted.clone(), run.clone(), piece.clone());
                    let blob = blob.clone();
                    let check = match piece.checkpoint {
                        None => {
                            let i = piece.members[0];
                            let unit = run[i].unit;
                            super::started_blocking(move || {
                                let kept = this.verify_and_keep(
                                    wanted.as_ref(),
                                    &run[i],
                                    &raw,
                                    unit.compression,
                                    Source::Origin,
                                    started,
                                );
                                let kept = vec![(i, kept)];
                                this.announce_kept(wanted.as_ref(), &blob, &run, &kept);
                                kept
                            })
                        }
                        Some(checkpoint) => {
                            let resume = checkpoint.and_then(|c| resumes.remove(&c));
                            tokio::spawn(async move {
                                let resume = match resume {
                                    None => Ok(None),
                                    Some(task) => match task.await {
                                        Ok(got) => got.map(Some),
                                        Err(_) => Err(ChunkFailure::Stopped.to_string()),
                                    },
                                };
                                let resume = match resume {
                                    Ok(resume) => resume,
                                    Err(e) => {
                                        return piece
                                            .members
                                            .iter()
                                            .map(|&i| (i, Err(e.clone())))
                                            .collect()
                                    }
                                };
                                super::blocking(move || {
                                    let kept = this.inflate_and_keep(
                                        wanted.as_ref(),
                                        &run,
                                        &piece,
                                        &raw,
                                        resume,
                                        started,
                                    );
                                    this.announce_kept(wanted.as_ref(), &blob, &run, &kept);
                                    kept
                                })
                                .await
                                .unwrap_or_default()
                            })
                        }
                    };
                    checks.push(check);
                }
            };
            // Spans of one checkpoint overlap: what a recent run fetched of this range
            // is taken from memory, the rest asked of the origin.
            let spans = run[pending[0]].unit.span.is_some();
            let mut joined = match spans {
                true => self.recent_spans().held(&blob, start, end),
                false => Vec::new(),
            };
            let held = joined.len();
            // Bytes that came over the network, whole or not (`arrived` starts again
            // from the asked range's start when the origin asks anew after a cut).
            let (mut received, mut shown) = (0, 0);
            let mut arrive = |arrived: &[u8]| {
                if arrived.len() < shown {
                    shown = 0;
                    joined.truncate(held);
                }
                received += (arrived.len() - shown) as u64;
                if spans {
                    joined.extend_from_slice(&arrived[shown..]);
                    take(&joined);
                } else {
                    take(arrived);
                }
                shown = arrived.len();
            };
            let failed = if start + held as u64 >= end {
                arrive(&[]);
                None
            } else {
                let asked = start + held as u64..end;
                match wanted.origin().range(&blob, asked, &mut arrive).await {
                    // For an origin that shows the bytes only at the end.
                    Ok(bytes) => {
                        arrive(&bytes);
                        None
                    }
                    Err(e) => Some(e.to_string()),
                }
            };
            wanted.observe(Event::OriginTransfer { bytes: received });
            // Kept at once, for runs planned while these are checked; forgotten below
            // if they spoil a unit.
            if spans {
                self.recent_spans().keep(&blob, start, joined);
            }
            let (mut verified, mut spoiled) = (0, false);
            for check in checks {
                let Ok(results) = check.await else {
                    last_error = ChunkFailure::Stopped.to_string();
                    continue;
                };
                for (i, result) in results {
                    match result {
                        Ok(got) => {
                            verified += got.data.len() as u64;
                            outcomes[i] = Some(Ok(got));
                        }
                        Err(reason) => {
                            spoiled = true;
                            self.count_failure(wanted.as_ref(), Source::Origin, true);
                            tracing::error!(
                                image = %wanted.name(),
                                chunk = run[i].unit.index,
                                blob,
                                offset = run[i].unit.offset,
                                attempt,
                                reason,
                                "chunk from origin failed verification; discarded"
                            );
                            last_error = ChunkFailure::Verification {
                                from: "origin",
                                reason,
                            }
                            .to_string();
                        }
                    }
                }
            }
            // Bytes that spoiled a unit are not read again: the next attempt asks the
            // origin for the whole range.
            if spans && spoiled {
                self.recent_spans().forget(&blob, start, end);
            }
            // For the scheduler's account of bytes by source: the verified,
            // uncompressed bytes, as the agent's own origin_bytes counts them.
            if verified > 0 {
                self.report_origin(&blob, (start, end), verified, started, pb::Outcome::Ok);
            }
            if let Some(e) = failed {
                self.count_failure(wanted.as_ref(), Source::Origin, false);
                tracing::warn!(image = %wanted.name(), blob, start, end, attempt, error = %e, "origin fetch failed");
                // Frees the scheduler's origin slot for another agent.
                self.report_origin(&blob, (start, end), 0, started, pb::Outcome::Connection);
                last_error = e;
                continue;
            }
        }
        last_error
    }

    /// Announces the units of `kept` this node stored, as soon as they are: peers
    /// fetch each from here while the rest of the run still streams in from the
    /// origin (announced at the run's end, a swarm waited for the whole run, and with
    /// many runs sharing a slow origin link every run ends at about the same moment).
    fn announce_kept(
        &self,
        wanted: &dyn Wanted,
        blob: &str,
        run: &[Planned],
        kept: &[(usize, Result<super::Fetched, String>)],
    ) {
        let held = kept
            .iter()
            .filter(|(_, got)| got.as_ref().is_ok_and(|got| got.newly_stored))
            .map(|&(i, _)| (run[i].unit.key, run[i].unit.range()))
            .collect();
        self.announce(wanted, blob, held);
    }

    fn report_origin(
        &self,
        blob: &str,
        range: (u64, u64),
        bytes: u64,
        started: Instant,
        outcome: pb::Outcome,
    ) {
        if let Some(peers) = &self.peers {
            peers.report(None, blob, range, bytes, started.elapsed(), outcome);
        }
    }
}
