//! `tessera checkpoint --boot APP_IMAGE --ready PROBE`: a release's checkpoint, made in
//! CI. The app image is booted in a container of its own (as `tessera run --boot`),
//! the probe is tried until the app is ready, the container is checkpointed through
//! containerd and pushed as a referrer of the image, and the container is removed.
//! Nodes that `tessera run` the image from then on restore it instead of booting.
//! With `--record-working-set` the new checkpoint is then restored once with lazy pages
//! (as `tessera run --lazy-pages --record-working-set`, the same probe as the first
//! request) and its working set pushed beside it, the clone removed.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::ready::Readiness;
use super::run::{self, RestoreChoice, RunOptions, RunSummary};
use super::run::{Outcome, WorkingSetChoice, WorkingSetUse};
use super::{checkpoint, CheckpointOptions, CheckpointSummary, Source};
use crate::config::Prefetch;
use crate::containerd::Containerd;
use crate::convert::ConvertProgress;
use crate::registry::client::RegistryClient;
use crate::registry::reference::Reference;
use crate::{Error, Result};

/// What `tessera checkpoint --boot` did.
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseSummary {
    pub boot: RunSummary,
    /// From the container's start to the probe's first success.
    pub ready_seconds: f64,
    pub probe: String,
    pub checkpoint: CheckpointSummary,
    /// The checkpoint's working set, if asked for: the recording restore's.
    pub working_set: Option<WorkingSetUse>,
}

impl std::fmt::Display for ReleaseSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "booted {} as container {}; ready after {:.2} s ({})",
            self.boot.image, self.boot.container, self.ready_seconds, self.probe
        )?;
        write!(f, "{}", self.checkpoint)?;
        if let Some(WorkingSetUse::Recorded {
            reference,
            chunks,
            compressed_bytes,
            ..
        }) = &self.working_set
        {
            writeln!(
                f,
                "  working set {chunks} chunks ({:.1} MiB): {reference}",
                *compressed_bytes as f64 / f64::from(1 << 20)
            )?;
        }
        Ok(())
    }
}

/// Boots `app` as `run.id`, waits for `ready`, checkpoints it with `ckpt` (its source
/// and app image are set here) and removes the container, whatever happened; with
/// `record_working_set`, then restores the checkpoint to record its working set.
#[tracing::instrument(skip_all, fields(image = %app, container = %run.id))]
pub async fn boot_and_checkpoint(
    client: Arc<RegistryClient>,
    app: &Reference,
    run: &RunOptions,
    ready: &Readiness,
    ckpt: &CheckpointOptions,
    record_working_set: bool,
    progress: &ConvertProgress,
) -> Result<ReleaseSummary> {
    let run = RunOptions {
        restore: RestoreChoice::Never,
        ..run.clone()
    };
    progress.set_phase(format!("boot {app}"));
    let boot = run::run(&client, app, &run).await?;
    let containerd =
        Containerd::connect(&run.containerd.address, &run.containerd.namespace).await?;
    let made = async {
        progress.set_phase(format!("wait until ready: {}", ready.probe));
        let started = Instant::now();
        let id = run.id.clone();
        let log = boot.log.clone();
        ready
            .probe
            .wait(ready.timeout, async || {
                match containerd.task_pid(&id).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(format!(
                        "container {id} exited before it was ready; its output is in {}",
                        log.display()
                    )),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        let ready_seconds = started.elapsed().as_secs_f64();
        tokio::time::sleep(ready.settle).await;
        let opts = CheckpointOptions {
            source: Source::Container {
                containerd: run.containerd.clone(),
                id: run.id.clone(),
            },
            leave_running: false,
            app: Some(app.clone()),
            ..ckpt.clone()
        };
        let checkpoint = checkpoint(client.clone(), None, &opts, progress).await?;
        Ok::<_, Error>((ready_seconds, checkpoint))
    }
    .await;
    let removed = containerd
        .remove_container(&run.id, &run.snapshotter, &run.id)
        .await;
    let (ready_seconds, checkpoint) = made?;
    removed?;
    let working_set = if record_working_set {
        Some(record(&client, app, &run, ready, &checkpoint, progress).await?)
    } else {
        None
    };
    Ok(ReleaseSummary {
        boot,
        ready_seconds,
        probe: ready.probe.to_string(),
        checkpoint,
        working_set,
    })
}

/// Restores `checkpoint` of `app` with lazy pages as a container of its own, records
/// its working set (the app's first request: `ready`'s probe) and removes it.
async fn record(
    client: &RegistryClient,
    app: &Reference,
    run: &RunOptions,
    ready: &Readiness,
    checkpoint: &CheckpointSummary,
    progress: &ConvertProgress,
) -> Result<WorkingSetUse> {
    let id = format!("{}-working-set", run.id);
    let restore = RunOptions {
        id: id.clone(),
        hostname: None,
        restore: RestoreChoice::Checkpoint(Reference::parse(&checkpoint.reference)?),
        lazy_pages: true,
        prefetch: Prefetch::None,
        working_set: WorkingSetChoice::Record(ready.clone()),
        ..run.clone()
    };
    progress.set_phase(format!(
        "record the working set of {}",
        checkpoint.reference
    ));
    let restored = run::run(client, app, &restore).await;
    let containerd =
        Containerd::connect(&run.containerd.address, &run.containerd.namespace).await?;
    let removed = containerd
        .remove_container(&id, &run.snapshotter, &id)
        .await;
    let restored = restored?;
    removed?;
    let failed = |why: String| Error::Criu {
        action: "record the working set".into(),
        reason: format!(
            "the checkpoint {} is pushed, but its working set is not: {why}",
            checkpoint.reference
        ),
    };
    match (restored.outcome, restored.working_set) {
        (Outcome::Booted { why }, _) => Err(failed(format!("it was not restored: {why}"))),
        (_, Some(WorkingSetUse::NotRecorded { why })) => Err(failed(why)),
        (_, Some(recorded)) => Ok(recorded),
        (_, None) => Err(failed("the restore recorded nothing".into())),
    }
}
