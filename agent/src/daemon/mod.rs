//! `tessera agent`: the daemon that owns the node's mounts, its chunk cache and its
//! registry credentials, and answers the local API.
//!
//! A mount fetches the manifest and the bootstrap only (verified against the layer
//! digest, then its own checksum and structure), serves the tree at once through FUSE
//! and fetches file data chunk by chunk as it is read ([`crate::fetch`]); prefetch runs
//! in the background at a bounded concurrency so reads are never queued behind it.
//! Preheat jobs from the scheduler fetch whole images into the cache the same way,
//! before anyone mounts them.

mod collector;
mod connections;
mod lifecycle;
pub mod local_api;
mod metrics;
mod mounted;
mod mounts;
mod prefetch;
mod preheat;
mod recorder;
mod root;
mod stale;
mod status;
mod upkeep;
mod usage;

pub use crate::fs::handover::Attach;
pub use metrics::serve_metrics;
pub use recorder::Recorder;
pub use root::{node_client, run, Listeners};
pub use status::{MountStatus, Status, SwarmStatus};
pub use upkeep::VerifyReport;
pub use usage::{CacheUsage, PruneReport};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::api::Request;
use crate::cache::pieces::PieceTables;
use crate::cache::ChunkCache;
use crate::config::{AgentConfig, CompressUploads, P2pConfig};
use crate::fetch::{FetchMetrics, Fetcher};
use crate::mirror::Mirror;
use crate::peer::preheat::PreheatSender;
use crate::peer::{Network, PeerAccess, PeerServer, UploadLimits};
use crate::registry::client::RegistryClient;
use crate::{Error, Result};
use connections::Connections;
use lifecycle::Mount;

/// The daemon's state, shared by the API, the metrics endpoint and the FUSE workers.
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    client: Arc<RegistryClient>,
    fetcher: Arc<Fetcher>,
    /// The chunk cache the fetcher stores into (its figures, its flush at shutdown).
    cache: Arc<ChunkCache>,
    /// This node in the swarm, when P2P is on.
    network: Option<Arc<Network>>,
    /// Every mount's backing copies take turns (`mounted::until_quiet`).
    backing_turn: Arc<tokio::sync::Semaphore>,
    runtime: tokio::runtime::Handle,
    /// Mounts by mountpoint (canonical path).
    mounts: Mutex<HashMap<PathBuf, Arc<Mount>>>,
    /// Where fetched bootstraps are kept, by layer digest.
    bootstrap_dir: PathBuf,
    /// The access keys of the restricted images mounted here (private repositories,
    /// checkpoints): the peer service's check, and this node's proofs to peers.
    access: Arc<PeerAccess>,
    /// This agent's mark in its mounts' source, to find them after a crash.
    owner: String,
    started: std::time::Instant,
    /// Tasks stopped at shutdown: the cache upkeep, and with P2P the peer service, the
    /// membership task and preheat jobs.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    mirror: Option<Arc<Mirror>>,
    /// The limits of every listener.
    connections: Connections,
}

/// Starts serving peers from `cache` on `listener` (bound to `p2p.peer_listen`) and
/// joins the swarm; the preheat jobs the scheduler hands out go to `preheat_tasks`.
#[allow(clippy::too_many_arguments)]
fn join_swarm(
    p2p: &P2pConfig,
    connections: &Connections,
    cache: Arc<ChunkCache>,
    tables: Arc<PieceTables>,
    access: Arc<PeerAccess>,
    preheat_tasks: PreheatSender,
    listener: tokio::net::TcpListener,
) -> Result<(Arc<Network>, Vec<tokio::task::JoinHandle<()>>)> {
    let token = match &p2p.token_file {
        Some(path) => Some(
            tessera_proto::auth::TokenFile::open(path)
                .map_err(|e| Error::io("read p2p token", path, e))?,
        ),
        None => None,
    };
    if p2p.fault_corrupt_uploads {
        tracing::error!("p2p.fault_corrupt_uploads is on: this agent serves CORRUPTED chunks to peers (a test-only fault switch)");
    }
    let server = PeerServer::new(
        cache.clone(),
        UploadLimits {
            max_uploads: p2p.max_uploads as usize,
            bytes_per_sec: (p2p.upload_bytes_per_sec > 0).then_some(p2p.upload_bytes_per_sec),
            corrupt: p2p.fault_corrupt_uploads,
            compress: match p2p.compress_uploads {
                CompressUploads::Auto => p2p.upload_bytes_per_sec > 0,
                CompressUploads::Always => true,
                CompressUploads::Never => false,
            },
        },
    )
    .with_piece_tables(tables);
    let host_id = crate::peer::network::host_id_of(p2p).ok_or_else(|| Error::Setting {
        setting: "p2p.advertise".into(),
        problem: "set it to the ip:port peers reach this node at".into(),
    })?;
    let server = server.with_access(access, &host_id);
    let tls = crate::peer::network::tls_server(p2p)?;
    let network = Network::new(p2p, server.clone(), preheat_tasks)?;
    // Chunks the cache drops are announced as dropped, so peers stop being sent here
    // for them. Weak: the network holds the cache (through its peer service).
    let told = Arc::downgrade(&network);
    cache.on_drop(Box::new(move |keys, cause| {
        if let Some(network) = told.upgrade() {
            network.dropped(keys, cause);
        }
    }));
    tracing::info!(listen = %p2p.peer_listen, host = network.host_id(), "serving peers");
    let gate = connections.gate("peer");
    let grpc = tessera_proto::listen::grpc_server(
        connections.streams_per_connection(),
        connections.max_age(),
    );
    let serving = tokio::spawn(async move {
        if let Err(e) = server.serve(listener, gate, grpc, token, tls).await {
            tracing::error!(error = %e, "the peer service stopped");
        }
    });
    let membership = network.spawn();
    Ok((network, vec![serving, membership]))
}

impl Agent {
    /// Opens the cache (checking it), clears mounts a crashed agent left behind, and
    /// prepares to serve; with P2P on, serves peers on `peer` (which the caller bound
    /// to `p2p.peer_listen`). Call from inside the runtime the agent will use.
    pub fn start(
        config: AgentConfig,
        client: Arc<RegistryClient>,
        peer: Option<tokio::net::TcpListener>,
    ) -> Result<Arc<Agent>> {
        if let Err(problems) = config.validate() {
            return Err(Error::InvalidConfig { problems });
        }
        std::fs::create_dir_all(&config.cache_dir)
            .map_err(|e| Error::io("create", &config.cache_dir, e))?;
        let owner = stale::owner_of(&config.cache_dir);
        let snapshotter_root = config
            .snapshotter
            .socket
            .as_ref()
            .and_then(|_| std::fs::canonicalize(&config.snapshotter.root).ok());
        for (path, outcome) in stale::clear_stale_mounts(&owner, snapshotter_root.as_deref()) {
            match outcome {
                Ok(()) => {
                    tracing::warn!(path = %path.display(), "cleared a stale Tessera mount left by a previous agent")
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "could not clear a stale mount")
                }
            }
        }
        let mut cache = ChunkCache::open(&config.cache_dir.join("chunks"), config.cache_capacity)?;
        if config.cache_disk_high_percent < 100 {
            let marks = crate::cache::Watermarks {
                high_percent: config.cache_disk_high_percent,
                low_percent: config.cache_disk_low_percent,
            };
            cache = cache.with_watermarks(marks, None);
        }
        let cache = Arc::new(cache);
        let bootstrap_dir = config.cache_dir.join("bootstraps");
        std::fs::create_dir_all(&bootstrap_dir)
            .map_err(|e| Error::io("create", &bootstrap_dir, e))?;
        let mut fetcher = Fetcher::new(
            cache.clone(),
            config.fetch.clone(),
            Arc::new(FetchMetrics::default()),
        );
        let mut network = None;
        let connections = Connections::new(&config.connections);
        tracing::info!(
            per_listener = connections.cap(),
            idle_timeout_secs = connections.idle().as_secs(),
            "connection limits"
        );
        let tables = Arc::new(PieceTables::open(&config.cache_dir.join("pieces"))?);
        // Root-only, beside the cache it protects (which outlives any one agent).
        let access = Arc::new(PeerAccess::open(&config.cache_dir.join("access"), |k| {
            cache.contains(k)
        })?);
        let mut background = Vec::new();
        let mut preheat_jobs = None;
        if config.p2p.active() {
            let listener = peer.ok_or(Error::Listener {
                setting: "p2p.peer_listen",
                problem: "set, but no listener for it was given to the agent",
            })?;
            let (sender, receiver) = crate::peer::preheat::queue();
            let (joined, tasks) = join_swarm(
                &config.p2p,
                &connections,
                cache.clone(),
                tables.clone(),
                access.clone(),
                sender,
                listener,
            )?;
            fetcher = fetcher.with_peers(joined.clone());
            network = Some(joined);
            background = tasks;
            preheat_jobs = Some(receiver);
        }
        let fetcher = Arc::new(fetcher);
        let mirror = config.mirror.listen.is_some().then(|| {
            Arc::new(Mirror::new(
                client.clone(),
                fetcher.clone(),
                tables,
                network.clone(),
                config.mirror.clone(),
            ))
        });
        let agent = Arc::new(Agent {
            config,
            client,
            fetcher,
            cache,
            network,
            backing_turn: Arc::new(tokio::sync::Semaphore::new(1)),
            runtime: tokio::runtime::Handle::current(),
            mounts: Mutex::new(HashMap::new()),
            bootstrap_dir,
            access,
            owner,
            started: std::time::Instant::now(),
            background: Mutex::new(background),
            mirror,
            connections,
        });
        let upkeep = tokio::spawn(upkeep::run(agent.cache.clone(), agent.config.scrub.clone()));
        agent
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(upkeep);
        if let (Some(network), Some(jobs)) = (agent.network.as_ref(), preheat_jobs) {
            let running = tokio::spawn(preheat::run(Arc::downgrade(&agent), network.clone(), jobs));
            agent
                .background
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(running);
        }
        Ok(agent)
    }

    /// The registry mirror, when `mirror.listen` is set (the caller serves it).
    pub fn mirror(&self) -> Option<&Arc<Mirror>> {
        self.mirror.as_ref()
    }

    /// The node's registry client (its credentials stay in the agent).
    pub fn registry_client(&self) -> &Arc<RegistryClient> {
        &self.client
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The limits of every listener (each server takes its gate here).
    pub(crate) fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Registers every metric of the agent in `registry`.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        self.fetcher.metrics.register(registry);
        self.connections.register(registry);
        if let Some(mirror) = &self.mirror {
            mirror.metrics.register(registry);
        }
        registry.register_collector(Box::new(collector::AgentCollector {
            agent: Arc::downgrade(self),
        }));
    }

    /// Answers one API request.
    pub async fn handle(self: &Arc<Self>, request: Request) -> Result<serde_json::Value> {
        fn to_json(v: impl Serialize) -> serde_json::Value {
            serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
        }
        match request {
            Request::Mount {
                image,
                mountpoint,
                platform,
                plan,
            } => {
                let status = self.mount(&image, &mountpoint, platform, plan).await?;
                Ok(to_json(status))
            }
            Request::ChunksOf { mountpoint, ranges } => {
                Ok(to_json(self.chunks_of(&mountpoint, &ranges)?))
            }
            Request::Umount { mountpoint } => {
                let status = self.umount(&mountpoint).await?;
                Ok(to_json(status))
            }
            Request::Status => Ok(to_json(self.status())),
            Request::CacheVerify => Ok(to_json(upkeep::verify_all(&self.cache, None).await)),
            Request::CacheUsage => Ok(to_json(self.cache_usage().await?)),
            Request::CachePrune { keep } => Ok(to_json(self.cache_prune(keep).await?)),
        }
    }

    /// The first step of a shutdown: goes on serving reads (they are the containers')
    /// until no FUSE read has come for [`QUIET`] and none waits on the network, for up
    /// to `grace`; then fails those still waiting with EIO, so no reader hangs on an
    /// agent that is going. (A reader between two reads of a file is not done: hence
    /// the quiet time rather than "nothing waiting right now".)
    pub async fn finish_reads(&self, grace: Duration) {
        const QUIET: Duration = Duration::from_secs(1);
        let started = tokio::time::Instant::now();
        while started.elapsed() < grace
            && (self.fetcher.reads_waiting() > 0 || self.fetcher.read_within(QUIET))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.fetcher.reads_waiting();
        if left > 0 {
            tracing::warn!(
                reads = left,
                grace_secs = grace.as_secs(),
                "reads still waiting when the shutdown grace ran out: failed with EIO"
            );
        }
        self.fetcher.stop();
    }

    /// Unmounts everything (shutdown), logging each mount's summary.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Mount>> = {
            let mut mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
            mounts.drain().map(|(_, m)| m).collect()
        };
        for m in all {
            m.shut_down().await;
        }
        if let Some(network) = self.network.as_ref() {
            network.leave().await;
        }
        for task in self
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
        let cache = self.cache.clone();
        match crate::fetch::blocking(move || cache.checkpoint()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not checkpoint the cache"),
            Err(e) => tracing::warn!(error = %e, "could not checkpoint the cache"),
        }
    }

    fn canonical(mountpoint: &Path) -> Result<PathBuf> {
        std::fs::canonicalize(mountpoint).map_err(|e| Error::io("find mountpoint", mountpoint, e))
    }
}
