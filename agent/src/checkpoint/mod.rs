//! Application checkpoints as Tessera images (issue 29, first step): `tessera
//! checkpoint` dumps a running process tree with CRIU and pushes the dump as a Tessera
//! image; `tessera restore` has the node's agent mount that image lazily and lets CRIU
//! restore the tree from the mount.
//!
//! A checkpoint image is an ordinary Tessera image (format.md) whose tree is CRIU's
//! images directory, chunked with content-defined chunking so that successive
//! checkpoints of an application share chunks. What a restore needs to know about the
//! dumping node is on the manifest as `io.tessera.checkpoint.*` annotations ([`node`]),
//! and in more detail in the image config's `io.tessera.checkpoint` object.
//!
//! With `--for APP_IMAGE` a checkpoint is an OCI 1.1 referrer of the app image
//! ([`app`]): `tessera restore --for APP_IMAGE` restores the newest one this node can
//! restore, or fails with [`Error::NoUsableCheckpoint`] (boot the image instead). Each
//! checkpoint is built against the previous one as its chunk dictionary, so pages that
//! did not change are referenced in the earlier blob instead of uploaded again.
//!
//! Restore reads the CRIU images from the agent's FUSE mount (every chunk verified,
//! peers first, then the origin) and the mount is dropped once `criu restore
//! --restore-detached` returns: CRIU has read what it needs by then.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rafs_format::builder::{BuildOptions, BuildSummary, Builder, ChunkDict};
use serde::Serialize;
use serde_json::json;

pub mod app;
pub mod criu;
pub mod node;
pub mod pagemap;
pub mod ready;
pub mod release;
pub mod run;
pub mod working_set;

pub use app::{checkpoints_of, ARTIFACT_TYPE};
pub use criu::{Criu, CriuVersion};
pub use node::NodeInfo;

use crate::api::{self, Request};
use crate::containerd::tasks::ContainerRecord;
use crate::containerd::Containerd;
use crate::convert::{push_built, ConvertProgress, PushSpec};
use crate::registry::client::RegistryClient;
use crate::registry::image::{self, PlatformImage};
use crate::registry::reference::{Platform, Reference};
use crate::{Error, RejectedCheckpoint, Result};

/// The exit code of `tessera restore --for` when there is no checkpoint to restore
/// ([`Error::NoUsableCheckpoint`]): a script boots the image on it and treats any
/// other failure (1) as one.
pub const NO_USABLE_CHECKPOINT_EXIT_CODE: i32 = 3;

/// The process id the tree had: CRIU restores it with the same one.
pub const PID_ANNOTATION: &str = "io.tessera.checkpoint.pid";
/// The dumped tree's root process name (`/proc/PID/comm`; never its command line,
/// which may carry secrets).
pub const PROCESS_ANNOTATION: &str = "io.tessera.checkpoint.process";
/// A container checkpoint's record of the container (its image, runtime and OCI
/// spec: [`ContainerRecord`]), beside CRIU's images in the checkpoint's tree.
pub const CONTAINER_FILE: &str = "tessera-container.json";
/// What was dumped: [`Kind`] (`process` when absent: the checkpoints made before
/// containers could be).
pub const KIND_ANNOTATION: &str = "io.tessera.checkpoint.kind";

/// What a checkpoint holds, and so how it is restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A process tree dumped by CRIU on the node (`tessera restore`).
    Process,
    /// A containerd container's task dumped by runc, with the container's record in
    /// the image config (`tessera run`).
    Container,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Process => "process",
            Kind::Container => "container",
        }
    }

    /// The kind a checkpoint's manifest annotations say.
    pub fn of(annotations: &BTreeMap<String, String>) -> Kind {
        match annotations.get(KIND_ANNOTATION).map(String::as_str) {
            Some("container") => Kind::Container,
            _ => Kind::Process,
        }
    }
}

/// What is checkpointed.
#[derive(Debug, Clone)]
pub enum Source {
    /// A process tree on this node, by its root's pid: CRIU dumps it directly.
    Process(u32),
    /// Container `id`'s task in containerd: runc dumps it through containerd's task
    /// API (runc's CRIU: the `--criu` its task was created with, else containerd's
    /// `PATH`).
    Container {
        containerd: ContainerdAt,
        id: String,
    },
}

/// Where containerd is.
#[derive(Debug, Clone)]
pub struct ContainerdAt {
    /// Its socket.
    pub address: PathBuf,
    pub namespace: String,
}

/// What to checkpoint and how.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    pub source: Source,
    /// Keep the tree running after the dump (else CRIU kills it once dumped).
    pub leave_running: bool,
    pub criu: Criu,
    /// How the dump is chunked and compressed (the command asks for CDC).
    pub build: BuildOptions,
    /// Scratch space for the dump and the built image (removed by the caller).
    pub work_dir: PathBuf,
    /// The app image the process runs (`--for`; a container's own image when not
    /// given): the checkpoint becomes a referrer of its manifest for this node's
    /// platform, in its repository.
    pub app: Option<Reference>,
    /// What the build references instead of storing again.
    pub chunk_dict: DictChoice,
}

/// Which earlier image a checkpoint's build takes as its chunk dictionary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DictChoice {
    /// None: every chunk is stored.
    None,
    /// This Tessera image (the previous checkpoint, usually).
    Image(Reference),
    /// With an app image, its newest checkpoint, if it has one; else none.
    NewestCheckpoint,
}

/// What `tessera checkpoint` did, for people (`Display`) and machines (`Serialize`).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSummary {
    /// Where it was pushed: the tag, or the app image's repository (untagged).
    pub target: String,
    pub digest: String,
    /// The checkpoint pinned by digest (what `tessera restore` takes).
    pub reference: String,
    /// The app image's manifest it is a referrer of (`--for`), pinned by digest.
    pub subject: Option<String>,
    pub kind: Kind,
    /// The container dumped (a container checkpoint).
    pub container: Option<String>,
    /// The image the build took as its chunk dictionary, pinned by digest.
    pub chunk_dict: Option<String>,
    pub pid: u32,
    pub process: String,
    pub left_running: bool,
    pub criu_version: String,
    pub kernel: String,
    /// Bytes of CRIU's images (the dump directory's files).
    pub dumped_bytes: u64,
    pub dumped_files: u64,
    /// Bytes of the image in the registry (blob, bootstrap, config, manifest).
    pub stored_bytes: u64,
    /// Bytes uploaded by this push.
    pub pushed_bytes: u64,
    /// Bytes the registry already had: the chunk dictionary's blobs this checkpoint
    /// references (chunks that did not change), or an unchanged checkpoint pushed again.
    pub reused_bytes: u64,
    pub build: BuildSummary,
    pub dump_seconds: f64,
    pub build_seconds: f64,
    pub push_seconds: f64,
    pub seconds: f64,
}

impl std::fmt::Display for CheckpointSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        match &self.container {
            Some(id) => writeln!(
                f,
                "checkpointed container {id} (pid {}, {}) -> {}",
                self.pid, self.process, self.target
            )?,
            None => writeln!(
                f,
                "checkpointed pid {} ({}) -> {}",
                self.pid, self.process, self.target
            )?,
        }
        writeln!(f, "  digest     {}", self.digest)?;
        if let Some(subject) = &self.subject {
            writeln!(f, "  for        {subject}")?;
        }
        if let Some(dict) = &self.chunk_dict {
            writeln!(
                f,
                "  dedup      {} of {} chunks referenced in {dict}",
                self.build.dict_chunks, self.build.unique_chunks
            )?;
        }
        writeln!(
            f,
            "  bytes      {:.1} MiB dumped ({} files); {:.1} MiB stored in the registry ({} chunks, {:.1}x smaller), {:.1} MiB uploaded, {:.1} MiB reused (already there)",
            mib(self.dumped_bytes),
            self.dumped_files,
            mib(self.stored_bytes),
            self.build.unique_chunks,
            self.dumped_bytes as f64 / self.stored_bytes.max(1) as f64,
            mib(self.pushed_bytes),
            mib(self.reused_bytes)
        )?;
        writeln!(
            f,
            "  time       {:.2} s (dump {:.2} s, build {:.2} s, push {:.2} s); the process was {}",
            self.seconds,
            self.dump_seconds,
            self.build_seconds,
            self.push_seconds,
            if self.left_running {
                "left running"
            } else {
                "stopped"
            }
        )?;
        writeln!(
            f,
            "  node       CRIU {}, kernel {}",
            self.criu_version, self.kernel
        )
    }
}

/// Dumps process tree `opts.pid` with CRIU and pushes the dump as Tessera image
/// `target` (a tag), or with `opts.app` and no target into the app image's repository
/// untagged, as a referrer of the app image. What can fail without the process is
/// done before the dump (the app image, the chunk dictionary). If the dump stopped the
/// tree and a later step fails, the dump is kept on disk and the error says where
/// ([`Error::CheckpointNotPushed`]).
#[tracing::instrument(skip_all, fields(source = ?opts.source))]
pub async fn checkpoint(
    client: Arc<RegistryClient>,
    target: Option<&Reference>,
    opts: &CheckpointOptions,
    progress: &ConvertProgress,
) -> Result<CheckpointSummary> {
    let started = Instant::now();
    let (pid, container) = match &opts.source {
        Source::Process(pid) => (*pid, None),
        Source::Container { containerd, id } => {
            let c = Containerd::connect(&containerd.address, &containerd.namespace).await?;
            let record = c.container(id).await?;
            let pid = c.task_pid(id).await?.ok_or_else(|| Error::Criu {
                action: "dump".into(),
                reason: format!("container {id} has no running task to checkpoint"),
            })?;
            (pid, Some((c, record)))
        }
    };
    let app_ref = match (&opts.app, &container) {
        (Some(app), _) => Some(app.clone()),
        (None, Some((_, record))) => {
            Some(Reference::parse(&record.image).map_err(|e| Error::Setting {
                setting: "--for".into(),
                problem: format!(
                    "container {}'s image {:?} is not a registry reference ({e}): name the \
                     app image with --for",
                    record.id, record.image
                ),
            })?)
        }
        (None, None) => None,
    };
    let target = push_target(target, app_ref.as_ref())?;
    let node = NodeInfo::probe(&opts.criu)?;
    let comm_path = PathBuf::from(format!("/proc/{pid}/comm"));
    let process = std::fs::read_to_string(&comm_path)
        .map_err(|e| Error::Criu {
            action: "dump".into(),
            reason: format!("no process {pid} to checkpoint ({e})"),
        })?
        .trim()
        .to_string();
    let app = match &app_ref {
        Some(app) => {
            progress.set_phase(format!("resolve {app}"));
            Some(image::resolve_platform(&client, app, &Platform::host()).await?)
        }
        None => None,
    };
    let dict = chunk_dict(
        &client,
        app.as_ref(),
        &opts.chunk_dict,
        &opts.work_dir,
        progress,
    )
    .await?;
    let images = opts.work_dir.join("dump");
    let criu_work = opts.work_dir.join("criu");
    for dir in [&images, &criu_work] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    }

    let t = Instant::now();
    match &container {
        None => {
            progress.set_phase(format!("dump pid {pid}"));
            let (criu, leave_running) = (opts.criu.clone(), opts.leave_running);
            let (dump_dir, work) = (images.clone(), criu_work.clone());
            tokio::task::spawn_blocking(move || criu.dump(pid, &dump_dir, &work, leave_running))
                .await
                .map_err(|e| task_failed("dump", e))??;
        }
        Some((c, record)) => {
            progress.set_phase(format!("checkpoint container {}", record.id));
            c.checkpoint_task(&record.id, &images, &criu_work, !opts.leave_running)
                .await?;
            // Beside CRIU's images, not in the metadata: the spec holds the command
            // line and environment.
            let file = images.join(CONTAINER_FILE);
            let bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::Criu {
                action: "dump".into(),
                reason: format!("serialise container {}'s record: {e}", record.id),
            })?;
            std::fs::write(&file, bytes).map_err(|e| Error::io("write", &file, e))?;
        }
    }
    let dump_seconds = t.elapsed().as_secs_f64();
    let (dumped_files, dumped_bytes) = dir_size(&images)?;
    tracing::info!(dumped_bytes, dumped_files, dump_seconds, "dumped");

    let subject = app.as_ref().map(app::subject_of);
    let after_dump = async {
        progress.set_phase("build checkpoint".into());
        let t = Instant::now();
        let mut build_opts = opts.build.clone();
        build_opts.progress = Some(progress.build.clone());
        build_opts.prefetch = restore_order(&images)?;
        build_opts.chunk_dict = dict.as_ref().map(|(_, dir)| ChunkDict {
            image_dir: dir.clone(),
            link_blobs: false,
        });
        let out = opts.work_dir.join("image");
        let dump_dir = images.clone();
        let build = tokio::task::spawn_blocking(move || -> rafs_format::Result<BuildSummary> {
            let mut builder = Builder::new(&out, build_opts)?;
            builder.add_dir(&dump_dir)?;
            builder.finish()
        })
        .await
        .map_err(|e| task_failed("build", e))??;
        let build_seconds = t.elapsed().as_secs_f64();

        progress.set_phase(format!("push {target}"));
        let t = Instant::now();
        let record = container.as_ref().map(|(_, record)| record);
        let config = image_config(&node, opts, pid, &process, record, dumped_bytes, &build)?;
        let mut annotations: serde_json::Map<String, serde_json::Value> = node
            .annotations()
            .into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect();
        let kind = if record.is_some() {
            Kind::Container
        } else {
            Kind::Process
        };
        annotations.insert(KIND_ANNOTATION.into(), json!(kind.as_str()));
        if kind == Kind::Process {
            // A container's tree is restored in a pid namespace of its own.
            annotations.insert(PID_ANNOTATION.into(), json!(pid.to_string()));
        }
        annotations.insert(PROCESS_ANNOTATION.into(), json!(process));
        annotations.insert(
            app::CREATED_ANNOTATION.into(),
            json!(app::rfc3339_utc(std::time::SystemTime::now())),
        );
        let spec = PushSpec {
            config,
            annotations,
            dict: dict.as_ref().map(|(image, _)| image),
            subject: subject.as_ref().map(|s| (s, ARTIFACT_TYPE)),
            ..PushSpec::default()
        };
        let pushed = push_built(&client, &target, &build, spec, &opts.work_dir, progress).await?;
        Ok::<_, Error>((build, build_seconds, pushed, t.elapsed().as_secs_f64()))
    };
    let (build, build_seconds, pushed, push_seconds) = match after_dump.await {
        Ok(done) => done,
        Err(cause) if !opts.leave_running => return Err(keep_dump(pid, &images, cause)),
        Err(cause) => return Err(cause),
    };
    let reference = Reference {
        tag: None,
        digest: Some(pushed.digest.clone()),
        ..target.clone()
    };
    Ok(CheckpointSummary {
        target: target.to_string(),
        digest: pushed.digest,
        reference: reference.to_string(),
        subject: app.map(|a| a.reference.to_string()),
        kind: if container.is_some() {
            Kind::Container
        } else {
            Kind::Process
        },
        container: container.map(|(_, record)| record.id),
        chunk_dict: dict.map(|(image, _)| image.reference.to_string()),
        pid,
        process,
        left_running: opts.leave_running,
        criu_version: node.criu.to_string(),
        kernel: node.kernel,
        dumped_bytes,
        dumped_files,
        stored_bytes: pushed.stored,
        pushed_bytes: pushed.pushed,
        reused_bytes: pushed.reused,
        build,
        dump_seconds,
        build_seconds,
        push_seconds,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Where a checkpoint goes: `target` (a tag; with an app image, in its repository, as
/// referrers are listed per repository), or untagged into the app image's repository.
fn push_target(target: Option<&Reference>, app: Option<&Reference>) -> Result<Reference> {
    match (target, app) {
        (Some(t), _) if t.digest.is_some() => Err(Error::Reference {
            input: t.to_string(),
            reason: "the target must be a tag: its digest is only known after the push".into(),
        }),
        (Some(t), Some(app))
            if (&t.registry, &t.repository) != (&app.registry, &app.repository) =>
        {
            Err(Error::Setting {
                setting: "TARGET".into(),
                problem: format!(
                    "{t} is not in the repository of --for {app}: a registry lists the \
                     referrers of an image in its own repository only. Push the \
                     checkpoint to {}/{}:TAG, or leave TARGET out to push it there untagged",
                    app.registry, app.repository
                ),
            })
        }
        (Some(t), _) => Ok(t.clone()),
        (None, Some(app)) => Ok(Reference {
            tag: None,
            digest: None,
            ..app.clone()
        }),
        (None, None) => Err(Error::Setting {
            setting: "TARGET".into(),
            problem: "give the tag to push the checkpoint to, or --for APP_IMAGE to push it \
                      beside that image as its referrer"
                .into(),
        }),
    }
}

/// The chunk dictionary `choice` names, resolved for this node's platform, and a
/// directory in `work` holding its bootstrap; `None` when there is none to use. A
/// named one that cannot be had fails the checkpoint (before the dump); of an app
/// image's checkpoints, one that cannot be had (made by another tool, deleted) is
/// logged and the next newest tried.
async fn chunk_dict(
    client: &RegistryClient,
    app: Option<&PlatformImage>,
    choice: &DictChoice,
    work: &Path,
    progress: &ConvertProgress,
) -> Result<Option<(PlatformImage, PathBuf)>> {
    let dir = work.join("dict");
    match (choice, app) {
        (DictChoice::None, _) | (DictChoice::NewestCheckpoint, None) => Ok(None),
        (DictChoice::Image(r), _) => fetch_dict(client, r, &dir, progress).await.map(Some),
        (DictChoice::NewestCheckpoint, Some(app)) => {
            progress.set_phase(format!("list the checkpoints of {}", app.reference));
            for listed in checkpoints_of(client, app).await? {
                match fetch_dict(client, &listed.reference, &dir, progress).await {
                    Ok(dict) => return Ok(Some(dict)),
                    Err(e) => tracing::warn!(
                        checkpoint = %listed.reference, error = %e,
                        "this checkpoint cannot be the chunk dictionary; trying an older one"
                    ),
                }
            }
            Ok(None)
        }
    }
}

/// Resolves Tessera image `reference` for this node's platform and fetches its
/// bootstrap into `dir`.
async fn fetch_dict(
    client: &RegistryClient,
    reference: &Reference,
    dir: &Path,
    progress: &ConvertProgress,
) -> Result<(PlatformImage, PathBuf)> {
    progress.set_phase(format!("fetch chunk dictionary {reference}"));
    let dict = image::resolve_platform(client, reference, &Platform::host()).await?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    image::fetch_bootstrap(client, &dict, dir).await?;
    tracing::info!(chunk_dict = %dict.reference, "building against the chunk dictionary");
    Ok((dict, dir.to_path_buf()))
}

fn task_failed(what: &str, e: tokio::task::JoinError) -> Error {
    Error::Criu {
        action: what.into(),
        reason: format!("its task ended without finishing: {e}"),
    }
}

/// Moves a dump whose process is gone out of the scratch dir (which the caller
/// removes) and wraps `cause` in the error that says where it is.
fn keep_dump(pid: u32, images: &Path, cause: Error) -> Error {
    let kept = std::env::temp_dir().join(format!(
        "tessera-checkpoint-{pid}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    ));
    match std::fs::rename(images, &kept) {
        Ok(()) => Error::CheckpointNotPushed {
            pid,
            kept,
            cause: Box::new(cause),
        },
        Err(e) => {
            tracing::error!(error = %e, dump = %images.display(), "could not keep the dump");
            cause
        }
    }
}

/// The checkpoint's prefetch list: every file of the dump (`dir`), in the order a
/// restore reads them — CRIU's small images first (the process tree, cores, memory
/// maps, files), then the page data, the bulk. A restore's mount prefetches them so.
pub(super) fn restore_order(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("read", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read", dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    names.sort_by_key(|n| (n.starts_with("pages-"), n.clone()));
    Ok(names.into_iter().map(|n| format!("/{n}")).collect())
}

/// Regular files under `dir` (CRIU's images are flat) and their bytes.
fn dir_size(dir: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("read", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read", dir, e))?;
        let meta = entry
            .metadata()
            .map_err(|e| Error::io("stat", entry.path(), e))?;
        if meta.is_file() {
            files += 1;
            bytes += meta.len();
        }
    }
    Ok((files, bytes))
}

/// An OCI image config for the checkpoint: the platform, the layers' diff IDs (as
/// `tessera convert` writes them), and everything recorded about the dump under
/// `io.tessera.checkpoint`.
fn image_config(
    node: &NodeInfo,
    opts: &CheckpointOptions,
    pid: u32,
    process: &str,
    container: Option<&ContainerRecord>,
    dumped_bytes: u64,
    build: &BuildSummary,
) -> Result<Vec<u8>> {
    let platform = Platform::host();
    let mut diff_ids: Vec<&str> = build.blobs.iter().map(|b| b.digest.as_str()).collect();
    diff_ids.push(&build.bootstrap_digest);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let config = json!({
        "architecture": platform.architecture,
        "os": platform.os,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "io.tessera.checkpoint": {
            "criu_version": node.criu.to_string(),
            "kernel": node.kernel,
            "cpu_model": node.cpu_model,
            "cpu_flags": node.cpu_flags,
            "pid": pid,
            "process": process,
            "kind": if container.is_some() { Kind::Container } else { Kind::Process },
            // The spec (command line, environment) is in the tree, not here.
            "container": container.map(|c| json!({
                "id": c.id, "image": c.image, "runtime": c.runtime, "file": CONTAINER_FILE,
            })),
            "left_running": opts.leave_running,
            "dumped_bytes": dumped_bytes,
            "criu_extra_args": opts.criu.extra_args,
            "created_unix_seconds": created,
        },
    });
    serde_json::to_vec(&config).map_err(|e| Error::Criu {
        action: "dump".into(),
        reason: format!("serialise the image config: {e}"),
    })
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub criu: Criu,
    /// The agent's local API socket: it mounts the checkpoint.
    pub socket: PathBuf,
    pub platform: Platform,
    /// Scratch space for the mountpoint and CRIU's log (removed by the caller).
    pub work_dir: PathBuf,
}

/// What `tessera restore` did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreSummary {
    pub image: String,
    pub digest: String,
    /// The app image whose newest usable checkpoint this was (`restore --for`).
    pub for_image: Option<String>,
    /// Newer checkpoints of that image that this node could not restore, and why.
    pub skipped: Vec<String>,
    /// The restored tree's root process.
    pub pid: u32,
    pub criu_version: String,
    /// Differences from the dumping node that did not stop the restore.
    pub notes: Vec<String>,
    /// Bytes CRIU read through the lazy mount.
    pub bytes_read: u64,
    /// Bytes the agent fetched for the mount from the origin (on the wire) and peers.
    pub origin_wire_bytes: u64,
    pub peer_bytes: u64,
    pub mount_seconds: f64,
    pub restore_seconds: f64,
    pub seconds: f64,
}

impl std::fmt::Display for RestoreSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        writeln!(f, "restored pid {} from {}", self.pid, self.image)?;
        writeln!(f, "  digest     {}", self.digest)?;
        if let Some(app) = &self.for_image {
            writeln!(
                f,
                "  for        {app} (its newest checkpoint this node can restore)"
            )?;
        }
        for skipped in &self.skipped {
            writeln!(f, "  skipped    {skipped}")?;
        }
        writeln!(
            f,
            "  bytes      {:.1} MiB read through the lazy mount; fetched {:.1} MiB from the origin (on the wire), {:.1} MiB from peers",
            mib(self.bytes_read),
            mib(self.origin_wire_bytes),
            mib(self.peer_bytes)
        )?;
        writeln!(
            f,
            "  time       {:.2} s (mount {:.2} s, criu restore {:.2} s) with CRIU {}",
            self.seconds, self.mount_seconds, self.restore_seconds, self.criu_version
        )?;
        for note in &self.notes {
            writeln!(f, "  note       {note}")?;
        }
        Ok(())
    }
}

/// Restores checkpoint `reference`: checks it against this node, has the agent on
/// `opts.socket` mount it lazily, runs `criu restore` from the mount, unmounts.
#[tracing::instrument(skip_all, fields(image = %reference))]
pub async fn restore(
    client: &RegistryClient,
    reference: &Reference,
    opts: &RestoreOptions,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let img = image::resolve_platform(client, reference, &opts.platform).await?;
    let annotations = manifest_annotations(&img.raw.bytes);
    let node = NodeInfo::probe(&opts.criu)?;
    check_kind(&reference.to_string(), &annotations, Kind::Process)?;
    let notes = node::check(&reference.to_string(), &annotations, &node)?;
    restore_checked(
        &img,
        &reference.to_string(),
        &annotations,
        &node,
        notes,
        opts,
        started,
    )
    .await
}

/// Restores the newest checkpoint of app image `app` (its manifest for
/// `opts.platform`) that this node can restore. Fails with
/// [`Error::NoUsableCheckpoint`] when it has none, or none this node can restore:
/// the caller boots the image then.
#[tracing::instrument(skip_all, fields(app = %app))]
pub async fn restore_for(
    client: &RegistryClient,
    app: &Reference,
    opts: &RestoreOptions,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let app_image = image::resolve_platform(client, app, &opts.platform).await?;
    let listed = checkpoints_of(client, &app_image).await?;
    let node = NodeInfo::probe(&opts.criu)?;
    let (chosen, rejected) = first_restorable(listed, Kind::Process, &node);
    let Some((candidate, notes)) = chosen else {
        return Err(Error::NoUsableCheckpoint {
            image: app.to_string(),
            subject: app_image.raw.digest.clone(),
            rejected,
        });
    };
    let name = candidate.reference.to_string();
    let img = image::resolve_platform(client, &candidate.reference, &opts.platform).await?;
    let mut summary = restore_checked(
        &img,
        &name,
        &candidate.annotations,
        &node,
        notes,
        opts,
        started,
    )
    .await?;
    summary.for_image = Some(app_image.reference.to_string());
    summary.skipped = rejected.iter().map(RejectedCheckpoint::line).collect();
    Ok(summary)
}

/// Of `candidates` (newest first), the first of kind `kind` that `node` can restore,
/// with the differences from its dumping node that did not stop it; and, newest first,
/// the ones before it that were refused, and why.
fn first_restorable(
    candidates: Vec<app::Listed>,
    kind: Kind,
    node: &NodeInfo,
) -> (Option<(app::Listed, Vec<String>)>, Vec<RejectedCheckpoint>) {
    let mut rejected = Vec::new();
    for candidate in candidates {
        let name = candidate.reference.to_string();
        let checked = check_kind(&name, &candidate.annotations, kind)
            .and_then(|()| node::check(&name, &candidate.annotations, node));
        match checked {
            Ok(notes) => return (Some((candidate, notes)), rejected),
            Err(e) => {
                let reason = match e {
                    Error::CheckpointIncompatible { reason, .. } => reason,
                    other => other.to_string(),
                };
                tracing::info!(checkpoint = %name, %reason, "skipping a checkpoint this node cannot restore");
                rejected.push(RejectedCheckpoint {
                    checkpoint: name,
                    created: candidate.created,
                    reason,
                });
            }
        }
    }
    (None, rejected)
}

/// Restores checkpoint `img` (called `name`), already checked against `node` (`notes`
/// are the differences that did not stop it).
async fn restore_checked(
    img: &PlatformImage,
    name: &str,
    annotations: &BTreeMap<String, String>,
    node: &NodeInfo,
    notes: Vec<String>,
    opts: &RestoreOptions,
    started: Instant,
) -> Result<RestoreSummary> {
    for note in &notes {
        tracing::warn!(%note, "restoring on a different node");
    }
    let recorded_pid = annotations
        .get(PID_ANNOTATION)
        .and_then(|p| p.parse::<u32>().ok());
    if let Some(pid) = recorded_pid {
        // CRIU gives the tree its old pids back: say so plainly if one is taken.
        if Path::new("/proc").join(pid.to_string()).exists() {
            return Err(Error::Criu {
                action: "restore".into(),
                reason: format!(
                    "the checkpoint's process had pid {pid}, which a process on this node \
                     has now; CRIU restores a tree with its own pids, so stop that process \
                     first (restoring into a new pid namespace is not supported yet)"
                ),
            });
        }
    }
    let mountpoint = opts.work_dir.join("mnt");
    let criu_work = opts.work_dir.join("criu");
    for dir in [&mountpoint, &criu_work] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    }
    let t = Instant::now();
    api::call(
        &opts.socket,
        Request::Mount {
            image: img.reference.to_string(),
            mountpoint: mountpoint.clone(),
            platform: None,
            plan: Default::default(),
        },
    )
    .await?;
    let mount_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let criu = opts.criu.clone();
    let (images, work) = (mountpoint.clone(), criu_work);
    let restored = tokio::task::spawn_blocking(move || criu.restore(&images, &work))
        .await
        .map_err(|e| task_failed("restore", e));
    let restore_seconds = t.elapsed().as_secs_f64();
    // The restored tree runs from memory now; the mount is not needed whatever happened.
    let unmounted = api::call(
        &opts.socket,
        Request::Umount {
            mountpoint: mountpoint.clone(),
        },
    )
    .await;
    let pid = restored??;
    let status = match unmounted {
        Ok(status) => status,
        Err(e) => {
            tracing::warn!(error = %e, mountpoint = %mountpoint.display(), "unmount after restore");
            serde_json::Value::Null
        }
    };
    let number = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    Ok(RestoreSummary {
        image: name.to_string(),
        digest: img.raw.digest.clone(),
        for_image: None,
        skipped: Vec::new(),
        pid,
        criu_version: node.criu.to_string(),
        notes,
        bytes_read: number(&status["bytes_read"]),
        origin_wire_bytes: number(&status["pull"]["origin_wire_bytes"]),
        peer_bytes: number(&status["pull"]["peer_bytes"]),
        mount_seconds,
        restore_seconds,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Checkpoint `name` (its manifest's `annotations`) is of kind `want`, or an error
/// that says which command restores it.
pub fn check_kind(name: &str, annotations: &BTreeMap<String, String>, want: Kind) -> Result<()> {
    let kind = Kind::of(annotations);
    if kind == want {
        return Ok(());
    }
    let command = match kind {
        Kind::Process => "`tessera restore`",
        Kind::Container => "`tessera run`",
    };
    Err(Error::CheckpointIncompatible {
        image: name.to_string(),
        reason: format!(
            "it is a checkpoint of a {}, not of a {}: restore it with {command}",
            kind.as_str(),
            want.as_str()
        ),
    })
}

/// A manifest's string annotations (none if it has none or is not JSON: the check
/// then says it is not a checkpoint).
fn manifest_annotations(manifest: &[u8]) -> BTreeMap<String, String> {
    let value: serde_json::Value = serde_json::from_slice(manifest).unwrap_or_default();
    value["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_for_an_app_image_goes_into_its_repository() {
        let app = Reference::parse("r.example/team/app:1.4").unwrap();
        let untagged = push_target(None, Some(&app)).unwrap();
        assert_eq!(untagged.to_string(), "r.example/team/app");
        let tag = Reference::parse("r.example/team/app:ckpt-1").unwrap();
        assert_eq!(push_target(Some(&tag), Some(&app)).unwrap(), tag);
        let elsewhere = Reference::parse("r.example/ckpt/app:v1").unwrap();
        let e = push_target(Some(&elsewhere), Some(&app)).unwrap_err();
        assert!(
            matches!(&e, Error::Setting { setting, .. } if setting == "TARGET"),
            "{e:?}"
        );
        assert!(e.to_string().contains("r.example/team/app:TAG"), "{e}");
        assert!(push_target(None, None).is_err());
        let pinned =
            Reference::parse(&format!("r.example/team/app@sha256:{}", "a".repeat(64))).unwrap();
        assert!(matches!(
            push_target(Some(&pinned), None),
            Err(Error::Reference { .. })
        ));
    }

    #[test]
    fn no_usable_checkpoint_says_boot_and_why() {
        let none = Error::NoUsableCheckpoint {
            image: "r.example/app:1".into(),
            subject: "sha256:abc".into(),
            rejected: Vec::new(),
        };
        let message = none.to_string();
        assert!(
            message.starts_with("no usable checkpoint: boot the image r.example/app:1")
                && message.contains("no checkpoint"),
            "{message}"
        );
        let incompatible = Error::NoUsableCheckpoint {
            image: "r.example/app:1".into(),
            subject: "sha256:abc".into(),
            rejected: vec![RejectedCheckpoint {
                checkpoint: "r.example/app@sha256:def".into(),
                created: Some("2025-01-01T00:00:00.000Z".into()),
                reason: "it was dumped by CRIU 3.17.1".into(),
            }],
        };
        let message = incompatible.to_string();
        assert!(
            message.contains("none of its 1 checkpoints")
                && message.contains(
                    "sha256:def (2025-01-01T00:00:00.000Z): it was dumped by CRIU 3.17.1"
                ),
            "{message}"
        );
    }

    #[test]
    fn manifest_annotations_are_read_leniently() {
        let m = br#"{"annotations":{"a":"1","b":2},"layers":[]}"#;
        let a = manifest_annotations(m);
        assert_eq!(a.len(), 1);
        assert_eq!(a["a"], "1");
        assert!(manifest_annotations(b"not json").is_empty());
        assert!(manifest_annotations(b"{}").is_empty());
    }
}
