//! The agent's composition root: [`run`] starts everything `tessera agent` serves — the
//! daemon ([`Agent`]), the local API, the metrics endpoint, the registry mirror, the
//! containerd snapshotter — on the listeners its caller bound, and stops it all when
//! the caller's `shutdown` future completes. The binary parses flags, binds and makes
//! that future from signals; a test can start an agent in process the same way, on
//! ports it bound to 0.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UnixListener};

use super::mounts::ImageTree;
use super::{local_api, serve_metrics, Agent};
use crate::api::ReadPlan;
use crate::config::AgentConfig;
use crate::cri::{self, CriProxy};
use crate::fs::handover::{Attach, Keeper};
use crate::layer_store::{self, LayerStore, LazyMounts};
use crate::registry::client::{ClientOptions, RegistryClient};
use crate::registry::credentials::{default_auth_file, DockerConfig};
use crate::registry::image::{Layers, PlatformImage};
use crate::snapshotter::remote::{BoxFuture, Remote};
use crate::snapshotter::{self, Images, Snapshotter};
use crate::{Error, Result};

/// The TCP listeners the caller bound, one for each address the configuration names
/// (and none for one it does not).
///
/// The two unix sockets (`socket`, `snapshotter.socket`) are not among them: [`run`]
/// binds each only once what it serves is ready, because a socket that accepts is how
/// the CLI, containerd, scripts and tests know the agent is ready (stale mounts
/// cleared, mounts from before a restart served again); a path in a temporary
/// directory is all a test needs to choose.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The local API on TCP (`api_listen`).
    pub api: Option<TcpListener>,
    /// The Prometheus endpoint (`metrics_listen`).
    pub metrics: Option<TcpListener>,
    /// The registry mirror containerd pulls through (`mirror.listen`).
    pub mirror: Option<TcpListener>,
    /// The peer service, with P2P on (`p2p.peer_listen`).
    pub peer: Option<TcpListener>,
}

impl Listeners {
    /// Checks that there is a listener for each address `config` names, and only for
    /// those.
    fn check(&self, config: &AgentConfig) -> Result<()> {
        let pairs = [
            (
                "api_listen",
                config.api_listen.is_some(),
                self.api.is_some(),
            ),
            (
                "metrics_listen",
                config.metrics_listen.is_some(),
                self.metrics.is_some(),
            ),
            (
                "mirror.listen",
                config.mirror.listen.is_some(),
                self.mirror.is_some(),
            ),
            ("p2p.peer_listen", config.p2p.active(), self.peer.is_some()),
        ];
        for (setting, configured, given) in pairs {
            match (configured, given) {
                (true, false) => {
                    return Err(Error::Listener {
                        setting,
                        problem: "set, but no listener for it was given to the agent",
                    })
                }
                (false, true) => {
                    return Err(Error::Listener {
                        setting,
                        problem: "not set (or P2P is off), but a listener was given to the agent",
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Runs the agent with `config` on `listeners` until `shutdown` completes, then
/// unmounts what it mounted (mounts handed to the FUSE keeper stay), leaves the swarm,
/// and removes its unix sockets.
pub async fn run(
    config: AgentConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    listeners.check(&config)?;
    let client = node_client(&config)?;
    let agent = Agent::start(config.clone(), client, listeners.peer)?;
    // Before the API's socket accepts (the agent's readiness signal): Podman finds
    // the store mounted once the agent is ready.
    let store = match &config.store_root {
        Some(root) => Some(serve_layer_store(&agent, root)?),
        None => None,
    };
    let mut servers = tokio::task::JoinSet::new();
    let limits = agent.connections();
    servers.spawn(local_api::serve_unix(
        agent.clone(),
        bind_unix(&config.socket)?,
        limits.gate("api-unix"),
    ));
    if let Some(listener) = listeners.api {
        let tls = config
            .api_tls_cert
            .as_deref()
            .zip(config.api_tls_key.as_deref());
        let gate = limits.gate("api-tcp");
        servers.spawn(local_api::serve_tcp(agent.clone(), listener, gate, tls)?);
    }
    // The snapshotter serves containerd only once what was mounted before a restart
    // is served again (a container prepared meanwhile would see an empty layer).
    let snapshotter = match config.snapshotter.socket {
        Some(_) => Some(start_snapshotter(&agent, &config.snapshotter.root).await?),
        None => None,
    };
    let cri_proxy = match &config.cri.listen {
        Some(_) => Some(Arc::new(CriProxy::new(
            &config.cri.containerd,
            Agent::registry_client(&agent).clone(),
            config.cri.credentials_file.as_deref(),
        )?)),
        None => None,
    };
    if let Some(listener) = listeners.metrics {
        let mut registry = Registry::default();
        agent.register_metrics(&mut registry);
        if let Some(s) = &snapshotter {
            s.metrics.register(&mut registry);
        }
        if let Some(p) = &cri_proxy {
            p.metrics.register(&mut registry);
        }
        let gate = limits.gate("metrics");
        servers.spawn(serve_metrics(
            listener,
            gate,
            limits.idle(),
            Arc::new(registry),
        ));
    }
    if let (Some(listener), Some(mirror), Some(addr)) =
        (listeners.mirror, agent.mirror(), &config.mirror.listen)
    {
        tracing::info!(listen = %addr, "registry mirror ready");
        let gate = limits.gate("mirror");
        servers.spawn(mirror.clone().serve(listener, gate, limits.idle()));
    }
    if let (Some(socket), Some(snapshotter)) = (&config.snapshotter.socket, snapshotter) {
        let listener = snapshotter::listen(socket)?;
        let gate = limits.gate("snapshotter");
        servers.spawn(async move {
            if let Err(e) = snapshotter::serve(snapshotter, listener, gate).await {
                tracing::error!(error = %e, "the snapshotter stopped");
            }
        });
        tracing::info!(socket = %socket.display(), "containerd snapshotter ready");
    }
    // After the snapshotter: a pull the kubelet sends through the proxy mounts layers.
    if let (Some(socket), Some(proxy)) = (&config.cri.listen, cri_proxy) {
        let listener = bind_unix(socket)?;
        let gate = limits.gate("cri");
        servers.spawn(async move {
            if let Err(e) = cri::serve(proxy, listener, gate).await {
                tracing::error!(error = %e, "the CRI image service proxy stopped");
            }
        });
        tracing::info!(socket = %socket.display(), containerd = %config.cri.containerd.display(), "CRI image service proxy ready");
    }
    tracing::info!(socket = %config.socket.display(), "agent ready");
    // The daemon's two lines for people on its console, whatever the log level.
    eprintln!("tessera agent: listening on {}", config.socket.display());
    shutdown.await;
    let grace = Duration::from_secs(config.shutdown_grace_secs);
    eprintln!(
        "tessera agent: shutting down, unmounting once reads in flight are done (at most {} s)",
        grace.as_secs()
    );
    servers.abort_all();
    // No new lookups: the images' trees are the agent's mounts, unmounted below.
    if let Some(store) = store {
        store.unmount();
    }
    agent.finish_reads(grace).await;
    agent.shutdown().await;
    let _ = std::fs::remove_file(&config.socket);
    for socket in [&config.snapshotter.socket, &config.cri.listen]
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(socket);
    }
    Ok(())
}

/// The registry client of the node, with the credentials of `registry.auth_file` (or
/// docker's default file): they stay in the agent.
pub fn node_client(config: &AgentConfig) -> Result<Arc<RegistryClient>> {
    let auth_file = config.registry.auth_file.clone().or_else(default_auth_file);
    let docker = match &auth_file {
        Some(p) => DockerConfig::load(p)?,
        None => DockerConfig::default(),
    };
    let client = RegistryClient::new(ClientOptions {
        plain_http: config.registry.insecure.clone(),
        credentials: docker.all_credentials()?,
        timeout: Duration::from_secs(config.fetch.timeout_secs),
        retries: config.fetch.retries,
        ..ClientOptions::default()
    })
    .map_err(Error::HttpClient)?;
    Ok(Arc::new(client))
}

/// Listens on the unix socket at `path`, replacing a socket file a previous agent left
/// (it would make bind fail).
fn bind_unix(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|e| Error::io("listen on", path, e))
}

/// Opens the snapshotter under `root` with the agent mounting its Tessera layers, and
/// serves again what it had mounted before a restart (taking over from the FUSE keeper
/// what it held).
async fn start_snapshotter(agent: &Arc<Agent>, root: &Path) -> Result<Arc<Snapshotter>> {
    std::fs::create_dir_all(root).map_err(|e| Error::io("create", root, e))?;
    let keeper = std::env::current_exe()
        .and_then(|exe| {
            Keeper::connect_or_start(
                &root.join("fuse-keeper.sock"),
                &exe,
                &root.join("fuse-keeper.log"),
            )
        })
        .map_err(|e| tracing::warn!(error = %e, "no FUSE keeper: the snapshotter's mounts will not outlive this agent"))
        .ok();
    let remote = Remote::new(Box::new(agent.clone()), keeper);
    let snapshotter = Snapshotter::open(root, Some(remote))?;
    snapshotter.restore().await?;
    Ok(snapshotter)
}

/// Mounts the additional layer store at `root`, mounting images' trees under the
/// cache directory (`layer-store/<manifest digest>`) through the agent.
fn serve_layer_store(agent: &Arc<Agent>, root: &Path) -> Result<layer_store::Served> {
    let trees = agent.config.cache_dir.join("layer-store");
    let store = Arc::new(LayerStore::new(Box::new(agent.clone()), trees));
    let fsname = format!("{}layer-store", super::stale::source_prefix(&agent.owner));
    layer_store::serve(store, root, fsname)
}

/// The layer store mounts Tessera images' trees through the agent.
impl LazyMounts for Arc<Agent> {
    fn registry_client(&self) -> &Arc<RegistryClient> {
        Agent::registry_client(self)
    }

    fn mount<'a>(
        &'a self,
        image: &'a str,
        layers: Layers,
        dir: &'a Path,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let tree = ImageTree {
                platform: None,
                layers,
            };
            self.mount_with(image, dir, tree, ReadPlan::default(), Attach::Mount)
                .await
                .map(|_| ())
        })
    }

    fn serves(&self, dir: &Path) -> bool {
        self.mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(dir)
    }

    fn bootstrap_size<'a>(&'a self, image: &'a PlatformImage) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let bootstrap = self.bootstrap_for(image, Layers::All).await?;
            Ok(bootstrap.as_bytes().len() as u64)
        })
    }
}

/// The snapshotter mounts Tessera layers through the agent.
impl Images for Arc<Agent> {
    fn registry_client(&self) -> &Arc<RegistryClient> {
        Agent::registry_client(self)
    }

    fn mount<'a>(
        &'a self,
        image: &'a str,
        layers: Option<u32>,
        dir: &'a Path,
        attach: Attach,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let tree = ImageTree {
                platform: None,
                layers: Layers::first(layers),
            };
            self.mount_with(image, dir, tree, ReadPlan::default(), attach)
                .await
                .map(|_| ())
        })
    }

    fn unmount<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.umount(dir).await.map(|_| ()) })
    }

    fn mounted_bytes<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Option<u64>> {
        Box::pin(Agent::mounted_bytes(self, dir))
    }
}
