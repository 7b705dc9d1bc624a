//! This agent's membership in the swarm: registration with a lease kept by heartbeats,
//! announcements of what it holds (sent as soon as chunks are verified, batched while a
//! send is under way), reports of transfers, the questions "who holds this range", and
//! the connections to other agents' peer services.
//!
//! The scheduler is an optimisation, never a dependency: while it cannot be reached (or
//! does not know this host), [`Network::find_peers`] answers `None` at once and the
//! fetcher goes to the origin; a background task keeps trying to register and, when it
//! succeeds, announces everything this host holds again (`full`), which is how a
//! restarted scheduler relearns the swarm.
//!
//! Several scheduler replicas (`p2p.scheduler` listing several URLs) share no state:
//! this host registers with every one, and talks about each blob (announcements,
//! lookups, reports) only to the replica that owns it on the [`Ring`]. When a replica
//! is lost its blobs move to the next one up, and this host announces what it holds
//! of them there at once.
//!
//! Files, each one concern: this one holds the [`Network`] and its state and joins
//! it up; [`membership`] registers and keeps the lease with heartbeats (one task per
//! replica), notices a lost replica and leaves; [`announce`] is what this host tells
//! the schedulers about data (held and dropped ranges, blob sizes, images, transfer
//! reports) and
//! what it asks them (who holds a range); [`peers`] are the connections to other
//! agents' peer services, TLS, and what a peer's failure means.

mod announce;
mod membership;
mod peers;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto::auth::{AddBearer, TokenFile};
use tessera_proto::pb;
use tessera_proto::pb::peer_service_client::PeerServiceClient;
use tessera_proto::pb::scheduler_client::SchedulerClient;
use tokio::sync::Notify;
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::cache::ChunkKey;
use crate::config::P2pConfig;
use crate::peer::preheat::{PreheatSender, Preheats};
use crate::peer::ring::Ring;
use crate::peer::PeerServer;
use crate::{Error, Result};

pub use peers::{failure_of, tls_server, PeerFailure, MAX_MESSAGE};
use peers::{tls_client, Authed};

/// How long a call to the scheduler may take before it counts as unreachable: the
/// fetcher would rather go to the origin than wait on a sick scheduler.
const SCHEDULER_TIMEOUT: Duration = Duration::from_secs(2);

/// The agent's side of the swarm.
#[derive(Debug)]
pub struct Network {
    host: pb::Host,
    /// The scheduler replicas (usually one), placed on `ring`.
    replicas: Vec<Replica>,
    ring: Ring,
    auth: AddBearer,
    server: PeerServer,
    /// Set when peers speak TLS (this agent's peer service does too).
    peer_tls: Option<ClientTlsConfig>,
    peer_timeout: Duration,
    max_wait: Duration,
    state: Mutex<State>,
    peers: Mutex<HashMap<SocketAddr, PeerServiceClient<Authed>>>,
    /// Preheat jobs from heartbeat answers (to the daemon's queue), and their progress
    /// for heartbeats.
    preheats: Preheats,
}

/// One scheduler replica and this host's membership in it.
#[derive(Debug)]
struct Replica {
    url: String,
    client: SchedulerClient<Authed>,
    /// Registered with it and it answers; `false` takes it off the ring.
    registered: AtomicBool,
    /// Wakes its membership task: something to announce or report, or re-register now.
    wake: Notify,
    /// A preheat job finished: heartbeat now rather than at the next beat.
    beat_now: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Everything this host announced since it started, merged per blob, less what it
    /// dropped since: re-announced in full after each registration (to each replica,
    /// the blobs it owns).
    held: HashMap<String, Vec<(u64, u64)>>,
    /// Where each announced chunk is in its blobs: the cache drops chunks by key, the
    /// schedulers know ranges of blobs (one chunk may sit in several).
    places: HashMap<ChunkKey, Vec<Place>>,
    /// Whole blob sizes, where known (sent with the ranges).
    sizes: HashMap<String, u64>,
    /// Images this host uses and their blobs (sent to every replica).
    images: HashMap<String, Vec<String>>,
    /// Not yet sent, by replica.
    pending: Vec<Pending>,
}

/// Where an announced chunk sits: a blob and the range of it.
type Place = (String, (u64, u64));

#[derive(Debug, Default)]
struct Pending {
    held: HashMap<String, Vec<(u64, u64)>>,
    /// Ranges this host no longer holds (chunks dropped from the cache).
    dropped: HashMap<String, Vec<(u64, u64)>>,
    images: HashMap<String, Vec<String>>,
    reports: Vec<pb::Transfer>,
}

/// The host id when none is configured: the hostname and the advertised address, which
/// is unique even for several agents on one machine.
fn default_host_id(advertised: SocketAddr) -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    if hostname.is_empty() {
        advertised.to_string()
    } else {
        format!("{hostname}@{advertised}")
    }
}

/// This host's id in the swarm: `p2p.host_id`, or the hostname and advertised address
/// (`None` when no address is advertised).
pub fn host_id_of(config: &P2pConfig) -> Option<String> {
    let address = config.advertised()?;
    Some(
        config
            .host_id
            .clone()
            .unwrap_or_else(|| default_host_id(address)),
    )
}

impl Network {
    /// Prepares to join the swarm `config` names; `server` is this agent's peer
    /// service (its load goes into heartbeats); preheat jobs the scheduler hands out go
    /// to `preheat_tasks` (see [`preheat::queue`](super::preheat::queue)). Nothing is
    /// sent until [`spawn`](Self::spawn).
    pub fn new(
        config: &P2pConfig,
        server: PeerServer,
        preheat_tasks: PreheatSender,
    ) -> Result<Arc<Network>> {
        let urls = config.scheduler_urls();
        if urls.is_empty() {
            return Err(Error::Setting {
                setting: "p2p.scheduler".into(),
                problem: "no scheduler configured: name one (or several, comma-separated)".into(),
            });
        }
        let address = config.advertised().ok_or_else(|| Error::Setting {
            setting: "p2p.advertise".into(),
            problem: "set it to the ip:port peers reach this node at".into(),
        })?;
        let auth = match &config.token_file {
            Some(path) => AddBearer::from_file(
                TokenFile::open(path).map_err(|e| Error::io("read p2p token", path, e))?,
            ),
            None => AddBearer::new(None),
        }
        .map_err(|e| Error::Setting {
            setting: "p2p.token_file".into(),
            problem: e.to_string(),
        })?;
        let tls = tls_client(config)?;
        let mut replicas = Vec::with_capacity(urls.len());
        for url in &urls {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| Error::Setting {
                    setting: "p2p.scheduler".into(),
                    problem: format!("{url:?}: {e}"),
                })?
                .connect_timeout(SCHEDULER_TIMEOUT)
                .timeout(SCHEDULER_TIMEOUT)
                .tcp_nodelay(true);
            if url.starts_with("https://") {
                let tls = tls.clone().ok_or_else(|| Error::Setting {
                    setting: "p2p.tls_ca".into(),
                    problem: format!("{url} is https://: set the CA that signed its certificate"),
                })?;
                endpoint = endpoint.tls_config(tls).map_err(|e| Error::Setting {
                    setting: "p2p.tls_ca".into(),
                    problem: e.to_string(),
                })?;
            }
            replicas.push(Replica {
                url: url.clone(),
                client: SchedulerClient::with_interceptor(endpoint.connect_lazy(), auth.clone()),
                registered: AtomicBool::new(false),
                wake: Notify::new(),
                beat_now: AtomicBool::new(false),
            });
        }
        let mut labels = HashMap::new();
        if let Some(zone) = &config.zone {
            labels.insert("zone".to_string(), zone.clone());
        }
        if let Some(rack) = &config.rack {
            labels.insert("rack".to_string(), rack.clone());
        }
        let host = pb::Host {
            id: host_id_of(config).unwrap_or_else(|| default_host_id(address)),
            address: address.to_string(),
            labels,
            upload_limit_bps: config.upload_bytes_per_sec,
            max_uploads: config.max_uploads,
        };
        let ring = Ring::new(&urls);
        let state = State {
            held: HashMap::new(),
            places: HashMap::new(),
            sizes: HashMap::new(),
            images: HashMap::new(),
            pending: urls.iter().map(|_| Pending::default()).collect(),
        };
        Ok(Arc::new(Network {
            host,
            replicas,
            ring,
            auth,
            server,
            peer_tls: if config.tls_cert.is_some() {
                tls.map(|t| match &config.tls_server_name {
                    Some(name) => t.domain_name(name.clone()),
                    None => t,
                })
            } else {
                None
            },
            peer_timeout: Duration::from_millis(config.peer_timeout_ms),
            max_wait: Duration::from_secs(config.max_wait_secs),
            state: Mutex::new(state),
            peers: Mutex::new(HashMap::new()),
            preheats: Preheats::new(preheat_tasks),
        }))
    }

    /// Records where a preheat job stands, for the next heartbeat (at once when it
    /// finished).
    pub fn preheat_progress(&self, progress: pb::PreheatProgress) {
        if self.preheats.record(progress) {
            for replica in &self.replicas {
                replica.beat_now.store(true, Ordering::Relaxed);
                replica.wake.notify_one();
            }
        }
    }

    pub fn host_id(&self) -> &str {
        &self.host.id
    }

    /// Whether a scheduler (any replica) currently knows this host.
    pub fn registered(&self) -> bool {
        self.replicas
            .iter()
            .any(|r| r.registered.load(Ordering::Relaxed))
    }

    /// Replicas that currently know this host, of those configured.
    pub fn replicas_registered(&self) -> (usize, usize) {
        let up = self
            .replicas
            .iter()
            .filter(|r| r.registered.load(Ordering::Relaxed))
            .count();
        (up, self.replicas.len())
    }

    /// The replica that owns `blob` now (among those that know this host).
    fn owner(&self, blob: &str) -> Option<usize> {
        self.ring.owner(blob, |r| {
            self.replicas[r].registered.load(Ordering::Relaxed)
        })
    }

    /// The peer service this host runs.
    pub fn server(&self) -> &PeerServer {
        &self.server
    }

    pub fn peer_timeout(&self) -> Duration {
        self.peer_timeout
    }

    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Starts the membership tasks (register, heartbeat, announce, report; one per
    /// replica) on the current runtime; aborting the handle stops them all.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let network = self.clone();
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for r in 0..network.replicas.len() {
                tasks.spawn(network.clone().membership(r));
            }
            while tasks.join_next().await.is_some() {}
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
