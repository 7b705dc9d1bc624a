//! Blobs through the mirror.
//!
//! 1. **Access**: the upstream must say this request's credentials may read the blob
//!    (a `HEAD`, remembered briefly; see [`super::access`]). Its answer also gives the
//!    size. A refusal goes back to the client as the upstream gave it.
//! 2. **Piece table**: this node's own (it verified the blob whole before), or one from
//!    a peer the scheduler names as a holder.
//! 3. With a table, the response is assembled piece by piece, a few pieces fetched
//!    ahead: cache → peers → origin (a Range request with the request's credentials),
//!    each piece checked against its digest, a bad one reported and fetched elsewhere.
//!    Each piece is offered to peers as soon as it is verified against the table, so a
//!    swarm pulling the blob spreads it among itself rather than every node waiting on
//!    the first holder (20 nodes at once through their mirrors had one node serve 95%
//!    of the pieces). A whole-blob response is hashed as it goes; if it does not match
//!    the digest the response is cut off (containerd retries), the pieces this pull
//!    added are dropped (and announced as dropped) and the table's peer is reported.
//! 4. Without a table the scheduler's single flight decides: one agent streams the
//!    blob from the origin (asking the scheduler again every few seconds to keep its
//!    flight), cutting and caching pieces as they pass and hashing the whole; the
//!    others wait for it and then fetch from peers. With P2P off or the scheduler down
//!    this is simply a verified proxy of the upstream.
//! 5. A Range request the swarm cannot answer from a table is proxied to the upstream
//!    as it is.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use hyper::{Method, StatusCode};
use rafs_format::chunk::Compression;
use sha2::{Digest, Sha256};
use tessera_proto::domain::{BlobDigest, Peer, PeerChoice, PieceTable};
use tessera_proto::pb;
use tokio::sync::mpsc;

use super::access::{fingerprint, AccessKey};
use super::{empty, error, relayed, Mirror, Response, Target, DOCKER_CONTENT_DIGEST};
use crate::cache::pieces::{piece_key, Cut, Cutter, PIECE_SIZE};
use crate::fetch::{self, Event, ForwardedOrigin, Origin, Source, Unit, Wanted};

/// Pieces fetched ahead of the one being sent.
const WINDOW: usize = 4;

/// Holders asked for their piece table before the origin.
const PEERS_PER_PIECE: usize = 3;

/// How often an agent streaming a blob from the origin tells the scheduler it still is.
const FLIGHT_KEEPALIVE: Duration = Duration::from_secs(3);

/// Times an origin stream is resumed after its body was cut off.
const RESUMES: u32 = 3;

type Sender = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// A piece being fetched: its bytes, and whether this fetch put it in the cache.
type PieceTask = tokio::task::JoinHandle<Result<Piece, String>>;

/// A verified piece, where it came from, and whether this fetch put it in the cache.
struct Piece {
    data: Arc<Vec<u8>>,
    source: Source,
    newly_cached: bool,
}

/// A streamed response and the channel its body is written to.
fn streaming(status: StatusCode, headers: HeaderMap) -> (Response, Sender) {
    let (tx, rx) = mpsc::channel(WINDOW);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let mut resp = hyper::Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().extend(headers);
    (super::api_version(resp), tx)
}

/// Ends a response with an error: the client sees the body cut off and retries.
async fn abort(tx: &Sender, why: &str) {
    let _ = tx.send(Err(std::io::Error::other(why.to_string()))).await;
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` against a blob of `size`: `Ok(None)` for a
/// header this server ignores (several ranges: the whole blob is sent), `Err` when
/// the range cannot be satisfied.
fn parse_range(header: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        (size.saturating_sub(n), size)
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            size
        } else {
            b.parse::<u64>()
                .map_err(|_| ())?
                .saturating_add(1)
                .min(size)
        };
        (start, end)
    };
    if start >= end || start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// The headers of a blob response for `[start, end)` of `size` bytes.
fn blob_headers(digest: &str, size: u64, part: Option<(u64, u64)>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert("accept-ranges", HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(digest) {
        h.insert(DOCKER_CONTENT_DIGEST, v);
    }
    let (start, end) = part.unwrap_or((0, size));
    h.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    if part.is_some() {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", end - 1)) {
            h.insert(CONTENT_RANGE, v);
        }
    }
    h
}

/// Where a blob's pieces are checked against.
struct Table {
    table: PieceTable,
    /// The peer that gave it; `None` when this node verified the blob itself.
    from: Option<Peer>,
}

/// What the swarm says about a blob this node has no table for.
enum Swarm {
    /// A holder's table.
    Table(Table),
    /// This node fetches it from the origin (the scheduler's flight is ours).
    Origin,
    /// No swarm, no scheduler, or no usable answer: the origin, without a flight.
    Alone,
}

impl Mirror {
    pub(super) async fn blob(
        self: Arc<Self>,
        t: Target,
        digest: String,
        head: bool,
        range: Option<String>,
    ) -> Response {
        if !super::is_sha256(&digest) {
            // Not a digest the swarm knows how to check: the upstream answers.
            return self.proxy(&t, &digest, head, range).await;
        }
        let size = match self.authorize(&t, &digest).await {
            Ok(size) => size,
            Err(refusal) => return refusal,
        };
        let part = match range.as_deref().map(|h| parse_range(h, size)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(r))) => Some(r),
            Some(Err(())) => {
                let mut h = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    h.insert(CONTENT_RANGE, v);
                }
                return empty(StatusCode::RANGE_NOT_SATISFIABLE, h);
            }
        };
        let status = if part.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        };
        if head {
            return empty(status, blob_headers(&digest, size, part));
        }
        let local = self.tables.get(&digest).filter(|table| table.size == size);
        let swarm = match (local, part) {
            (Some(table), _) => Swarm::Table(Table { table, from: None }),
            (None, None) => self.swarm_for(&digest, size, true).await,
            (None, Some(_)) => self.swarm_for(&digest, size, false).await,
        };
        let (resp, tx) = streaming(status, blob_headers(&digest, size, part));
        match swarm {
            Swarm::Table(table) => {
                let want = part.unwrap_or((0, size));
                tokio::spawn(self.send_pieces(t, digest, table, want, part.is_none(), tx));
            }
            Swarm::Origin | Swarm::Alone if part.is_none() => {
                let flight = matches!(swarm, Swarm::Origin);
                tokio::spawn(self.stream_from_origin(t, digest, size, flight, tx));
            }
            _ => return self.proxy(&t, &digest, false, range).await,
        }
        resp
    }

    /// Asks the upstream whether the request's credentials may read the blob (unless a
    /// recent answer says so): its size, or the refusal to send back.
    async fn authorize(&self, t: &Target, digest: &str) -> Result<u64, Response> {
        let key = AccessKey {
            credential: fingerprint(t.auth.as_deref()),
            registry: t.r.registry.clone(),
            repository: t.r.repository.clone(),
            blob: digest.to_string(),
        };
        if let Some(size) = self.access.allowed(&key, Instant::now()) {
            return Ok(size);
        }
        let resp = self
            .origin
            .forward(
                &t.r,
                Method::HEAD,
                &format!("blobs/{digest}"),
                HeaderMap::new(),
                t.auth.clone(),
            )
            .await;
        let unreachable = match &resp {
            Ok(r) => r.status().is_server_error(),
            Err(_) => true,
        };
        if unreachable {
            // The upstream cannot answer: a yes it gave this credential lately stands,
            // if the operator chose so (`mirror.last_known_secs`).
            let within = Duration::from_secs(self.config.last_known_secs);
            if let Some(size) = self.access.allowed_within(&key, Instant::now(), within) {
                self.metrics.last_known.inc();
                return Ok(size);
            }
        }
        let resp = resp.map_err(|e| error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            tracing::info!(registry = %t.r.registry, repository = %t.r.repository, blob = digest, %status, "upstream refused the blob to this request");
            let mut refusal = error(
                status,
                super::code_of(status),
                &format!("upstream {} answered {status} for this blob", t.r.registry),
            );
            refusal.headers_mut().extend(
                relayed(resp.headers()).into_iter().filter(|(name, _)| {
                    name.as_ref().map(|n| n == "www-authenticate") == Some(true)
                }),
            );
            return Err(refusal);
        }
        let size = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                error(
                    StatusCode::BAD_GATEWAY,
                    "UNKNOWN",
                    "the upstream did not give the blob's size",
                )
            })?;
        self.access.allow(key, size, Instant::now());
        Ok(size)
    }

    /// Finds a table among the blob's holders; or learns this node should fetch it from
    /// the origin; waiting while another agent does (only when `wait`).
    async fn swarm_for(&self, digest: &str, size: u64, wait: bool) -> Swarm {
        let Some(network) = &self.network else {
            return Swarm::Alone;
        };
        let started = Instant::now();
        let max_wait = Duration::from_secs(self.config.max_wait_secs);
        loop {
            match network.find_peers(digest, (0, size.max(1))).await {
                None => return Swarm::Alone,
                Some(PeerChoice::Origin) => return Swarm::Origin,
                Some(PeerChoice::Wait(pause)) => {
                    if !wait || started.elapsed() + pause > max_wait {
                        tracing::warn!(blob = digest, "another agent's origin fetch of this blob takes too long; fetching it from the origin too");
                        return Swarm::Alone;
                    }
                    tokio::time::sleep(pause).await;
                }
                Some(PeerChoice::Peers(peers)) => {
                    for peer in peers.iter().take(PEERS_PER_PIECE) {
                        match network.piece_table(peer, digest).await {
                            Ok(table) if table.size == size && table.blob.0 == digest => {
                                return Swarm::Table(Table {
                                    table,
                                    from: Some(peer.clone()),
                                })
                            }
                            Ok(_) => {
                                tracing::warn!(peer = %peer.id.0, blob = digest, "a peer's piece table does not fit the blob; peer reported");
                                network.report(
                                    Some(peer),
                                    digest,
                                    (0, size.max(1)),
                                    0,
                                    Duration::ZERO,
                                    pb::Outcome::VerificationFailed,
                                );
                            }
                            Err(f) => {
                                tracing::debug!(peer = %peer.id.0, blob = digest, failure = ?f, "no piece table from this peer");
                            }
                        }
                    }
                    // Holders without a table (e.g. agents holding chunks of a Tessera
                    // blob by FUSE): the origin, without a flight.
                    return Swarm::Alone;
                }
            }
        }
    }

    /// Sends `[want)` of the blob piece by piece (see the module docs).
    async fn send_pieces(
        self: Arc<Self>,
        t: Target,
        digest: String,
        table: Table,
        want: (u64, u64),
        whole: bool,
        tx: Sender,
    ) {
        let table_arc = Arc::new(table.table.clone());
        let pieces = table.table.pieces_covering(want.0, want.1);
        let mut window: VecDeque<(usize, PieceTask)> = VecDeque::new();
        let mut next = pieces.start;
        let mut hasher = Sha256::new();
        let mut added = Vec::new();
        loop {
            while window.len() < WINDOW && next < pieces.end {
                let task = tokio::spawn(self.clone().piece(t.clone(), table_arc.clone(), next));
                window.push_back((next, task));
                next += 1;
            }
            let Some((index, task)) = window.pop_front() else {
                break;
            };
            let Piece {
                data,
                source,
                newly_cached,
            } = match task.await {
                Ok(Ok(got)) => got,
                Ok(Err(why)) => {
                    tracing::error!(
                        blob = digest,
                        piece = index,
                        why,
                        "no source gave a piece; response cut off"
                    );
                    self.discard(&added, &window);
                    return abort(&tx, &why).await;
                }
                Err(e) => {
                    self.discard(&added, &window);
                    return abort(&tx, &e.to_string()).await;
                }
            };
            if newly_cached {
                added.push(table.table.digests[index]);
            }
            if whole {
                hasher.update(data.as_slice());
            }
            let (start, end) = table.table.piece_range(index);
            let from = want.0.saturating_sub(start) as usize;
            let to = (want.1.min(end) - start) as usize;
            let bytes = Bytes::copy_from_slice(&data[from..to]);
            self.count(source, bytes.len());
            if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                // The client went away; what is cached stays only if verified below.
                for (_, task) in &window {
                    task.abort();
                }
                if whole || table.from.is_some() {
                    self.drop_pieces(&added);
                }
                return;
            }
        }
        let network = self.network.as_ref();
        if whole {
            let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
            if actual != digest {
                self.whole_failed(&digest, &actual, table.from.as_ref(), table.table.size);
                // Every piece, not only those this pull added: cached pieces are
                // trusted, not re-hashed, so one the disk spoiled is found only here.
                self.drop_pieces(&table.table.digests);
                if table.from.is_none() {
                    self.tables.remove(&digest);
                }
                return abort(&tx, "the blob does not match its digest").await;
            }
            if table.from.is_some() {
                if let Err(e) = self.tables.put(&table.table) {
                    tracing::warn!(blob = digest, error = %e, "could not record a piece table");
                    return;
                }
            }
            if let Some(network) = network {
                let t = &table.table;
                let pieces =
                    (0..t.digests.len()).map(|i| (piece_key(t.digests[i]), t.piece_range(i)));
                network.held(&digest, pieces);
            }
        } else if table.from.is_none() {
            // A part, checked against this node's own table: its new pieces may be
            // offered.
            if let Some(network) = network {
                let pieces = table
                    .table
                    .digests
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| added.contains(d))
                    .map(|(i, d)| (piece_key(*d), table.table.piece_range(i)));
                network.held(&digest, pieces);
            }
        }
    }

    /// Stops fetching ahead and drops what this pull added (it was never verified as
    /// part of the blob).
    fn discard(&self, added: &[[u8; 32]], window: &VecDeque<(usize, PieceTask)>) {
        for (_, task) in window {
            task.abort();
        }
        self.drop_pieces(added);
    }

    fn drop_pieces(&self, added: &[[u8; 32]]) {
        for d in added {
            if let Err(e) = self.fetcher.store().remove(&piece_key(*d)) {
                tracing::warn!(error = %e, "could not drop an unverified piece");
            }
        }
    }

    fn whole_failed(&self, digest: &str, actual: &str, from: Option<&Peer>, size: u64) {
        let source = if from.is_some() {
            Source::Peer
        } else {
            Source::Origin
        };
        tracing::error!(
            blob = digest,
            actual,
            peer = from.map(|p| p.id.0.as_str()),
            "the blob does not match its digest; response cut off, its new pieces dropped"
        );
        self.metrics
            .verification_failures
            .get_or_create(&source.label())
            .inc();
        self.metrics.aborted.inc();
        if let Some(network) = &self.network {
            network.report(
                from,
                digest,
                (0, size.max(1)),
                0,
                Duration::ZERO,
                pb::Outcome::VerificationFailed,
            );
        }
    }

    /// One piece, verified, through the fetch pipeline (memory, store, flight, peers,
    /// origin with this request's credentials).
    async fn piece(
        self: Arc<Self>,
        t: Target,
        table: Arc<PieceTable>,
        index: usize,
    ) -> Result<Piece, String> {
        let unit = piece_unit(&table, index);
        let wanted: Arc<dyn Wanted> = Arc::new(BlobPieces {
            table: table.clone(),
            origin: ForwardedOrigin {
                client: self.origin.clone(),
                reference: t.r.clone(),
                auth: t.auth.clone(),
            },
            mirror: self.clone(),
        });
        match self.fetcher.unit(&wanted, unit).await {
            Ok(got) => Ok(Piece {
                data: got.data,
                source: got.source,
                newly_cached: got.newly_stored,
            }),
            Err(why) => Err(format!("piece {index} of {}: {why}", table.blob.0)),
        }
    }

    fn count(&self, source: Source, bytes: usize) {
        self.metrics
            .bytes
            .get_or_create(&source.label())
            .inc_by(bytes as u64);
    }

    /// Streams the whole blob from the origin to the client, cutting it into pieces on
    /// the way; a match with the digest at the end makes them this node's table.
    async fn stream_from_origin(
        self: Arc<Self>,
        t: Target,
        digest: String,
        size: u64,
        flight: bool,
        tx: Sender,
    ) {
        let keepalive = match (&self.network, flight) {
            (Some(network), true) => {
                let (network, blob) = (network.clone(), digest.clone());
                Some(tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(FLIGHT_KEEPALIVE).await;
                        let _ = network.find_peers(&blob, (0, size.max(1))).await;
                    }
                }))
            }
            _ => None,
        };
        let started = Instant::now();
        let outcome = self.tee_origin(&t, &digest, size, &tx).await;
        if let Some(k) = keepalive {
            k.abort();
        }
        let (cutter, added) = match outcome {
            Ok(done) => done,
            Err((why, added)) => {
                tracing::warn!(
                    blob = digest,
                    why,
                    "streaming the blob from the origin failed"
                );
                self.drop_pieces(&added);
                if let Some(network) = &self.network {
                    // Ends this node's flight so another agent may try.
                    network.report(
                        None,
                        &digest,
                        (0, size.max(1)),
                        0,
                        started.elapsed(),
                        pb::Outcome::Connection,
                    );
                }
                return abort(&tx, &why).await;
            }
        };
        let mut added = added;
        let Cut {
            last,
            digest: actual,
            digests,
            len,
        } = cutter.finish();
        if let Some((d, piece)) = last {
            if self.put_piece(d, piece).await {
                added.push(d);
            }
        }
        if actual != digest || len != size {
            self.whole_failed(&digest, &actual, None, size);
            self.drop_pieces(&added);
            return abort(&tx, "the blob from the upstream does not match its digest").await;
        }
        let table = PieceTable {
            blob: BlobDigest(digest.clone()),
            size,
            piece_size: PIECE_SIZE,
            digests,
        };
        if let Err(e) = self.tables.put(&table) {
            tracing::warn!(blob = digest, error = %e, "could not record a piece table; the blob will not be offered to peers");
            return;
        }
        if let Some(network) = &self.network {
            let pieces = (0..table.digests.len())
                .map(|i| (piece_key(table.digests[i]), table.piece_range(i)));
            network.held(&digest, pieces);
            network.report(
                None,
                &digest,
                (0, size.max(1)),
                size,
                started.elapsed(),
                pb::Outcome::Ok,
            );
        }
        tracing::info!(
            blob = digest,
            size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "blob fetched from the origin and verified"
        );
    }

    /// The origin stream itself: bytes go to the client as they come, a body cut off is
    /// resumed with a Range request. Returns the cutter and the pieces it cached.
    async fn tee_origin(
        &self,
        t: &Target,
        digest: &str,
        size: u64,
        tx: &Sender,
    ) -> Result<(Cutter, Vec<[u8; 32]>), (String, Vec<[u8; 32]>)> {
        let mut cutter = Cutter::new(PIECE_SIZE);
        let mut added = Vec::new();
        let mut resumes = 0;
        'request: loop {
            let pos = cutter.len;
            let mut headers = HeaderMap::new();
            if pos > 0 {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes={pos}-")) {
                    headers.insert(RANGE, v);
                }
            }
            let resp = self
                .origin
                .forward(
                    &t.r,
                    Method::GET,
                    &format!("blobs/{digest}"),
                    headers,
                    t.auth.clone(),
                )
                .await;
            let mut resp = match resp {
                Ok(r) => r,
                Err(e) => return Err((e.to_string(), added)),
            };
            let status = resp.status();
            // A resumed request answered with the whole body: skip what was sent.
            let mut skip = match (pos, status) {
                (0, StatusCode::OK) | (_, StatusCode::PARTIAL_CONTENT) => 0,
                (p, StatusCode::OK) => p,
                (_, s) => return Err((format!("upstream answered {s}"), added)),
            };
            loop {
                match resp.chunk().await {
                    Ok(Some(mut bytes)) => {
                        if skip > 0 {
                            let n = skip.min(bytes.len() as u64);
                            skip -= n;
                            bytes = bytes.slice(n as usize..);
                            if bytes.is_empty() {
                                continue;
                            }
                        }
                        if cutter.len + bytes.len() as u64 > size {
                            return Err((
                                "the upstream sent more than the blob's size".into(),
                                added,
                            ));
                        }
                        for (d, piece) in cutter.push(&bytes) {
                            if self.put_piece(d, piece).await {
                                added.push(d);
                            }
                        }
                        self.count(Source::Origin, bytes.len());
                        if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                            return Err(("the client went away".into(), added));
                        }
                    }
                    Ok(None) => return Ok((cutter, added)),
                    Err(e) if resumes < RESUMES => {
                        resumes += 1;
                        tracing::debug!(blob = digest, at = cutter.len, error = %e, "origin body cut off; resuming");
                        continue 'request;
                    }
                    Err(e) => return Err((format!("upstream body cut off: {e}"), added)),
                }
            }
        }
    }

    /// Caches a piece this node cut; `true` if it was not cached before.
    async fn put_piece(&self, digest: [u8; 32], piece: Vec<u8>) -> bool {
        let store = self.fetcher.store().clone();
        let key = piece_key(digest);
        fetch::blocking(move || !store.contains(&key) && store.put(&key, &piece).is_ok())
            .await
            .unwrap_or(false)
    }

    /// Relays the blob (or its HEAD, or a part) straight from the upstream.
    async fn proxy(&self, t: &Target, digest: &str, head: bool, range: Option<String>) -> Response {
        let mut headers = HeaderMap::new();
        if let Some(v) = range.and_then(|r| HeaderValue::from_str(&r).ok()) {
            headers.insert(RANGE, v);
        }
        let method = if head { Method::HEAD } else { Method::GET };
        let resp = match self
            .origin
            .forward(
                &t.r,
                method,
                &format!("blobs/{digest}"),
                headers,
                t.auth.clone(),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e.to_string()),
        };
        let status = resp.status();
        let headers = relayed(resp.headers());
        if head {
            return empty(status, headers);
        }
        let (out, tx) = streaming(status, headers);
        tokio::spawn(async move {
            let mut resp = resp;
            loop {
                match resp.chunk().await {
                    Ok(Some(bytes)) => {
                        if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => return abort(&tx, &e.to_string()).await,
                }
            }
        });
        out
    }
}

/// Piece `index` of a blob as a unit of the fetch pipeline: stored as it is, checked
/// against the table's sha256.
fn piece_unit(table: &PieceTable, index: usize) -> Unit {
    let (start, end) = table.piece_range(index);
    let len = (end - start) as u32;
    Unit {
        key: piece_key(table.digests[index]),
        index: index as u32,
        blob: 0,
        offset: start,
        stored_size: len,
        compression: Compression::None,
        size: len,
        span: None,
    }
}

/// The pieces of one blob, as the fetch pipeline sees them: fetched one at a time
/// (the response's window keeps several in flight), kept out of memory, offered to
/// peers as soon as each is verified against the table. That risks nothing: a piece is
/// stored under its own digest, and a peer asks for it by the digest in its own table
/// and checks what it gets. A table a lying holder gave names digests no honest table
/// names (peers asking here find nothing and rank this node down), and the blob's
/// digest fails at the end, which drops the pieces again.
struct BlobPieces {
    table: Arc<PieceTable>,
    origin: ForwardedOrigin,
    /// For its verification-failure metric.
    mirror: Arc<Mirror>,
}

impl Wanted for BlobPieces {
    fn name(&self) -> String {
        self.table.blob.0.clone()
    }

    fn blob(&self, _unit: &Unit) -> &str {
        &self.table.blob.0
    }

    fn next_in_blob(&self, _unit: &Unit) -> Option<Unit> {
        None
    }

    fn origin(&self) -> &dyn Origin {
        &self.origin
    }

    fn keep_in_memory(&self) -> bool {
        false
    }

    fn observe(&self, event: Event) {
        if let Event::VerificationFailed(source) = event {
            self.mirror
                .metrics
                .verification_failures
                .get_or_create(&source.label())
                .inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Ok(Some((0, 10))));
        assert_eq!(parse_range("bytes=90-", 100), Ok(Some((90, 100))));
        assert_eq!(parse_range("bytes=-10", 100), Ok(Some((90, 100))));
        assert_eq!(parse_range("bytes=95-200", 100), Ok(Some((95, 100))));
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(parse_range("items=0-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=100-", 100), Err(()));
        assert_eq!(parse_range("bytes=5-2", 100), Err(()));
        assert_eq!(parse_range("bytes=x-2", 100), Err(()));
    }
}
