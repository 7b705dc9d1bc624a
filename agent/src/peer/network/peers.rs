//! Connections to other agents' peer services (one lazily connected gRPC client per
//! address, with the bearer token, TLS when peers speak it, large HTTP/2 windows), the
//! TLS settings of this agent's peer service and of its dialling, and what a peer's
//! gRPC failure means for choosing the next one.

use std::net::SocketAddr;

use rafs_format::chunk::DigestAlgo;
use tessera_proto::auth::AddBearer;
use tessera_proto::domain::{ChunkEncoding, Peer};
use tessera_proto::pb;
use tessera_proto::pb::peer_service_client::PeerServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::Network;
use crate::config::P2pConfig;
use crate::{Error, Result};

/// A gRPC channel that sends the bearer token.
pub(super) type Authed = InterceptedService<Channel, AddBearer>;

/// Largest gRPC message: one chunk (chunks are at most 16 MiB) with room to spare.
pub const MAX_MESSAGE: usize = 32 << 20;

impl Network {
    /// Opens a stream of the chunks `digests` of `blob` from `peer`, with this node's
    /// proofs of access when the blob is a restricted image's (`peer::access`).
    pub async fn fetch_chunks(
        &self,
        peer: &Peer,
        blob: &str,
        algo: DigestAlgo,
        digests: Vec<[u8; 32]>,
    ) -> std::result::Result<tonic::Streaming<pb::ChunkData>, PeerFailure> {
        let mut client = self.peer_client(peer.address)?;
        let proofs = self
            .server
            .access()
            .map(|a| a.proofs(&self.host.id, &peer.id.0, blob))
            .unwrap_or_default();
        let access = (!proofs.is_empty()).then(|| pb::ChunkAccess {
            requester: self.host.id.clone(),
            blob: blob.to_string(),
            proofs: proofs
                .into_iter()
                .map(|(manifest, proof)| pb::AccessProof {
                    manifest,
                    proof: proof.to_vec(),
                })
                .collect(),
        });
        let request = pb::FetchChunksRequest {
            digest_algorithm: match algo {
                DigestAlgo::Sha256 => "sha256",
                DigestAlgo::Blake3 => "blake3",
            }
            .to_string(),
            digests: digests.into_iter().map(|d| d.to_vec()).collect(),
            accept_encodings: vec![ChunkEncoding::Zstd.name().to_string()],
            access,
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
}

/// The TLS settings for dialling the scheduler and peers: trust `p2p.tls_ca`.
pub(super) fn tls_client(config: &P2pConfig) -> Result<Option<ClientTlsConfig>> {
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
    /// It holds chunks of a restricted image and this node could not prove access to
    /// them (`peer::access`): not the peer's fault, so it is not reported.
    Refused,
}

impl PeerFailure {
    pub fn outcome(self) -> pb::Outcome {
        match self {
            PeerFailure::Busy | PeerFailure::Protocol | PeerFailure::Refused => pb::Outcome::Other,
            PeerFailure::Timeout => pb::Outcome::Timeout,
            PeerFailure::Connection => pb::Outcome::Connection,
            PeerFailure::VerificationFailed => pb::Outcome::VerificationFailed,
            PeerFailure::NotFound => pb::Outcome::NotFound,
        }
    }
}

/// What a gRPC error from a peer means for choosing the next one.
pub fn failure_of(status: &tonic::Status) -> PeerFailure {
    match status.code() {
        tonic::Code::ResourceExhausted => PeerFailure::Busy,
        tonic::Code::PermissionDenied => PeerFailure::Refused,
        tonic::Code::DeadlineExceeded => PeerFailure::Timeout,
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => {
            PeerFailure::Connection
        }
        _ => PeerFailure::Protocol,
    }
}
