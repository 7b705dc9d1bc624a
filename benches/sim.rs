//! The swarm simulation (issue 24): the scheduler's real decision code — the pure
//! `tessera_scheduler::swarm::Swarm`, time passed in — driven by a discrete-event model
//! of N agents and an origin (`sim/world.rs`) over flow-level bandwidth sharing
//! (`sim/net.rs`), past what one machine can run for real.
//!
//! Set-ups, each printed as a table:
//!
//! 1. **testbed**: the real swarm benchmark's (benches/swarm.rs) at N = 1 and 20 (and
//!    every N of the real run's JSON): an 80 MiB image in 4 layers of 8 MiB files read
//!    by every node, the origin at 200 Mbit/s, peers over unthrottled veths on one
//!    machine, whose CPU (calibrated on a real run, `sim/cpu.rs`) is what limits them;
//!    printed next to the real run's figures with the relative error.
//! 2. **common**: N = 100, 1,000, 5,000 (`TESSERA_BENCH_SIM_NODES`): a 1 GiB image in 4
//!    layers, 1 Gbit/s hosts, the origin at the mission's 200 Mbit/s.
//! 3. **kraken**: Kraken's published benchmark (uber/kraken README, "Benchmark"): 2,600
//!    hosts, a 3 GB image in 2 layers, 300 MB/s per host up and down, 5 origins
//!    (modelled as one origin of 5 × 300 MB/s), every node pulling the whole image
//!    with `fetch_all` as a preheat does; side by side with its p50/p99/p99.9.
//!
//! For each: completion p50/p99/p99.9 and the last node, origin egress (and its multiple
//! of the image), the wall time of the real `find_peers` and `announce` calls in this
//! process (p50/p99), events and the simulation's wall time. Prints Markdown; with
//! `TESSERA_BENCH_JSON=FILE` writes JSON (scenario "sim", `benches/scenarios/sim.py`).
//!
//! Knobs: `TESSERA_BENCH_SIM_NODES` (common set-up's N, default `100,1000,5000`),
//! `TESSERA_BENCH_SIM_CHUNK_MB` (the model's chunk for set-ups of 1,000 nodes and more,
//! default 4: see benches/README.md), `TESSERA_BENCH_SIM_REAL=swarm.json` (the real
//! swarm benchmark's JSON to validate against; the testbed's CPU capacity is
//! calibrated on its runs at `TESSERA_BENCH_SIM_CALIBRATE` nodes, default `1,5`, or
//! on another run's JSON, `TESSERA_BENCH_SIM_CALIBRATION=swarm.json`: `sim/cpu.rs`),
//! `TESSERA_BENCH_SIM_ONLY=testbed,common` (those set-ups and Kraken's),
//! `TESSERA_BENCH_SIM_KRAKEN_NODES`, `TESSERA_BENCH_SIM_KRAKEN_CHUNK_MB` (default 1), `TESSERA_BENCH_SIM_ORIGIN_TIMEOUT_SECS`
//! (a what-if: the scheduler's `origin_timeout` instead of its default 10 s), `TESSERA_BENCH_SIM_SMALL=1` (the smoke
//! size: small images, N = 100, a few seconds).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "sim/cpu.rs"]
mod cpu;
#[path = "sim/net.rs"]
mod net;
#[path = "sim/world.rs"]
mod world;

use serde_json::{json, Value};
use tessera_benches::{machine_summary, Table};
use tessera_scheduler::swarm::SwarmConfig;
use world::{Outcomes, Pull, Setup, World};

const MIB: u64 = 1 << 20;

/// Kraken's published figures (uber/kraken README, "Benchmark"): p50, p99, p99.9.
const KRAKEN: [f64; 3] = [10.0, 18.0, 22.0];

/// The real swarm benchmark's recorded P2P lazy-read figures (benches/RESULTS.md,
/// 2026-11): nodes, last node done (s); registry egress at 20 nodes (× image).
const RECORDED_REAL: [(usize, f64); 2] = [(1, 3.57), (20, 10.15)];
const RECORDED_REAL_EGRESS: f64 = 1.02;

/// The agent's `fetch.stream_bytes` and `fetch.prefetch_concurrency` defaults
/// (agent/src/config.rs): a whole-image pull's runs.
const STREAM_BYTES: u64 = 4 * MIB;
const PREFETCH_CONCURRENCY: usize = 8;

/// The testbed's CPU capacity when no real run's JSON is given: the calibration
/// recorded in benches/README.md ("Simulation").
const RECORDED_CAPACITY_BPS: f64 = 281e6;
const RECORDED_CAPACITY_SOURCE: &str =
    "a real P2P swarm run of 2026-11-27 at N = 1 and 20: 0.09 cores + 7.31 CPU-s per GiB received";

/// Simulated seconds after which a run is cut off (a model that never completes).
const HORIZON: f64 = 3600.0;

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Whether `TESSERA_BENCH_SIM_ONLY` (a comma list of `testbed`, `common`; unset: all)
/// asks for this set-up (Kraken's always runs; `TESSERA_BENCH_SIM_KRAKEN_NODES` sizes it).
fn only(setup: &str) -> bool {
    std::env::var("TESSERA_BENCH_SIM_ONLY")
        .map_or(true, |v| v.split(',').any(|s| s.trim() == setup))
}

fn nodes_list() -> Vec<usize> {
    counts_from_env("TESSERA_BENCH_SIM_NODES", &[100, 1000, 5000])
}

/// A comma list of node counts from the environment variable `name`; `default` when it
/// is unset or names none.
fn counts_from_env(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// The model's chunk for a set-up of `nodes`: 1 MiB (the real chunk) below 1,000 nodes,
/// coarser above so N = 5,000 stays within minutes.
fn chunk_for(nodes: usize) -> u64 {
    if nodes < 1000 {
        return MIB;
    }
    let mb: u64 = std::env::var("TESSERA_BENCH_SIM_CHUNK_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    mb.max(1) * MIB
}

/// Defaults shared by every set-up: the real agent's and scheduler's.
fn base(name: &str, nodes: usize) -> Setup {
    Setup {
        name: name.to_string(),
        nodes,
        layers: Vec::new(),
        file_bytes: 8 * MIB,
        chunk_bytes: chunk_for(nodes),
        // A reader of every file, fetch.readahead_bytes ahead.
        pull: Pull::Read {
            window_bytes: 16 * MIB,
        },
        host_up_bps: 125e6,
        host_down_bps: 125e6,
        host_rtt: 0.0005,
        origin_bps: 25e6,
        origin_rtt: 0.02,
        cpu_bps: None,
        // p2p.max_uploads, p2p.max_wait_secs
        max_uploads: 32,
        max_wait: 20.0,
        origin_timeout: std::env::var("TESSERA_BENCH_SIM_ORIGIN_TIMEOUT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| SwarmConfig::default().origin_timeout.as_secs_f64()),
        seed: 24,
    }
}

fn testbed(nodes: usize, cpu_bps: f64, small: bool) -> Setup {
    let mb = if small { 2 } else { 8 };
    Setup {
        // 10 files of 8 MiB in four layers, as benches/swarm.rs lays them out.
        layers: vec![3 * mb * MIB, 3 * mb * MIB, 2 * mb * MIB, 2 * mb * MIB],
        file_bytes: mb * MIB,
        // Unthrottled veths: the CPU is the limit, not the links.
        host_up_bps: 10e9 / 8.0,
        host_down_bps: 10e9 / 8.0,
        host_rtt: 0.0002,
        origin_rtt: 0.001,
        cpu_bps: Some(cpu_bps),
        ..base("testbed", nodes)
    }
}

fn common(nodes: usize, small: bool) -> Setup {
    let layer = if small { 16 * MIB } else { 256 * MIB };
    Setup {
        layers: vec![layer; 4],
        ..base("common", nodes)
    }
}

fn kraken(nodes: usize, small: bool) -> Setup {
    let layer: u64 = if small { 64 * MIB } else { 1_500_000_000 };
    Setup {
        layers: vec![layer; 2],
        // Kraken's agents pull whole images: ours do that with `fetch_all` (a preheat
        // job, prefetch `all`), in runs of fetch.stream_bytes, fetch.prefetch_concurrency
        // at once. At the real 1 MiB chunk, so that a run's slices go to several peers
        // as the agent's do (`TESSERA_BENCH_SIM_KRAKEN_CHUNK_MB`).
        pull: Pull::All {
            stream_bytes: STREAM_BYTES,
            concurrency: PREFETCH_CONCURRENCY,
        },
        chunk_bytes: std::env::var("TESSERA_BENCH_SIM_KRAKEN_CHUNK_MB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1)
            .max(1)
            * MIB,
        host_up_bps: 300e6,
        host_down_bps: 300e6,
        origin_bps: 5.0 * 300e6,
        origin_rtt: 0.001,
        ..base("kraken", nodes)
    }
}

/// Nearest-rank percentile of sorted values.
fn pct<T: Copy>(sorted: &[T], p: f64) -> T {
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

struct Measured {
    setup: Setup,
    out: Outcomes,
    decide: [u32; 2],
    announce: [u32; 2],
}

fn simulate(setup: Setup) -> Measured {
    eprintln!(
        "sim: {} with {} nodes ({} MiB image, {} KiB chunks)...",
        setup.name,
        setup.nodes,
        setup.image_bytes() / MIB,
        setup.chunk_bytes >> 10
    );
    let mut out = World::new(setup.clone()).run(HORIZON);
    out.decide_ns.sort_unstable();
    out.announce_ns.sort_unstable();
    let two = |v: &[u32]| {
        if v.is_empty() {
            [0, 0]
        } else {
            [pct(v, 50.0), pct(v, 99.0)]
        }
    };
    let (decide, announce) = (two(&out.decide_ns), two(&out.announce_ns));
    eprintln!(
        "sim: {} with {} nodes: last done {:.2} s, {} events in {:.1} s",
        setup.name,
        setup.nodes,
        out.done.last().copied().unwrap_or(0.0),
        out.events,
        out.wall.as_secs_f64()
    );
    Measured {
        setup,
        out,
        decide,
        announce,
    }
}

fn secs(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2} s")
    } else {
        "never".to_string()
    }
}

fn ns(x: u32) -> String {
    if x >= 10_000 {
        format!("{:.1} µs", f64::from(x) / 1000.0)
    } else {
        format!("{x} ns")
    }
}

fn row_json(m: &Measured) -> Value {
    let d = &m.out.done;
    let image = m.setup.image_bytes();
    let l = &m.out.lookups;
    json!({
        "method": m.setup.name,
        "nodes": m.setup.nodes,
        "image_bytes": image,
        "chunk_bytes": m.setup.chunk_bytes,
        "host_bps": m.setup.host_down_bps,
        "origin_bps": m.setup.origin_bps,
        "p50_s": pct(d, 50.0),
        "p99_s": pct(d, 99.0),
        "p999_s": pct(d, 99.9),
        "last_s": pct(d, 100.0),
        "origin_bytes": m.out.origin_bytes,
        "egress_vs_image": m.out.origin_bytes as f64 / image as f64,
        "decide_p50_ns": m.decide[0].max(1),
        "decide_p99_ns": m.decide[1].max(1),
        "announce_p50_ns": m.announce[0].max(1),
        "announce_p99_ns": m.announce[1].max(1),
        "lookups": {"peers": l.peers, "wait": l.wait, "origin": l.origin,
                    "remembered": l.remembered, "busy": l.busy,
                    "gave_up_waiting": l.gave_up_waiting, "fruitless": l.fruitless},
        "events": m.out.events,
        "wall_s": m.out.wall.as_secs_f64().max(1e-6),
    })
}

fn print_runs(title: &str, runs: &[&Measured]) {
    let mut t = Table::new(
        title,
        &[
            "nodes",
            "image",
            "p50",
            "p99",
            "p99.9",
            "last",
            "origin egress",
            "find_peers p50/p99",
            "announce p50/p99",
            "peers/wait/origin answers",
            "busy",
            "gave up / fruitless",
            "events",
            "wall",
        ],
    );
    for m in runs {
        let d = &m.out.done;
        let image = m.setup.image_bytes();
        let l = &m.out.lookups;
        t.row(vec![
            format!("{}", m.setup.nodes),
            format!("{} MiB", image / MIB),
            secs(pct(d, 50.0)),
            secs(pct(d, 99.0)),
            secs(pct(d, 99.9)),
            secs(pct(d, 100.0)),
            format!(
                "{} MiB ({:.2}×)",
                m.out.origin_bytes / MIB,
                m.out.origin_bytes as f64 / image as f64
            ),
            format!("{} / {}", ns(m.decide[0]), ns(m.decide[1])),
            format!("{} / {}", ns(m.announce[0]), ns(m.announce[1])),
            format!("{} / {} / {}", l.peers, l.wait, l.origin),
            format!("{}", l.busy),
            format!("{} / {}", l.gave_up_waiting, l.fruitless),
            format!("{}", m.out.events),
            format!("{:.1} s", m.out.wall.as_secs_f64()),
        ]);
    }
    t.print();
}

/// The real run: its figures (nodes, last node done), the egress at 20 nodes, the
/// JSON itself when `TESSERA_BENCH_SIM_REAL` names one (else the recorded figures), and
/// where they came from.
/// Nodes and the last node's done time (the median repetition), per row of the real
/// benchmark.
type Times = Vec<(usize, f64)>;

/// Each repetition's last node done, at `nodes`, in the real benchmark's JSON.
fn repetitions(real: Option<&Value>, nodes: usize) -> Vec<f64> {
    real.and_then(|v| v["rows"].as_array())
        .into_iter()
        .flatten()
        .filter(|row| row["method"] == cpu::METHOD && row["nodes"].as_u64() == Some(nodes as u64))
        .flat_map(|row| row["runs"].as_array().cloned().unwrap_or_default())
        .filter_map(|run| run["last_done_seconds"].as_f64())
        .collect()
}

fn real_figures() -> (Times, Option<f64>, Option<Value>, String) {
    if let Ok(path) = std::env::var("TESSERA_BENCH_SIM_REAL") {
        let text = std::fs::read_to_string(&path).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let mut times = Vec::new();
        let mut egress = None;
        for row in v["rows"].as_array().into_iter().flatten() {
            if row["method"] != cpu::METHOD {
                continue;
            }
            let (Some(n), Some(t)) = (row["nodes"].as_u64(), row["last_done_seconds"].as_f64())
            else {
                continue;
            };
            times.push((n as usize, t));
            if n == 20 {
                egress = row["egress_vs_image"].as_f64();
            }
        }
        return (times, egress, Some(v), path);
    }
    (
        RECORDED_REAL.to_vec(),
        Some(RECORDED_REAL_EGRESS),
        None,
        "benches/RESULTS.md (2026-11)".to_string(),
    )
}

/// The node counts the CPU capacity is calibrated on (`TESSERA_BENCH_SIM_CALIBRATE`,
/// default 1 and 5); the others are predicted.
fn calibration_nodes() -> Vec<usize> {
    counts_from_env("TESSERA_BENCH_SIM_CALIBRATE", &[1, 5])
}

fn main() {
    let small = env_flag("TESSERA_BENCH_SIM_SMALL");
    let started = std::time::Instant::now();
    println!("machine: {}", machine_summary());
    let (real, real_egress, real_json, real_source) = real_figures();
    let calibrate_on = calibration_nodes();
    // `TESSERA_BENCH_SIM_CALIBRATION`: another run's JSON to calibrate on (default:
    // the validated JSON's runs at the calibration node counts).
    let (calibration_json, calibration_source) =
        match std::env::var("TESSERA_BENCH_SIM_CALIBRATION") {
            Ok(path) => (
                Some(
                    serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap())
                        .unwrap(),
                ),
                path,
            ),
            Err(_) => (real_json.clone(), real_source.clone()),
        };
    let calibrated = calibration_json
        .as_ref()
        .and_then(|v| cpu::calibrate(v, &calibrate_on));
    let same_runs = calibration_source == real_source;
    let (capacity_bps, capacity_source) = match &calibrated {
        Some(c) => {
            println!(
                "testbed CPU, calibrated on {calibration_source} at N = {:?}: {:.1} machine CPU-s for {:.0} MiB received; fit: {:.2} cores busy whatever moves + {:.2} CPU-s per GiB received; {} cores: {:.0} MB/s machine-wide",
                c.nodes,
                c.cpu_seconds,
                c.bytes / MIB as f64,
                c.baseline,
                c.per_byte * (1u64 << 30) as f64,
                c.cores,
                c.bps / 1e6
            );
            (c.bps, format!("{calibration_source}, N = {:?}", c.nodes))
        }
        None => {
            println!(
                "testbed CPU: the recorded calibration ({RECORDED_CAPACITY_SOURCE}): {:.0} MB/s machine-wide",
                RECORDED_CAPACITY_BPS / 1e6
            );
            (RECORDED_CAPACITY_BPS, RECORDED_CAPACITY_SOURCE.to_string())
        }
    };
    // Rows of the validated JSON that were calibrated on (none when another JSON was).
    let calibration_used: Vec<usize> = calibrated
        .as_ref()
        .filter(|_| same_runs)
        .map_or_else(Vec::new, |c| c.nodes.clone());

    // 1. The testbed, against the real run.
    let mut testbed_nodes: Vec<usize> = vec![1, 20];
    for &(n, _) in &real {
        if !testbed_nodes.contains(&n) {
            testbed_nodes.push(n);
        }
    }
    testbed_nodes.sort_unstable();
    if !only("testbed") {
        testbed_nodes.clear();
    }
    let testbed_runs: Vec<Measured> = testbed_nodes
        .iter()
        .map(|&n| simulate(testbed(n, capacity_bps, small)))
        .collect();
    print_runs(
        "testbed: the real swarm benchmark's set-up",
        &testbed_runs.iter().collect::<Vec<_>>(),
    );
    let mut v = Table::new(
        &format!("validation: model vs the real run ({real_source})"),
        &[
            "nodes",
            "role",
            "model: last done",
            "real: last done",
            "error",
            "real repetitions",
            "model egress",
            "real egress",
        ],
    );
    let mut validation = Vec::new();
    for m in &testbed_runs {
        let Some(&(_, real_t)) = real.iter().find(|(n, _)| *n == m.setup.nodes) else {
            continue;
        };
        let model_t = pct(&m.out.done, 100.0);
        let error = (model_t - real_t) / real_t;
        let reps = repetitions(real_json.as_ref(), m.setup.nodes);
        let egress = m.out.origin_bytes as f64 / m.setup.image_bytes() as f64;
        let real_e = if m.setup.nodes == 20 {
            real_egress
        } else {
            None
        };
        let role = if calibration_used.contains(&m.setup.nodes) {
            "calibration"
        } else {
            "prediction"
        };
        v.row(vec![
            format!("{}", m.setup.nodes),
            role.to_string(),
            secs(model_t),
            secs(real_t),
            format!("{:+.0}%", error * 100.0),
            reps.iter()
                .map(|&t| format!("{t:.2} s ({:+.0}%)", (model_t - t) / t * 100.0))
                .collect::<Vec<_>>()
                .join(", "),
            format!("{egress:.2}×"),
            real_e.map_or("–".to_string(), |e| format!("{e:.2}×")),
        ]);
        validation.push(json!({
            "nodes": m.setup.nodes, "role": role, "model_s": model_t, "real_s": real_t, "error": error,
            "real_repetitions_s": reps,
            "model_egress_vs_image": egress, "real_egress_vs_image": real_e,
        }));
    }
    v.note(format!(
        "CPU capacity calibrated on {capacity_source}; the issue's bar: predictions within 25%"
    ));
    v.print();

    // 2. The common set-up at each N.
    let mut common_nodes = if small { vec![100] } else { nodes_list() };
    if !only("common") {
        common_nodes.clear();
    }
    let common_runs: Vec<Measured> = common_nodes
        .iter()
        .map(|&n| simulate(common(n, small)))
        .collect();
    print_runs(
        "common: 1 GiB image in 4 layers, 1 Gbit/s hosts, origin 200 Mbit/s",
        &common_runs.iter().collect::<Vec<_>>(),
    );

    // 3. Kraken's published set-up.
    let kraken_nodes = std::env::var("TESSERA_BENCH_SIM_KRAKEN_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 100 } else { 2600 });
    let kraken_run = simulate(kraken(kraken_nodes, small));
    print_runs(
        "kraken: 3 GB image in 2 layers, 300 MB/s hosts, 5 × 300 MB/s origin",
        &[&kraken_run],
    );
    let d = &kraken_run.out.done;
    let ours = [pct(d, 50.0), pct(d, 99.0), pct(d, 99.9)];
    let mut k = Table::new(
        &format!(
            "Kraken's published figures vs ours ({} hosts)",
            kraken_run.setup.nodes
        ),
        &["", "p50", "p99", "p99.9"],
    );
    k.row(
        std::iter::once("Kraken (published)".to_string())
            .chain(KRAKEN.iter().map(|&x| secs(x)))
            .collect(),
    );
    k.row(
        std::iter::once("tessera (simulated)".to_string())
            .chain(ours.iter().map(|&x| secs(x)))
            .collect(),
    );
    k.note(format!(
        "the issue's target: p99 below Kraken's 18 s — {}",
        if ours[1] < KRAKEN[1] { "met" } else { "missed" }
    ));
    k.print();
    println!(
        "\nsimulation: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );

    if let Ok(path) = std::env::var("TESSERA_BENCH_JSON") {
        let rows: Vec<Value> = testbed_runs
            .iter()
            .chain(&common_runs)
            .chain(std::iter::once(&kraken_run))
            .map(row_json)
            .collect();
        let report = json!({
            "scenario": "sim",
            "machine": machine_summary(),
            "small": small,
            "rows": rows,
            "cpu": {
                "bps": capacity_bps, "source": capacity_source,
                "calibrated_on_nodes": calibration_used,
                "cpu_seconds": calibrated.as_ref().map(|c| c.cpu_seconds),
                "baseline_cores": calibrated.as_ref().map(|c| c.baseline),
                "cpu_seconds_per_byte": calibrated.as_ref().map(|c| c.per_byte),
                "bytes": calibrated.as_ref().map(|c| c.bytes),
            },
            "validation": validation,
            "real_source": real_source,
            "kraken": {"published": {"p50_s": KRAKEN[0], "p99_s": KRAKEN[1], "p999_s": KRAKEN[2]},
                       "ours": {"p50_s": ours[0], "p99_s": ours[1], "p999_s": ours[2]}},
            "seconds": started.elapsed().as_secs_f64(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
}
