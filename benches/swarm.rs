//! The swarm benchmark: N agents (1, 5, 10, 20), each on its own host of a
//! network-namespace cluster, start reading the same image at the same moment from a
//! registry whose egress is capped; the same pulls with P2P off run beside them in the
//! same run. Prints, per N, the completion time of the last agent and the registry's
//! egress (counted on its own interface), as the published 1/5/50-node table does.
//!
//! `make bench-swarm` (root; builds the release binaries first). Knobs:
//! `TESSERA_BENCH_SWARM_NODES` (default `1,5,10,20`), `TESSERA_BENCH_SWARM_MB` (image
//! size, default 32), `TESSERA_BENCH_SWARM_CAP` (registry egress, default `200mbit`).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::swarm::{wait_registered, Swarm};

struct Run {
    last_done: Duration,
    egress: u64,
    image: u64,
}

/// One pull by `n` agents, P2P on or off.
fn run(n: usize, p2p: bool, mb: usize, cap: &str) -> Run {
    let files = (mb / 8).max(1) as u64;
    let mut swarm = Swarm::new(files, 8 << 20, cap, &[]);
    let extra: &[&str] = if p2p { &[] } else { &["--no-p2p"] };
    let agents: Vec<_> = (0..n).map(|_| swarm.agent(extra)).collect();
    if p2p {
        agents.iter().for_each(wait_registered);
    }
    let mounts: Vec<_> = agents.iter().map(|a| swarm.mount(a)).collect();
    let before = swarm.origin_tx();
    let barrier = std::sync::Barrier::new(n);
    let start = Instant::now();
    let done: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(k, mnt)| {
                let (swarm, barrier) = (&swarm, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    for i in 0..swarm.files.len() {
                        let (path, data) = &swarm.files[(i + k) % swarm.files.len()];
                        assert!(std::fs::read(mnt.join(path)).unwrap() == *data, "{path}");
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Run {
        last_done: done.into_iter().max().unwrap_or_default(),
        egress: swarm.origin_tx() - before,
        image: swarm.image_bytes,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let nodes: Vec<usize> = std::env::var("TESSERA_BENCH_SWARM_NODES")
        .unwrap_or_else(|_| "1,5,10,20".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("TESSERA_BENCH_SWARM_NODES: numbers")
        })
        .collect();
    let mb: usize = std::env::var("TESSERA_BENCH_SWARM_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let cap = std::env::var("TESSERA_BENCH_SWARM_CAP").unwrap_or_else(|_| "200mbit".into());
    println!("swarm: {mb} MiB image of random files, registry egress capped at {cap}");
    println!(
        "{:>5} | {:>12} {:>12} {:>7} | {:>14} {:>14} {:>7}",
        "nodes", "last done", "last done", "", "origin egress", "origin egress", ""
    );
    println!(
        "{:>5} | {:>12} {:>12} {:>7} | {:>14} {:>14} {:>7}",
        "", "P2P off", "P2P on", "speedup", "P2P off", "P2P on", "ratio"
    );
    for &n in &nodes {
        let off = run(n, false, mb, &cap);
        let on = run(n, true, mb, &cap);
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
        println!(
            "{n:>5} | {:>11.2}s {:>11.2}s {:>6.1}x | {:>14} {:>14} {:>6.2}x",
            off.last_done.as_secs_f64(),
            on.last_done.as_secs_f64(),
            off.last_done.as_secs_f64() / on.last_done.as_secs_f64().max(1e-9),
            mib(off.egress),
            mib(on.egress),
            on.egress as f64 / on.image as f64,
        );
    }
    println!("ratio: P2P-on origin egress / the image's compressed size (1.00 = each byte once)");
}
