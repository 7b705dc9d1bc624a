//! Scheduler benchmark on a swarm of 10,000 simulated hosts that each announced 1,000
//! blobs. The baseline, measured in the same run, is the same workload on a swarm of
//! 100 hosts: the ratios show what swarm size costs.
//!
//! - Peer lookups per second and their latency (p50, p99), in process against the
//!   `Swarm` itself, and through the real gRPC service on 127.0.0.1 with concurrent
//!   clients.
//! - The real admin API on 127.0.0.1, from concurrent clients on keep-alive HTTP/1.1
//!   connections: requests per second, latency and response size of
//!   `GET /api/v1/stats`, `GET /api/v1/hosts/{id}` (random hosts), `GET /api/v1/hosts`
//!   (the whole list, so fewer requests), `GET /metrics`, and `POST
//!   /api/v1/hosts/{id}/block` + `/unblock` pairs (each a sled write and flush).
//! - gRPC lookups while a client reads `GET /api/v1/hosts` in a loop, against lookups
//!   alone: the admin API and the gRPC service share one `Mutex<Swarm>`, so the ratio
//!   is what admin reads cost the hot path. A probe of `GET /healthz` every 50 ms
//!   shows whether the scheduler's runtime stays responsive meanwhile.
//!
//! The scheduler (both services over one swarm, wired as its binary wires them) runs on
//! a Tokio runtime of its own and the clients on another, like two processes sharing
//! the machine's cores.
//!
//! `make bench-scheduler`; `TESSERA_BENCH_SCALE=0.1` shrinks the big swarm, the lookup
//! and admin request counts (`0.02`, 200 hosts, is the smoke size: seconds). Each
//! workload stops after `TESSERA_BENCH_SCHEDULER_SECONDS` (default 8) even if it has
//! not sent all its requests, so a busy machine cannot stretch the run past ~3 minutes;
//! the figures say how many were sent. `TESSERA_BENCH_JSON=FILE` also writes the
//! figures as JSON (scenario "scheduler", rendered by `benches/scenarios/scheduler.py`).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tessera_benches::{
    fmt_bytes, fmt_duration, machine_summary, measure, peak_rss_bytes, ratio, scale, Rng, Table,
};
use tessera_proto::domain::{Announce, BlobDigest, BlobRanges, ByteRange, FindPeers, Host, HostId};
use tessera_proto::pb;
use tessera_scheduler::admin::{Admin, AdminTokens};
use tessera_scheduler::preheat::Preheats;
use tessera_scheduler::service::SchedulerService;
use tessera_scheduler::store::Store;
use tessera_scheduler::swarm::{Decision, Swarm, SwarmConfig};

const BLOBS: usize = 1_000;
/// Blobs are 64 MiB; hosts hold a few 1–8 MiB ranges of each.
const BLOB_BYTES: u64 = 64 << 20;
const MIB: u64 = 1 << 20;

fn blob(i: usize) -> BlobDigest {
    BlobDigest(format!("sha256:{i:064x}"))
}

fn host_id(i: usize) -> HostId {
    HostId(format!("node-{i:05}"))
}

/// A swarm of `hosts` hosts, each holding a few ranges of every one of the 1,000 blobs.
fn build(hosts: usize, rng: &mut Rng) -> (Swarm, Duration) {
    let now = Instant::now();
    let mut swarm = Swarm::new(SwarmConfig {
        lease: Duration::from_secs(3600),
        ..SwarmConfig::default()
    });
    let started = Instant::now();
    for h in 0..hosts {
        swarm.register(
            Host {
                id: host_id(h),
                address: format!("10.{}.{}.{}:7081", h >> 16, (h >> 8) & 255, h & 255)
                    .parse()
                    .unwrap(),
                labels: [("zone".to_string(), format!("zone-{}", h % 8))].into(),
                upload_limit_bps: None,
                max_uploads: 16,
            },
            now,
        );
        let held = (0..BLOBS)
            .map(|b| BlobRanges {
                blob: blob(b),
                ranges: (0..1 + rng.below(3))
                    .map(|_| {
                        let start = rng.below(BLOB_BYTES / MIB - 8) * MIB;
                        ByteRange {
                            start,
                            end: start + (1 + rng.below(8)) * MIB,
                        }
                    })
                    .collect(),
                size: Some(BLOB_BYTES),
            })
            .collect();
        swarm
            .announce(
                Announce {
                    host: host_id(h),
                    held,
                    dropped: Vec::new(),
                    full: false,
                    images: Vec::new(),
                },
                now,
            )
            .unwrap();
    }
    (swarm, started.elapsed())
}

/// How long one workload may run before it stops sending (it keeps what it measured).
fn workload_cap() -> Duration {
    let secs = std::env::var("TESSERA_BENCH_SCHEDULER_SECONDS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .unwrap_or(8.0);
    Duration::from_secs_f64(secs)
}

/// `full` requests at full scale, scaled like the swarm, at least `min`.
fn scaled(full: usize, min: usize) -> usize {
    ((full as f64 * scale()) as usize).max(min)
}

fn query(hosts: usize, rng: &mut Rng) -> FindPeers {
    let start = rng.below(BLOB_BYTES / MIB - 1) * MIB;
    FindPeers {
        host: host_id(rng.below(hosts as u64) as usize),
        blob: blob(rng.below(BLOBS as u64) as usize),
        range: ByteRange {
            start,
            end: start + MIB,
        },
    }
}

/// Throughput and latency of one workload.
#[derive(Clone)]
struct Figures {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// What a request yielded on average: for lookups the share answered with peers,
    /// for admin requests the bytes of the response.
    per_request: f64,
    requests: usize,
}

impl Figures {
    /// The figures as JSON fields: `<what>_per_s`, `p50_us`, `p99_us`, `<what>` (count).
    fn json(&self, what: &str) -> serde_json::Map<String, serde_json::Value> {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let mut m = serde_json::Map::new();
        m.insert(what.into(), self.requests.into());
        m.insert(format!("{what}_per_s"), self.per_sec.into());
        m.insert("p50_us".into(), us(self.p50).into());
        m.insert("p99_us".into(), us(self.p99).into());
        m
    }
}

fn figures(mut samples: Vec<Duration>, elapsed: Duration, total: f64) -> Figures {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    Figures {
        per_sec: samples.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        per_request: total / samples.len() as f64,
        requests: samples.len(),
    }
}

/// "12345", "12.3", "0.48": rates of slow requests keep their digits.
fn fmt_rate(per_sec: f64) -> String {
    if per_sec >= 100.0 {
        format!("{per_sec:.0}")
    } else if per_sec >= 10.0 {
        format!("{per_sec:.1}")
    } else {
        format!("{per_sec:.2}")
    }
}

/// Lookups straight on the swarm: the scheduler's own cost.
fn in_process(swarm: &mut Swarm, hosts: usize, lookups: usize) -> Figures {
    let mut rng = Rng::new(7);
    let queries: Vec<FindPeers> = (0..lookups).map(|_| query(hosts, &mut rng)).collect();
    let mut samples = Vec::with_capacity(lookups);
    let mut found = 0;
    let now = Instant::now();
    let started = Instant::now();
    let deadline = started + workload_cap();
    for q in &queries {
        if Instant::now() > deadline {
            break;
        }
        let t = Instant::now();
        let d = swarm.find_peers(q, now).unwrap();
        samples.push(t.elapsed());
        if matches!(d, Decision::Peers(_)) {
            found += 1;
        }
    }
    figures(samples, started.elapsed(), f64::from(found))
}

/// The admin token the benchmark's clients present.
const TOKEN: &str = "bench-admin-token";

/// The scheduler as its binary wires it: the gRPC service and the admin API over one
/// `Mutex<Swarm>`, on a runtime of their own.
struct Scheduler {
    /// Runs both services; dropping it stops them.
    _rt: tokio::runtime::Runtime,
    grpc: SocketAddr,
    admin: SocketAddr,
    /// The admin store (sled) and the token file; declared after the runtime, so the
    /// services stop before it is deleted.
    _dir: tempfile::TempDir,
}

fn start(swarm: Swarm) -> Scheduler {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let store = Store::open(&dir.path().join("state")).unwrap();
    let (grpc, admin) = rt.block_on(async move {
        let swarm = Arc::new(Mutex::new(swarm));
        let preheats = Arc::new(Mutex::new(Preheats::open(None).unwrap()));
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_addr = grpc.local_addr().unwrap();
        let service = SchedulerService::new(swarm.clone(), preheats.clone());
        // As the binary serves: TCP_NODELAY on accepted sockets (without it some answers
        // waited 40 ms on a delayed ACK; benches/README.md, scheduler section).
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::scheduler_server::SchedulerServer::new(service))
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)),
                ),
        );
        let tokens = AdminTokens {
            admin: token,
            read: None,
        };
        let admin = Admin::new(swarm, preheats, store, tokens).unwrap();
        admin.ready.store(true, Ordering::Relaxed);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = listener.local_addr().unwrap();
        let gate = tessera_proto::listen::Gate::new("admin", 4096, Duration::from_secs(30));
        tokio::spawn(admin.serve(listener, gate, Duration::from_secs(30)));
        (grpc_addr, admin_addr)
    });
    Scheduler {
        _rt: rt,
        grpc,
        admin,
        _dir: dir,
    }
}

/// Lookups through the gRPC service from `clients` concurrent clients.
async fn over_grpc(addr: SocketAddr, hosts: usize, lookups: usize, clients: usize) -> Figures {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let started = Instant::now();
    let deadline = started + workload_cap();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let mut client = pb::scheduler_client::SchedulerClient::new(channel.clone());
        let per_client = lookups / clients;
        tasks.spawn(async move {
            let mut rng = Rng::new(100 + c as u64);
            let mut samples = Vec::with_capacity(per_client);
            let mut found = 0;
            for _ in 0..per_client {
                if Instant::now() > deadline {
                    break;
                }
                let q = query(hosts, &mut rng);
                let t = Instant::now();
                let answer = client
                    .find_peers(pb::FindPeersRequest {
                        host_id: q.host.0,
                        blob: q.blob.0,
                        range: Some(q.range.into()),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                samples.push(t.elapsed());
                if answer.action == pb::Action::Peers as i32 {
                    found += 1;
                }
            }
            (samples, found)
        });
    }
    let mut samples = Vec::new();
    let mut found = 0;
    while let Some(r) = tasks.join_next().await {
        let (s, f) = r.unwrap();
        samples.extend(s);
        found += f;
    }
    figures(samples, started.elapsed(), f64::from(found))
}

/// One keep-alive HTTP/1.1 connection to the admin API.
struct AdminClient {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl AdminClient {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        AdminClient { sender }
    }

    /// Sends one request and reads the whole answer; returns its size. Anything but
    /// 200 fails the benchmark: a refusal measured as a success would flatter it.
    async fn send(&mut self, method: Method, path: &str) -> usize {
        self.sender.ready().await.unwrap();
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, "127.0.0.1")
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Empty::new())
            .unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            status,
            StatusCode::OK,
            "{method} {path}: {}",
            String::from_utf8_lossy(&body)
        );
        body.len()
    }
}

/// The admin requests measured.
#[derive(Debug, Clone, Copy)]
enum AdminOp {
    Stats,
    Host,
    Hosts,
    Metrics,
    BlockUnblock,
}

const ADMIN_OPS: [AdminOp; 5] = [
    AdminOp::Stats,
    AdminOp::Host,
    AdminOp::Hosts,
    AdminOp::Metrics,
    AdminOp::BlockUnblock,
];

/// Concurrent admin clients, each on its own connection: a few dashboards and scripts,
/// well under the API's limit of requests served at once.
const ADMIN_CLIENTS: usize = 4;

impl AdminOp {
    fn label(self) -> &'static str {
        match self {
            AdminOp::Stats => "GET /api/v1/stats",
            AdminOp::Host => "GET /api/v1/hosts/{id}",
            AdminOp::Hosts => "GET /api/v1/hosts",
            AdminOp::Metrics => "GET /metrics",
            AdminOp::BlockUnblock => "POST …/block, …/unblock",
        }
    }

    /// Requests at full scale: few for the whole host list, which takes seconds with
    /// 10,000 hosts; block and unblock wait for a sled flush each.
    fn requests(self) -> usize {
        let full = match self {
            AdminOp::Stats | AdminOp::Host | AdminOp::Metrics => 20_000,
            AdminOp::Hosts => 20,
            AdminOp::BlockUnblock => 2_000,
        };
        scaled(full, ADMIN_CLIENTS * 2)
    }
}

/// `op` against the admin API from [`ADMIN_CLIENTS`] concurrent connections; block
/// and unblock are timed as separate requests.
async fn admin_load(addr: SocketAddr, op: AdminOp, hosts: usize) -> Figures {
    let mut conns = Vec::with_capacity(ADMIN_CLIENTS);
    for _ in 0..ADMIN_CLIENTS {
        conns.push(AdminClient::connect(addr).await);
    }
    let per_client = op.requests() / ADMIN_CLIENTS;
    let started = Instant::now();
    let deadline = started + workload_cap();
    let mut tasks = tokio::task::JoinSet::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut rng = Rng::new(200 + c as u64);
            let mut samples = Vec::with_capacity(per_client);
            let mut bytes = 0;
            while samples.len() < per_client && Instant::now() <= deadline {
                let random_host = |rng: &mut Rng| host_id(rng.below(hosts as u64) as usize).0;
                let requests = match op {
                    AdminOp::Stats => vec![(Method::GET, "/api/v1/stats".to_string())],
                    AdminOp::Host => vec![(
                        Method::GET,
                        format!("/api/v1/hosts/{}", random_host(&mut rng)),
                    )],
                    AdminOp::Hosts => vec![(Method::GET, "/api/v1/hosts".to_string())],
                    AdminOp::Metrics => vec![(Method::GET, "/metrics".to_string())],
                    AdminOp::BlockUnblock => {
                        // Each client blocks only its own hosts (c, c + clients, …), so
                        // its unblock always finds its block.
                        let mine = (hosts / ADMIN_CLIENTS) as u64;
                        let id = host_id(c + ADMIN_CLIENTS * rng.below(mine) as usize).0;
                        ["block", "unblock"]
                            .map(|a| (Method::POST, format!("/api/v1/hosts/{id}/{a}")))
                            .to_vec()
                    }
                };
                for (method, path) in requests {
                    let t = Instant::now();
                    bytes += conn.send(method, &path).await;
                    samples.push(t.elapsed());
                }
            }
            (samples, bytes)
        });
    }
    let mut samples = Vec::new();
    let mut bytes = 0;
    while let Some(r) = tasks.join_next().await {
        let (s, b) = r.unwrap();
        samples.extend(s);
        bytes += b;
    }
    figures(samples, started.elapsed(), bytes as f64)
}

/// Requests for `path` on one connection, `pause` apart, until `stop` is set (at least
/// one).
fn background(
    addr: SocketAddr,
    path: &'static str,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Figures> {
    tokio::spawn(async move {
        let mut conn = AdminClient::connect(addr).await;
        let (mut samples, mut bytes) = (Vec::new(), 0);
        let started = Instant::now();
        loop {
            let t = Instant::now();
            bytes += conn.send(Method::GET, path).await;
            samples.push(t.elapsed());
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        figures(samples, started.elapsed(), bytes as f64)
    })
}

/// gRPC lookups, and what the admin API answered meanwhile.
struct Beside {
    lookups: Figures,
    /// `GET /api/v1/hosts` back to back, when the lookups ran beside them.
    reads: Option<Figures>,
    /// `GET /healthz` every 50 ms, as a liveness probe would (no lock, no token).
    probes: Figures,
}

/// gRPC lookups from `clients` concurrent clients, beside one admin client reading
/// `GET /api/v1/hosts` back to back if `reads`, and a probe of `GET /healthz`.
async fn lookups_beside(
    s: &Scheduler,
    hosts: usize,
    lookups: usize,
    clients: usize,
    reads: bool,
) -> Beside {
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Duration::from_millis(50);
    let probes = background(s.admin, "/healthz", pause, stop.clone());
    let reads = reads.then(|| background(s.admin, "/api/v1/hosts", Duration::ZERO, stop.clone()));
    let found = over_grpc(s.grpc, hosts, lookups, clients).await;
    stop.store(true, Ordering::Relaxed);
    Beside {
        lookups: found,
        reads: match reads {
            Some(r) => Some(r.await.unwrap()),
            None => None,
        },
        probes: probes.await.unwrap(),
    }
}

/// Everything measured against one running scheduler.
struct Served {
    grpc: Beside,
    admin: Vec<(AdminOp, Figures)>,
    contended: Beside,
}

const GRPC_LOOKUPS: usize = 40_000;
const GRPC_CLIENTS: usize = 8;
/// Lookups while the host list is read back to back: few, because with 10,000 hosts
/// each read holds the swarm's lock for seconds and the lookups wait.
const CONTENDED_LOOKUPS: usize = 400;

fn serve_and_measure(clients: &tokio::runtime::Runtime, swarm: Swarm, hosts: usize) -> Served {
    let s = start(swarm);
    clients.block_on(async {
        let lookups = scaled(GRPC_LOOKUPS, 800);
        let grpc = lookups_beside(&s, hosts, lookups, GRPC_CLIENTS, false).await;
        let mut admin = Vec::new();
        for op in ADMIN_OPS {
            admin.push((op, admin_load(s.admin, op, hosts).await));
        }
        let lookups = scaled(CONTENDED_LOOKUPS, 80);
        let contended = lookups_beside(&s, hosts, lookups, GRPC_CLIENTS, true).await;
        Served {
            grpc,
            admin,
            contended,
        }
    })
}

fn main() {
    println!("{}", machine_summary());
    let big = ((10_000.0 * scale()) as usize).max(200);
    let small = 100;
    let mut rng = Rng::new(42);
    let rss_before = peak_rss_bytes().unwrap_or(0);
    let (mut baseline, _) = build(small, &mut rng);
    let (mut swarm, build_time) = build(big, &mut rng);
    let rss = peak_rss_bytes().unwrap_or(0).saturating_sub(rss_before);

    let lookups = scaled(200_000, 2_000);
    let base = in_process(&mut baseline, small, lookups);
    let local = in_process(&mut swarm, big, lookups);
    // What `GET /api/v1/hosts` does under the swarm's lock before it serialises.
    let list_small = measure(3, || baseline.hosts(Instant::now()));
    let list_big = measure(3, || swarm.hosts(Instant::now()));

    let clients = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let base_served = serve_and_measure(&clients, baseline, small);
    let served = serve_and_measure(&clients, swarm, big);

    let mut t = Table::new(
        &format!("peer lookups: {big} hosts × {BLOBS} blobs vs a {small}-host baseline"),
        &[
            "path",
            "swarm",
            "lookups/s",
            "p50",
            "p99",
            "answered with peers",
            "vs baseline (lookups/s)",
        ],
    );
    let row = |t: &mut Table, path: &str, hosts: usize, f: &Figures, b: &Figures| {
        t.row(vec![
            path.into(),
            format!("{hosts} hosts"),
            format!("{:.0}", f.per_sec),
            format!("{:.1} µs", f.p50.as_secs_f64() * 1e6),
            format!("{:.1} µs", f.p99.as_secs_f64() * 1e6),
            format!("{:.0}%", f.per_request * 100.0),
            ratio(f.per_sec / b.per_sec),
        ]);
    };
    let grpc = format!("gRPC, {GRPC_CLIENTS} clients");
    row(&mut t, "in process", small, &base, &base);
    row(&mut t, "in process", big, &local, &base);
    let base_grpc = &base_served.grpc.lookups;
    row(&mut t, &grpc, small, base_grpc, base_grpc);
    row(&mut t, &grpc, big, &served.grpc.lookups, base_grpc);
    t.note(format!(
        "{} holdings ({big} hosts × {BLOBS} blobs) built in {:.1} s; memory for the big swarm ≈ {}",
        big * BLOBS,
        build_time.as_secs_f64(),
        fmt_bytes(rss)
    ));
    t.note("a lookup asks for 1 MiB of a random blob from a random host; each host holds 1-3 ranges of 1-8 MiB per 64 MiB blob");
    t.print();

    let mut t = Table::new(
        &format!(
            "admin API, {ADMIN_CLIENTS} keep-alive clients: {big} hosts vs a {small}-host baseline"
        ),
        &[
            "request",
            "swarm",
            "requests",
            "requests/s",
            "p50",
            "p99",
            "response",
            "vs baseline (requests/s)",
        ],
    );
    for ((op, b), (_, f)) in base_served.admin.iter().zip(&served.admin) {
        for (hosts, f) in [(small, b), (big, f)] {
            t.row(vec![
                op.label().into(),
                format!("{hosts} hosts"),
                f.requests.to_string(),
                fmt_rate(f.per_sec),
                fmt_duration(f.p50),
                fmt_duration(f.p99),
                fmt_bytes(f.per_request as u64),
                ratio(f.per_sec / b.per_sec),
            ]);
        }
    }
    t.note("every request carries the admin token (the API reads its token file on each request); block and unblock each write the blocklist to sled and flush it, and are counted as two requests");
    t.note(format!(
        "Swarm::hosts() alone, in process (built under the swarm's lock, before serialising): {} for {small} hosts, {} for {big} hosts",
        fmt_duration(list_small.median),
        fmt_duration(list_big.median)
    ));
    t.print();

    let mut t = Table::new(
        &format!(
            "gRPC lookups ({GRPC_CLIENTS} clients) while one admin client reads GET /api/v1/hosts back to back"
        ),
        &[
            "admin load",
            "swarm",
            "lookups",
            "lookups/s",
            "p50",
            "p99",
            "host lists read meanwhile",
            "GET /healthz p50 / p99",
            "vs lookups alone (lookups/s)",
        ],
    );
    for (hosts, s) in [(small, &base_served), (big, &served)] {
        for (label, b) in [
            ("none", &s.grpc),
            ("GET /api/v1/hosts in a loop", &s.contended),
        ] {
            let f = &b.lookups;
            t.row(vec![
                label.into(),
                format!("{hosts} hosts"),
                f.requests.to_string(),
                fmt_rate(f.per_sec),
                fmt_duration(f.p50),
                fmt_duration(f.p99),
                b.reads.as_ref().map_or("-".into(), |r| {
                    format!("{}/s, p50 {}", fmt_rate(r.per_sec), fmt_duration(r.p50))
                }),
                format!(
                    "{} / {}",
                    fmt_duration(b.probes.p50),
                    fmt_duration(b.probes.p99)
                ),
                ratio(f.per_sec / s.grpc.lookups.per_sec),
            ]);
        }
    }
    t.note("the admin API and the gRPC service share one Mutex<Swarm>; the host list is built under it and serialised after");
    t.note("GET /healthz is probed every 50 ms throughout: it takes no lock, so its latency is the scheduler runtime's own");
    t.print();

    if let Ok(path) = std::env::var("TESSERA_BENCH_JSON") {
        let json = report_json(&Report {
            big,
            small,
            build_time,
            swarm_bytes: rss,
            local: [&base, &local],
            served: [&base_served, &served],
            list: [list_small.median, list_big.median],
        });
        if let Some(dir) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
        println!("figures written to {path}");
    }
}

/// Everything measured, for the JSON.
struct Report<'a> {
    big: usize,
    small: usize,
    build_time: Duration,
    swarm_bytes: u64,
    /// In-process lookups: baseline (small swarm), then the big swarm.
    local: [&'a Figures; 2],
    served: [&'a Served; 2],
    /// `Swarm::hosts()` in process: small, big.
    list: [Duration; 2],
}

/// The figures as `benches/scenarios/scheduler.py` reads them: the lookups as `rows`
/// (what `check_results.py` checks), the admin API and the contended lookups beside them.
fn report_json(r: &Report) -> serde_json::Value {
    use serde_json::{json, Value};
    let hosts = [r.small, r.big];
    let grpc_method = format!("gRPC, {GRPC_CLIENTS} clients");
    let mut rows = Vec::new();
    for (method, figs) in [
        ("in process".to_string(), r.local),
        (
            grpc_method,
            [&r.served[0].grpc.lookups, &r.served[1].grpc.lookups],
        ),
    ] {
        for (i, f) in figs.iter().enumerate() {
            let mut m = f.json("lookups");
            m.insert("method".into(), method.clone().into());
            m.insert("hosts".into(), hosts[i].into());
            m.insert("answered_share".into(), f.per_request.into());
            m.insert("vs_baseline".into(), (f.per_sec / figs[0].per_sec).into());
            rows.push(Value::Object(m));
        }
    }
    let mut admin = Vec::new();
    for (i, op) in ADMIN_OPS.iter().enumerate() {
        let base = &r.served[0].admin[i].1;
        for (s, h) in r.served.iter().zip(hosts) {
            let f = &s.admin[i].1;
            let mut m = f.json("requests");
            m.insert("request".into(), op.label().into());
            m.insert("hosts".into(), h.into());
            m.insert("response_bytes".into(), f.per_request.into());
            m.insert("vs_baseline".into(), (f.per_sec / base.per_sec).into());
            admin.push(Value::Object(m));
        }
    }
    let mut contended = Vec::new();
    for (s, h) in r.served.iter().zip(hosts) {
        for (label, b) in [
            ("none", &s.grpc),
            ("GET /api/v1/hosts in a loop", &s.contended),
        ] {
            let mut m = b.lookups.json("lookups");
            m.insert("admin_load".into(), label.into());
            m.insert("hosts".into(), h.into());
            m.insert(
                "vs_alone".into(),
                (b.lookups.per_sec / s.grpc.lookups.per_sec).into(),
            );
            if let Some(reads) = &b.reads {
                m.insert("host_lists_per_s".into(), reads.per_sec.into());
                m.insert(
                    "host_list_p50_us".into(),
                    (reads.p50.as_secs_f64() * 1e6).into(),
                );
            }
            m.insert(
                "healthz_p50_us".into(),
                (b.probes.p50.as_secs_f64() * 1e6).into(),
            );
            m.insert(
                "healthz_p99_us".into(),
                (b.probes.p99.as_secs_f64() * 1e6).into(),
            );
            contended.push(Value::Object(m));
        }
    }
    json!({
        "scenario": "scheduler",
        "hosts": r.big,
        "baseline_hosts": r.small,
        "blobs": BLOBS,
        "holdings": r.big * BLOBS,
        "build_seconds": r.build_time.as_secs_f64(),
        "swarm_memory_bytes": r.swarm_bytes,
        "grpc_clients": GRPC_CLIENTS,
        "admin_clients": ADMIN_CLIENTS,
        "workload_cap_seconds": workload_cap().as_secs_f64(),
        "host_list_in_process_us": [r.list[0].as_secs_f64() * 1e6, r.list[1].as_secs_f64() * 1e6],
        "rows": rows,
        "admin": admin,
        "contended": contended,
    })
}
