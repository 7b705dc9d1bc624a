//! containerd's containers and tasks services, as `tessera checkpoint --container` and
//! `tessera run` use them: read a container's record, checkpoint its task into a
//! directory (runc drives CRIU), and make a container and its task again, either booted
//! or restored from a directory of CRIU images.
//!
//! The directory paths go in runc's task options (`containerd.runc.v1`): containerd
//! then neither packs the checkpoint into its content store nor unpacks one from it,
//! so a restore reads CRIU's images straight from the agent's lazy mount.

use std::path::Path;
use std::time::Duration;

use prost::Message;
use tessera_proto::containerd::containers::containers_client::ContainersClient;
use tessera_proto::containerd::containers::{self, Container};
use tessera_proto::containerd::runc::v1 as runc;
use tessera_proto::containerd::snapshots;
use tessera_proto::containerd::snapshots::snapshots_client::SnapshotsClient;
use tessera_proto::containerd::tasks::tasks_client::TasksClient;
use tessera_proto::containerd::tasks::{self as task_api};
use tessera_proto::containerd::types::Mount;
use tessera_proto::containerd::v1::types::Status as TaskStatus;
use tonic::Code;

use super::Containerd;
use crate::{Error, Result};

/// The type of a container's spec in its record (containerd's `typeurl` name of the
/// OCI runtime spec; the value is the spec's JSON).
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// runc's shim, the runtime `ctr run` uses.
pub const RUNC_V2: &str = "io.containerd.runc.v2";
/// runc's task options: on a create, where to restore from.
const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
/// runc's checkpoint options: where the images go, and how.
const RUNC_CHECKPOINT_OPTIONS: &str = "containerd.runc.v1.CheckpointOptions";
/// How long a killed task may take to stop before its removal gives up.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// What containerd knows of a container: enough to make it again on another node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    /// The image it was made from, as containerd names it.
    pub image: String,
    /// The runtime (`io.containerd.runc.v2`).
    pub runtime: String,
    /// Its OCI runtime spec.
    pub spec: serde_json::Value,
    pub snapshotter: String,
    pub snapshot_key: String,
}

/// How a task's process is started.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// From the image's command.
    Boot,
    /// By CRIU from the images in `images`, with `work` for its logs.
    Restore { images: &'a Path, work: &'a Path },
}

impl Containerd {
    /// Container `id`'s record.
    pub async fn container(&self, id: &str) -> Result<ContainerRecord> {
        let answer = ContainersClient::new(self.channel.clone())
            .get(self.request(containers::GetContainerRequest { id: id.to_string() }))
            .await
            .map_err(|s| self.error(format!("get container {id}"), &s))?
            .into_inner();
        let c = answer.container.unwrap_or_default();
        let spec = c.spec.unwrap_or_default();
        let spec = serde_json::from_slice(&spec.value).map_err(|e| Error::Containerd {
            address: self.address.clone(),
            what: format!("read container {id}'s spec"),
            reason: format!("it is not the JSON of an OCI runtime spec: {e}"),
        })?;
        Ok(ContainerRecord {
            id: c.id,
            image: c.image,
            runtime: c.runtime.map(|r| r.name).unwrap_or_default(),
            spec,
            snapshotter: c.snapshotter,
            snapshot_key: c.snapshot_key,
        })
    }

    /// Whether containerd has a container `id`.
    pub async fn has_container(&self, id: &str) -> Result<bool> {
        let answer = ContainersClient::new(self.channel.clone())
            .get(self.request(containers::GetContainerRequest { id: id.to_string() }))
            .await;
        match answer {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(self.error(format!("get container {id}"), &s)),
        }
    }

    /// The pid of container `id`'s task on this node, if it has one running.
    pub async fn task_pid(&self, id: &str) -> Result<Option<u32>> {
        let answer = TasksClient::new(self.channel.clone())
            .get(self.request(task_api::GetRequest {
                container_id: id.to_string(),
                exec_id: String::new(),
            }))
            .await;
        match answer {
            Ok(a) => Ok(a
                .into_inner()
                .process
                .filter(|p| p.status == TaskStatus::Running as i32)
                .map(|p| p.pid)),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(self.error(format!("get the task of container {id}"), &s)),
        }
    }

    /// Checkpoints container `id`'s task into `images` (CRIU's image files), with
    /// CRIU's logs in `work`; established TCP connections are dumped (a restore closes
    /// them). With `exit` the task stops once dumped.
    pub async fn checkpoint_task(
        &self,
        id: &str,
        images: &Path,
        work: &Path,
        exit: bool,
    ) -> Result<()> {
        let options = runc::CheckpointOptions {
            exit,
            open_tcp: true,
            image_path: images.display().to_string(),
            work_path: work.display().to_string(),
            ..runc::CheckpointOptions::default()
        };
        TasksClient::new(self.channel.clone())
            .checkpoint(self.request(task_api::CheckpointTaskRequest {
                container_id: id.to_string(),
                parent_checkpoint: String::new(),
                options: Some(any(RUNC_CHECKPOINT_OPTIONS, &options)),
            }))
            .await
            .map_err(|s| {
                self.error(
                    format!(
                        "checkpoint container {id} (CRIU's log: {}/dump.log)",
                        work.display()
                    ),
                    &s,
                )
            })?;
        Ok(())
    }

    /// `Snapshots.Prepare` of `key` on `parent`: the mounts of the new active snapshot.
    pub async fn prepare_rootfs(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
    ) -> Result<Vec<Mount>> {
        let answer = SnapshotsClient::new(self.channel.clone())
            .prepare(self.request(snapshots::PrepareSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
                parent: parent.to_string(),
                labels: Default::default(),
            }))
            .await
            .map_err(|s| self.error(format!("prepare the rootfs snapshot {key}"), &s))?;
        Ok(answer.into_inner().mounts)
    }

    /// Creates container `record.id` (its spec, image, runtime and snapshot).
    pub async fn create_container(&self, record: &ContainerRecord) -> Result<()> {
        let spec = serde_json::to_vec(&record.spec).map_err(|e| Error::Containerd {
            address: self.address.clone(),
            what: format!("create container {}", record.id),
            reason: format!("serialise its spec: {e}"),
        })?;
        let container = Container {
            id: record.id.clone(),
            image: record.image.clone(),
            runtime: Some(containers::container::Runtime {
                name: record.runtime.clone(),
                options: None,
            }),
            spec: Some(prost_types::Any {
                type_url: SPEC_TYPE_URL.into(),
                value: spec,
            }),
            snapshotter: record.snapshotter.clone(),
            snapshot_key: record.snapshot_key.clone(),
            ..Container::default()
        };
        ContainersClient::new(self.channel.clone())
            .create(self.request(containers::CreateContainerRequest {
                container: Some(container),
            }))
            .await
            .map_err(|s| self.error(format!("create container {}", record.id), &s))?;
        Ok(())
    }

    /// Creates container `id`'s task on `rootfs` and starts it (`start` says how), its
    /// output appended to `log`; runc runs `criu` for this task's restore and later
    /// checkpoints (else the one on its `PATH`). Returns the task's pid.
    pub async fn start_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        start: Start<'_>,
        log: &Path,
        criu: Option<&Path>,
    ) -> Result<u32> {
        let mut options = runc::Options {
            criu_path: criu.map(|p| p.display().to_string()).unwrap_or_default(),
            ..runc::Options::default()
        };
        if let Start::Restore { images, work } = start {
            options.criu_image_path = images.display().to_string();
            options.criu_work_path = work.display().to_string();
        }
        let options = Some(any(RUNC_OPTIONS, &options));
        let log = format!("file://{}", log.display());
        let mut tasks = TasksClient::new(self.channel.clone());
        tasks
            .create(self.request(task_api::CreateTaskRequest {
                container_id: id.to_string(),
                rootfs,
                stdin: String::new(),
                stdout: log.clone(),
                stderr: log,
                terminal: false,
                checkpoint: None,
                options,
                runtime_path: String::new(),
            }))
            .await
            .map_err(|s| self.error(format!("create the task of container {id}"), &s))?;
        let what = match start {
            Start::Boot => format!("start container {id}"),
            Start::Restore { work, .. } => format!(
                "restore container {id} (CRIU's log: {}/restore.log)",
                work.display()
            ),
        };
        let started = tasks
            .start(self.request(task_api::StartRequest {
                container_id: id.to_string(),
                exec_id: String::new(),
            }))
            .await
            .map_err(|s| self.error(what, &s))?;
        Ok(started.into_inner().pid)
    }

    /// Removes container `id` with whatever it has: its task (killed, waited for,
    /// deleted), the container record, and snapshot `key` in `snapshotter`. Each part
    /// that is not there is skipped; the first other failure is returned after the
    /// rest was tried.
    pub async fn remove_container(&self, id: &str, snapshotter: &str, key: &str) -> Result<()> {
        let mut first_error = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                tracing::warn!(container = id, error = %e, "removing a container");
                first_error.get_or_insert(e);
            }
        };
        keep(self.delete_task(id).await);
        let deleted = ContainersClient::new(self.channel.clone())
            .delete(self.request(containers::DeleteContainerRequest { id: id.to_string() }))
            .await;
        keep(match deleted {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(self.error(format!("delete container {id}"), &s)),
        });
        let removed = SnapshotsClient::new(self.channel.clone())
            .remove(self.request(snapshots::RemoveSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            }))
            .await;
        keep(match removed {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(self.error(format!("remove snapshot {key}"), &s)),
        });
        first_error.map_or(Ok(()), Err)
    }

    /// Kills container `id`'s task (all its processes), waits until it stopped, and
    /// deletes it; no task is nothing to do.
    async fn delete_task(&self, id: &str) -> Result<()> {
        let mut tasks = TasksClient::new(self.channel.clone());
        let killed = tasks
            .kill(self.request(task_api::KillRequest {
                container_id: id.to_string(),
                exec_id: String::new(),
                signal: 9,
                all: true,
            }))
            .await;
        match killed {
            Ok(_) => {}
            // No task, or a created one whose process never ran (a failed restore:
            // nothing to signal); the delete below finds out which.
            Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => {}
            Err(s) => return Err(self.error(format!("kill the task of container {id}"), &s)),
        }
        let deadline = tokio::time::Instant::now() + STOP_TIMEOUT;
        loop {
            let answer = tasks
                .get(self.request(task_api::GetRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                }))
                .await;
            let running = match answer {
                Ok(a) => a
                    .into_inner()
                    .process
                    .is_some_and(|p| p.status == TaskStatus::Running as i32),
                Err(s) if s.code() == Code::NotFound => return Ok(()),
                Err(s) => return Err(self.error(format!("get the task of container {id}"), &s)),
            };
            if !running || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match tasks
            .delete(self.request(task_api::DeleteTaskRequest {
                container_id: id.to_string(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(self.error(format!("delete the task of container {id}"), &s)),
        }
    }
}

/// `message` as a `google.protobuf.Any` under containerd's `typeurl` name `type_url`
/// (containerd registers its own types by their bare full names).
fn any(type_url: &str, message: &impl Message) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url.into(),
        value: message.encode_to_vec(),
    }
}
