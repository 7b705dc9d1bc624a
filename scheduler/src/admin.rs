//! The admin API: HTTP/JSON beside the gRPC service (`--admin-listen`), specified in
//! `docs/scheduler-admin-api.yaml`.
//!
//! - `GET /healthz` (the process answers) and `GET /readyz` (the gRPC service is up)
//!   need no token, so probes can use them.
//! - Everything else needs `Authorization: Bearer <token>`: the admin token for
//!   everything, the read token (if configured) for `GET`s only. Token files are read
//!   again on every request, so tokens rotate without a restart.
//! - `GET /metrics`: Prometheus text, `tessera_scheduler_*`.
//! - `GET /api/v1/hosts`, `/api/v1/hosts/{id}`, `/api/v1/blobs`, `/api/v1/images`,
//!   `/api/v1/stats`, `/api/v1/blocklist`.
//! - `POST /api/v1/hosts/{id}/block` and `/unblock`: a blocked host is never offered as
//!   a peer; the blocklist is kept in the store across restarts.
//! - `POST /api/v1/hosts/{id}/drain` and `/undrain`: a draining host is not offered
//!   as a peer (nor chosen for preheats) until it registers again, so its uploads run
//!   down before maintenance; not kept across restarts.
//! - `POST /api/v1/preheat`, `GET /api/v1/preheat[/{id}]`: preheat jobs
//!   ([`crate::preheat`]).
//!
//! Abuse is bounded: bodies over [`MAX_BODY`] are refused (413), at most
//! [`MAX_CONCURRENT`] requests are served at once (503 beyond), and every refusal is
//! JSON `{"error": "..."}` saying what was wrong.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tessera_proto::domain::HostId;
use tessera_proto::listen::Gate;
use tokio::sync::Semaphore;

use crate::preheat::{PreheatRequest, Preheats, Refusal, State};
use crate::store::Store;
use crate::swarm::Swarm;
use crate::Error;
use tessera_proto::auth::Token;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 << 10;

/// Requests served at once.
pub const MAX_CONCURRENT: usize = 64;

type Body = Full<Bytes>;

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Read,
    Admin,
}

/// Where the tokens are: read again at every request.
#[derive(Debug, Clone)]
pub struct AdminTokens {
    pub admin: PathBuf,
    pub read: Option<PathBuf>,
}

impl AdminTokens {
    /// Checks both files now, so a bad path fails at start rather than at the first
    /// request.
    pub fn check(&self) -> Result<(), Error> {
        for path in std::iter::once(&self.admin).chain(&self.read) {
            tessera_proto::auth::read_tokens(path).map_err(|cause| Error::TokenFile {
                path: path.clone(),
                cause,
            })?;
        }
        Ok(())
    }

    /// The scope `presented` grants, if any.
    fn scope(&self, presented: &str) -> Option<Scope> {
        // Any line of the file, so tokens rotate without refusing anyone.
        let matches = |path: &PathBuf| {
            tessera_proto::auth::read_tokens(path)
                .is_ok_and(|tokens| Token::matches_any(&tokens, presented))
        };
        if matches(&self.admin) {
            Some(Scope::Admin)
        } else if self.read.as_ref().is_some_and(matches) {
            Some(Scope::Read)
        } else {
            None
        }
    }
}

/// A TLS acceptor (rustls) for the admin listener from a PEM certificate chain and key:
/// the same files as the gRPC service's `--tls-cert` and `--tls-key`.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, Error> {
    tessera_proto::tls::acceptor(cert, key).map_err(|e| Error::Tls { reason: e.0 })
}

/// The admin API's shared state.
#[derive(Debug)]
pub struct Admin {
    swarm: Arc<Mutex<Swarm>>,
    preheats: Arc<Mutex<Preheats>>,
    store: Store,
    tokens: AdminTokens,
    started: Instant,
    limit: Semaphore,
    /// Set once the gRPC service listens.
    pub ready: std::sync::atomic::AtomicBool,
    /// The listeners' gates, whose refusals the metrics show.
    gates: std::sync::OnceLock<Vec<Gate>>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    // Compact: a 10,000-host list is megabytes already (the CLI prints it pretty).
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn refuse(status: StatusCode, why: &str) -> Response<Body> {
    json(status, &ErrorBody { error: why })
}

fn unauthorized(why: &str) -> Response<Body> {
    let mut resp = refuse(StatusCode::UNAUTHORIZED, why);
    resp.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tessera-scheduler\""),
    );
    resp
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

impl Admin {
    /// The admin API over `swarm`, with the blocklist in `store` (applied to the swarm
    /// now).
    pub fn new(
        swarm: Arc<Mutex<Swarm>>,
        preheats: Arc<Mutex<Preheats>>,
        store: Store,
        tokens: AdminTokens,
    ) -> Result<Arc<Admin>, Error> {
        tokens.check()?;
        {
            let mut s = swarm.lock().unwrap_or_else(|p| p.into_inner());
            for id in store.blocked()? {
                s.set_blocked(&HostId(id), true);
            }
        }
        Ok(Arc::new(Admin {
            swarm,
            preheats,
            store,
            tokens,
            started: Instant::now(),
            limit: Semaphore::new(MAX_CONCURRENT),
            ready: std::sync::atomic::AtomicBool::new(false),
            gates: std::sync::OnceLock::new(),
        }))
    }

    fn swarm(&self) -> std::sync::MutexGuard<'_, Swarm> {
        self.swarm.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn preheats(&self) -> std::sync::MutexGuard<'_, Preheats> {
        self.preheats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts the refusals of these listeners' gates in the metrics.
    pub fn count_refusals(&self, gates: Vec<Gate>) {
        let _ = self.gates.set(gates);
    }

    /// Serves plain HTTP on `listener` until the task is dropped, taking connections
    /// through `gate`; a request head must arrive within `idle`, also between requests.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        gate: Gate,
        idle: Duration,
    ) {
        loop {
            let stream = gate.accept(&listener).await;
            tokio::spawn(self.clone().serve_connection(stream, idle));
        }
    }

    /// Serves HTTPS on `listener` (see [`tls_acceptor`]) until the task is dropped.
    pub async fn serve_tls(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        gate: Gate,
        idle: Duration,
        tls: tokio_rustls::TlsAcceptor,
    ) {
        loop {
            let stream = gate.accept(&listener).await;
            let peer = stream.get_ref().peer_addr().ok();
            let (admin, tls) = (self.clone(), tls.clone());
            tokio::spawn(async move {
                // A client that never finishes its handshake must not hold a task.
                let handshake = tokio::time::timeout(Duration::from_secs(10), tls.accept(stream));
                match handshake.await {
                    Ok(Ok(stream)) => admin.serve_connection(stream, idle).await,
                    Ok(Err(e)) => {
                        tracing::debug!(?peer, error = %e, "admin API: TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(?peer, "admin API: TLS handshake timed out"),
                }
            });
        }
    }

    async fn serve_connection<IO>(self: Arc<Self>, io: IO, idle: Duration)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| {
            let admin = self.clone();
            async move { Ok::<_, Infallible>(admin.handle(req).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(idle)
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await;
    }

    /// Answers one request.
    pub async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        // Probes first, outside the concurrency limit: a busy API must not fail them.
        match (&parts.method, path.as_str()) {
            (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok\n".into(), "text/plain"),
            (&Method::GET, "/readyz") => {
                return if self.ready.load(std::sync::atomic::Ordering::Relaxed) {
                    text(StatusCode::OK, "ready\n".into(), "text/plain")
                } else {
                    refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: the gRPC service is not listening yet",
                    )
                };
            }
            _ => {}
        }
        let Ok(_permit) = self.limit.try_acquire() else {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many admin requests at once; try again",
            );
        };
        let presented = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(presented) = presented else {
            return unauthorized(
                "the admin API requires a bearer token (Authorization: Bearer <token>)",
            );
        };
        let Some(scope) = self.tokens.scope(presented) else {
            return unauthorized("the admin API refused the bearer token");
        };
        let needed = if matches!(parts.method, Method::GET | Method::HEAD) {
            Scope::Read
        } else {
            Scope::Admin
        };
        if scope < needed {
            return refuse(
                StatusCode::FORBIDDEN,
                "this token may only read; changes need the admin token",
            );
        }
        // Read whole but bounded, so a huge body is cut off with a clear answer.
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("request body larger than {MAX_BODY} bytes"),
                )
            }
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("could not read the request body: {e}"),
                )
            }
        };
        // HEAD is answered as GET (hyper sends no body for it).
        let method = if parts.method == Method::HEAD {
            Method::GET
        } else {
            parts.method.clone()
        };
        // The swarm's lock and the work under it keep this thread busy; on the
        // multi-threaded runtime, tell Tokio so the gRPC service keeps its workers.
        if tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread
        {
            tokio::task::block_in_place(|| self.route(&method, &path, &body))
        } else {
            self.route(&method, &path, &body)
        }
    }

    fn route(&self, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
        let now = Instant::now();
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        match (method, segments.as_slice()) {
            (&Method::GET, ["metrics"]) => text(
                StatusCode::OK,
                self.metrics(now),
                // What prometheus-client writes: OpenMetrics text.
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            // Each view is taken under the lock, then serialised without it.
            (&Method::GET, ["api", "v1", "hosts"]) => {
                let hosts = self.swarm().hosts(now);
                json(StatusCode::OK, &hosts)
            }
            (&Method::GET, ["api", "v1", "hosts", id]) => {
                let host = self.swarm().host(&HostId(id.to_string()), now);
                match host {
                    Some(h) => json(StatusCode::OK, &h),
                    None => refuse(StatusCode::NOT_FOUND, &format!("no registered host {id:?}")),
                }
            }
            (&Method::GET, ["api", "v1", "blobs"]) => {
                let blobs = self.swarm().blobs();
                json(StatusCode::OK, &blobs)
            }
            (&Method::GET, ["api", "v1", "images"]) => {
                let images = self.swarm().images();
                json(StatusCode::OK, &images)
            }
            (&Method::GET, ["api", "v1", "stats"]) => {
                let stats = self.swarm().stats(now);
                json(StatusCode::OK, &stats)
            }
            (&Method::GET, ["api", "v1", "blocklist"]) => match self.store.blocked() {
                Ok(list) => json(StatusCode::OK, &list),
                Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            },
            (&Method::POST, ["api", "v1", "hosts", id, action @ ("block" | "unblock")]) => {
                self.block(id, *action == "block", now)
            }
            (&Method::POST, ["api", "v1", "hosts", id, action @ ("drain" | "undrain")]) => {
                self.drain(id, *action == "drain", now)
            }
            (&Method::POST, ["api", "v1", "preheat"]) => self.preheat(body, now),
            (&Method::GET, ["api", "v1", "preheat"]) => {
                json(StatusCode::OK, &self.preheats().list())
            }
            (&Method::GET, ["api", "v1", "preheat", id]) => match self.preheats().get(id) {
                Some(job) => json(StatusCode::OK, job),
                None => refuse(StatusCode::NOT_FOUND, &format!("no preheat job {id:?}")),
            },
            (_, ["api", "v1", ..]) | (_, ["metrics"]) => refuse(
                StatusCode::NOT_FOUND,
                &format!("no such endpoint: {method} {path} (see docs/scheduler-admin-api.yaml)"),
            ),
            _ => refuse(StatusCode::NOT_FOUND, &format!("no such endpoint: {path}")),
        }
    }

    /// Starts a preheat job: `{"image", "count"?, "labels"?, "platform"?, "timeout_secs"?}`.
    fn preheat(&self, body: &[u8], now: Instant) -> Response<Body> {
        let request: PreheatRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("preheat request: {e} (expected {{\"image\": REF, \"count\": N}})"),
                )
            }
        };
        let candidates: Vec<_> = self
            .swarm()
            .hosts(now)
            .into_iter()
            .filter(|h| !h.blocked && !h.draining)
            .map(|h| (h.id, h.labels))
            .collect();
        match self.preheats().create(request, candidates) {
            Ok(job) => {
                tracing::warn!(job = %job.id, image = %job.image, hosts = job.hosts.len(), "admin: preheat started");
                json(StatusCode::ACCEPTED, &job)
            }
            Err(Refusal::Invalid(why)) => refuse(StatusCode::BAD_REQUEST, &why),
            Err(Refusal::NotEnoughHosts(why)) => refuse(StatusCode::CONFLICT, &why),
        }
    }

    fn drain(&self, id: &str, drain: bool, now: Instant) -> Response<Body> {
        let host = HostId(id.to_string());
        let view = {
            let mut swarm = self.swarm();
            swarm
                .set_draining(&host, drain, now)
                .ok()
                .and_then(|()| swarm.host(&host, now))
        };
        let Some(view) = view else {
            return refuse(
                StatusCode::NOT_FOUND,
                &format!("no registered host {id:?} (GET /api/v1/hosts lists them)"),
            );
        };
        tracing::warn!(
            host = id,
            draining = drain,
            "admin: host {}",
            if drain {
                "draining"
            } else {
                "no longer draining"
            }
        );
        json(StatusCode::OK, &view)
    }

    fn block(&self, id: &str, block: bool, now: Instant) -> Response<Body> {
        let host = HostId(id.to_string());
        if id.is_empty() || id.len() > 253 || id.chars().any(char::is_control) {
            return refuse(StatusCode::BAD_REQUEST, "invalid host id");
        }
        let changed = if block {
            // Only hosts the swarm knows: a typo must not silently block nobody.
            if !self.swarm().is_registered(&host, now) {
                return refuse(
                    StatusCode::NOT_FOUND,
                    &format!("no registered host {id:?} (GET /api/v1/hosts lists them)"),
                );
            }
            self.store.block(id)
        } else {
            self.store.unblock(id)
        };
        let changed = match changed {
            Ok(c) => c,
            Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        if !block && !changed {
            return refuse(
                StatusCode::NOT_FOUND,
                &format!("host {id:?} is not blocked"),
            );
        }
        self.swarm().set_blocked(&host, block);
        tracing::warn!(
            host = id,
            blocked = block,
            "admin: host {}",
            if block { "blocked" } else { "unblocked" }
        );
        #[derive(Serialize)]
        struct Answer<'a> {
            host: &'a str,
            blocked: bool,
            changed: bool,
        }
        json(
            StatusCode::OK,
            &Answer {
                host: id,
                blocked: block,
                changed,
            },
        )
    }

    /// Prometheus text exposition of the swarm's numbers, read at scrape time.
    fn metrics(&self, now: Instant) -> String {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        let s = self.swarm().stats(now);
        let c = s.counters;
        let mut registry = prometheus_client::registry::Registry::with_prefix("tessera_scheduler");
        let gauges = [
            ("hosts", "Registered hosts", s.hosts as i64),
            ("blobs", "Blobs held or being fetched", s.blobs as i64),
            (
                "blocked_hosts",
                "Hosts on the blocklist",
                s.blocked_hosts as i64,
            ),
            (
                "origin_fetches",
                "Origin fetches under way (single-flight)",
                s.active_origin_fetches as i64,
            ),
            (
                "active_uploads",
                "Uploads to peers the hosts reported in their last heartbeat",
                s.active_uploads as i64,
            ),
            (
                "uptime_seconds",
                "Seconds since the scheduler started",
                self.started.elapsed().as_secs() as i64,
            ),
        ];
        for (name, help, value) in gauges {
            let g = Gauge::<i64>::default();
            g.set(value);
            registry.register(name, help, g);
        }
        let labelled = [
            (
                "bytes",
                "Bytes agents reported fetching, by source",
                "source",
                vec![("peer", c.peer_bytes), ("origin", c.origin_bytes)],
            ),
            (
                "lookups",
                "Peer lookups answered, by decision",
                "decision",
                vec![
                    ("peers", c.lookups_peers),
                    ("origin", c.lookups_origin),
                    ("wait", c.lookups_wait),
                ],
            ),
        ];
        for (name, help, label, values) in labelled {
            let family = Family::<Vec<(String, String)>, Counter>::default();
            for (value_label, value) in values {
                family
                    .get_or_create(&vec![(label.to_string(), value_label.to_string())])
                    .inc_by(value);
            }
            registry.register(name, help, family);
        }
        let counters = [
            (
                "verification_failures",
                "Transfers reported as failing verification",
                c.verification_failures,
            ),
            (
                "failed_transfers",
                "Other failed transfers reported",
                c.failed_transfers,
            ),
        ];
        for (name, help, value) in counters {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            registry.register(name, help, counter);
        }
        let jobs = Family::<Vec<(String, String)>, Gauge>::default();
        let preheats = self.preheats();
        for state in State::ALL {
            jobs.get_or_create(&vec![("state".to_string(), state.name().to_string())])
                .set(preheats.count(state) as i64);
        }
        drop(preheats);
        registry.register("preheat_jobs", "Preheat jobs kept, by state", jobs);
        let refused = Family::<Vec<(String, String)>, Counter>::default();
        for gate in self.gates.get().into_iter().flatten() {
            refused
                .get_or_create(&vec![("listener".to_string(), gate.name().to_string())])
                .inc_by(gate.refused());
        }
        registry.register(
            "connections_refused",
            "Connections closed at once because their listener was at its cap",
            refused,
        );
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}
