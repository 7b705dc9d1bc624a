//! containerd's `containerd.services.snapshots.v1.Snapshots` gRPC service over the
//! snapshotter, on a unix socket. Messages become the snapshotter's types here; its
//! error codes become the gRPC codes containerd maps back to its own errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use tessera_proto::containerd::snapshots as pb;
use tessera_proto::containerd::snapshots::snapshots_server::{Snapshots, SnapshotsServer};
use tessera_proto::containerd::types::Mount;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{Code, Info, Kind, MountSpec, Snapshotter};
use crate::{Error, Result};

/// The snapshotter's unix socket at `path` (a stale socket file is replaced).
pub fn listen(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    }
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).map_err(|e| Error::io("listen on", path, e))
}

/// Serves `snapshotter` on `listener` until the task is dropped.
pub async fn serve(
    snapshotter: Arc<Snapshotter>,
    listener: tokio::net::UnixListener,
    gate: tessera_proto::listen::Gate,
) -> Result<()> {
    tonic::transport::Server::builder()
        .add_service(SnapshotsServer::new(Service(snapshotter)))
        .serve_with_incoming(gate.incoming(listener))
        .await
        .map_err(|e| Error::Service {
            service: "snapshotter service".into(),
            reason: e.to_string(),
        })
}

struct Service(Arc<Snapshotter>);

fn status(e: Error) -> Status {
    let message = e.to_string();
    match e {
        Error::Snapshot { code, .. } => match code {
            Code::NotFound => Status::not_found(message),
            Code::AlreadyExists => Status::already_exists(message),
            Code::FailedPrecondition => Status::failed_precondition(message),
            Code::InvalidArgument => Status::invalid_argument(message),
            Code::Internal => Status::internal(message),
        },
        Error::Transport { .. } => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

fn mounts(specs: Vec<MountSpec>) -> Vec<Mount> {
    specs
        .into_iter()
        .map(|m| Mount {
            r#type: m.kind,
            source: m.source,
            target: String::new(),
            options: m.options,
        })
        .collect()
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

fn info(i: Info) -> pb::Info {
    pb::Info {
        name: i.name,
        parent: i.parent,
        kind: match i.kind {
            Kind::View => pb::Kind::View,
            Kind::Active => pb::Kind::Active,
            Kind::Committed => pb::Kind::Committed,
        } as i32,
        created_at: Some(timestamp(i.created)),
        updated_at: Some(timestamp(i.updated)),
        labels: i.labels.into_iter().collect(),
    }
}

fn labels(l: std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    l.into_iter().collect()
}

type InfoStream = Pin<Box<dyn Stream<Item = Result<pb::ListSnapshotsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Snapshots for Service {
    #[tracing::instrument(name = "snapshot_prepare", skip_all, fields(key = %request.get_ref().key, parent = %request.get_ref().parent))]
    async fn prepare(
        &self,
        request: Request<pb::PrepareSnapshotRequest>,
    ) -> Result<Response<pb::PrepareSnapshotResponse>, Status> {
        let r = request.into_inner();
        let m = self
            .0
            .prepare(&r.key, &r.parent, labels(r.labels), false)
            .await;
        self.0.metrics.count("prepare", &m);
        let m = m.map_err(status)?;
        Ok(Response::new(pb::PrepareSnapshotResponse {
            mounts: mounts(m),
        }))
    }

    #[tracing::instrument(name = "snapshot_view", skip_all, fields(key = %request.get_ref().key, parent = %request.get_ref().parent))]
    async fn view(
        &self,
        request: Request<pb::ViewSnapshotRequest>,
    ) -> Result<Response<pb::ViewSnapshotResponse>, Status> {
        let r = request.into_inner();
        let m = self
            .0
            .prepare(&r.key, &r.parent, labels(r.labels), true)
            .await;
        self.0.metrics.count("view", &m);
        let m = m.map_err(status)?;
        Ok(Response::new(pb::ViewSnapshotResponse {
            mounts: mounts(m),
        }))
    }

    async fn mounts(
        &self,
        request: Request<pb::MountsRequest>,
    ) -> Result<Response<pb::MountsResponse>, Status> {
        let m = self.0.mounts(&request.get_ref().key);
        self.0.metrics.count("mounts", &m);
        let m = m.map_err(status)?;
        Ok(Response::new(pb::MountsResponse { mounts: mounts(m) }))
    }

    #[tracing::instrument(name = "snapshot_commit", skip_all, fields(key = %request.get_ref().key, name = %request.get_ref().name))]
    async fn commit(
        &self,
        request: Request<pb::CommitSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let r = request.into_inner();
        let done = self.0.commit(&r.name, &r.key, labels(r.labels)).await;
        self.0.metrics.count("commit", &done);
        done.map_err(status)?;
        Ok(Response::new(()))
    }

    #[tracing::instrument(name = "snapshot_remove", skip_all, fields(key = %request.get_ref().key))]
    async fn remove(
        &self,
        request: Request<pb::RemoveSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let done = self.0.remove(&request.get_ref().key).await;
        self.0.metrics.count("remove", &done);
        done.map_err(status)?;
        Ok(Response::new(()))
    }

    async fn stat(
        &self,
        request: Request<pb::StatSnapshotRequest>,
    ) -> Result<Response<pb::StatSnapshotResponse>, Status> {
        let i = self.0.stat(&request.get_ref().key);
        self.0.metrics.count("stat", &i);
        let i = i.map_err(status)?;
        Ok(Response::new(pb::StatSnapshotResponse {
            info: Some(info(i)),
        }))
    }

    async fn update(
        &self,
        request: Request<pb::UpdateSnapshotRequest>,
    ) -> Result<Response<pb::UpdateSnapshotResponse>, Status> {
        let r = request.into_inner();
        let Some(given) = r.info else {
            return Err(Status::invalid_argument("update: no snapshot info given"));
        };
        let given = Info {
            name: given.name,
            parent: given.parent,
            kind: Kind::Committed,
            created: SystemTime::UNIX_EPOCH,
            updated: SystemTime::UNIX_EPOCH,
            labels: labels(given.labels),
        };
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let updated = self.0.update(given, &paths).await;
        self.0.metrics.count("update", &updated);
        let updated = updated.map_err(status)?;
        Ok(Response::new(pb::UpdateSnapshotResponse {
            info: Some(info(updated)),
        }))
    }

    type ListStream = InfoStream;

    async fn list(
        &self,
        request: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let all = self.0.list(&request.get_ref().filters);
        self.0.metrics.count("list", &all);
        let all = all.map_err(status)?;
        // One message per hundred, as containerd's own service batches them.
        let batches: Vec<pb::ListSnapshotsResponse> = all
            .chunks(100)
            .map(|c| pb::ListSnapshotsResponse {
                info: c.iter().cloned().map(info).collect(),
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(
            batches.into_iter().map(Ok),
        ))))
    }

    async fn usage(
        &self,
        request: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        let u = self.0.usage(&request.get_ref().key).await;
        self.0.metrics.count("usage", &u);
        let u = u.map_err(status)?;
        Ok(Response::new(pb::UsageResponse {
            size: u.size,
            inodes: u.inodes,
        }))
    }

    #[tracing::instrument(name = "snapshot_cleanup", skip_all)]
    async fn cleanup(&self, _: Request<pb::CleanupRequest>) -> Result<Response<()>, Status> {
        let done = self.0.cleanup().await;
        self.0.metrics.count("cleanup", &done);
        done.map_err(status)?;
        Ok(Response::new(()))
    }
}
