//! `tessera run IMAGE ID`: container ID from app image IMAGE in containerd, restored from
//! the image's newest checkpoint that this node can restore when there is one ("restore
//! if present"), booted from the image when there is none, and booted too when the
//! restore fails, saying why.
//!
//! Both ways the rootfs is the app image's lazy mount (`tessera pull` puts the image in
//! containerd on the Tessera snapshotter, and the container's snapshot is prepared on
//! its top layer). A restore reads CRIU's images from the agent's lazy mount of the
//! checkpoint (every chunk verified, peers first) through runc's task options, so
//! containerd never copies the checkpoint, and takes the container's spec recorded in
//! the checkpoint. Each restored container is a clone, not a copy: its own id, pid
//! namespace and hostname, its established TCP connections closed (CRIU's `tcp-close`,
//! through runc's `org.criu.config` annotation) so that the app reconnects, its
//! listening sockets restored.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::app::Listed;
use super::criu::{LazyPages, LAZY_PAGES_LOG};
use super::node::NodeInfo;
use super::ready::Readiness;
use super::working_set::{self, WorkingSet};
use super::{
    checkpoints_of, first_restorable, manifest_annotations, ContainerdAt, Criu, Kind,
    CONTAINER_FILE,
};
use crate::api::{self, ChunkList, ReadPlan, Request};
use crate::config::Prefetch;
use crate::containerd::spec;
use crate::containerd::tasks::{ContainerRecord, Start, RUNC_V2};
use crate::containerd::Containerd;
use crate::pull::{self, PullOptions};
use crate::registry::client::RegistryClient;
use crate::registry::image::{self, PlatformImage};
use crate::registry::reference::{Platform, Reference};
use crate::{Error, Result};

/// The spec annotation through which runc hands CRIU a config file.
const CRIU_CONFIG_ANNOTATION: &str = "org.criu.config";
/// What that file says on a restore: established connections come back closed.
const CRIU_RESTORE_CONFIG: &str = "tcp-close\n";
/// And when the rootfs is the image the checkpoint was made of (its `subject`): the
/// files the app maps are checked by size, not by reading each one's ELF build-id
/// (CRIU's default). That image is pinned by digest and every chunk of it verified, so
/// its files are the dumped ones, and reading a note of every mapped library through a
/// cold lazy mount costs a fetch each before the app can run.
const CRIU_SAME_IMAGE_CONFIG: &str = "file-validation filesize\n";
/// And with lazy pages: the memory comes from `criu lazy-pages`.
const CRIU_LAZY_CONFIG: &str = "lazy-pages\n";
/// How long the lazy-pages daemon may take to send a restored tree all its memory.
const LAZY_PAGES_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Which checkpoint `tessera run` restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreChoice {
    /// The image's newest checkpoint this node can restore, if any.
    Newest,
    /// This one (if this node can restore it).
    Checkpoint(Reference),
    /// None: boot.
    Never,
}

/// Where and how to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub containerd: ContainerdAt,
    /// The Tessera snapshotter's name in containerd's config.
    pub snapshotter: String,
    /// The new container's id.
    pub id: String,
    /// Its hostname [default: its id].
    pub hostname: Option<String>,
    pub restore: RestoreChoice,
    /// The CRIU runc runs for this container (its restore, and its later checkpoints).
    pub criu: Criu,
    /// The agent's local API socket: it mounts the checkpoint.
    pub socket: PathBuf,
    pub platform: Platform,
    /// Where the container's files live while it runs: CRIU's config and logs, the
    /// checkpoint's mountpoint during a restore, the output log by default.
    pub state_dir: PathBuf,
    /// The container's output [default: `<state_dir>/<namespace>-<id>/output.log`].
    pub log: Option<PathBuf>,
    /// How the agent prefetches the checkpoint's mount after its working set: a plain
    /// restore has CRIU read every file, in the order of the checkpoint's prefetch
    /// list, so `All` (the list, then the rest) fetches what CRIU will read, many
    /// chunks at once, ahead of it. With lazy pages `None` is better: the restore and
    /// the first requests need little of the heap (the working set), and the daemon
    /// sends the rest after.
    pub prefetch: Prefetch,
    /// CRIU's lazy pages: the restored process starts before its memory has arrived
    /// (`criu lazy-pages` serves its page faults from the mount through userfaultfd
    /// and sends the rest after), so the restore stops growing with the heap.
    pub lazy_pages: bool,
    /// What a restore does with the checkpoint's working set (`working_set`).
    pub working_set: WorkingSetChoice,
}

/// What a restore does with the checkpoint's working set.
#[derive(Debug, Clone)]
pub enum WorkingSetChoice {
    /// Fetch the checkpoint's newest recorded working set first, if it has one.
    Use,
    /// Restore without it.
    Ignore,
    /// Record this restore's: the checkpoint's chunks read from its mount until the
    /// probe says the app answered (and its settle time passed), pushed as a referrer
    /// of the checkpoint.
    Record(Readiness),
}

/// What a restore did with the checkpoint's working set.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum WorkingSetUse {
    /// The checkpoint's recorded working set was fetched first.
    Fetched {
        chunks: usize,
        compressed_bytes: u64,
    },
    /// This restore's working set was recorded and pushed as `reference`.
    Recorded {
        reference: String,
        chunks: usize,
        compressed_bytes: u64,
        /// From the restore's start until the probe's first success.
        ready_seconds: f64,
    },
    /// Recording was asked for and failed (the container runs on).
    NotRecorded { why: String },
}

/// How the container started.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Outcome {
    Restored {
        /// The checkpoint, pinned by digest.
        checkpoint: String,
        /// Newer checkpoints this node could not restore, and why.
        skipped: Vec<String>,
        /// Differences from the dumping node that did not stop the restore.
        notes: Vec<String>,
    },
    Booted {
        /// Why it was not restored.
        why: String,
    },
}

/// What `tessera run` did.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub container: String,
    pub namespace: String,
    /// The app image, pinned by digest.
    pub image: String,
    pub hostname: String,
    /// The task's pid on this node.
    pub pid: u32,
    pub outcome: Outcome,
    /// A restore's checkpoint bytes read through the lazy mount, and what the agent
    /// fetched for them from the origin (on the wire) and from peers.
    pub checkpoint_bytes_read: u64,
    pub origin_wire_bytes: u64,
    pub peer_bytes: u64,
    /// A restore's mount of the checkpoint, and the container's restore (the task
    /// created and started: runc's CRIU reading the mount).
    pub mount_seconds: f64,
    pub restore_seconds: f64,
    /// With lazy pages (`lazy_pages`), from the restore's start until the last page of
    /// memory had arrived (the app ran meanwhile).
    pub lazy_pages: bool,
    pub pages_seconds: Option<f64>,
    /// A restore's use of the checkpoint's working set, if it had one or recorded one.
    pub working_set: Option<WorkingSetUse>,
    /// The container's output.
    pub log: PathBuf,
    pub seconds: f64,
}

impl std::fmt::Display for RunSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        match &self.outcome {
            Outcome::Restored {
                checkpoint,
                skipped,
                notes,
            } => {
                writeln!(
                    f,
                    "restored container {} (pid {}, hostname {}) from {checkpoint}",
                    self.container, self.pid, self.hostname
                )?;
                writeln!(f, "  image      {}", self.image)?;
                writeln!(
                    f,
                    "  bytes      {:.1} MiB of the checkpoint read through the lazy mount; fetched {:.1} MiB from the origin (on the wire), {:.1} MiB from peers",
                    mib(self.checkpoint_bytes_read),
                    mib(self.origin_wire_bytes),
                    mib(self.peer_bytes)
                )?;
                match &self.working_set {
                    Some(WorkingSetUse::Fetched {
                        chunks,
                        compressed_bytes,
                    }) => writeln!(
                        f,
                        "  working set {chunks} chunks ({:.1} MiB) fetched first",
                        mib(*compressed_bytes)
                    )?,
                    Some(WorkingSetUse::Recorded {
                        reference,
                        chunks,
                        compressed_bytes,
                        ready_seconds,
                    }) => writeln!(
                        f,
                        "  working set {chunks} chunks ({:.1} MiB) read until ready after {ready_seconds:.2} s: pushed as {reference}",
                        mib(*compressed_bytes)
                    )?,
                    Some(WorkingSetUse::NotRecorded { why }) => {
                        writeln!(f, "  working set not recorded: {why}")?
                    }
                    None => {}
                }
                for s in skipped {
                    writeln!(f, "  skipped    {s}")?;
                }
                for n in notes {
                    writeln!(f, "  note       {n}")?;
                }
            }
            Outcome::Booted { why } => {
                writeln!(
                    f,
                    "booted container {} (pid {}, hostname {}) from {}",
                    self.container, self.pid, self.hostname, self.image
                )?;
                writeln!(f, "  not restored: {why}")?;
            }
        }
        writeln!(f, "  output     {}", self.log.display())?;
        if matches!(self.outcome, Outcome::Restored { .. }) {
            writeln!(
                f,
                "  time       {:.2} s (mount {:.2} s, restore {:.2} s)",
                self.seconds, self.mount_seconds, self.restore_seconds
            )
        } else {
            writeln!(f, "  time       {:.2} s", self.seconds)
        }
    }
}

/// A checkpoint chosen for a restore.
struct Chosen {
    image: PlatformImage,
    name: String,
    skipped: Vec<String>,
    notes: Vec<String>,
}

/// Runs container `opts.id` from app image `app` (see the module's doc).
#[tracing::instrument(skip_all, fields(image = %app, container = %opts.id))]
pub async fn run(
    client: &RegistryClient,
    app: &Reference,
    opts: &RunOptions,
) -> Result<RunSummary> {
    let started = Instant::now();
    if matches!(opts.working_set, WorkingSetChoice::Record(_)) && !opts.lazy_pages {
        return Err(Error::Setting {
            setting: "--record-working-set".into(),
            problem: "a working set is recorded from the page faults of a restore with lazy \
                      pages: add --lazy-pages"
                .into(),
        });
    }
    let c = Containerd::connect(&opts.containerd.address, &opts.containerd.namespace).await?;
    if c.has_container(&opts.id).await? {
        return Err(Error::Setting {
            setting: "ID".into(),
            problem: format!(
                "containerd already has a container {} in namespace {}: remove it (`ctr -n {} \
                 task kill {}; ctr -n {} container rm {}`) or choose another id",
                opts.id,
                opts.containerd.namespace,
                opts.containerd.namespace,
                opts.id,
                opts.containerd.namespace,
                opts.id
            ),
        });
    }
    let pull_opts = PullOptions {
        address: opts.containerd.address.clone(),
        namespace: opts.containerd.namespace.clone(),
        snapshotter: opts.snapshotter.clone(),
        platform: opts.platform.clone(),
    };
    let app_image = image::resolve_platform(client, app, &opts.platform).await?;
    let app_config = image::fetch_config(client, &app_image).await?;
    let pulled = pull::pull_resolved(app, &app_image, &app_config, &pull_opts, &mut |_| {}).await?;
    let hostname = opts.hostname.clone().unwrap_or_else(|| opts.id.clone());
    let dir = opts
        .state_dir
        .join(format!("{}-{}", opts.containerd.namespace, opts.id));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
    let log = opts.log.clone().unwrap_or_else(|| dir.join("output.log"));
    let base = Base {
        client,
        app_digest: &app_image.raw.digest,
        c: &c,
        opts,
        image_name: &pulled.image,
        parent: &pulled.chain_id,
        hostname: &hostname,
        dir: &dir,
        log: &log,
    };

    let chosen = match opts.restore {
        RestoreChoice::Never => Err(None),
        _ => choose(client, &app_image, opts).await.map_err(Some),
    };
    let why_boot = match chosen {
        Ok(chosen) => {
            let name = chosen.name.clone();
            match base.restore(chosen).await {
                Ok((pid, outcome, read)) => {
                    return Ok(base.summary(&app_image, pid, outcome, read, started));
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %name, error = %e, "restore failed; booting instead");
                    format!("restoring {name} failed: {e}")
                }
            }
        }
        Err(None) => "asked to boot (--boot)".into(),
        Err(Some(e @ Error::NoUsableCheckpoint { .. })) => e.to_string(),
        Err(Some(e)) => format!("the image's checkpoints could not be looked at: {e}"),
    };
    let pid = base.boot(&app_config).await?;
    let outcome = Outcome::Booted { why: why_boot };
    Ok(base.summary(&app_image, pid, outcome, Read::default(), started))
}

/// The checkpoint to restore: `opts.restore`'s, if this node can restore it.
async fn choose(client: &RegistryClient, app: &PlatformImage, opts: &RunOptions) -> Result<Chosen> {
    let node = NodeInfo::probe(&opts.criu)?;
    // A checkpoint named by the caller is resolved once, here; the newest is resolved
    // once chosen.
    let (candidates, named) = match &opts.restore {
        RestoreChoice::Never => (Vec::new(), None),
        RestoreChoice::Checkpoint(r) => {
            let img = image::resolve_platform(client, r, &opts.platform).await?;
            let listed = Listed {
                reference: r.clone(),
                created: None,
                annotations: manifest_annotations(&img.raw.bytes),
            };
            (vec![listed], Some(img))
        }
        RestoreChoice::Newest => (checkpoints_of(client, app).await?, None),
    };
    let (chosen, rejected) = first_restorable(candidates, Kind::Container, &node);
    let Some((candidate, notes)) = chosen else {
        return Err(Error::NoUsableCheckpoint {
            image: app.reference.to_string(),
            subject: app.raw.digest.clone(),
            rejected,
        });
    };
    let image = match named {
        Some(img) => img,
        None => image::resolve_platform(client, &candidate.reference, &opts.platform).await?,
    };
    Ok(Chosen {
        image,
        name: candidate.reference.to_string(),
        skipped: rejected
            .iter()
            .map(crate::RejectedCheckpoint::line)
            .collect(),
        notes,
    })
}

/// What the checkpoint's lazy mount read and fetched, and how long the mount and the
/// restore took.
#[derive(Debug, Default, Clone)]
struct Read {
    bytes: u64,
    origin_wire: u64,
    peer: u64,
    mount_seconds: f64,
    restore_seconds: f64,
    /// With lazy pages: until the last page arrived.
    pages_seconds: Option<f64>,
    working_set: Option<WorkingSetUse>,
}

/// What a restore and a boot share.
struct Base<'a> {
    client: &'a RegistryClient,
    /// The app image's manifest digest: the rootfs.
    app_digest: &'a str,
    c: &'a Containerd,
    opts: &'a RunOptions,
    /// The app image's name in containerd.
    image_name: &'a str,
    /// Its top layer's chain ID: the rootfs snapshot's parent.
    parent: &'a str,
    hostname: &'a str,
    /// This container's state directory.
    dir: &'a Path,
    log: &'a Path,
}

impl Base<'_> {
    /// Restores `chosen` into a new container; on failure nothing of it is left.
    async fn restore(&self, chosen: Chosen) -> Result<(u32, Outcome, Read)> {
        let t = Instant::now();
        let mountpoint = self.dir.join("checkpoint");
        let work = self.dir.join("criu");
        for d in [&mountpoint, &work] {
            std::fs::create_dir_all(d).map_err(|e| Error::io("create", d, e))?;
        }
        let mut plan = ReadPlan {
            prefetch: Some(self.opts.prefetch),
            ..ReadPlan::default()
        };
        let mut working_set = None;
        if matches!(self.opts.working_set, WorkingSetChoice::Use) {
            match working_set::find(self.client, &chosen.image).await {
                Ok(Some(set)) => {
                    working_set = Some(WorkingSetUse::Fetched {
                        chunks: set.chunks.len(),
                        compressed_bytes: set.compressed_bytes,
                    });
                    plan.first = set.chunks;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(checkpoint = %chosen.name, error = %e, "its working set could not be read; restoring without")
                }
            }
        }
        api::call(
            &self.opts.socket,
            Request::Mount {
                image: chosen.image.reference.to_string(),
                mountpoint: mountpoint.clone(),
                platform: None,
                plan,
            },
        )
        .await?;
        let mount_seconds = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let same_image = subject_of(&chosen.image.raw.bytes).as_deref() == Some(self.app_digest);
        let restored = self
            .restore_from(&chosen.name, same_image, &mountpoint, &work)
            .await;
        let restore_seconds = t.elapsed().as_secs_f64();
        if let (Ok((pid, _)), WorkingSetChoice::Record(ready)) = (&restored, &self.opts.working_set)
        {
            let recorded = self
                .record_working_set(&chosen.image, &mountpoint, &work, ready, *pid, t)
                .await;
            working_set = Some(recorded.unwrap_or_else(|e| {
                tracing::warn!(checkpoint = %chosen.name, error = %e, "the working set was not recorded");
                WorkingSetUse::NotRecorded { why: e.to_string() }
            }));
        }
        // With lazy pages the memory is still arriving from the mount: it stays until
        // the daemon has sent every page.
        let (restored, pages_seconds) = match restored {
            Ok((pid, Some(mut daemon))) => {
                let waited = tokio::task::spawn_blocking(move || daemon.wait(LAZY_PAGES_LIMIT))
                    .await
                    .map_err(|e| Error::Criu {
                        action: "lazy-pages".into(),
                        reason: format!("waiting for it ended without finishing: {e}"),
                    })
                    .and_then(|r| r);
                if let Err(e) = &waited {
                    tracing::error!(error = %e, pid, "the restored container's lazy pages");
                }
                (waited.map(|()| pid), Some(t.elapsed().as_secs_f64()))
            }
            Ok((pid, None)) => (Ok(pid), None),
            Err(e) => (Err(e), None),
        };
        // The restored tree runs from memory now; the mount is not needed whatever
        // happened.
        let unmounted = api::call(
            &self.opts.socket,
            Request::Umount {
                mountpoint: mountpoint.clone(),
            },
        )
        .await;
        let pid = match restored {
            Ok(pid) => pid,
            Err(e) => {
                self.remove().await;
                return Err(e);
            }
        };
        let status = unmounted.unwrap_or_else(|e| {
            tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "unmount after restore");
            serde_json::Value::Null
        });
        let number = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let read = Read {
            bytes: number(&status["bytes_read"]),
            origin_wire: number(&status["pull"]["origin_wire_bytes"]),
            peer: number(&status["pull"]["peer_bytes"]),
            mount_seconds,
            restore_seconds,
            pages_seconds,
            working_set,
        };
        let outcome = Outcome::Restored {
            checkpoint: chosen.name,
            skipped: chosen.skipped,
            notes: chosen.notes,
        };
        Ok((pid, outcome, read))
    }

    /// Waits for `ready` (the restored app, `pid`, answering its first requests), then
    /// pushes the working set of `checkpoint`, mounted at `mountpoint`: what its restore
    /// read, and the pages the app faulted in since (the log of the lazy-pages daemon in
    /// `work`).
    async fn record_working_set(
        &self,
        checkpoint: &PlatformImage,
        mountpoint: &Path,
        work: &Path,
        ready: &Readiness,
        pid: u32,
        restore_started: Instant,
    ) -> Result<WorkingSetUse> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        ready
            .probe
            .wait(ready.timeout, async || {
                if proc.exists() {
                    Ok(())
                } else {
                    Err(format!(
                        "the restored app (pid {pid}) exited before it answered; its output is in {}",
                        self.log.display()
                    ))
                }
            })
            .await?;
        let ready_seconds = restore_started.elapsed().as_secs_f64();
        tokio::time::sleep(ready.settle).await;
        let log = work.join(LAZY_PAGES_LOG);
        let dir = mountpoint.to_path_buf();
        let ranges = tokio::task::spawn_blocking(move || {
            let faults = std::fs::read(&log).map_err(|e| Error::io("read", &log, e))?;
            working_set::ranges(&dir, &String::from_utf8_lossy(&faults))
        })
        .await
        .map_err(|e| {
            Error::Agent(format!(
                "reading the working set ended without finishing: {e}"
            ))
        })??;
        let list = api::call(
            &self.opts.socket,
            Request::ChunksOf {
                mountpoint: mountpoint.to_path_buf(),
                ranges,
            },
        )
        .await?;
        let list: ChunkList = serde_json::from_value(list)
            .map_err(|e| Error::Agent(format!("the agent's answer to chunks_of: {e}")))?;
        let set = WorkingSet {
            chunks: list.chunks,
            compressed_bytes: list.compressed_bytes,
        };
        let reference = working_set::push(self.client, checkpoint, &set).await?;
        Ok(WorkingSetUse::Recorded {
            reference: reference.to_string(),
            chunks: set.chunks.len(),
            compressed_bytes: set.compressed_bytes,
            ready_seconds,
        })
    }

    /// Restores the container recorded in checkpoint `name`, mounted at `mountpoint`,
    /// CRIU's logs in `work`: its task's pid, and with lazy pages the daemon still
    /// sending it memory.
    async fn restore_from(
        &self,
        name: &str,
        same_image: bool,
        mountpoint: &Path,
        work: &Path,
    ) -> Result<(u32, Option<LazyPages>)> {
        let file = mountpoint.join(CONTAINER_FILE);
        let bytes = tokio::fs::read(&file)
            .await
            .map_err(|e| Error::io("read", &file, e))?;
        let record = recorded_container(name, &bytes)?;
        let mut spec = record.spec.clone();
        spec::set_hostname(&mut spec, self.hostname);
        spec["linux"]["cgroupsPath"] = serde_json::json!(format!(
            "/{}/{}",
            self.opts.containerd.namespace, self.opts.id
        ));
        let criu_config = self.dir.join("criu.conf");
        let mut config = CRIU_RESTORE_CONFIG.to_string();
        if same_image {
            config.push_str(CRIU_SAME_IMAGE_CONFIG);
        }
        if self.opts.lazy_pages {
            config.push_str(CRIU_LAZY_CONFIG);
        }
        std::fs::write(&criu_config, config).map_err(|e| Error::io("write", &criu_config, e))?;
        spec::annotate(
            &mut spec,
            CRIU_CONFIG_ANNOTATION,
            &criu_config.display().to_string(),
        );
        let container = ContainerRecord {
            id: self.opts.id.clone(),
            image: self.image_name.to_string(),
            runtime: if record.runtime.is_empty() {
                RUNC_V2.into()
            } else {
                record.runtime.clone()
            },
            spec,
            snapshotter: self.opts.snapshotter.clone(),
            snapshot_key: self.opts.id.clone(),
        };

        self.create(&container).await?;
        let rootfs = self
            .c
            .prepare_rootfs(&self.opts.snapshotter, &self.opts.id, self.parent)
            .await?;
        let start = Start::Restore {
            images: mountpoint,
            work,
        };
        let criu = runc_criu(&self.opts.criu.path);
        let daemon = if self.opts.lazy_pages {
            let (criu, images, work) = (
                self.opts.criu.clone(),
                mountpoint.to_path_buf(),
                work.to_path_buf(),
            );
            let verbose = matches!(self.opts.working_set, WorkingSetChoice::Record(_));
            let started =
                tokio::task::spawn_blocking(move || criu.lazy_pages(&images, &work, verbose))
                    .await
                    .map_err(|e| Error::Criu {
                        action: "lazy-pages".into(),
                        reason: format!("its start ended without finishing: {e}"),
                    })??;
            Some(started)
        } else {
            None
        };
        let pid = self
            .c
            .start_task(&self.opts.id, rootfs, start, self.log, criu.as_deref())
            .await?;
        if spec::has_own_uts_namespace(&container.spec) {
            set_hostname(pid, self.hostname)?;
        }
        Ok((pid, daemon))
    }

    /// Boots a new container from the app image's config, `config`.
    async fn boot(&self, config: &[u8]) -> Result<u32> {
        let spec = spec::boot_spec(
            config,
            &self.opts.containerd.namespace,
            &self.opts.id,
            self.hostname,
        )?;
        let container = ContainerRecord {
            id: self.opts.id.clone(),
            image: self.image_name.to_string(),
            runtime: RUNC_V2.into(),
            spec,
            snapshotter: self.opts.snapshotter.clone(),
            snapshot_key: self.opts.id.clone(),
        };
        let booted = async {
            self.create(&container).await?;
            let rootfs = self
                .c
                .prepare_rootfs(&self.opts.snapshotter, &self.opts.id, self.parent)
                .await?;
            let criu = runc_criu(&self.opts.criu.path);
            self.c
                .start_task(
                    &self.opts.id,
                    rootfs,
                    Start::Boot,
                    self.log,
                    criu.as_deref(),
                )
                .await
        }
        .await;
        if booted.is_err() {
            self.remove().await;
        }
        booted
    }

    async fn create(&self, container: &ContainerRecord) -> Result<()> {
        self.c.create_container(container).await
    }

    /// Removes what a failed start left (logged, not returned: the start's error is
    /// the one to report).
    async fn remove(&self) {
        let (id, snapshotter) = (&self.opts.id, &self.opts.snapshotter);
        if let Err(e) = self.c.remove_container(id, snapshotter, id).await {
            tracing::warn!(container = %id, error = %e, "removing what a failed start left");
        }
    }

    fn summary(
        &self,
        app: &PlatformImage,
        pid: u32,
        outcome: Outcome,
        read: Read,
        started: Instant,
    ) -> RunSummary {
        let pinned = Reference {
            tag: None,
            digest: Some(app.raw.digest.clone()),
            ..app.reference.clone()
        };
        RunSummary {
            container: self.opts.id.clone(),
            namespace: self.opts.containerd.namespace.clone(),
            image: pinned.to_string(),
            hostname: self.hostname.to_string(),
            pid,
            outcome,
            checkpoint_bytes_read: read.bytes,
            origin_wire_bytes: read.origin_wire,
            peer_bytes: read.peer,
            mount_seconds: read.mount_seconds,
            restore_seconds: read.restore_seconds,
            lazy_pages: read.pages_seconds.is_some(),
            pages_seconds: read.pages_seconds,
            working_set: read.working_set,
            log: self.log.to_path_buf(),
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// The digest of a manifest's `subject`, if it has one.
fn subject_of(manifest: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(manifest).ok()?;
    v["subject"]["digest"].as_str().map(String::from)
}

/// The container record of checkpoint `name` (its [`CONTAINER_FILE`]'s bytes).
fn recorded_container(name: &str, bytes: &[u8]) -> Result<ContainerRecord> {
    serde_json::from_slice(bytes).map_err(|e| Error::CheckpointIncompatible {
        image: name.to_string(),
        reason: format!("its {CONTAINER_FILE} is not a container record: {e}"),
    })
}

/// The CRIU binary runc is told to use: `criu`'s absolute path (containerd's shim has
/// its own `PATH`), or none when it cannot be found here (runc then looks in its own).
fn runc_criu(criu: &Path) -> Option<PathBuf> {
    if criu.components().count() > 1 {
        return std::path::absolute(criu).ok();
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(criu))
        .find(|p| p.is_file())
}

/// Sets the hostname in the UTS namespace of process `pid` (a restored container's:
/// CRIU gave it the dumped one). From a thread of its own, which alone joins it.
fn set_hostname(pid: u32, hostname: &str) -> Result<()> {
    let path = PathBuf::from(format!("/proc/{pid}/ns/uts"));
    let ns = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
    let name = hostname.to_string();
    let joined = std::thread::spawn(move || -> std::io::Result<()> {
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::HostNameAndNISDomainName),
        )?;
        rustix::system::sethostname(name.as_bytes())?;
        Ok(())
    })
    .join();
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::io("set the hostname in", &path, e)),
        Err(_) => Err(Error::Criu {
            action: "restore".into(),
            reason: format!("setting the hostname of pid {pid} failed"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_without_a_container_record_is_incompatible() {
        let e = recorded_container("ck", br#"{"pid":1}"#).unwrap_err();
        assert!(
            matches!(&e, Error::CheckpointIncompatible { image, .. } if image == "ck"),
            "{e:?}"
        );
        assert!(e.to_string().contains("not a container record"), "{e}");
        let ok = br#"{"id":"a","image":"r/i:1","runtime":"io.containerd.runc.v2",
            "spec":{"hostname":"a"},"snapshotter":"tessera","snapshot_key":"a"}"#;
        let record = recorded_container("ck", ok).unwrap();
        assert_eq!(record.spec["hostname"], "a");
    }

    #[test]
    fn a_checkpoint_names_its_image_by_subject() {
        let m = br#"{"subject":{"mediaType":"m","digest":"sha256:aa","size":1},"layers":[]}"#;
        assert_eq!(subject_of(m).as_deref(), Some("sha256:aa"));
        assert_eq!(subject_of(br#"{"layers":[]}"#), None);
        assert_eq!(subject_of(b"junk"), None);
    }

    #[test]
    fn runc_is_given_criu_by_absolute_path() {
        assert_eq!(
            runc_criu(Path::new("/opt/criu/criu")),
            Some(PathBuf::from("/opt/criu/criu"))
        );
        assert!(runc_criu(Path::new("tools/criu")).unwrap().is_absolute());
        assert_eq!(runc_criu(Path::new("no-such-criu-binary-here")), None);
    }
}
