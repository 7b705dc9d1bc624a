//! Scheduler benchmark: peer lookups per second and their latency (p50, p99) in a swarm
//! of 10,000 simulated hosts that each announced 1,000 blobs — in process against the
//! `Swarm` itself, and through the real gRPC service on 127.0.0.1 with concurrent
//! clients. The baseline, measured in the same run, is the same workload on a swarm of
//! 100 hosts: the ratios show what swarm size costs a lookup.
//!
//! `make bench-scheduler`; `TESSERA_BENCH_SCALE=0.1` shrinks the big swarm.

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_benches::{fmt_bytes, machine_summary, peak_rss_bytes, ratio, scale, Rng, Table};
use tessera_proto::domain::{Announce, BlobDigest, BlobRanges, ByteRange, FindPeers, Host, HostId};
use tessera_proto::pb;
use tessera_scheduler::preheat::Preheats;
use tessera_scheduler::service::SchedulerService;
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
            })
            .collect();
        swarm
            .announce(
                Announce {
                    host: host_id(h),
                    held,
                    dropped: Vec::new(),
                    full: false,
                },
                now,
            )
            .unwrap();
    }
    (swarm, started.elapsed())
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

struct Figures {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    peers_found: f64,
}

fn figures(mut samples: Vec<Duration>, elapsed: Duration, found: usize) -> Figures {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    Figures {
        per_sec: samples.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        peers_found: found as f64 / samples.len() as f64,
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
    for q in &queries {
        let t = Instant::now();
        let d = swarm.find_peers(q, now).unwrap();
        samples.push(t.elapsed());
        if matches!(d, Decision::Peers(_)) {
            found += 1;
        }
    }
    figures(samples, started.elapsed(), found)
}

/// Lookups through the gRPC service on 127.0.0.1 from `clients` concurrent clients.
fn over_grpc(swarm: Swarm, hosts: usize, lookups: usize, clients: usize) -> Figures {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let preheats = Arc::new(Mutex::new(Preheats::open(None).unwrap()));
        let service = SchedulerService::new(Arc::new(Mutex::new(swarm)), preheats);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::scheduler_server::SchedulerServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let mut client = pb::scheduler_client::SchedulerClient::new(channel.clone());
            let per_client = lookups / clients;
            tasks.spawn(async move {
                let mut rng = Rng::new(100 + c as u64);
                let mut samples = Vec::with_capacity(per_client);
                let mut found = 0;
                for _ in 0..per_client {
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
        figures(samples, started.elapsed(), found)
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

    let lookups = 200_000;
    let base = in_process(&mut baseline, small, lookups);
    let local = in_process(&mut swarm, big, lookups);
    let grpc_lookups = 40_000;
    let base_grpc = over_grpc(baseline, small, grpc_lookups, 8);
    let grpc = over_grpc(swarm, big, grpc_lookups, 8);

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
            format!("{:.0}%", f.peers_found * 100.0),
            ratio(f.per_sec / b.per_sec),
        ]);
    };
    row(&mut t, "in process", small, &base, &base);
    row(&mut t, "in process", big, &local, &base);
    row(&mut t, "gRPC, 8 clients", small, &base_grpc, &base_grpc);
    row(&mut t, "gRPC, 8 clients", big, &grpc, &base_grpc);
    t.note(format!(
        "{} holdings ({big} hosts × {BLOBS} blobs) built in {:.1} s; memory for the big swarm ≈ {}",
        big * BLOBS,
        build_time.as_secs_f64(),
        fmt_bytes(rss)
    ));
    t.note("a lookup asks for 1 MiB of a random blob from a random host; each host holds 1-3 ranges of 1-8 MiB per 64 MiB blob");
    t.print();
}
