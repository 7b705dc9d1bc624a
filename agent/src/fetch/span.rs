//! Spans of unconverted gzip layers (format.md §17): units whose stored bytes are a
//! stretch of an image's own gzip layer, from a checkpoint's byte to the end of the
//! unit's data. The origin step hands a run's units over in [`Piece`]s: an ordinary
//! unit alone, the spans of one checkpoint together, so that they cost one inflation
//! from the checkpoint, not one each.
//!
//! A checkpoint's window (the 32 KiB of output before it) is an ordinary unit of the
//! index's own blob. It is read from memory, the store or the origin, never through a
//! flight: a window may have the same digest as a span (the same 32 KiB), and a run
//! waiting on a flight that waits on the run would never end.

use std::sync::Arc;

use rafs_format::chunk::{decode_and_verify, verify_digest};
use rafs_format::gzip;
use tokio::time::Instant;

use super::run::Planned;
use super::unit::{Event, Fetched, Resume, Unit, Wanted};
use super::{blocking, Fetcher, Source};

/// Units of a run the origin step verifies together once their bytes are here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Piece {
    /// Indexes into the run; for spans, in the order of their output.
    pub members: Vec<usize>,
    /// `[start, end)` of the blob the members' stored bytes lie in.
    pub range: (u64, u64),
    /// For spans: their checkpoint (`None`: the layer's start).
    pub checkpoint: Option<Option<u32>>,
}

/// The `pending` units of `run` as pieces, in the order their bytes are complete.
pub(super) fn pieces(run: &[Planned], pending: &[usize]) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    for &i in pending {
        let unit = &run[i].unit;
        let range = unit.range();
        let checkpoint = unit.span.map(|s| s.checkpoint);
        let joins = checkpoint.is_some()
            && pieces
                .iter_mut()
                .find(|p| p.checkpoint == checkpoint)
                .map(|p| {
                    p.members.push(i);
                    p.range = (p.range.0.min(range.0), p.range.1.max(range.1));
                })
                .is_some();
        if !joins {
            pieces.push(Piece {
                members: vec![i],
                range,
                checkpoint,
            });
        }
    }
    for p in &mut pieces {
        p.members
            .sort_by_key(|&i| run[i].unit.span.map_or(0, |s| s.skip));
    }
    pieces.sort_by_key(|p| p.range.1);
    pieces
}

impl Fetcher {
    /// Blocking: inflates a piece of spans from `raw` (its stored bytes, from
    /// `piece.range.0`) in one pass and keeps each unit whose bytes match its digest;
    /// the result of each member, by run index.
    pub(super) fn inflate_and_keep(
        &self,
        wanted: &dyn Wanted,
        run: &[Planned],
        piece: &Piece,
        raw: &[u8],
        resume: Option<gzip::Checkpoint>,
        started: Instant,
    ) -> Vec<(usize, Result<Fetched, String>)> {
        let ranges: Vec<(u64, usize)> = piece
            .members
            .iter()
            .map(|&i| {
                let unit = &run[i].unit;
                (
                    u64::from(unit.span.map_or(0, |s| s.skip)),
                    unit.size as usize,
                )
            })
            .collect();
        let mut results = Vec::with_capacity(ranges.len());
        let pass = gzip::inflate_ranges(raw, resume.as_ref(), &ranges, |k, data| {
            let i = piece.members[k];
            let key = run[i].unit.key;
            let kept = verify_digest(&data, key.algo, &key.digest)
                .map(|()| self.keep(wanted, &run[i], data, Source::Origin, started));
            results.push((i, kept));
        });
        if let Err((k, e)) = pass {
            let reason = e.to_string();
            results.extend(piece.members[k..].iter().map(|&i| (i, Err(reason.clone()))));
        }
        results
    }

    /// Where the spans of checkpoint `index` resume: its offsets and its window's
    /// verified bytes.
    pub(super) async fn resume_at(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        index: u32,
    ) -> Result<gzip::Checkpoint, String> {
        let Resume {
            in_bits,
            out,
            window,
            window_len,
        } = wanted
            .resume(index)
            .ok_or_else(|| format!("the index has no checkpoint {index}"))?;
        let window = match window {
            Some(unit) => self
                .window(wanted, unit)
                .await
                .map_err(|e| format!("the window of checkpoint {index}: {e}"))?
                .to_vec(),
            None => vec![0; window_len as usize],
        };
        Ok(gzip::Checkpoint {
            in_bits,
            out,
            window,
        })
    }

    /// A window's verified bytes: from memory, the store, or the origin (kept in both).
    async fn window(
        self: &Arc<Self>,
        wanted: &Arc<dyn Wanted>,
        unit: Unit,
    ) -> Result<Arc<Vec<u8>>, String> {
        if let Some(got) = self.in_memory(&unit) {
            return Ok(got.data);
        }
        if self.store.contains(&unit.key) {
            let (this, wanted) = (self.clone(), wanted.clone());
            let hit = blocking(move || this.in_store(&wanted, &unit))
                .await
                .map_err(|e| e.to_string())?;
            if let Some(got) = hit {
                return Ok(got.data);
            }
        }
        let started = Instant::now();
        let blob = wanted.blob(&unit).to_string();
        let (start, end) = unit.range();
        let raw = wanted
            .origin()
            .range(&blob, start..end, &mut |_| {})
            .await
            .map_err(|e| e.to_string())?;
        wanted.observe(Event::OriginTransfer {
            bytes: raw.len() as u64,
        });
        let (this, wanted) = (self.clone(), wanted.clone());
        blocking(move || {
            let data = decode_and_verify(
                &raw,
                unit.compression,
                unit.size,
                unit.key.algo,
                &unit.key.digest,
            )?;
            let bytes = data.len() as u64;
            wanted.observe(Event::Got {
                source: Source::Origin,
                bytes,
            });
            this.metrics
                .record(Source::Origin, bytes, started.elapsed());
            if let Err(e) = this.store.put(&unit.key, &data) {
                tracing::debug!(unit = %unit.key, error = %e, "could not cache a window");
            }
            let data = Arc::new(data);
            this.remember(unit.key, &data);
            Ok(data)
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
