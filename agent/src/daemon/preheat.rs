//! Preheat jobs the scheduler hands this agent: fetch a whole image into the cache
//! before anyone mounts it, with the node's own registry credentials, through the same
//! verified path as reads (cache → peers → origin). Progress goes back to the scheduler
//! in heartbeats.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tessera_proto::pb;

use super::Agent;
use crate::fetch::Wanted;
use crate::peer::preheat::PreheatReceiver;
use crate::peer::Network;
use crate::registry::image::Layers;
use crate::registry::reference::Reference;
use crate::{Error, Result};

/// Jobs run at once; each fetches `fetch.prefetch_concurrency` chunks at a time.
const JOBS_AT_ONCE: usize = 2;

/// How often a running job's progress is updated for the next heartbeat.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// Runs the jobs arriving on `tasks` until the agent is gone.
pub(super) async fn run(agent: Weak<Agent>, network: Arc<Network>, mut tasks: PreheatReceiver) {
    let limit = Arc::new(tokio::sync::Semaphore::new(JOBS_AT_ONCE));
    while let Some(task) = tasks.recv().await {
        let Some(agent) = agent.upgrade() else { return };
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return;
        };
        let network = network.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let job = task.job_id.clone();
            let progress = Progress::default();
            let outcome = agent.preheat(&task, &progress, &network).await;
            let mut last = progress.snapshot(&job, pb::PreheatState::Succeeded);
            match outcome {
                Ok(()) => tracing::info!(
                    job = %job,
                    image = %task.image,
                    chunks = last.chunks_total,
                    bytes = last.bytes_total,
                    "preheat done: the image is in the cache"
                ),
                Err(e) => {
                    tracing::warn!(job = %job, image = %task.image, error = %e, "preheat failed");
                    last.state = pb::PreheatState::Failed.into();
                    last.error = e.to_string();
                }
            }
            network.preheat_progress(last);
        });
    }
}

/// A running job's counters.
#[derive(Debug, Default)]
struct Progress {
    chunks_done: AtomicU64,
    chunks_total: AtomicU64,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
}

impl Progress {
    fn snapshot(&self, job: &str, state: pb::PreheatState) -> pb::PreheatProgress {
        pb::PreheatProgress {
            job_id: job.to_string(),
            state: state.into(),
            chunks_done: self.chunks_done.load(Ordering::Relaxed),
            chunks_total: self.chunks_total.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            error: String::new(),
        }
    }
}

impl Agent {
    /// Fetches every chunk of `task.image` (and its bootstrap) into the cache.
    #[tracing::instrument(skip_all, fields(job = %task.job_id, image = %task.image))]
    async fn preheat(
        self: &Arc<Self>,
        task: &pb::PreheatTask,
        progress: &Progress,
        network: &Network,
    ) -> Result<()> {
        let reference = Reference::parse(&task.image)?;
        let platform = (!task.platform.is_empty()).then_some(task.platform.as_str());
        let (_, chunks) = self.open_image(&reference, platform, Layers::All).await?;
        chunks.bypass_memory();
        let bootstrap = chunks.bootstrap.clone();
        // Blob order, so neighbouring missing chunks travel as one run.
        let mut list: Vec<(u32, u64, u32, u32)> = (0..bootstrap.chunk_count())
            .filter_map(|c| bootstrap.chunk(c).ok())
            .map(|i| {
                (
                    i.blob_index,
                    i.compressed_offset,
                    i.index,
                    i.uncompressed_size,
                )
            })
            .collect();
        list.sort_unstable();
        list.dedup_by_key(|c| c.2);
        progress
            .chunks_total
            .store(list.len() as u64, Ordering::Relaxed);
        progress
            .bytes_total
            .store(list.iter().map(|c| u64::from(c.3)).sum(), Ordering::Relaxed);
        let mut first_error: Option<String> = None;
        let mut failed = 0u64;
        let mut reported = Instant::now();
        let mut units: Vec<_> = list
            .iter()
            .filter_map(|&(_, _, index, _)| chunks.unit(index).ok())
            .collect();
        self.fetcher.start_anywhere(&mut units);
        let wanted: Arc<dyn Wanted> = chunks.clone();
        let concurrency = self.config.fetch.prefetch_concurrency.max(1);
        self.fetcher
            .fetch_all(&wanted, units, concurrency, |unit, outcome| {
                match outcome {
                    Ok(_) => {
                        progress.chunks_done.fetch_add(1, Ordering::Relaxed);
                        progress
                            .bytes_done
                            .fetch_add(u64::from(unit.size), Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed += 1;
                        first_error.get_or_insert_with(|| {
                            Error::Chunk {
                                image: chunks.reference.to_string(),
                                chunk: unit.index,
                                digest: unit.key.to_string(),
                                reason: e,
                            }
                            .to_string()
                        });
                    }
                }
                if reported.elapsed() >= PROGRESS_EVERY {
                    network.preheat_progress(
                        progress.snapshot(&task.job_id, pb::PreheatState::Running),
                    );
                    reported = Instant::now();
                }
            })
            .await;
        match first_error {
            None => Ok(()),
            Some(first) => Err(Error::Preheat {
                failed,
                total: list.len(),
                first,
            }),
        }
    }
}
