//! A client of containerd's own gRPC services on its socket (v1.6 API): content,
//! images, leases and snapshots, as containerd's Go client calls them (containers and
//! tasks are in [`super::tasks`]). Every call
//! carries the namespace (`containerd-namespace`) and, once one is held, the lease
//! (`containerd-lease`) under which what it creates is kept from the garbage collector.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tessera_proto::containerd::content::content_client::ContentClient;
use tessera_proto::containerd::content::{self, WriteAction, WriteContentRequest};
use tessera_proto::containerd::images::images_client::ImagesClient;
use tessera_proto::containerd::images::{self, Image};
use tessera_proto::containerd::leases;
use tessera_proto::containerd::leases::leases_client::LeasesClient;
use tessera_proto::containerd::snapshots;
use tessera_proto::containerd::snapshots::snapshots_client::SnapshotsClient;
use tessera_proto::containerd::types::Descriptor;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use crate::{Error, Result};

/// How long dialling the socket may take (a daemon that accepts answers at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a lease outlives a pull that died holding it (containerd's client: 24 h).
const LEASE_EXPIRY: Duration = Duration::from_secs(3600);
/// Bytes per `Content.Write` message (well under containerd's 16 MiB message limit).
const WRITE_PIECE: usize = 1 << 20;

/// A connection to containerd in one namespace.
#[derive(Debug)]
pub struct Containerd {
    /// The socket, for messages.
    pub(super) address: PathBuf,
    /// `containerd-namespace` on every call.
    namespace: AsciiMetadataValue,
    /// `containerd-lease` on every call once [`Containerd::lease`] made one.
    lease: Option<(String, AsciiMetadataValue)>,
    pub(super) channel: Channel,
}

/// The outcome of preparing a layer's snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum Prepared {
    /// The snapshotter answered "already exists": the layer's committed snapshot is
    /// there (a Tessera layer, made without unpacking).
    Exists,
    /// An active snapshot to unpack into was made (not a lazy layer).
    Active,
}

impl Containerd {
    /// Dials containerd's socket; an answer that says containerd is not there says
    /// where it was looked for.
    pub async fn connect(address: &Path, namespace: &str) -> Result<Containerd> {
        let namespace: AsciiMetadataValue = namespace.parse().map_err(|_| Error::Setting {
            setting: "--namespace".into(),
            problem: format!("{namespace:?} is not a containerd namespace name"),
        })?;
        let socket = address.to_path_buf();
        // The URI is a placeholder: the connector dials the unix socket.
        let channel = Endpoint::from_static("http://containerd")
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| Error::Containerd {
                address: address.to_path_buf(),
                what: "connect".into(),
                reason: format!(
                    "{}: is containerd running? Name its socket with --address",
                    source_chain(&e)
                ),
            })?;
        Ok(Containerd {
            address: address.to_path_buf(),
            namespace,
            lease: None,
            channel,
        })
    }

    /// A request with the namespace and the lease.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        self.headers(request.metadata_mut());
        request
    }

    fn headers(&self, metadata: &mut MetadataMap) {
        metadata.insert("containerd-namespace", self.namespace.clone());
        if let Some((_, lease)) = &self.lease {
            metadata.insert("containerd-lease", lease.clone());
        }
    }

    pub(super) fn error(&self, what: impl Into<String>, status: &Status) -> Error {
        Error::Containerd {
            address: self.address.clone(),
            what: what.into(),
            reason: format!("{}: {}", code_name(status.code()), status.message()),
        }
    }

    /// Takes a lease `id` that expires on its own after [`LEASE_EXPIRY`] (if this
    /// process dies holding it); every later call works under it.
    pub async fn lease(&mut self, id: &str) -> Result<()> {
        let expires = SystemTime::now() + LEASE_EXPIRY;
        let expires = prost_types::Timestamp {
            seconds: expires
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
            nanos: 0,
        };
        let labels = HashMap::from([("containerd.io/gc.expire".to_string(), expires.to_string())]);
        let request = self.request(leases::CreateRequest {
            id: id.to_string(),
            labels,
        });
        LeasesClient::new(self.channel.clone())
            .create(request)
            .await
            .map_err(|s| self.error("create a lease", &s))?;
        let value: AsciiMetadataValue = id.parse().map_err(|_| Error::Setting {
            setting: "lease".into(),
            problem: format!("{id:?} is not a header value"),
        })?;
        self.lease = Some((id.to_string(), value));
        Ok(())
    }

    /// Lets the lease go: what it kept is now kept only by what refers to it (the
    /// image record).
    pub async fn release(&mut self) -> Result<()> {
        let Some((id, _)) = self.lease.take() else {
            return Ok(());
        };
        let request = self.request(leases::DeleteRequest {
            id: id.clone(),
            sync: false,
        });
        LeasesClient::new(self.channel.clone())
            .delete(request)
            .await
            .map_err(|s| self.error(format!("delete lease {id}"), &s))?;
        Ok(())
    }

    /// Writes `data` into the content store as `digest` with `labels` (as a
    /// `Content.Write` session: data, then commit with the expected digest). Content
    /// already there gets the labels added.
    pub async fn write_content(
        &self,
        reference: &str,
        digest: &str,
        data: &[u8],
        labels: HashMap<String, String>,
    ) -> Result<()> {
        let what = format!("write {digest} into the content store");
        let total = data.len() as i64;
        let mut messages = Vec::new();
        for (i, piece) in data.chunks(WRITE_PIECE).enumerate() {
            messages.push(WriteContentRequest {
                action: WriteAction::Write as i32,
                r#ref: reference.to_string(),
                total,
                expected: digest.to_string(),
                offset: (i * WRITE_PIECE) as i64,
                data: piece.to_vec(),
                labels: HashMap::new(),
            });
        }
        messages.push(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: reference.to_string(),
            total,
            expected: digest.to_string(),
            offset: total,
            data: Vec::new(),
            labels: labels.clone(),
        });
        let request = self.request(tokio_stream::iter(messages));
        let written = async {
            let mut answers = ContentClient::new(self.channel.clone())
                .write(request)
                .await?
                .into_inner();
            while answers.message().await?.is_some() {}
            Ok::<_, Status>(())
        };
        match written.await {
            Ok(()) => Ok(()),
            // The content store has it (another pull, an earlier one): label it.
            Err(s) if s.code() == Code::AlreadyExists => self.label_content(digest, labels).await,
            Err(s) => Err(self.error(what, &s)),
        }
    }

    /// Adds `labels` to the content `digest` (`Content.Update` of those labels only).
    async fn label_content(&self, digest: &str, labels: HashMap<String, String>) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let request = self.request(content::UpdateRequest {
            info: Some(content::Info {
                digest: digest.to_string(),
                labels,
                ..content::Info::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths }),
        });
        ContentClient::new(self.channel.clone())
            .update(request)
            .await
            .map_err(|s| self.error(format!("label {digest} in the content store"), &s))?;
        Ok(())
    }

    /// Whether snapshot `key` exists in `snapshotter`.
    pub async fn snapshot_exists(&self, snapshotter: &str, key: &str) -> Result<bool> {
        let request = self.request(snapshots::StatSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        });
        match SnapshotsClient::new(self.channel.clone())
            .stat(request)
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(self.snapshotter_error(snapshotter, format!("stat snapshot {key}"), &s)),
        }
    }

    /// `Snapshots.Prepare` of `key` on `parent` with `labels`.
    pub async fn prepare(
        &self,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Prepared> {
        let request = self.request(snapshots::PrepareSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
            parent: parent.to_string(),
            labels,
        });
        match SnapshotsClient::new(self.channel.clone())
            .prepare(request)
            .await
        {
            Ok(_) => Ok(Prepared::Active),
            Err(s) if s.code() == Code::AlreadyExists => Ok(Prepared::Exists),
            Err(s) => {
                Err(self.snapshotter_error(snapshotter, format!("prepare snapshot {key}"), &s))
            }
        }
    }

    /// `Snapshots.Remove` of `key`.
    pub async fn remove_snapshot(&self, snapshotter: &str, key: &str) -> Result<()> {
        let request = self.request(snapshots::RemoveSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        });
        SnapshotsClient::new(self.channel.clone())
            .remove(request)
            .await
            .map_err(|s| {
                self.snapshotter_error(snapshotter, format!("remove snapshot {key}"), &s)
            })?;
        Ok(())
    }

    /// An error of the snapshots service, with what to do when containerd has no such
    /// snapshotter or cannot reach it.
    fn snapshotter_error(&self, snapshotter: &str, what: String, status: &Status) -> Error {
        let mut error = self.error(what, status);
        let hint = if status.code() == Code::InvalidArgument
            && status.message().contains("snapshotter not loaded")
        {
            Some(format!(
                "containerd has no snapshotter {snapshotter:?}: add the agent's snapshotter \
                 to its config with `tessera containerd-config --snapshotter-socket SOCKET` \
                 and restart containerd, or name another with --snapshotter"
            ))
        } else if status.code() == Code::Unavailable {
            Some(format!(
                "containerd cannot reach snapshotter {snapshotter:?}: is `tessera agent \
                 --snapshotter-socket` running at the socket containerd's config names?"
            ))
        } else {
            None
        };
        if let (Some(hint), Error::Containerd { reason, .. }) = (hint, &mut error) {
            reason.push_str("; ");
            reason.push_str(&hint);
        }
        error
    }

    /// Creates the image record `name` → `target`, or points an existing one at it.
    pub async fn put_image(&self, name: &str, target: Descriptor) -> Result<()> {
        let image = Image {
            name: name.to_string(),
            labels: HashMap::new(),
            target: Some(target),
            created_at: None,
            updated_at: None,
        };
        let mut client = ImagesClient::new(self.channel.clone());
        let created = client
            .create(self.request(images::CreateImageRequest {
                image: Some(image.clone()),
            }))
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => {
                // As containerd's client does: the whole record replaced (no mask).
                client
                    .update(self.request(images::UpdateImageRequest {
                        image: Some(image),
                        update_mask: None,
                    }))
                    .await
                    .map_err(|s| self.error(format!("update image {name}"), &s))?;
                Ok(())
            }
            Err(s) => Err(self.error(format!("create image {name}"), &s)),
        }
    }
}

/// A gRPC code as containerd's errors name them.
fn code_name(code: Code) -> String {
    let name = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// An error and its causes, `: `-joined (a transport error says little on its own).
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_read_as_containerd_writes_them() {
        assert_eq!(code_name(Code::AlreadyExists), "already exists");
        assert_eq!(code_name(Code::NotFound), "not found");
        assert_eq!(code_name(Code::Unavailable), "unavailable");
    }
}
