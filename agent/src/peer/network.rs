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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rafs_format::chunk::DigestAlgo;
use tessera_proto::auth::{AddBearer, TokenFile};
use tessera_proto::domain::{Peer, PeerChoice};
use tessera_proto::pb;
use tessera_proto::pb::peer_service_client::PeerServiceClient;
use tessera_proto::pb::scheduler_client::SchedulerClient;
use tokio::sync::Notify;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::config::P2pConfig;
use crate::peer::preheat::{PreheatSender, Preheats};
use crate::peer::ring::Ring;
use crate::peer::PeerServer;
use crate::{Error, Result};

type Authed = InterceptedService<Channel, AddBearer>;

/// Largest gRPC message: one chunk (chunks are at most 16 MiB) with room to spare.
pub const MAX_MESSAGE: usize = 32 << 20;

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
    /// Everything this host announced since it started, merged per blob: re-announced
    /// in full after each registration (to each replica, the blobs it owns).
    held: HashMap<String, Vec<(u64, u64)>>,
    /// Whole blob sizes, where known (sent with the ranges).
    sizes: HashMap<String, u64>,
    /// Images this host uses and their blobs (sent to every replica).
    images: HashMap<String, Vec<String>>,
    /// Not yet sent, by replica.
    pending: Vec<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    held: HashMap<String, Vec<(u64, u64)>>,
    images: HashMap<String, Vec<String>>,
    reports: Vec<pb::Transfer>,
}

/// Sorts and merges `[start, end)` ranges in place.
fn merge(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(s, e) in ranges.iter() {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    *ranges = out;
}

/// Announced ranges, with each blob's size where known.
fn to_pb(
    map: &HashMap<String, Vec<(u64, u64)>>,
    sizes: &HashMap<String, u64>,
) -> Vec<pb::BlobRanges> {
    map.iter()
        .map(|(blob, ranges)| pb::BlobRanges {
            blob: blob.clone(),
            ranges: ranges
                .iter()
                .map(|&(start, end)| pb::ByteRange { start, end })
                .collect(),
            size: sizes.get(blob).copied().unwrap_or(0),
        })
        .collect()
}

fn images_pb(images: &HashMap<String, Vec<String>>) -> Vec<pb::ImageBlobs> {
    images
        .iter()
        .map(|(image, blobs)| pb::ImageBlobs {
            image: image.clone(),
            blobs: blobs.clone(),
        })
        .collect()
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

/// The TLS settings for dialling the scheduler and peers: trust `p2p.tls_ca`.
fn tls_client(config: &P2pConfig) -> Result<Option<ClientTlsConfig>> {
    let Some(ca) = &config.tls_ca else {
        return Ok(None);
    };
    let pem = std::fs::read(ca).map_err(|e| Error::io("read p2p.tls_ca", ca, e))?;
    Ok(Some(
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
    ))
}

/// The peer service's TLS identity from `p2p.tls_cert` and `p2p.tls_key`, if set.
pub fn tls_server(config: &P2pConfig) -> Result<Option<tonic::transport::ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let cert = std::fs::read(cert).map_err(|e| Error::io("read p2p.tls_cert", cert, e))?;
    let key = std::fs::read(key).map_err(|e| Error::io("read p2p.tls_key", key, e))?;
    Ok(Some(
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key)),
    ))
}

/// How a peer transfer ended, for the report and the choice of the next peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerFailure {
    /// It was serving its maximum of uploads: try another, without blame.
    Busy,
    Timeout,
    Connection,
    VerificationFailed,
    /// It answered with something that is not the protocol.
    Protocol,
    /// It does not hold what was asked (no longer, or never did).
    NotFound,
}

impl PeerFailure {
    pub fn outcome(self) -> pb::Outcome {
        match self {
            PeerFailure::Busy | PeerFailure::Protocol => pb::Outcome::Other,
            PeerFailure::Timeout => pb::Outcome::Timeout,
            PeerFailure::Connection => pb::Outcome::Connection,
            PeerFailure::VerificationFailed => pb::Outcome::VerificationFailed,
            PeerFailure::NotFound => pb::Outcome::NotFound,
        }
    }
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
            return Err(Error::Agent("p2p: no scheduler configured".into()));
        }
        let address = config.advertised().ok_or_else(|| {
            Error::Agent("p2p: set p2p.advertise to the ip:port peers reach this node at".into())
        })?;
        let auth = match &config.token_file {
            Some(path) => AddBearer::from_file(
                TokenFile::open(path).map_err(|e| Error::io("read p2p token", path, e))?,
            ),
            None => AddBearer::new(None),
        }
        .map_err(|e| Error::Agent(format!("p2p: {e}")))?;
        let tls = tls_client(config)?;
        let mut replicas = Vec::with_capacity(urls.len());
        for url in &urls {
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| Error::Agent(format!("p2p.scheduler {url:?}: {e}")))?
                .connect_timeout(SCHEDULER_TIMEOUT)
                .timeout(SCHEDULER_TIMEOUT)
                .tcp_nodelay(true);
            if url.starts_with("https://") {
                let tls = tls.clone().ok_or_else(|| {
                    Error::Agent("p2p: an https:// scheduler needs p2p.tls_ca".into())
                })?;
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|e| Error::Agent(format!("p2p.scheduler TLS: {e}")))?;
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
            id: config
                .host_id
                .clone()
                .unwrap_or_else(|| default_host_id(address)),
            address: address.to_string(),
            labels,
            upload_limit_bps: config.upload_bytes_per_sec,
            max_uploads: config.max_uploads,
        };
        let ring = Ring::new(&urls);
        let state = State {
            held: HashMap::new(),
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

    /// Replica `r` is gone or forgot us: off the ring until registered again. What this
    /// host holds of the blobs it owned is announced to their new owners.
    fn lost(&self, r: usize, why: &str) {
        let replica = &self.replicas[r];
        replica.wake.notify_one();
        if !replica.registered.swap(false, Ordering::Relaxed) {
            return;
        }
        if !self.registered() {
            tracing::warn!(
                host = %self.host.id,
                scheduler = %replica.url,
                reason = why,
                "lost the scheduler; fetching from the origin until it is back"
            );
            return;
        }
        tracing::warn!(host = %self.host.id, scheduler = %replica.url, reason = why, "lost a scheduler replica; its blobs move to the next replica");
        let up = |i: usize| self.replicas[i].registered.load(Ordering::Relaxed);
        let mut woken = Vec::new();
        {
            let mut state = self.state();
            let state = &mut *state;
            for (blob, ranges) in &state.held {
                if self.ring.owner(blob, |i| i == r || up(i)) != Some(r) {
                    continue;
                }
                if let Some(to) = self.ring.owner(blob, up) {
                    let list = state.pending[to].held.entry(blob.clone()).or_default();
                    list.extend(ranges.iter().copied());
                    merge(list);
                    woken.push(to);
                }
            }
        }
        woken.sort_unstable();
        woken.dedup();
        for to in woken {
            self.replicas[to].wake.notify_one();
        }
    }

    async fn membership(self: Arc<Self>, r: usize) {
        let replica = &self.replicas[r];
        let mut backoff = Duration::from_millis(200);
        let mut heartbeat_every = Duration::from_secs(10);
        let mut unreachable_logged = false;
        loop {
            if !replica.registered.load(Ordering::Relaxed) {
                match self.register(r).await {
                    Ok(lease) => {
                        heartbeat_every =
                            (lease / 3).clamp(Duration::from_millis(200), Duration::from_secs(10));
                        backoff = Duration::from_millis(200);
                        unreachable_logged = false;
                    }
                    Err(e) => {
                        if !unreachable_logged {
                            tracing::warn!(host = %self.host.id, scheduler = %replica.url, error = %e, "cannot register with the scheduler; retrying (its blobs go to other replicas, or the origin)");
                            unreachable_logged = true;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let beat = tokio::select! {
                _ = tokio::time::sleep(heartbeat_every) => true,
                _ = replica.wake.notified() => false,
            };
            if beat || replica.beat_now.swap(false, Ordering::Relaxed) {
                self.heartbeat(r).await;
            }
            if replica.registered.load(Ordering::Relaxed) {
                self.flush(r).await;
            }
        }
    }

    /// Registers with replica `r` and announces, in full, what this host holds of the
    /// blobs `r` owns once it is up.
    async fn register(&self, r: usize) -> std::result::Result<Duration, tonic::Status> {
        let replica = &self.replicas[r];
        let mut scheduler = replica.client.clone();
        let lease = scheduler
            .register(pb::RegisterRequest {
                host: Some(self.host.clone()),
            })
            .await?
            .into_inner()
            .lease_ms;
        let up = |i: usize| i == r || self.replicas[i].registered.load(Ordering::Relaxed);
        let (held, images) = {
            let mut state = self.state();
            state.pending[r].held.clear();
            state.pending[r].images.clear();
            let owned: HashMap<String, Vec<(u64, u64)>> = state
                .held
                .iter()
                .filter(|(blob, _)| self.ring.owner(blob, up) == Some(r))
                .map(|(b, ranges)| (b.clone(), ranges.clone()))
                .collect();
            (to_pb(&owned, &state.sizes), images_pb(&state.images))
        };
        scheduler
            .announce(pb::AnnounceRequest {
                host_id: self.host.id.clone(),
                held,
                full: true,
                dropped: Vec::new(),
                images,
            })
            .await?;
        replica.registered.store(true, Ordering::Relaxed);
        tracing::info!(host = %self.host.id, address = %self.host.address, scheduler = %replica.url, "joined the swarm");
        Ok(Duration::from_millis(lease.max(1)))
    }

    async fn heartbeat(&self, r: usize) {
        let replica = &self.replicas[r];
        let uploads = u32::try_from(self.server.active_uploads()).unwrap_or(u32::MAX);
        let preheats = self.preheats.all();
        let answer = replica
            .client
            .clone()
            .heartbeat(pb::HeartbeatRequest {
                host_id: self.host.id.clone(),
                active_uploads: uploads,
                upload_bps: 0,
                preheats,
            })
            .await;
        match answer {
            Ok(a) if a.get_ref().reregister => self.lost(r, "the scheduler asked to re-register"),
            Ok(a) => self.preheats.start(a.into_inner().preheats),
            Err(e) => self.lost(r, e.message()),
        }
    }

    /// Sends replica `r` its pending announcements and reports.
    async fn flush(&self, r: usize) {
        let (pending, held) = {
            let mut state = self.state();
            let pending = std::mem::take(&mut state.pending[r]);
            let held = to_pb(&pending.held, &state.sizes);
            (pending, held)
        };
        let mut scheduler = self.replicas[r].client.clone();
        if !held.is_empty() || !pending.images.is_empty() {
            let sent = scheduler
                .announce(pb::AnnounceRequest {
                    host_id: self.host.id.clone(),
                    held,
                    full: false,
                    dropped: Vec::new(),
                    images: images_pb(&pending.images),
                })
                .await;
            // Not lost: `held` has it, and the full announcement after re-registering
            // sends it.
            if let Err(e) = sent {
                return self.lost(r, e.message());
            }
        }
        if !pending.reports.is_empty() {
            let sent = scheduler
                .report(pb::ReportRequest {
                    host_id: self.host.id.clone(),
                    transfers: pending.reports,
                })
                .await;
            if let Err(e) = sent {
                self.lost(r, e.message());
            }
        }
    }

    /// Records that this host now holds (verified, cached) these ranges of `blob`; they
    /// are announced right away.
    pub fn held(&self, blob: &str, ranges: impl IntoIterator<Item = (u64, u64)>) {
        let owner = {
            let mut state = self.state();
            let new: Vec<(u64, u64)> = ranges.into_iter().filter(|(s, e)| s < e).collect();
            if new.is_empty() {
                return;
            }
            let list = state.held.entry(blob.to_string()).or_default();
            list.extend(new.iter().copied());
            merge(list);
            // With no replica up, the full announcement at registration carries it.
            let Some(r) = self.owner(blob) else { return };
            let list = state.pending[r].held.entry(blob.to_string()).or_default();
            list.extend(new);
            merge(list);
            r
        };
        self.replicas[owner].wake.notify_one();
    }

    /// Records blobs' whole sizes, sent with their ranges from now on.
    pub fn blob_sizes(&self, sizes: impl IntoIterator<Item = (String, u64)>) {
        self.state().sizes.extend(sizes);
    }

    /// Records that this host uses `image`, made of `blobs`; every replica is told.
    pub fn uses_image(&self, image: &str, blobs: Vec<String>) {
        {
            let mut state = self.state();
            if state.images.get(image) == Some(&blobs) {
                return;
            }
            state.images.insert(image.to_string(), blobs.clone());
            for pending in &mut state.pending {
                pending.images.insert(image.to_string(), blobs.clone());
            }
        }
        for replica in &self.replicas {
            replica.wake.notify_one();
        }
    }

    /// Queues a transfer's outcome for the scheduler. `peer` is `None` for the origin.
    pub fn report(
        &self,
        peer: Option<&Peer>,
        blob: &str,
        range: (u64, u64),
        bytes: u64,
        duration: Duration,
        outcome: pb::Outcome,
    ) {
        if range.0 >= range.1 {
            return;
        }
        let Some(r) = self.owner(blob) else { return };
        self.state().pending[r].reports.push(pb::Transfer {
            peer_id: peer.map(|p| p.id.0.clone()).unwrap_or_default(),
            blob: blob.to_string(),
            range: Some(pb::ByteRange {
                start: range.0,
                end: range.1,
            }),
            bytes,
            duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
            outcome: outcome.into(),
        });
        self.replicas[r].wake.notify_one();
    }

    /// Asks who holds `[start, end)` of `blob` (the replica that owns it; if that one
    /// fails, the next). `None`: no usable answer (not registered, no replica
    /// reachable or answering sense) — use the origin.
    pub async fn find_peers(&self, blob: &str, range: (u64, u64)) -> Option<PeerChoice> {
        for _ in 0..self.replicas.len() {
            let r = self.owner(blob)?;
            let answer = self.replicas[r]
                .client
                .clone()
                .find_peers(pb::FindPeersRequest {
                    host_id: self.host.id.clone(),
                    blob: blob.to_string(),
                    range: Some(pb::ByteRange {
                        start: range.0,
                        end: range.1,
                    }),
                })
                .await;
            match answer {
                Ok(a) => match PeerChoice::try_from(a.into_inner()) {
                    Ok(choice) => return Some(choice),
                    Err(e) => {
                        tracing::warn!(error = %e, "the scheduler's answer is invalid; using the origin");
                        return None;
                    }
                },
                Err(e) => self.lost(r, e.message()),
            }
        }
        None
    }

    /// Opens a stream of the chunks `digests` from `peer`.
    pub async fn fetch_chunks(
        &self,
        peer: &Peer,
        algo: DigestAlgo,
        digests: Vec<[u8; 32]>,
    ) -> std::result::Result<tonic::Streaming<pb::ChunkData>, PeerFailure> {
        let mut client = self.peer_client(peer.address)?;
        let request = pb::FetchChunksRequest {
            digest_algorithm: match algo {
                DigestAlgo::Sha256 => "sha256",
                DigestAlgo::Blake3 => "blake3",
            }
            .to_string(),
            digests: digests.into_iter().map(|d| d.to_vec()).collect(),
        };
        match tokio::time::timeout(self.peer_timeout, client.fetch_chunks(request)).await {
            Err(_) => Err(PeerFailure::Timeout),
            Ok(Ok(stream)) => Ok(stream.into_inner()),
            Ok(Err(status)) => Err(failure_of(&status)),
        }
    }

    /// The piece table `peer` recorded for `blob` (the registry mirror's), checked for
    /// shape; whether its digests are true the caller finds out piece by piece.
    pub async fn piece_table(
        &self,
        peer: &Peer,
        blob: &str,
    ) -> std::result::Result<tessera_proto::domain::PieceTable, PeerFailure> {
        let mut client = self.peer_client(peer.address)?;
        let request = pb::PieceTableRequest {
            blob: blob.to_string(),
        };
        match tokio::time::timeout(self.peer_timeout, client.piece_table(request)).await {
            Err(_) => Err(PeerFailure::Timeout),
            Ok(Ok(table)) => tessera_proto::domain::PieceTable::try_from(table.into_inner())
                .map_err(|_| PeerFailure::Protocol),
            Ok(Err(status)) if status.code() == tonic::Code::NotFound => Err(PeerFailure::NotFound),
            Ok(Err(status)) => Err(failure_of(&status)),
        }
    }

    fn peer_client(
        &self,
        address: SocketAddr,
    ) -> std::result::Result<PeerServiceClient<Authed>, PeerFailure> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = peers.get(&address) {
            return Ok(c.clone());
        }
        let scheme = if self.peer_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|_| PeerFailure::Protocol)?;
        if let Some(tls) = &self.peer_tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|_| PeerFailure::Protocol)?;
        }
        let endpoint = endpoint
            .connect_timeout(self.peer_timeout)
            .tcp_nodelay(true)
            // Chunks are large: a small HTTP/2 window would throttle every stream.
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20));
        let client =
            PeerServiceClient::with_interceptor(endpoint.connect_lazy(), self.auth.clone())
                .max_decoding_message_size(MAX_MESSAGE);
        peers.insert(address, client.clone());
        Ok(client)
    }

    /// Leaves the swarm (shutdown): the schedulers stop sending peers here at once
    /// rather than when the lease runs out.
    pub async fn leave(&self) {
        let leaving = self
            .replicas
            .iter()
            .filter(|r| r.registered.swap(false, Ordering::Relaxed));
        let calls = leaving.map(|r| {
            let mut client = r.client.clone();
            let host_id = self.host.id.clone();
            async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    client.leave(pb::LeaveRequest { host_id }),
                )
                .await;
            }
        });
        let mut all = tokio::task::JoinSet::new();
        for call in calls {
            all.spawn(call);
        }
        while all.join_next().await.is_some() {}
    }
}

/// What a gRPC error from a peer means for choosing the next one.
pub fn failure_of(status: &tonic::Status) -> PeerFailure {
    match status.code() {
        tonic::Code::ResourceExhausted => PeerFailure::Busy,
        tonic::Code::DeadlineExceeded => PeerFailure::Timeout,
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => {
            PeerFailure::Connection
        }
        _ => PeerFailure::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut r = vec![(10, 20), (0, 5), (5, 8), (19, 30), (40, 50)];
        merge(&mut r);
        assert_eq!(r, [(0, 8), (10, 30), (40, 50)]);
    }
}
