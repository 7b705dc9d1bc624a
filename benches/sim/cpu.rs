//! The testbed's CPU capacity, calibrated on one real swarm run and checked on others.
//!
//! On the real swarm benchmark every node is a process on the same 2 cores, so once
//! the origin's copy is in, the swarm moves bytes as fast as the machine can process
//! them: the agents' receive, verify, store and serve; the readers' FUSE reads (kernel
//! time in the reading processes); the registry; the scheduler. A microbenchmark of the
//! data path (sha256, memcpy, loopback TCP: the first version of this model) counted
//! about a third of that and put the 20-node run at half its real time.
//!
//! So the capacity is measured where it is spent: the swarm benchmark's per-run
//! profile (benches/swarm.rs `Profile`: the machine's busy share over the run, each
//! node's done time and bytes from peers and the origin) gives the machine's CPU
//! seconds over each run at the node counts named for calibration (N = 1 and 5 by
//! default: `TESSERA_BENCH_SIM_CALIBRATE`), fitted (least squares) as
//!
//!   machine CPU-seconds = baseline × run seconds + per_byte × bytes received,
//!
//! the baseline being what the machine spends whatever moves (the scheduler, the
//! registry, the harness, idle agents: a share of a core), `per_byte` everything the
//! swarm does per byte a node receives — the receiver's verify and store, the
//! sender's read and send (a byte received from a peer is a byte served), the
//! reader's FUSE read. With runs at one node count only the baseline is taken as 0.
//! Capacity = (cores − baseline) / per_byte, shared by every flow (`net.rs`). The
//! other node counts of the same JSON are then predicted, not fitted.

use serde_json::Value;

/// The method whose runs calibrate and validate the model.
pub const METHOD: &str = "tessera lazy read, P2P";

/// What the calibration found.
#[derive(Debug, Clone)]
pub struct Capacity {
    /// The node counts calibrated on.
    pub nodes: Vec<usize>,
    /// Machine CPU seconds over those runs, and bytes the nodes received in them.
    pub cpu_seconds: f64,
    pub bytes: f64,
    /// The fit: cores busy whatever moves, and CPU seconds per byte received.
    pub baseline: f64,
    pub per_byte: f64,
    pub cores: usize,
    /// Bytes per second the machine can receive, verify, store and read back.
    pub bps: f64,
}

/// Calibrates on the runs of `METHOD` at `nodes` in the swarm benchmark's JSON; `None`
/// when it has no profiled run at any of them.
pub fn calibrate(real: &Value, nodes: &[usize]) -> Option<Capacity> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut cpu_seconds, mut bytes, mut used) = (0.0, 0.0, Vec::new());
    // Each run: (seconds, bytes received, machine CPU seconds).
    let mut runs: Vec<(f64, f64, f64)> = Vec::new();
    for row in real["rows"].as_array()? {
        if row["method"] != METHOD {
            continue;
        }
        let Some(n) = row["nodes"].as_u64().map(|n| n as usize) else {
            continue;
        };
        if !nodes.contains(&n) {
            continue;
        }
        for run in row["runs"].as_array().into_iter().flatten() {
            let p = &run["profile"];
            let (Some(busy), Some(done)) =
                (p["machine_busy"].as_f64(), p["done_seconds"].as_array())
            else {
                continue;
            };
            let last = done.iter().filter_map(Value::as_f64).fold(0.0, f64::max);
            let sum = |key: &str| -> f64 {
                p[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_f64)
                    .sum()
            };
            let received = sum("peer_bytes") + sum("origin_bytes");
            if last <= 0.0 || received <= 0.0 {
                continue;
            }
            cpu_seconds += busy * cores as f64 * last;
            bytes += received;
            runs.push((last, received, busy * cores as f64 * last));
            if !used.contains(&n) {
                used.push(n);
            }
        }
    }
    if bytes <= 0.0 {
        return None;
    }
    used.sort_unstable();
    let (baseline, per_byte) = if used.len() > 1 {
        fit(&runs)
    } else {
        (0.0, cpu_seconds / bytes)
    };
    Some(Capacity {
        nodes: used,
        cpu_seconds,
        bytes,
        baseline,
        per_byte,
        cores,
        bps: (cores as f64 - baseline).max(0.1) / per_byte,
    })
}

/// Least squares of cpu = baseline × seconds + per_byte × bytes over the runs; a
/// negative term (noise) leaves it all per byte.
fn fit(runs: &[(f64, f64, f64)]) -> (f64, f64) {
    let (mut ss, mut sb, mut bb, mut sc, mut bc) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(s, b, c) in runs {
        ss += s * s;
        sb += s * b;
        bb += b * b;
        sc += s * c;
        bc += b * c;
    }
    let det = ss * bb - sb * sb;
    let baseline = (sc * bb - bc * sb) / det;
    let per_byte = (ss * bc - sb * sc) / det;
    if det.abs() < f64::EPSILON || baseline < 0.0 || per_byte <= 0.0 {
        // Noise the two terms cannot tell apart: all of it per byte.
        return (0.0, bc / bb);
    }
    (baseline, per_byte)
}
