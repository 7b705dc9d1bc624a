//! The registry-mirror benchmark: `ctr image pull` of a plain multi-layer OCI image,
//! side by side in one run:
//!
//! 1. one node, straight from the registry vs through the node's agent (no swarm): what
//!    the mirror costs a single pull;
//! 2. N nodes (default 10) pulling at the same moment from a registry whose egress is
//!    capped, straight from the registry vs through their agents in a swarm: the time
//!    of the last pull and the registry's egress (counted on its own interface).
//!
//! Every node is a network namespace with its own containerd and agent.
//! `make bench-mirror` (root; builds the binaries first). Knobs:
//! `TESSERA_BENCH_MIRROR_NODES` (default 10), `TESSERA_BENCH_MIRROR_MB` (image size,
//! default 64, in four layers), `TESSERA_BENCH_MIRROR_CAP` (registry egress in the
//! swarm runs, default `200mbit`).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::containerd::PullOptions;
use support::mirror::{metric, BedOptions, MirrorBed, MirrorNode};
use support::registry::Auth;
use support::swarm::wait_registered;

struct Run {
    last_done: Duration,
    egress: u64,
    image: u64,
}

/// `n` nodes pull at once, through their mirrors (in a swarm) or straight from the
/// registry.
fn run(n: usize, through_mirror: bool, layers: &[usize], cap: Option<&str>) -> Run {
    let mut bed = MirrorBed::new(BedOptions {
        layers,
        cap,
        scheduler: through_mirror && n > 1,
        auth: Auth::None,
    });
    let nodes: Vec<MirrorNode> = (0..n).map(|_| bed.node(&[])).collect();
    if through_mirror && n > 1 {
        nodes.iter().for_each(|node| wait_registered(&node.agent));
    }
    let before = bed.origin_tx();
    let barrier = std::sync::Barrier::new(n);
    let start = Instant::now();
    let done: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|node| {
                let (bed, barrier) = (&bed, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let out = if through_mirror {
                        bed.pull(node, None)
                    } else {
                        node.containerd.pull(
                            &bed.reference,
                            &PullOptions {
                                plain_http: true,
                                ..PullOptions::default()
                            },
                        )
                    };
                    assert!(
                        out.status.success(),
                        "ctr pull: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let egress = bed.origin_tx() - before;
    bed.assert_rootfs(&nodes[0]);
    if through_mirror {
        // Where the agents' blob bytes came from, summed over the nodes.
        let mut by_source = [0f64; 3];
        for node in &nodes {
            let text = node.agent.metrics();
            for (i, source) in ["cache", "peer", "origin"].iter().enumerate() {
                by_source[i] += metric(
                    &text,
                    &format!("tessera_agent_mirror_blob_bytes_total{{source=\"{source}\"}}"),
                );
            }
            if std::env::var_os("TESSERA_BENCH_MIRROR_LOGS").is_some() {
                for line in node
                    .agent
                    .log()
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                {
                    eprintln!("{line}");
                }
            }
        }
        let mib = |b: f64| b / f64::from(1 << 20);
        println!(
            "  ({n} node(s) through the mirror: {:.1} MiB from peers, {:.1} MiB from the origin, {:.1} MiB from caches)",
            mib(by_source[1]),
            mib(by_source[2]),
            mib(by_source[0])
        );
    }
    Run {
        last_done: done.into_iter().max().unwrap_or_default(),
        egress,
        image: bed.image_bytes,
    }
}

fn main() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let nodes: usize = env("TESSERA_BENCH_MIRROR_NODES", "10")
        .parse()
        .expect("TESSERA_BENCH_MIRROR_NODES: a number");
    let mb: usize = env("TESSERA_BENCH_MIRROR_MB", "64")
        .parse()
        .expect("TESSERA_BENCH_MIRROR_MB: a number");
    let cap = env("TESSERA_BENCH_MIRROR_CAP", "200mbit");
    // Four layers: 3/8, 1/4, 1/4, 1/8 of the image.
    let layers: Vec<usize> = [3, 2, 2, 1].iter().map(|p| (mb << 20) * p / 8).collect();
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
    println!("mirror: ctr image pull of a {mb} MiB image in 4 layers of random bytes");
    println!(
        "{:<28} | {:>10} {:>10} {:>7} | {:>13} {:>13} {:>6}",
        "", "direct", "mirror", "ratio", "egress direct", "egress mirror", "ratio"
    );
    let line = |label: &str, direct: &Run, mirror: &Run| {
        println!(
            "{label:<28} | {:>9.2}s {:>9.2}s {:>6.2}x | {:>13} {:>13} {:>5.2}x",
            direct.last_done.as_secs_f64(),
            mirror.last_done.as_secs_f64(),
            mirror.last_done.as_secs_f64() / direct.last_done.as_secs_f64().max(1e-9),
            mib(direct.egress),
            mib(mirror.egress),
            mirror.egress as f64 / mirror.image as f64,
        );
    };
    let direct = run(1, false, &layers, None);
    let mirror = run(1, true, &layers, None);
    line("1 node, uncapped", &direct, &mirror);
    let direct = run(nodes, false, &layers, Some(&cap));
    let mirror = run(nodes, true, &layers, Some(&cap));
    line(
        &format!("{nodes} nodes, registry at {cap}"),
        &direct,
        &mirror,
    );
    println!("time ratio: mirror / direct (below 1: faster through the mirror)");
    println!(
        "egress ratio: the mirror run's registry egress / the image's size (1.00 = each byte once)"
    );
}
