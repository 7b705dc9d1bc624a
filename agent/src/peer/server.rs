//! The `tessera.v1.PeerService`: other agents fetch chunks by digest from this node's
//! cache. Only verified data is ever served — the cache holds nothing else and
//! re-verifies on read — and the requester verifies again on arrival, trusting no peer.
//! Uploads are bounded in number and in bandwidth so serving peers never starves the
//! node's own workloads. Chunks of restricted images (private repositories,
//! checkpoints) go only to requests that prove pull access ([`super::access`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rafs_format::chunk::DigestAlgo;
use tessera_proto::domain::{ChunkEncoding, DigestAlgorithm, FetchChunks};
use tessera_proto::pb;
use tokio::sync::Semaphore;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::access::PeerAccess;
use crate::cache::pieces::PieceTables;
use crate::cache::{ChunkCache, ChunkKey};

/// Limits on what this node gives to peers.
#[derive(Debug, Clone)]
pub struct UploadLimits {
    /// Requests served at once; more are refused with `resource_exhausted` (the
    /// requester tries another peer rather than queueing here).
    pub max_uploads: usize,
    /// Bytes per second across all uploads; `None`: unlimited.
    pub bytes_per_sec: Option<u64>,
    /// Test-only fault switch: flip a byte of every chunk sent, as a broken or hostile
    /// peer would, so tests can show requesters verify, report and exclude it.
    pub corrupt: bool,
    /// Send chunks zstd-compressed to requesters that decode it (costs this node's CPU,
    /// saves the link's bytes).
    pub compress: bool,
}

/// Chunks of one upload read from the cache at once, ahead of the stream: at most this
/// many chunks (8 MiB at the default chunk size) wait in memory per upload.
const READS_AHEAD: usize = 8;

/// zstd level of compressed uploads: the fastest, since it runs per upload.
const UPLOAD_ZSTD_LEVEL: i32 = 1;

/// Serves cached chunks to peers.
#[derive(Debug, Clone)]
pub struct PeerServer {
    cache: Arc<ChunkCache>,
    uploads: Arc<Semaphore>,
    limits: UploadLimits,
    /// When the bandwidth budget next has room (shared by all uploads).
    pacer: Arc<tokio::sync::Mutex<Instant>>,
    /// Chunk bytes sent to peers since start (uncompressed), and as sent.
    uploaded: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    /// The registry mirror's piece tables of blobs verified whole here.
    tables: Option<Arc<PieceTables>>,
    /// The access keys of restricted images, and this node's host id (what requesters'
    /// proofs name as the server); `None`: every chunk is served (tests).
    access: Option<(Arc<PeerAccess>, Arc<str>)>,
}

impl PeerServer {
    pub fn new(cache: Arc<ChunkCache>, limits: UploadLimits) -> Self {
        PeerServer {
            cache,
            uploads: Arc::new(Semaphore::new(limits.max_uploads.max(1))),
            limits,
            pacer: Arc::new(tokio::sync::Mutex::new(Instant::now())),
            uploaded: Arc::new(AtomicU64::new(0)),
            sent: Arc::new(AtomicU64::new(0)),
            tables: None,
            access: None,
        }
    }

    /// Serves chunks of restricted images only to requests proving access with a key
    /// in `access`, made for this node as `host_id` (its id in the swarm).
    pub fn with_access(mut self, access: Arc<PeerAccess>, host_id: &str) -> Self {
        self.access = Some((access, Arc::from(host_id)));
        self
    }

    /// The access keys of the restricted images this node mounted, if it checks them.
    pub fn access(&self) -> Option<&Arc<PeerAccess>> {
        self.access.as_ref().map(|(a, _)| a)
    }

    /// Requests refused for lack of a proof of access since start.
    pub fn refused_requests(&self) -> u64 {
        self.access.as_ref().map_or(0, |(a, _)| a.refused())
    }

    /// Also answers for the mirror's piece tables.
    pub fn with_piece_tables(mut self, tables: Arc<PieceTables>) -> Self {
        self.tables = Some(tables);
        self
    }

    /// Chunk bytes sent to peers since start.
    pub fn uploaded_bytes(&self) -> u64 {
        self.uploaded.load(Ordering::Relaxed)
    }

    /// Bytes sent to peers since start as they went on the wire (compressed or not).
    pub fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Uploads in progress.
    pub fn active_uploads(&self) -> usize {
        self.limits.max_uploads.max(1) - self.uploads.available_permits()
    }

    /// Serves the peer service on `listener` until the task is dropped: over TLS when
    /// `tls` is set; requests must carry `token` when one is set.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        gate: tessera_proto::listen::Gate,
        server: tonic::transport::Server,
        token: Option<tessera_proto::auth::TokenFile>,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> crate::Result<()> {
        use tessera_proto::pb::peer_service_server::PeerServiceServer;
        let addr = listener.local_addr().ok();
        let service = PeerServiceServer::with_interceptor(
            self,
            tessera_proto::auth::RequireBearer::from_file(token, "peer service"),
        );
        let mut builder = server;
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(|e| crate::Error::Service {
                service: "peer service".into(),
                reason: format!("TLS: {e}"),
            })?;
        }
        // Uploads are bounded by `max_uploads`; the server's stream limit and the gate
        // bound what a flood can open.
        builder
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20))
            .add_service(service)
            .serve_with_incoming(gate.incoming(listener))
            .await
            .map_err(|e| crate::Error::Service {
                service: format!("peer service on {addr:?}"),
                reason: format!("stopped: {e}"),
            })
    }
}

/// Waits until `bytes` fit the bandwidth budget (a virtual clock advanced by each send).
async fn pace(pacer: &tokio::sync::Mutex<Instant>, bytes: usize, rate: Option<u64>) {
    let Some(rate) = rate.filter(|r| *r > 0) else {
        return;
    };
    let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
    let ready = {
        let mut next = pacer.lock().await;
        let start = (*next).max(Instant::now());
        *next = start + cost;
        start
    };
    tokio::time::sleep_until(ready.into()).await;
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::ChunkData, Status>> + Send>>;

#[tonic::async_trait]
impl pb::peer_service_server::PeerService for PeerServer {
    type FetchChunksStream = ChunkStream;

    async fn fetch_chunks(
        &self,
        request: Request<pb::FetchChunksRequest>,
    ) -> Result<Response<Self::FetchChunksStream>, Status> {
        let wanted = FetchChunks::try_from(request.into_inner())?;
        let algo = match wanted.algorithm {
            DigestAlgorithm::Sha256 => DigestAlgo::Sha256,
            DigestAlgorithm::Blake3 => DigestAlgo::Blake3,
        };
        if let Some((access, host_id)) = &self.access {
            if let Err(refusal) =
                access.check(host_id, algo, &wanted.digests, wanted.access.as_ref())
            {
                access.count_refusal();
                // Names only: never a key or a proof.
                tracing::debug!(
                    requester = wanted.access.as_ref().map_or("(no proof)", |a| a.requester.0.as_str()),
                    blob = wanted.access.as_ref().map_or("", |a| a.blob.0.as_str()),
                    chunks = wanted.digests.len(),
                    %refusal,
                    "refused a peer's request for chunks of a restricted image"
                );
                return Err(Status::permission_denied(format!(
                    "{refusal}: this peer serves chunks of a private image or a checkpoint \
                     only to nodes that read its manifest from the registry"
                )));
            }
        }
        let permit = self.uploads.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted("this peer is serving its maximum of uploads")
        })?;
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (cache, pacer, rate, corrupt, uploaded) = (
            self.cache.clone(),
            self.pacer.clone(),
            self.limits.bytes_per_sec,
            self.limits.corrupt,
            self.uploaded.clone(),
        );
        let compress = self.limits.compress && wanted.accepts_zstd;
        let sent = self.sent.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut digests = wanted.digests.into_iter();
            // Reads in flight, in the order asked: a chunk file not in the page cache
            // waits on the disk for its directory entry, inode and data, and a disk
            // serves several such reads at once about as fast as one.
            let mut reads = VecDeque::with_capacity(READS_AHEAD);
            loop {
                while reads.len() < READS_AHEAD {
                    let Some(digest) = digests.next() else { break };
                    let key = ChunkKey { algo, digest };
                    // Verified as it leaves the node, and compressed if asked (file
                    // I/O, hashing, zstd: off the async workers); a chunk the disk
                    // spoiled is dropped, not served.
                    let cache = cache.clone();
                    let read = tokio::task::spawn_blocking(move || {
                        let data = cache.get_verified(&key).ok().flatten()?;
                        let bytes = data.len() as u64;
                        Some((bytes, encode(data, compress)))
                    });
                    reads.push_back((digest, read));
                }
                let Some((digest, read)) = reads.pop_front() else {
                    return;
                };
                let read = read.await.ok().flatten();
                // Chunks this node does not hold are skipped: the requester asks elsewhere.
                let Some((bytes, (mut data, encoding))) = read else {
                    continue;
                };
                if corrupt {
                    if let Some(b) = data.first_mut() {
                        *b ^= 0xff;
                    }
                }
                pace(&pacer, data.len(), rate).await;
                let on_wire = data.len() as u64;
                let message = pb::ChunkData {
                    digest: digest.to_vec(),
                    data,
                    encoding: encoding.name().to_string(),
                };
                if tx.send(Ok(message)).await.is_err() {
                    return; // The requester went away.
                }
                // Counted once handed to the stream, as the requester counts it.
                uploaded.fetch_add(bytes, Ordering::Relaxed);
                sent.fetch_add(on_wire, Ordering::Relaxed);
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn piece_table(
        &self,
        request: Request<pb::PieceTableRequest>,
    ) -> Result<Response<pb::PieceTableResponse>, Status> {
        let blob = tessera_proto::domain::BlobDigest::parse("blob", request.into_inner().blob)?;
        let tables = self.tables.clone();
        let table = tokio::task::spawn_blocking(move || tables.and_then(|t| t.get(&blob.0)))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| Status::not_found("no piece table for this blob here"))?;
        Ok(Response::new(pb::PieceTableResponse::from(&table)))
    }
}

/// The chunk as sent: zstd-compressed when `compress` and it pays (a tenth smaller at
/// least), else plain.
fn encode(data: Vec<u8>, compress: bool) -> (Vec<u8>, ChunkEncoding) {
    if compress {
        if let Ok(packed) = zstd::bulk::compress(&data, UPLOAD_ZSTD_LEVEL) {
            if packed.len() < data.len() - data.len() / 10 {
                return (packed, ChunkEncoding::Zstd);
            }
        }
    }
    (data, ChunkEncoding::Plain)
}
