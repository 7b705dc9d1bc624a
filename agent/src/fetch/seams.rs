//! The seams of the fetch pipeline: where bytes come from (the origin, peers) and where
//! verified ones are kept (the store), each behind a small trait. The pipeline's
//! policies — single flight, run merging, peer choice, retries — are written against
//! these traits only, so `fetch::tests` drives them in process with fakes and paused
//! time; the real implementations over the registry client, the swarm
//! (`peer::Network`) and the chunk cache are at the end of this file.
//!
//! The traits return boxed futures rather than using `async fn` so that the pipeline can
//! hold them as trait objects (one origin per image or per mirror request, with its own
//! credentials).

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rafs_format::chunk::DigestAlgo;
use tessera_proto::domain::{ChunkData, Peer, PeerChoice};
use tessera_proto::pb;

use crate::cache::{ChunkCache, ChunkKey};
use crate::peer::network::{failure_of, PeerFailure};
use crate::peer::Network;
use crate::registry::client::RegistryClient;
use crate::registry::reference::Reference;
use crate::Result;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The origin registry as one fetch may use it: the repository and the credentials are
/// the implementation's business (the node's own for mounts, the client's for the
/// mirror), so they never reach the pipeline, the scheduler or peers.
pub trait Origin: Send + Sync {
    /// `[range)` of `blob`; `arrived` is shown the bytes received so far (from the
    /// range's start) each time more arrive, and again from the start when the
    /// implementation asks anew after a body was cut off. The whole range at the end.
    fn range<'a>(
        &'a self,
        blob: &'a str,
        range: Range<u64>,
        arrived: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFuture<'a, Result<Vec<u8>>>;
}

/// The swarm: who holds what, the chunks they stream, and what this node tells the
/// scheduler.
pub trait Peers: Send + Sync {
    /// Who holds `[start, end)` of `blob`. `None`: no usable answer (the origin, then).
    fn find<'a>(&'a self, blob: &'a str, range: (u64, u64)) -> BoxFuture<'a, Option<PeerChoice>>;

    /// Opens a stream of the units `digests` of `blob` from `peer`: it sends them in
    /// request order, skipping what it lacks (or refuses them all,
    /// [`PeerFailure::Refused`], when they are a restricted image's and this node
    /// cannot prove access to it).
    fn open<'a>(
        &'a self,
        peer: &'a Peer,
        blob: &'a str,
        algo: DigestAlgo,
        digests: Vec<[u8; 32]>,
    ) -> BoxFuture<'a, std::result::Result<Box<dyn PeerStream>, PeerFailure>>;

    /// Tells the scheduler how a transfer went (`peer` is `None` for the origin).
    fn report(
        &self,
        peer: Option<&Peer>,
        blob: &str,
        range: (u64, u64),
        bytes: u64,
        took: Duration,
        outcome: pb::Outcome,
    );

    /// Tells the scheduler this node now holds (verified, stored) these chunks, at
    /// these ranges of `blob` (the keys let it announce the ranges as dropped when the
    /// cache drops the chunks).
    fn held(&self, blob: &str, chunks: Vec<(ChunkKey, (u64, u64))>);

    /// How long a peer may stall before it is abandoned (for about 1 MiB).
    fn peer_timeout(&self) -> Duration;

    /// How long a fetch waits for other agents (their origin fetch, busy holders)
    /// before going to the origin itself.
    fn max_wait(&self) -> Duration;

    /// Whether this node is a member of the swarm now (registered with a scheduler):
    /// holders it remembers are asked only while it is.
    fn member(&self) -> bool;
}

/// Units arriving from one peer.
pub trait PeerStream: Send {
    /// The next unit; `Ok(None)` at a clean end.
    fn next(&mut self) -> BoxFuture<'_, std::result::Result<Option<ChunkData>, PeerFailure>>;
}

/// Verified units on this node's disk, by the digest of their bytes (verified on the way
/// in, trusted after: shared/MISSION.md). `get`, `read` and `put` do file I/O: the
/// pipeline calls them only on the blocking pool ([`super::blocking`]) or a FUSE worker
/// thread. `contains` is an index probe, cheap enough to make inline.
pub trait Store: Send + Sync {
    /// The unit's bytes, checked; `None` when absent or no longer good.
    fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>>;
    /// Bytes `range` of the unit (within its size), reading only those; `None` as for
    /// `get`.
    fn read(&self, key: &ChunkKey, range: Range<u64>) -> Result<Option<Vec<u8>>>;
    fn contains(&self, key: &ChunkKey) -> bool;
    /// Keeps bytes the caller verified against `key`.
    fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()>;
    /// Drops a unit; `true` if it was there.
    fn remove(&self, key: &ChunkKey) -> Result<bool>;
}

impl Store for ChunkCache {
    fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        ChunkCache::get(self, key)
    }
    fn read(&self, key: &ChunkKey, range: Range<u64>) -> Result<Option<Vec<u8>>> {
        ChunkCache::read(self, key, range)
    }
    fn contains(&self, key: &ChunkKey) -> bool {
        ChunkCache::contains(self, key)
    }
    fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()> {
        ChunkCache::put(self, key, data)
    }
    fn remove(&self, key: &ChunkKey) -> Result<bool> {
        ChunkCache::remove(self, key)
    }
}

/// An image's blobs in its repository, read with the node's own credentials.
#[derive(Debug)]
pub struct RegistryOrigin {
    pub client: Arc<RegistryClient>,
    /// The image, pinned by digest: its blobs are read from its repository.
    pub reference: Reference,
}

impl Origin for RegistryOrigin {
    fn range<'a>(
        &'a self,
        blob: &'a str,
        range: Range<u64>,
        arrived: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(
            self.client
                .blob_range_streamed(&self.reference, blob, range, arrived),
        )
    }
}

/// A blob read on behalf of a mirror client, with that client's `Authorization`.
#[derive(Debug)]
pub struct ForwardedOrigin {
    pub client: Arc<RegistryClient>,
    /// Registry and repository.
    pub reference: Reference,
    pub auth: Option<String>,
}

impl Origin for ForwardedOrigin {
    fn range<'a>(
        &'a self,
        blob: &'a str,
        range: Range<u64>,
        _arrived: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        // Pieces are checked whole, so nothing is gained by showing partial bodies.
        Box::pin(
            self.client
                .blob_range_forwarded(&self.reference, blob, range, self.auth.clone()),
        )
    }
}

impl Peers for Network {
    fn find<'a>(&'a self, blob: &'a str, range: (u64, u64)) -> BoxFuture<'a, Option<PeerChoice>> {
        Box::pin(self.find_peers(blob, range))
    }

    fn open<'a>(
        &'a self,
        peer: &'a Peer,
        blob: &'a str,
        algo: DigestAlgo,
        digests: Vec<[u8; 32]>,
    ) -> BoxFuture<'a, std::result::Result<Box<dyn PeerStream>, PeerFailure>> {
        Box::pin(async move {
            let stream = self.fetch_chunks(peer, blob, algo, digests).await?;
            Ok(Box::new(GrpcChunks(stream)) as Box<dyn PeerStream>)
        })
    }

    fn report(
        &self,
        peer: Option<&Peer>,
        blob: &str,
        range: (u64, u64),
        bytes: u64,
        took: Duration,
        outcome: pb::Outcome,
    ) {
        Network::report(self, peer, blob, range, bytes, took, outcome);
    }

    fn held(&self, blob: &str, chunks: Vec<(ChunkKey, (u64, u64))>) {
        Network::held(self, blob, chunks);
    }

    fn peer_timeout(&self) -> Duration {
        Network::peer_timeout(self)
    }

    fn max_wait(&self) -> Duration {
        Network::max_wait(self)
    }

    fn member(&self) -> bool {
        self.registered()
    }
}

/// A peer's gRPC stream of chunks, each checked for shape.
struct GrpcChunks(tonic::Streaming<pb::ChunkData>);

impl PeerStream for GrpcChunks {
    fn next(&mut self) -> BoxFuture<'_, std::result::Result<Option<ChunkData>, PeerFailure>> {
        Box::pin(async move {
            match self.0.message().await {
                Err(status) => Err(failure_of(&status)),
                Ok(None) => Ok(None),
                Ok(Some(m)) => ChunkData::try_from(m)
                    .map(Some)
                    .map_err(|_| PeerFailure::Protocol),
            }
        })
    }
}
