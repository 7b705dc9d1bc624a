//! The CRI image-service proxy (`cri.listen`): the kubelet's `--image-service-endpoint`
//! names the agent's socket, and every call of CRI's image service goes on to
//! containerd's, unchanged (its metadata too: the deadline travels with it).
//!
//! Why: a pod's `imagePullSecrets` reach containerd only inside `PullImage` calls, and a
//! lazy mount reads the image long after the pull, from the agent. So the proxy keeps
//! the `auth` of each `PullImage` for that image's repository in the node's registry
//! client (`RegistryClient::keep_pull_credential`), before passing the call on: the
//! snapshotter mounts the image while containerd is still pulling it. A pull that fails
//! puts back what was kept before (the registry may have refused these credentials).
//!
//! The credentials stay in memory: never logged (no request is ever printed), never in
//! the agent's state, never sent to peers or the scheduler (the registry client sends
//! them to the image's registry only). A pull without credentials is passed on as it
//! is and gets none: containerd asks the registry, which decides, whatever the node has
//! cached. Only an operator's opt-in (`cri.credentials_file`) keeps them across a
//! restart, in a file only root may read (see [`CredentialsFile`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tessera_proto::cri::image_service_client::ImageServiceClient;
use tessera_proto::cri::image_service_server::{ImageService, ImageServiceServer};
use tessera_proto::cri::{
    AuthConfig, ImageFsInfoRequest, ImageFsInfoResponse, ImageStatusRequest, ImageStatusResponse,
    ListImagesRequest, ListImagesResponse, PullImageRequest, PullImageResponse, RemoveImageRequest,
    RemoveImageResponse,
};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::registry::client::{Credential, RegistryClient};
use crate::registry::reference::Reference;
use crate::{Error, Result};

/// The proxy: containerd's image service behind, the node's registry client to keep
/// credentials in.
#[derive(Debug)]
pub struct CriProxy {
    containerd: ImageServiceClient<Channel>,
    registry: Arc<RegistryClient>,
    file: Option<CredentialsFile>,
    pub metrics: CriMetrics,
}

/// Prometheus metrics of the CRI proxy.
#[derive(Debug, Default)]
pub struct CriMetrics {
    /// Calls passed on to containerd, by method and outcome (`ok` or the gRPC code).
    calls: Family<CallLabel, Counter>,
    /// `PullImage` calls, by whether they brought credentials and the outcome.
    pulls: Family<PullLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    method: &'static str,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PullLabel {
    credentials: &'static str,
    outcome: String,
}

impl CriMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_agent_cri_calls",
            "CRI image-service calls the proxy passed on to containerd, by method and outcome",
            self.calls.clone(),
        );
        registry.register(
            "tessera_agent_cri_pulls",
            "CRI PullImage calls through the proxy, by whether they brought credentials (kept for the repository when the pull succeeded) and outcome",
            self.pulls.clone(),
        );
    }

    fn count<T>(&self, method: &'static str, answer: &std::result::Result<T, Status>) {
        self.calls
            .get_or_create(&CallLabel {
                method,
                outcome: outcome(answer),
            })
            .inc();
    }
}

fn outcome<T>(answer: &std::result::Result<T, Status>) -> String {
    match answer {
        Ok(_) => "ok".to_string(),
        Err(status) => format!("{:?}", status.code()).to_lowercase(),
    }
}

impl CriProxy {
    /// A proxy passing calls on to containerd's socket at `containerd` (dialled at the
    /// first call and again after containerd restarts), keeping credentials in
    /// `registry`, and in `file` if the operator opted in (what it holds is loaded now).
    pub fn new(
        containerd: &Path,
        registry: Arc<RegistryClient>,
        file: Option<&Path>,
    ) -> Result<CriProxy> {
        let socket = containerd.to_path_buf();
        // The URI is a placeholder: the connector dials the unix socket.
        let channel = Endpoint::from_static("http://containerd").connect_with_connector_lazy(
            tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }),
        );
        let file = file.map(|p| CredentialsFile {
            path: p.to_path_buf(),
        });
        if let Some(f) = &file {
            let loaded = f.load()?;
            let count = loaded.len();
            for (image, credential) in loaded {
                registry.keep_pull_credential(&image, Some(credential));
            }
            tracing::info!(file = %f.path.display(), repositories = count, "loaded the kept pull credentials");
        }
        Ok(CriProxy {
            containerd: ImageServiceClient::new(channel),
            registry,
            file,
            metrics: CriMetrics::default(),
        })
    }

    fn containerd(&self) -> ImageServiceClient<Channel> {
        self.containerd.clone()
    }

    fn save(&self) {
        if let Some(file) = &self.file {
            if let Err(e) = file.save(&self.registry.pull_credentials()) {
                tracing::warn!(error = %e, "could not keep the pull credentials on disk; they stay in memory");
            }
        }
    }
}

/// Serves `proxy` on `listener` until the task is dropped.
pub async fn serve(
    proxy: Arc<CriProxy>,
    listener: tokio::net::UnixListener,
    gate: tessera_proto::listen::Gate,
) -> Result<()> {
    tonic::transport::Server::builder()
        .add_service(ImageServiceServer::new(Proxy(proxy)))
        .serve_with_incoming(gate.incoming(listener))
        .await
        .map_err(|e| Error::Service {
            service: "CRI image service proxy".into(),
            reason: e.to_string(),
        })
}

/// The credential a `PullImage` carries, if any, as the registry client keeps it:
/// a registry token, an identity token, a user and password, or `auth` (base64 of
/// `user:password`), in that order, as containerd reads them. Errors never quote it.
pub fn credential_of(auth: &AuthConfig) -> std::result::Result<Option<Credential>, String> {
    if !auth.registry_token.is_empty() {
        return Ok(Some(Credential::RegistryToken(auth.registry_token.clone())));
    }
    if !auth.identity_token.is_empty() {
        return Ok(Some(Credential::IdentityToken(auth.identity_token.clone())));
    }
    if !auth.username.is_empty() {
        return Ok(Some(Credential::Basic {
            username: auth.username.clone(),
            password: auth.password.clone(),
        }));
    }
    if !auth.auth.is_empty() {
        let decoded = BASE64
            .decode(auth.auth.trim())
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or("auth.auth is not base64 of user:password")?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or("auth.auth is not base64 of user:password")?;
        return Ok(Some(Credential::Basic {
            username: username.to_string(),
            password: password.to_string(),
        }));
    }
    Ok(None)
}

struct Proxy(Arc<CriProxy>);

/// The same call for containerd: its metadata (deadline included) and message.
fn onward<T>(request: Request<T>) -> Request<T> {
    let (metadata, extensions, message) = request.into_parts();
    Request::from_parts(metadata, extensions, message)
}

#[tonic::async_trait]
impl ImageService for Proxy {
    async fn list_images(
        &self,
        request: Request<ListImagesRequest>,
    ) -> std::result::Result<Response<ListImagesResponse>, Status> {
        let answer = self.0.containerd().list_images(onward(request)).await;
        self.0.metrics.count("list_images", &answer);
        answer
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> std::result::Result<Response<ImageStatusResponse>, Status> {
        let answer = self.0.containerd().image_status(onward(request)).await;
        self.0.metrics.count("image_status", &answer);
        answer
    }

    async fn pull_image(
        &self,
        request: Request<PullImageRequest>,
    ) -> std::result::Result<Response<PullImageResponse>, Status> {
        let message = request.get_ref();
        let name = message
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let credential = match message.auth.as_ref().map(credential_of).transpose() {
            Ok(c) => c.flatten(),
            Err(reason) => return Err(Status::invalid_argument(reason)),
        };
        // Kept before the pull: the snapshotter mounts the image during it.
        let kept = match (credential, Reference::parse(&name)) {
            (Some(credential), Ok(image)) => {
                let before = self
                    .0
                    .registry
                    .keep_pull_credential(&image, Some(credential));
                Some((image, before))
            }
            _ => None,
        };
        let answer = self.0.containerd().pull_image(onward(request)).await;
        self.0.metrics.count("pull_image", &answer);
        self.0
            .metrics
            .pulls
            .get_or_create(&PullLabel {
                credentials: if kept.is_some() { "yes" } else { "no" },
                outcome: outcome(&answer),
            })
            .inc();
        if let Some((image, before)) = kept {
            match &answer {
                Ok(_) => {
                    tracing::info!(registry = %image.registry, repository = %image.repository, "a CRI pull brought credentials: kept for this repository's lazy mounts");
                    self.0.save();
                }
                Err(status) => {
                    tracing::info!(registry = %image.registry, repository = %image.repository, code = ?status.code(), "a CRI pull with credentials failed: the credentials kept before stay");
                    self.0.registry.keep_pull_credential(&image, before);
                }
            }
        }
        answer
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> std::result::Result<Response<RemoveImageResponse>, Status> {
        let answer = self.0.containerd().remove_image(onward(request)).await;
        self.0.metrics.count("remove_image", &answer);
        answer
    }

    async fn image_fs_info(
        &self,
        request: Request<ImageFsInfoRequest>,
    ) -> std::result::Result<Response<ImageFsInfoResponse>, Status> {
        let answer = self.0.containerd().image_fs_info(onward(request)).await;
        self.0.metrics.count("image_fs_info", &answer);
        answer
    }
}

/// The opt-in file that keeps pulls' credentials across a restart (`cri.credentials_file`).
///
/// Root-only rather than encrypted: the agent must read it after a restart with no
/// one at hand, so a key would sit on the same disk, readable by the same root: no
/// better than the file's own permissions, and a false comfort. So: mode 0600, owned
/// by the agent's user, written whole to a temporary file beside it and renamed; a file
/// that others may read is refused at start.
#[derive(Debug)]
struct CredentialsFile {
    path: PathBuf,
}

/// One repository's credential as the file holds it.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Stored {
    Basic { username: String, password: String },
    IdentityToken { token: String },
    RegistryToken { token: String },
}

impl CredentialsFile {
    fn load(&self) -> Result<Vec<(Reference, Credential)>> {
        let bad = |reason: String| Error::Config {
            path: self.path.clone(),
            reason,
        };
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("read", &self.path, e)),
        };
        if meta.mode() & 0o077 != 0 || meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(bad(
                "holds registry credentials but others may read it or it is not the agent's: `chown root` and `chmod 600` it, or remove it".into(),
            ));
        }
        let bytes = std::fs::read(&self.path).map_err(|e| Error::io("read", &self.path, e))?;
        let stored: BTreeMap<String, Stored> = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not the agent's credentials file: {e}")))?;
        stored
            .into_iter()
            .map(|(repository, s)| {
                let image = Reference::parse(&repository)
                    .map_err(|e| bad(format!("{repository:?} is not a repository: {e}")))?;
                let credential = match s {
                    Stored::Basic { username, password } => {
                        Credential::Basic { username, password }
                    }
                    Stored::IdentityToken { token } => Credential::IdentityToken(token),
                    Stored::RegistryToken { token } => Credential::RegistryToken(token),
                };
                Ok((image, credential))
            })
            .collect()
    }

    fn save(&self, kept: &[((String, String), Credential)]) -> std::io::Result<()> {
        let stored: BTreeMap<String, Stored> = kept
            .iter()
            .map(|((registry, repository), c)| {
                let s = match c.clone() {
                    Credential::Basic { username, password } => {
                        Stored::Basic { username, password }
                    }
                    Credential::IdentityToken(token) => Stored::IdentityToken { token },
                    Credential::RegistryToken(token) => Stored::RegistryToken { token },
                };
                (format!("{registry}/{repository}"), s)
            })
            .collect();
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // The mode given at creation is masked by the umask; the file must be 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(&serde_json::to_vec(&stored).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_of_each_kind_and_none() {
        let auth = |f: fn(&mut AuthConfig)| {
            let mut a = AuthConfig::default();
            f(&mut a);
            credential_of(&a)
        };
        assert!(matches!(auth(|_| {}), Ok(None)));
        assert!(matches!(
            auth(|a| {
                a.username = "u".into();
                a.password = "p".into();
            }),
            Ok(Some(Credential::Basic { username, password })) if username == "u" && password == "p"
        ));
        assert!(matches!(
            auth(|a| a.auth = BASE64.encode("u:p:q")),
            Ok(Some(Credential::Basic { username, password })) if username == "u" && password == "p:q"
        ));
        assert!(matches!(
            auth(|a| a.identity_token = "t".into()),
            Ok(Some(Credential::IdentityToken(t))) if t == "t"
        ));
        assert!(matches!(
            auth(|a| {
                a.registry_token = "r".into();
                a.username = "u".into();
            }),
            Ok(Some(Credential::RegistryToken(t))) if t == "r"
        ));
        let bad = auth(|a| a.auth = BASE64.encode("no-colon-secret"));
        assert!(
            bad.as_ref().is_err_and(|e| !e.contains("secret")),
            "{bad:?}"
        );
    }

    #[test]
    fn the_file_is_root_only_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let file = CredentialsFile {
            path: dir.path().join("creds.json"),
        };
        assert!(file.load().unwrap().is_empty(), "no file: nothing kept");
        let kept = vec![(
            ("127.0.0.1:5000".to_string(), "private/app".to_string()),
            Credential::Basic {
                username: "u".into(),
                password: "hunter2".into(),
            },
        )];
        file.save(&kept).unwrap();
        let mode = std::fs::metadata(&file.path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = file.load().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].0.registry, "127.0.0.1:5000");
        assert_eq!(loaded[0].0.repository, "private/app");
        assert!(
            matches!(&loaded[0].1, Credential::Basic { password, .. } if password == "hunter2")
        );
        std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = file.load().unwrap_err().to_string();
        assert!(refused.contains("chmod 600"), "{refused}");
        assert!(!refused.contains("hunter2"), "{refused}");
    }
}
