//! The registry mirror: containerd pulls *any* image through the node's agent
//! (`tessera agent --mirror-listen ADDR`, named in containerd's `hosts.toml` by
//! `tessera containerd-config`), so plain OCI images travel peer-to-peer too.
//!
//! It speaks the read side of the distribution API. Each request goes to the upstream
//! registry named by containerd's `ns` query parameter (or `mirror.default_registry`),
//! so one endpoint serves every registry.
//!
//! - `/v2/` answers itself; manifests and tag lists are proxied to the upstream with the
//!   request's own `Authorization` (a 401 goes back with the upstream's challenge, which
//!   containerd answers). Manifests by digest are checked against the digest and kept
//!   briefly per credential.
//! - Blobs ([`blob`]) are served in pieces through the swarm: cache → peers → origin,
//!   with the scheduler's single flight, every piece checked against the piece table
//!   and the whole blob against its digest before the response completes.
//! - Access ([`access`]): cached and peer bytes are served only after the upstream said
//!   this request's credentials may read the blob. Credentials never leave the
//!   request's path to its upstream: not to the scheduler, not to peers, not to logs.
//! - When the swarm cannot help (P2P off, the scheduler down, no peer), blobs stream
//!   straight from the upstream, verified on the way: a node never loses the ability
//!   to pull.
//! - Tags are resolved at the upstream on every request (a tag can move). Only with
//!   `mirror.last_known_secs` set, and only while the upstream cannot be reached (no
//!   connection, or a 5xx after the client's retries), does the mirror answer from
//!   what the upstream last told the same credential within that time: the tag's
//!   digest, the manifest by digest, its yes to reading a blob. Nodes then start from
//!   the swarm while the registry is down; a credential the registry never accepted
//!   still gets nothing.

mod access;
mod blob;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::pieces::PieceTables;
use crate::config::MirrorConfig;
use crate::fetch::{Fetcher, Source, SourceLabel};
use crate::peer::Network;
use crate::registry::client::{RegistryClient, MANIFEST_MEDIA_TYPES};
use crate::registry::image::is_sha256_digest as is_sha256;
use crate::registry::reference::Reference;
use access::{fingerprint, AccessCache};

type Body = BoxBody<Bytes, std::io::Error>;
type Response = hyper::Response<Body>;

/// Largest manifest or tag list relayed (they are small JSON documents).
const MAX_DOCUMENT: usize = 4 << 20;

/// Most manifests kept in memory.
const MAX_MANIFESTS: usize = 1024;

pub(crate) const DOCKER_CONTENT_DIGEST: HeaderName =
    HeaderName::from_static("docker-content-digest");

/// Headers of an upstream response worth relaying to the client.
const RELAYED: [&str; 7] = [
    "content-type",
    "content-length",
    "content-range",
    "docker-content-digest",
    "www-authenticate",
    "etag",
    "accept-ranges",
];

/// The mirror. Shared by every connection.
#[derive(Debug)]
pub struct Mirror {
    origin: Arc<RegistryClient>,
    /// The fetch pipeline pieces come through (its store holds them).
    fetcher: Arc<Fetcher>,
    tables: Arc<PieceTables>,
    network: Option<Arc<Network>>,
    config: MirrorConfig,
    access: AccessCache,
    /// Manifests by (credential, registry, repository, digest): media type and bytes.
    manifests: Mutex<HashMap<ManifestKey, (String, Bytes, Instant)>>,
    /// What each tag last resolved to, by (credential, registry, repository, tag):
    /// for `mirror.last_known_secs`.
    tags: Mutex<HashMap<ManifestKey, KnownTag>>,
    /// Requests answered since start.
    answered: std::sync::atomic::AtomicU64,
    pub metrics: MirrorMetrics,
}

type ManifestKey = ([u8; 32], String, String, String);

/// A tag's answer from the upstream: the manifest's digest, media type and size.
#[derive(Debug, Clone)]
struct KnownTag {
    digest: String,
    media: String,
    len: u64,
    at: Instant,
}

/// Where a request goes upstream, and with what credentials.
#[derive(Debug, Clone)]
struct Target {
    /// Registry and repository (no tag or digest).
    r: Reference,
    /// The request's `Authorization` value, passed to the upstream only.
    auth: Option<String>,
}

/// Prometheus metrics of the mirror.
#[derive(Debug, Default)]
pub struct MirrorMetrics {
    /// Requests answered, by kind (`manifest`, `blob`, `tags`, `base`, `other`) and
    /// HTTP status.
    pub requests: Family<RequestLabel, Counter>,
    /// Blob bytes served, by where they came from.
    pub bytes: Family<SourceLabel, Counter>,
    /// Pieces or whole blobs that failed verification, by source.
    pub verification_failures: Family<SourceLabel, Counter>,
    /// Responses cut off because a blob failed its digest (containerd retries).
    pub aborted: Counter,
    /// Answers given from what the upstream said earlier, because it could not be
    /// reached (`mirror.last_known_secs`).
    pub last_known: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    kind: &'static str,
    code: u16,
}

impl MirrorMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_agent_mirror_requests",
            "Registry mirror requests answered, by kind and HTTP status",
            self.requests.clone(),
        );
        registry.register(
            "tessera_agent_mirror_blob_bytes",
            "Blob bytes the registry mirror served, by source",
            self.bytes.clone(),
        );
        registry.register(
            "tessera_agent_mirror_verification_failures",
            "Blob pieces or whole blobs that failed verification in the mirror, by source",
            self.verification_failures.clone(),
        );
        registry.register(
            "tessera_agent_mirror_aborted_responses",
            "Mirror responses cut off because the blob failed its digest",
            self.aborted.clone(),
        );
        registry.register(
            "tessera_agent_mirror_last_known_answers",
            "Answers (a tag's digest, a manifest, a blob's access) the mirror gave from what the upstream said earlier, because it could not be reached",
            self.last_known.clone(),
        );
    }
}

/// What `tessera status` shows of the mirror.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MirrorStatus {
    pub requests: u64,
    /// Blob bytes served, by source.
    pub bytes_by_source: HashMap<String, u64>,
    pub aborted_responses: u64,
}

/// An OCI error document.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message }] });
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    full(status, headers, Bytes::from(body.to_string()))
}

fn full(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
    let mut resp = hyper::Response::new(Full::new(body).map_err(|e| match e {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().extend(headers);
    api_version(resp)
}

fn empty(status: StatusCode, headers: HeaderMap) -> Response {
    let mut resp = hyper::Response::new(Empty::new().map_err(|e| match e {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().extend(headers);
    api_version(resp)
}

fn api_version(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        "docker-distribution-api-version",
        HeaderValue::from_static("registry/2.0"),
    );
    resp
}

/// The headers of an upstream response the client should see.
fn relayed(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in RELAYED {
        for v in upstream.get_all(name) {
            out.append(HeaderName::from_static(name), v.clone());
        }
    }
    out
}

/// The error code the distribution spec uses for an upstream status.
fn code_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "UNAUTHORIZED",
        403 => "DENIED",
        404 => "NAME_UNKNOWN",
        429 => "TOOMANYREQUESTS",
        _ => "UNKNOWN",
    }
}

/// A repository name as the distribution spec allows it (lowercase components of
/// `[a-z0-9._-]` separated by `/`).
fn valid_repository(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        })
}

/// A registry host as `ns` names it (`host[:port]`).
fn valid_registry(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

/// `true` for `sha256:` and 64 lowercase hex digits.
/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Base,
    Manifest { name: &'a str, reference: &'a str },
    Blob { name: &'a str, digest: &'a str },
    Tags { name: &'a str },
}

fn route(path: &str) -> Option<Route<'_>> {
    if path == "/v2" || path == "/v2/" {
        return Some(Route::Base);
    }
    let rest = path.strip_prefix("/v2/")?;
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return Some(Route::Tags { name });
    }
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        return Some(Route::Manifest { name, reference });
    }
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        // Uploads (`blobs/uploads/…`) are for pushing: not a mirror's business.
        if !digest.contains('/') {
            return Some(Route::Blob { name, digest });
        }
    }
    None
}

impl Mirror {
    pub fn new(
        origin: Arc<RegistryClient>,
        fetcher: Arc<Fetcher>,
        tables: Arc<PieceTables>,
        network: Option<Arc<Network>>,
        config: MirrorConfig,
    ) -> Self {
        Mirror {
            access: AccessCache::new(
                Duration::from_secs(config.access_ttl_secs),
                Duration::from_secs(config.last_known_secs),
            ),
            origin,
            fetcher,
            tables,
            network,
            config,
            manifests: Mutex::new(HashMap::new()),
            tags: Mutex::new(HashMap::new()),
            answered: Default::default(),
            metrics: MirrorMetrics::default(),
        }
    }

    pub fn status(&self) -> MirrorStatus {
        let requests = self.answered.load(std::sync::atomic::Ordering::Relaxed);
        let bytes_by_source = [Source::Cache, Source::Peer, Source::Origin]
            .into_iter()
            .map(|s| {
                let label = s.label();
                (
                    label.name().to_string(),
                    self.metrics.bytes.get_or_create(&label).get(),
                )
            })
            .collect();
        MirrorStatus {
            requests,
            bytes_by_source,
            aborted_responses: self.metrics.aborted.get(),
        }
    }

    /// Serves the mirror on `listener` until the task is dropped, taking connections
    /// through `gate`; a request head must arrive within `idle`, also between requests.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        gate: tessera_proto::listen::Gate,
        idle: Duration,
    ) {
        loop {
            let stream = gate.accept(&listener).await;
            let mirror = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let mirror = mirror.clone();
                    async move { Ok::<_, Infallible>(mirror.handle(req).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(idle)
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(error = %e, "mirror connection ended");
                }
            });
        }
    }

    /// Answers one request.
    pub async fn handle<B>(self: Arc<Self>, req: hyper::Request<B>) -> Response {
        let (kind, resp) = self.answer(&req).await;
        let code = resp.status().as_u16();
        self.answered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics
            .requests
            .get_or_create(&RequestLabel { kind, code })
            .inc();
        resp
    }

    async fn answer<B>(self: &Arc<Self>, req: &hyper::Request<B>) -> (&'static str, Response) {
        let method = req.method().clone();
        let Some(route) = route(req.uri().path()) else {
            return (
                "other",
                error(
                    StatusCode::NOT_FOUND,
                    "NOT_FOUND",
                    "not a distribution API path",
                ),
            );
        };
        if method != Method::GET && method != Method::HEAD {
            return (
                "other",
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "UNSUPPORTED",
                    "this is a pull-only registry mirror",
                ),
            );
        }
        let query = req.uri().query().unwrap_or("");
        let mut ns = None;
        let mut rest: Vec<(String, String)> = Vec::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            if k == "ns" {
                ns = Some(v.into_owned());
            } else {
                rest.push((k.into_owned(), v.into_owned()));
            }
        }
        let registry = ns.unwrap_or_else(|| self.config.default_registry.clone());
        if !valid_registry(&registry) {
            return (
                "other",
                error(
                    StatusCode::BAD_REQUEST,
                    "UNSUPPORTED",
                    "invalid ns parameter",
                ),
            );
        }
        let target = |name: &str| Target {
            r: Reference {
                registry: registry.clone(),
                repository: name.to_string(),
                tag: None,
                digest: None,
            },
            auth: req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        };
        let head = method == Method::HEAD;
        match route {
            Route::Base => (
                "base",
                full(StatusCode::OK, HeaderMap::new(), Bytes::from("{}")),
            ),
            Route::Manifest { name, .. } | Route::Blob { name, .. } | Route::Tags { name }
                if !valid_repository(name) =>
            {
                (
                    "other",
                    error(
                        StatusCode::BAD_REQUEST,
                        "NAME_INVALID",
                        "invalid repository name",
                    ),
                )
            }
            Route::Manifest { name, reference } => (
                "manifest",
                self.manifest(&target(name), reference, head, req.headers())
                    .await,
            ),
            Route::Tags { name } => {
                let mut tail = "tags/list".to_string();
                if !rest.is_empty() {
                    tail.push('?');
                    tail.push_str(
                        &form_urlencoded::Serializer::new(String::new())
                            .extend_pairs(&rest)
                            .finish(),
                    );
                }
                (
                    "tags",
                    self.relay(&target(name), &tail, head, HeaderMap::new())
                        .await,
                )
            }
            Route::Blob { name, digest } => {
                let range = req
                    .headers()
                    .get(hyper::header::RANGE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                (
                    "blob",
                    self.clone()
                        .blob(target(name), digest.to_string(), head, range)
                        .await,
                )
            }
        }
    }

    /// A manifest: from the short cache when asked by digest, else from the upstream
    /// (checked against the digest when asked by one).
    async fn manifest(
        &self,
        t: &Target,
        reference: &str,
        head: bool,
        request_headers: &HeaderMap,
    ) -> Response {
        let by_digest = is_sha256(reference);
        let key: ManifestKey = (
            fingerprint(t.auth.as_deref()),
            t.r.registry.clone(),
            t.r.repository.clone(),
            reference.to_string(),
        );
        let ttl = Duration::from_secs(self.config.manifest_ttl_secs);
        if by_digest {
            if let Some(kept) = self.kept_manifest(&key, head, ttl) {
                return kept;
            }
        }
        let mut headers = HeaderMap::new();
        for v in request_headers.get_all(ACCEPT) {
            headers.append(ACCEPT, v.clone());
        }
        if headers.is_empty() {
            headers.insert(ACCEPT, HeaderValue::from_static(MANIFEST_MEDIA_TYPES));
        }
        let tail = format!("manifests/{reference}");
        if !by_digest {
            return self.tag(t, key, head, headers).await;
        }
        if head {
            return self.relay(t, &tail, head, headers).await;
        }
        let last_known = Duration::from_secs(self.config.last_known_secs);
        let resp = match self
            .forward_or_last_known(t, Method::GET, &tail, headers, || {
                self.kept_manifest(&key, head, last_known)
            })
            .await
        {
            Ok(r) => r,
            Err(answer) => return answer,
        };
        let status = resp.status();
        let headers = relayed(resp.headers());
        let body = match read_bounded(resp).await {
            Ok(b) => b,
            Err(e) => return error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e),
        };
        if status == StatusCode::OK {
            let actual = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
            if actual != reference {
                tracing::error!(registry = %t.r.registry, repository = %t.r.repository, reference, actual, "upstream manifest does not match its digest");
                return error(
                    StatusCode::BAD_GATEWAY,
                    "MANIFEST_INVALID",
                    "the upstream's manifest does not match its digest",
                );
            }
            let media = headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            self.keep_manifest(key, media, body.clone());
        }
        let mut headers = headers;
        headers.remove(hyper::header::CONTENT_LENGTH);
        full(status, headers, body)
    }

    /// Forwards a request for `tail` upstream. When the upstream cannot answer (no
    /// connection, or a 5xx after the client's retries), `last_known` may answer in
    /// its place (`mirror.last_known_secs`); else its failure is the answer.
    async fn forward_or_last_known(
        &self,
        t: &Target,
        method: Method,
        tail: &str,
        headers: HeaderMap,
        last_known: impl FnOnce() -> Option<Response>,
    ) -> Result<reqwest::Response, Response> {
        let unreachable = match self
            .origin
            .forward(&t.r, method, tail, headers, t.auth.clone())
            .await
        {
            Ok(r) if !r.status().is_server_error() => return Ok(r),
            unreachable => unreachable,
        };
        if let Some(kept) = last_known() {
            tracing::info!(registry = %t.r.registry, repository = %t.r.repository, tail, "the upstream cannot be reached: answering with what it said last");
            self.metrics.last_known.inc();
            return Err(kept);
        }
        Err(match unreachable {
            Ok(r) => {
                let (status, mut headers) = (r.status(), relayed(r.headers()));
                headers.remove(hyper::header::CONTENT_LENGTH);
                match read_bounded(r).await {
                    Ok(body) => full(status, headers, body),
                    Err(e) => error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e),
                }
            }
            Err(e) => error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e.to_string()),
        })
    }

    fn keep_manifest(&self, key: ManifestKey, media: String, body: Bytes) {
        let mut cache = self.manifests.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_MANIFESTS {
            cache.clear();
        }
        cache.insert(key, (media, body, Instant::now()));
    }

    /// The answer from the manifests kept by digest, if one is younger than `within`.
    fn kept_manifest(&self, key: &ManifestKey, head: bool, within: Duration) -> Option<Response> {
        let (media, bytes) = self
            .manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .filter(|(_, _, at)| at.elapsed() < within)
            .map(|(media, bytes, _)| (media.clone(), bytes.clone()))?;
        let headers = manifest_headers(&media, &key.3, bytes.len() as u64);
        Some(if head {
            empty(StatusCode::OK, headers)
        } else {
            let mut headers = headers;
            headers.remove(hyper::header::CONTENT_LENGTH);
            full(StatusCode::OK, headers, bytes)
        })
    }

    /// A manifest by tag: always resolved at the upstream; what it said is remembered
    /// (and a GET's manifest kept by digest) for `mirror.last_known_secs`, which answers
    /// in its place only while it cannot be reached.
    async fn tag(&self, t: &Target, key: ManifestKey, head: bool, headers: HeaderMap) -> Response {
        let method = if head { Method::HEAD } else { Method::GET };
        let tail = format!("manifests/{}", key.3);
        let resp = match self
            .forward_or_last_known(t, method, &tail, headers, || {
                self.last_known_tag(&key, head)
            })
            .await
        {
            Ok(r) => r,
            Err(answer) => return answer,
        };
        let status = resp.status();
        let mut headers = relayed(resp.headers());
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let media = header("content-type").unwrap_or_default();
        let said_digest = header(DOCKER_CONTENT_DIGEST.as_str());
        let said_len = header("content-length").and_then(|l| l.parse::<u64>().ok());
        let body = if head {
            None
        } else {
            match read_bounded(resp).await {
                Ok(body) => Some(body),
                Err(e) => return error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e),
            }
        };
        if status == StatusCode::OK && self.config.last_known_secs > 0 {
            let known = match &body {
                Some(b) => Some((
                    format!("sha256:{}", hex::encode(Sha256::digest(b))),
                    b.len() as u64,
                )),
                None => said_digest.zip(said_len),
            };
            if let Some((digest, len)) = known {
                if let Some(b) = &body {
                    let by_digest = (key.0, key.1.clone(), key.2.clone(), digest.clone());
                    self.keep_manifest(by_digest, media.clone(), b.clone());
                }
                let mut tags = self.tags.lock().unwrap_or_else(|p| p.into_inner());
                if tags.len() >= MAX_MANIFESTS {
                    tags.clear();
                }
                tags.insert(
                    key,
                    KnownTag {
                        digest,
                        media,
                        len,
                        at: Instant::now(),
                    },
                );
            }
        }
        match body {
            None => empty(status, headers),
            Some(body) => {
                headers.remove(hyper::header::CONTENT_LENGTH);
                full(status, headers, body)
            }
        }
    }

    /// What the upstream last said of a tag to this credential, within
    /// `mirror.last_known_secs`: a HEAD's answer, or a GET's with the manifest kept.
    fn last_known_tag(&self, key: &ManifestKey, head: bool) -> Option<Response> {
        let within = Duration::from_secs(self.config.last_known_secs);
        let known = self
            .tags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .filter(|k| k.at.elapsed() < within)
            .cloned()?;
        if head {
            return Some(empty(
                StatusCode::OK,
                manifest_headers(&known.media, &known.digest, known.len),
            ));
        }
        let by_digest = (key.0, key.1.clone(), key.2.clone(), known.digest);
        self.kept_manifest(&by_digest, false, within)
    }

    /// Relays a small document (manifest by tag, tag list) or its HEAD from the
    /// upstream, with its status and headers.
    async fn relay(&self, t: &Target, tail: &str, head: bool, headers: HeaderMap) -> Response {
        let method = if head { Method::HEAD } else { Method::GET };
        let resp = match self
            .origin
            .forward(&t.r, method, tail, headers, t.auth.clone())
            .await
        {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e.to_string()),
        };
        let status = resp.status();
        let mut headers = relayed(resp.headers());
        if head {
            return empty(status, headers);
        }
        headers.remove(hyper::header::CONTENT_LENGTH);
        match read_bounded(resp).await {
            Ok(body) => full(status, headers, body),
            Err(e) => error(StatusCode::BAD_GATEWAY, "UNKNOWN", &e),
        }
    }
}

/// A manifest's headers: media type, digest, length.
fn manifest_headers(media: &str, digest: &str, len: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(media) {
        headers.insert(CONTENT_TYPE, v);
    }
    if let Ok(v) = HeaderValue::from_str(digest) {
        headers.insert(DOCKER_CONTENT_DIGEST, v);
    }
    headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(len));
    headers
}

/// Reads an upstream body of at most [`MAX_DOCUMENT`] bytes.
async fn read_bounded(mut resp: reqwest::Response) -> Result<Bytes, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("upstream body cut off: {e}"))?
    {
        if out.len() + chunk.len() > MAX_DOCUMENT {
            return Err(format!(
                "upstream document larger than {MAX_DOCUMENT} bytes"
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/v2/"), Some(Route::Base));
        assert_eq!(
            route("/v2/library/alpine/manifests/latest"),
            Some(Route::Manifest {
                name: "library/alpine",
                reference: "latest"
            })
        );
        assert_eq!(
            route("/v2/a/b/blobs/sha256:00"),
            Some(Route::Blob {
                name: "a/b",
                digest: "sha256:00"
            })
        );
        assert_eq!(route("/v2/a/tags/list"), Some(Route::Tags { name: "a" }));
        assert_eq!(route("/v2/a/blobs/uploads/x"), None);
        assert_eq!(route("/v1/a"), None);
        assert!(valid_repository("library/alpine"));
        assert!(!valid_repository("a/../b"));
        assert!(!valid_repository("A"));
        assert!(valid_registry("127.0.0.1:5000"));
        assert!(!valid_registry("a/b"));
    }
}
