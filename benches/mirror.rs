//! The registry-mirror benchmark: what the mirror costs a single pull. `ctr image pull`
//! of a plain multi-layer OCI image on one node, registry uncapped, side by side in one
//! run: straight from the registry (the baseline) vs through the node's agent (no
//! swarm). Many nodes pulling at once, through their mirrors in a swarm or straight
//! from a capped registry, are the swarm benchmark's (`benches/swarm.rs`).
//!
//! The node is a network namespace with its own containerd and agent.
//! `make bench-mirror` (root; builds the binaries first). Knobs:
//! `TESSERA_BENCH_MIRROR_MB` (image size, default 64, in four layers),
//! `TESSERA_BENCH_REPS` (default 3; medians of interleaved repetitions).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::time::Instant;

use support::containerd::PullOptions;
use support::mirror::{BedOptions, MirrorBed};
use support::registry::Auth;

/// One pull on a new node, through its mirror or straight from the registry: seconds
/// and the registry's egress.
fn run(through_mirror: bool, layers: &[usize]) -> (f64, u64, u64) {
    let mut bed = MirrorBed::new(BedOptions {
        layers,
        cap: None,
        scheduler: false,
        auth: Auth::None,
    });
    let node = bed.node(&[]);
    let before = bed.origin_tx();
    let start = Instant::now();
    let out = if through_mirror {
        bed.pull(&node, None)
    } else {
        node.containerd
            .pull(&bed.reference, &PullOptions::plain_http())
    };
    let took = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "ctr pull: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let egress = bed.origin_tx() - before;
    bed.assert_rootfs(&node);
    (took, egress, bed.image_bytes)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let mb: usize = env("TESSERA_BENCH_MIRROR_MB", "64")
        .parse()
        .expect("TESSERA_BENCH_MIRROR_MB: a number");
    let reps: usize = env("TESSERA_BENCH_REPS", "3")
        .parse()
        .expect("TESSERA_BENCH_REPS: a number");
    // Four layers: 3/8, 1/4, 1/4, 1/8 of the image.
    let layers: Vec<usize> = [3, 2, 2, 1].iter().map(|p| (mb << 20) * p / 8).collect();
    let (mut direct, mut mirror) = (Vec::new(), Vec::new());
    let mut egress = (0, 0);
    let mut image = 0;
    // Interleaved, so a machine that slows down slows both alike.
    for _ in 0..reps {
        let (t, e, i) = run(false, &layers);
        direct.push(t);
        let (tm, em, _) = run(true, &layers);
        mirror.push(tm);
        (egress, image) = ((e, em), i);
    }
    let (direct, mirror) = (median(direct), median(mirror));
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
    println!(
        "mirror: ctr image pull of a {mb} MiB image in 4 layers of random bytes, one node, registry uncapped, median of {reps}"
    );
    println!("| | seconds | vs direct | registry sent |");
    println!("|---|---:|---:|---:|");
    println!(
        "| straight from the registry (baseline) | {direct:.2} | 1.00x | {} |",
        mib(egress.0)
    );
    println!(
        "| through the node's tessera mirror | {mirror:.2} | {:.2}x | {} |",
        mirror / direct.max(1e-9),
        mib(egress.1)
    );
    println!(
        "vs direct: this time / the direct pull's (above 1: the mirror's cost); image {}",
        mib(image)
    );
}
