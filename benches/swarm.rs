//! The swarm benchmark: N nodes (1, 5, 10, 20), each a host of a network-namespace
//! cluster, pull one image at the same moment from a registry whose egress is capped.
//! Four ways, side by side in one run, on the same image (random files in four layers,
//! pushed as a plain OCI image and converted for Tessera):
//!
//! 1. `ctr image pull --plain-http` straight from the registry: what a cluster without
//!    Tessera does (the baseline);
//! 2. `tessera mount` and a read of every file through the lazy mount, P2P off
//!    (`--no-p2p`): every node fetches its own copy;
//! 3. the same with P2P on (a scheduler; agents fetch from each other);
//! 4. `ctr image pull` through each node's agent as its registry mirror (`hosts.toml`),
//!    P2P on.
//!
//! For each N and method: the time until the last node is done (from the same moment
//! for every node), the registry's egress (counted on its own interface), its multiple
//! of the image's size, and ratios against the baseline at the same N and against the
//! same method on one node. Prints Markdown; with `TESSERA_BENCH_JSON=FILE` writes the
//! figures as JSON (`benches/scenarios/swarm.py` renders them).
//!
//! Every run starts cold: new agents, caches and containerds on the same hosts, the
//! scheduler restarted empty. Each run is bounded (`TESSERA_BENCH_SWARM_TIMEOUT`,
//! default 300 s: then the run's agents and containerds are killed and the benchmark
//! fails), and everything (processes, mounts, namespaces, files) is removed on the way
//! out, also after a failure.
//!
//! `make bench-swarm` (root). Knobs: `TESSERA_BENCH_SWARM_NODES` (default `1,5,10,20`;
//! 1 is always measured), `TESSERA_BENCH_SWARM_MB` (image size, default 80),
//! `TESSERA_BENCH_SWARM_CAP` (registry egress, default `200mbit`, the mission's origin
//! link), `TESSERA_BENCH_REPS` (default 1; medians of interleaved repetitions),
//! `TESSERA_BENCH_SWARM_METHODS` (some of `direct,lazy,p2p,mirror`; default all;
//! without `direct` there is no "vs ctr pull").
//!
//! Where the time goes: after each run it prints (stderr) a profile — when the first,
//! median and last node were done, the machine's CPU busy over the run, CPU seconds of
//! the agents, containerds and scheduler, what the agents got from peers and from the
//! origin and how long they waited for it, and who served: how many agents uploaded
//! and the largest share one of them served. `TESSERA_BENCH_SWARM_PROFILE=nodes` adds
//! a line per node; the JSON's rows carry the profile.
//!
//! Why 80 MiB: one node alone needs ~3.5 s of the capped link, long enough against a
//! mount's and a scheduler's fixed costs for the "vs 1 node" ratio to mean something;
//! 20 plain pulls need 20 × 80 MiB at 25 MB/s ≈ 67 s, inside the 120 s `ctr --timeout`
//! the containerd harness passes; and the whole scenario (16 runs, 36 nodes' worth
//! of agents and containerds per method) takes ~7 minutes on 2 cores (8 minutes with
//! a 96 MiB image on a busy machine), a third of the suite's hour.

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::agent::AgentProcess;
use support::containerd::{Containerd, PullOptions};
use support::mirror::{metric, MIRROR};
use support::netns::NetHost;
use support::swarm::{wait_registered, Swarm};
use support::{s, tessera_ok};

#[derive(Clone, Copy, PartialEq)]
enum Method {
    CtrDirect,
    LazyNoP2p,
    LazyP2p,
    CtrMirror,
}

/// In the order they run; the first is the baseline.
const METHODS: [(Method, &str); 4] = [
    (Method::CtrDirect, "ctr pull, straight from the registry"),
    (Method::LazyNoP2p, "tessera lazy read, P2P off"),
    (Method::LazyP2p, "tessera lazy read, P2P"),
    (
        Method::CtrMirror,
        "ctr pull through the tessera mirror, P2P",
    ),
];

struct Bench {
    swarm: Swarm,
    /// One host per node, reused by every run (each run's processes on it are new).
    hosts: Vec<NetHost>,
    /// containerd's hosts directory pointing it at the node's agent.
    hosts_dir: PathBuf,
    timeout: Duration,
    runs: usize,
}

/// What one run measured.
#[derive(Clone)]
struct Run {
    last_done: f64,
    egress: u64,
    profile: Profile,
}

/// Where one run's time went (see the module docs).
#[derive(Clone, Default)]
struct Profile {
    /// Seconds until each node was done, in node order.
    done: Vec<f64>,
    /// Share of the machine's CPU time busy over the run (1.0: every core, all along).
    machine_busy: f64,
    /// CPU seconds over the run, per node's agent and containerd, and the scheduler's.
    agent_cpu: Vec<f64>,
    containerd_cpu: Vec<f64>,
    scheduler_cpu: f64,
    /// Per node: verified bytes from peers and the origin, the seconds those chunks
    /// took to arrive (summed over chunks, so concurrent ones add up), bytes served to
    /// peers, and the seconds FUSE reads waited.
    peer_bytes: Vec<f64>,
    origin_bytes: Vec<f64>,
    peer_seconds: Vec<f64>,
    origin_seconds: Vec<f64>,
    served_bytes: Vec<f64>,
    read_wait_seconds: Vec<f64>,
    /// The run's progress over time.
    timeline: Vec<Sample>,
}

/// How often a run's progress is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// A run's progress at one moment.
#[derive(Clone, Default)]
struct Sample {
    seconds: f64,
    /// Sent by the registry since the run started.
    registry_bytes: f64,
    /// Verified bytes the agents got from peers and the origin, all together.
    received_bytes: f64,
    nodes_done: usize,
}

impl Profile {
    fn sum(v: &[f64]) -> f64 {
        v.iter().sum()
    }

    /// One paragraph for stderr.
    fn summary(&self) -> String {
        let mut done = self.done.clone();
        done.sort_by(f64::total_cmp);
        let mib = |b: f64| b / f64::from(1 << 20);
        let served = Profile::sum(&self.served_bytes);
        let top = self.served_bytes.iter().copied().fold(0.0, f64::max);
        let servers = self.served_bytes.iter().filter(|&&b| b > 0.0).count();
        format!(
            "done first {:.2} s, median {:.2} s, last {:.2} s; machine CPU busy {:.0}%; CPU s: agents {:.1} (max {:.1}), containerds {:.1}, scheduler {:.2}; \
             from peers {:.1} MiB in {:.1} chunk-s, from the origin {:.1} MiB in {:.1} chunk-s; FUSE reads waited {:.1} s; \
             {servers} of {} agents served peers, the busiest {:.0}% of {:.1} MiB",
            done.first().copied().unwrap_or(0.0),
            done.get(done.len() / 2).copied().unwrap_or(0.0),
            done.last().copied().unwrap_or(0.0),
            self.machine_busy * 100.0,
            Profile::sum(&self.agent_cpu),
            self.agent_cpu.iter().copied().fold(0.0, f64::max),
            Profile::sum(&self.containerd_cpu),
            self.scheduler_cpu,
            mib(Profile::sum(&self.peer_bytes)),
            Profile::sum(&self.peer_seconds),
            mib(Profile::sum(&self.origin_bytes)),
            Profile::sum(&self.origin_seconds),
            Profile::sum(&self.read_wait_seconds),
            self.agent_cpu.len(),
            if served > 0.0 { 100.0 * top / served } else { 0.0 },
            mib(served),
        )
    }

    /// The progress line: at each sample, MiB the registry sent / MiB the agents got
    /// (nodes done).
    fn timeline(&self) -> String {
        let mib = |b: f64| b / f64::from(1 << 20);
        let points: Vec<String> = self
            .timeline
            .iter()
            .map(|p| {
                format!(
                    "{:.1}s {:.0}/{:.0} ({})",
                    p.seconds,
                    mib(p.registry_bytes),
                    mib(p.received_bytes),
                    p.nodes_done
                )
            })
            .collect();
        format!(
            "  progress (registry MiB / agents' MiB (done)): {}",
            points.join(", ")
        )
    }

    fn nodes(&self) -> String {
        let mib = |b: f64| b / f64::from(1 << 20);
        (0..self.done.len())
            .map(|i| {
                let at = |v: &[f64]| v.get(i).copied().unwrap_or(0.0);
                format!(
                    "  node {i}: done {:.2} s, agent CPU {:.2} s, containerd CPU {:.2} s, peers {:.1} MiB/{:.1} s, origin {:.1} MiB/{:.1} s, served {:.1} MiB, reads waited {:.1} s\n",
                    at(&self.done),
                    at(&self.agent_cpu),
                    at(&self.containerd_cpu),
                    mib(at(&self.peer_bytes)),
                    at(&self.peer_seconds),
                    mib(at(&self.origin_bytes)),
                    at(&self.origin_seconds),
                    mib(at(&self.served_bytes)),
                    at(&self.read_wait_seconds),
                )
            })
            .collect()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "done_seconds": self.done,
            "machine_busy": self.machine_busy,
            "agent_cpu_seconds": self.agent_cpu,
            "containerd_cpu_seconds": self.containerd_cpu,
            "scheduler_cpu_seconds": self.scheduler_cpu,
            "peer_bytes": self.peer_bytes,
            "origin_bytes": self.origin_bytes,
            "peer_chunk_seconds": self.peer_seconds,
            "origin_chunk_seconds": self.origin_seconds,
            "served_bytes": self.served_bytes,
            "read_wait_seconds": self.read_wait_seconds,
            "timeline": self.timeline.iter().map(|p| serde_json::json!({
                "seconds": p.seconds,
                "registry_bytes": p.registry_bytes,
                "received_bytes": p.received_bytes,
                "nodes_done": p.nodes_done,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A node's processes for one run. Fields drop in order: containerd, then the agent.
struct Node {
    containerd: Option<Containerd>,
    agent: Option<AgentProcess>,
}

impl Bench {
    /// `n` nodes pull at once by `method`; everything they made is removed after.
    fn run(&mut self, method: Method, n: usize) -> Run {
        self.runs += 1;
        let dir = self.swarm.dir().join(format!("run{}", self.runs));
        // An empty scheduler: nothing known of the last run's (gone) agents.
        self.swarm.scheduler.restart();
        let nodes: Vec<Node> = (0..n)
            .map(|i| {
                self.node(
                    method,
                    &self.hosts[i].clone(),
                    &dir.join(format!("node{i}")),
                )
            })
            .collect();
        if matches!(method, Method::LazyP2p | Method::CtrMirror) {
            nodes
                .iter()
                .filter_map(|n| n.agent.as_ref())
                .for_each(wait_registered);
        }
        let before = self.swarm.origin_tx();
        let cpu_before = Cpu::read(&self.swarm, &nodes);
        let (done, samples) = self.pull_all(method, &nodes);
        let egress = self.swarm.origin_tx() - before;
        let mut profile = Cpu::read(&self.swarm, &nodes).profile_since(&cpu_before, &nodes, done);
        profile.timeline = samples;
        let last_done = profile.done.iter().copied().fold(0.0, f64::max);
        let agent_dirs: Vec<PathBuf> = nodes
            .iter()
            .filter_map(|n| n.agent.as_ref().map(|a| a.dir.clone()))
            .collect();
        drop(nodes);
        for d in agent_dirs.iter().chain([&dir]) {
            let _ = std::fs::remove_dir_all(d);
        }
        Run {
            last_done,
            egress,
            profile,
        }
    }

    fn node(&mut self, method: Method, host: &NetHost, dir: &Path) -> Node {
        let agent = match method {
            Method::CtrDirect => None,
            Method::LazyNoP2p => Some(self.swarm.agent_in(host, &["--no-p2p"])),
            Method::LazyP2p => Some(self.swarm.agent_in(host, &[])),
            Method::CtrMirror => Some(self.swarm.agent_in(host, &["--mirror-listen", MIRROR])),
        };
        let containerd = matches!(method, Method::CtrDirect | Method::CtrMirror)
            .then(|| Containerd::start_in(&dir.join("containerd"), host));
        Node { containerd, agent }
    }

    /// Every node pulls from the same moment; returns when each was done (seconds),
    /// and the run's progress sampled every [`SAMPLE_EVERY`].
    fn pull_all(&self, method: Method, nodes: &[Node]) -> (Vec<f64>, Vec<Sample>) {
        let barrier = std::sync::Barrier::new(nodes.len());
        let start = Instant::now();
        let (finished, watch) = mpsc::channel::<()>();
        let done_count = AtomicUsize::new(0);
        let over = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(move || self.watchdog(&watch, nodes));
            let sampler = scope.spawn(|| self.sample(nodes, start, &done_count, &over));
            let handles: Vec<_> = nodes
                .iter()
                .enumerate()
                .map(|(k, node)| {
                    let (barrier, done_count) = (&barrier, &done_count);
                    scope.spawn(move || {
                        barrier.wait();
                        self.pull(method, node, k);
                        done_count.fetch_add(1, Ordering::SeqCst);
                        start.elapsed().as_secs_f64()
                    })
                })
                .collect();
            let done: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            drop(finished);
            over.store(true, Ordering::SeqCst);
            let samples = sampler.join().unwrap_or_default();
            // Re-raise a node's failure (after the watchdog is told to stand down).
            let done = done
                .into_iter()
                .map(|d| d.unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect();
            (done, samples)
        })
    }

    /// What the registry has sent and the agents have received so far, every
    /// [`SAMPLE_EVERY`] until `over`: when the bytes came, not only how many.
    fn sample(
        &self,
        nodes: &[Node],
        start: Instant,
        done: &AtomicUsize,
        over: &AtomicBool,
    ) -> Vec<Sample> {
        let registry_before = self.swarm.origin_tx();
        let mut samples = Vec::new();
        while !over.load(Ordering::SeqCst) {
            std::thread::sleep(SAMPLE_EVERY);
            let received = nodes
                .iter()
                .filter_map(|n| n.agent.as_ref())
                .map(|a| {
                    let text = a.metrics();
                    ["peer", "origin"]
                        .iter()
                        .map(|source| received_from(&text, source))
                        .sum::<f64>()
                })
                .sum();
            samples.push(Sample {
                seconds: start.elapsed().as_secs_f64(),
                registry_bytes: (self.swarm.origin_tx() - registry_before) as f64,
                received_bytes: received,
                nodes_done: done.load(Ordering::SeqCst),
            });
        }
        samples
    }

    /// One node's pull by `method`; node `k` reads the files starting at the `k`th.
    fn pull(&self, method: Method, node: &Node, k: usize) {
        let swarm = &self.swarm;
        match (method, &node.containerd, &node.agent) {
            (Method::CtrDirect, Some(containerd), _) => {
                containerd.pull_ok(&swarm.plain_reference, &PullOptions::plain_http());
            }
            (Method::CtrMirror, Some(containerd), Some(_)) => {
                let opts = PullOptions {
                    hosts_dir: Some(self.hosts_dir.clone()),
                    ..PullOptions::default()
                };
                containerd.pull_ok(&swarm.plain_reference, &opts);
            }
            (_, None, Some(agent)) => {
                let mnt = swarm.mount(agent);
                for i in 0..swarm.files.len() {
                    let (path, data) = &swarm.files[(i + k) % swarm.files.len()];
                    let got = std::fs::read(mnt.join(path))
                        .unwrap_or_else(|e| panic!("read {path} through the mount: {e}"));
                    assert!(got == *data, "{path} read through the mount differs");
                }
            }
            _ => unreachable!("a node has what its method needs"),
        }
    }

    /// Kills the run's agents and containerds if it is not over within the timeout,
    /// so its pulls fail (and the benchmark with them) instead of hanging.
    fn watchdog(&self, finished: &mpsc::Receiver<()>, nodes: &[Node]) {
        if finished.recv_timeout(self.timeout) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        eprintln!(
            "swarm: a run took longer than {:?} (TESSERA_BENCH_SWARM_TIMEOUT); stopping it",
            self.timeout
        );
        let mut pids: Vec<u32> = nodes
            .iter()
            .filter_map(|n| n.containerd.as_ref().map(Containerd::pid))
            .collect();
        pids.extend(
            nodes
                .iter()
                .filter_map(|n| n.agent.as_ref())
                .filter_map(|a| agent_pid(&a.socket)),
        );
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// CPU time so far: the machine's (busy and all, in clock ticks) and each process's
/// (seconds), to take differences of over a run.
struct Cpu {
    machine_busy: u64,
    machine_all: u64,
    agents: Vec<f64>,
    containerds: Vec<f64>,
    scheduler: f64,
}

impl Cpu {
    fn read(swarm: &Swarm, nodes: &[Node]) -> Cpu {
        let (machine_busy, machine_all) = machine_ticks();
        let of = |pid: Option<u32>| pid.map_or(0.0, process_cpu_seconds);
        Cpu {
            machine_busy,
            machine_all,
            agents: nodes
                .iter()
                .map(|n| of(n.agent.as_ref().and_then(|a| agent_pid(&a.socket))))
                .collect(),
            containerds: nodes
                .iter()
                .map(|n| of(n.containerd.as_ref().map(Containerd::pid)))
                .collect(),
            scheduler: of(swarm.scheduler.pid()),
        }
    }

    /// The run's profile: CPU since `before`, and what each agent's metrics say.
    fn profile_since(&self, before: &Cpu, nodes: &[Node], done: Vec<f64>) -> Profile {
        let minus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect();
        let all = self.machine_all.saturating_sub(before.machine_all).max(1);
        let mut p = Profile {
            done,
            machine_busy: self.machine_busy.saturating_sub(before.machine_busy) as f64 / all as f64,
            agent_cpu: minus(&self.agents, &before.agents),
            containerd_cpu: minus(&self.containerds, &before.containerds),
            scheduler_cpu: self.scheduler - before.scheduler,
            ..Profile::default()
        };
        for node in nodes {
            let text = node
                .agent
                .as_ref()
                .map(AgentProcess::metrics)
                .unwrap_or_default();
            let m = |sample: &str| metric(&text, sample);
            p.peer_bytes.push(received_from(&text, "peer"));
            p.origin_bytes.push(received_from(&text, "origin"));
            p.peer_seconds
                .push(m("tessera_agent_chunk_fetch_seconds_sum{source=\"peer\"}"));
            p.origin_seconds.push(m(
                "tessera_agent_chunk_fetch_seconds_sum{source=\"origin\"}",
            ));
            p.served_bytes
                .push(m("tessera_agent_peer_upload_bytes_total"));
            p.read_wait_seconds
                .push(m("tessera_agent_fuse_read_seconds_sum"));
        }
        p
    }
}

/// Verified bytes an agent got from `source` (`peer` or `origin`), by its metrics
/// `text`. Mirror pieces count in the fetch series and again in the mirror's (served
/// to containerd); a blob the mirror streamed from the origin only in the mirror's:
/// the larger of the two is what came in.
fn received_from(text: &str, source: &str) -> f64 {
    let fetched = metric(
        text,
        &format!("tessera_agent_bytes_total{{source=\"{source}\"}}"),
    );
    let mirrored = metric(
        text,
        &format!("tessera_agent_mirror_blob_bytes_total{{source=\"{source}\"}}"),
    );
    fetched.max(mirrored)
}

/// The machine's CPU ticks: busy (not idle or waiting on I/O) and all (`/proc/stat`).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let all: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// A process's user and system CPU seconds so far (`/proc/PID/stat`), 0 once gone.
fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command (which may hold spaces) in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are the 14th and 15th fields; `after` starts at the 3rd.
    (ticks(11) + ticks(12)) as f64 / clock_ticks_per_second()
}

/// `getconf CLK_TCK`: 100 on every Linux this runs on, asked rather than assumed.
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The pid of the agent this benchmark started with `--socket SOCKET` (a path unique to
/// it); an agent killed leaves its FUSE mount's readers with an error, not a hang.
fn agent_pid(socket: &Path) -> Option<u32> {
    let want = socket.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let mut args = cmdline.split(|&b| b == 0).skip(1);
        (args.next() == Some(b"agent".as_slice()) && args.any(|a| a == b"--socket"))
            .then(|| args.next())
            .flatten()
            .filter(|a| *a == want)
            .map(|_| pid)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let mut nodes: Vec<usize> = env("TESSERA_BENCH_SWARM_NODES", "1,5,10,20")
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("TESSERA_BENCH_SWARM_NODES: numbers")
        })
        .collect();
    // One node alone is what the mission's completion target is measured against.
    nodes.push(1);
    nodes.sort_unstable();
    nodes.dedup();
    let mb: usize = env("TESSERA_BENCH_SWARM_MB", "80")
        .parse()
        .expect("TESSERA_BENCH_SWARM_MB: a number");
    let cap = env("TESSERA_BENCH_SWARM_CAP", "200mbit");
    let reps: usize = env("TESSERA_BENCH_REPS", "1")
        .parse()
        .expect("TESSERA_BENCH_REPS: a number");
    let timeout = Duration::from_secs(
        env("TESSERA_BENCH_SWARM_TIMEOUT", "300")
            .parse()
            .expect("TESSERA_BENCH_SWARM_TIMEOUT: seconds"),
    );
    let chosen: Vec<Method> = env("TESSERA_BENCH_SWARM_METHODS", "direct,lazy,p2p,mirror")
        .split(',')
        .map(|m| match m.trim() {
            "direct" => Method::CtrDirect,
            "lazy" => Method::LazyNoP2p,
            "p2p" => Method::LazyP2p,
            "mirror" => Method::CtrMirror,
            other => panic!(
                "TESSERA_BENCH_SWARM_METHODS: {other:?} is none of direct, lazy, p2p, mirror"
            ),
        })
        .collect();
    let per_node = env("TESSERA_BENCH_SWARM_PROFILE", "") == "nodes";
    let began = Instant::now();

    // 8 MiB files (fewer for a small image), in four layers.
    let file_size = (mb.clamp(1, 32) << 20) / 4;
    let files = ((mb << 20) / file_size).max(1) as u64;
    let mut swarm = Swarm::layered(files, file_size, 4, &cap);
    let hosts_dir = swarm.dir().join("certs.d");
    let registry = swarm.reference.split('/').next().unwrap().to_string();
    tessera_ok(&[
        "containerd-config",
        "--registry",
        &registry,
        "--insecure",
        &registry,
        "--mirror",
        &format!("http://{MIRROR}"),
        "--certs-dir",
        s(&hosts_dir),
        "--containerd-config",
        s(&swarm.dir().join("no-containerd-config.toml")),
    ]);
    let most = *nodes.iter().max().unwrap();
    let hosts = (0..most).map(|_| swarm.host()).collect();
    let mut bench = Bench {
        swarm,
        hosts,
        hosts_dir,
        timeout,
        runs: 0,
    };

    // runs[method][nodes index]: every repetition.
    let mut runs = vec![vec![Vec::new(); nodes.len()]; METHODS.len()];
    for (j, &n) in nodes.iter().enumerate() {
        // Interleaved, so a machine that slows down slows every method alike.
        for _ in 0..reps {
            for (i, (method, label)) in METHODS.iter().enumerate() {
                if !chosen.contains(method) {
                    continue;
                }
                let run = bench.run(*method, n);
                eprintln!(
                    "swarm: {n} node(s), {label}: {:.2} s, registry sent {:.1} MiB\n  {}",
                    run.last_done,
                    run.egress as f64 / f64::from(1 << 20),
                    run.profile.summary()
                );
                eprintln!("{}", run.profile.timeline());
                if per_node {
                    eprint!("{}", run.profile.nodes());
                }
                runs[i][j].push(run);
            }
        }
    }
    report(&bench.swarm, &nodes, &runs, &cap, reps, began.elapsed());
}

/// Prints the table and writes the JSON.
fn report(
    swarm: &Swarm,
    nodes: &[usize],
    runs: &[Vec<Vec<Run>>],
    cap: &str,
    reps: usize,
    took: Duration,
) {
    let time = |i: usize, j: usize| median(runs[i][j].iter().map(|r| r.last_done).collect());
    let egress = |i: usize, j: usize| median(runs[i][j].iter().map(|r| r.egress as f64).collect());
    let image = |i: usize| match METHODS[i].0 {
        Method::CtrDirect | Method::CtrMirror => swarm.plain_image_bytes,
        Method::LazyNoP2p | Method::LazyP2p => swarm.image_bytes,
    } as f64;
    let mib = |b: f64| b / f64::from(1 << 20);
    println!(
        "swarm: {} files, {:.1} MiB (plain image {:.1} MiB, converted {:.1} MiB), registry egress capped at {cap}, median of {reps}; {:.0} s in all",
        swarm.files.len(),
        mib(swarm.total() as f64),
        mib(swarm.plain_image_bytes as f64),
        mib(swarm.image_bytes as f64),
        took.as_secs_f64()
    );
    println!(
        "| method | nodes | last done s | vs ctr pull | vs 1 node | registry sent | x image | worst run x image |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (i, (_, label)) in METHODS.iter().enumerate() {
        if runs[i].iter().any(Vec::is_empty) {
            continue; // Not chosen (TESSERA_BENCH_SWARM_METHODS).
        }
        for (j, &n) in nodes.iter().enumerate() {
            let (t, e) = (time(i, j), egress(i, j));
            // "In every run": the worst repetition's egress beside the median.
            let worst = runs[i][j].iter().map(|r| r.egress).max().unwrap_or(0) as f64;
            // Without the baseline (not chosen) there is nothing to compare with.
            let vs_baseline = if runs[0][j].is_empty() {
                f64::NAN
            } else {
                time(0, j) / t.max(1e-9)
            };
            let vs_alone = t / time(i, 0).max(1e-9);
            let times_image = e / image(i);
            println!(
                "| {label} | {n} | {t:.2} | {vs_baseline:.2}x | {vs_alone:.2}x | {:.1} MiB | {times_image:.2}x | {:.2}x |",
                mib(e),
                worst / image(i)
            );
            rows.push(serde_json::json!({
                "method": label,
                "nodes": n,
                "last_done_seconds": t,
                "vs_baseline": vs_baseline.is_finite().then_some(vs_baseline),
                "vs_alone": vs_alone,
                "registry_bytes": e,
                "egress_vs_image": times_image,
                "worst_egress_vs_image": worst / image(i),
                "runs": runs[i][j].iter().map(|r| serde_json::json!({
                    "last_done_seconds": r.last_done,
                    "registry_bytes": r.egress,
                    "profile": r.profile.json(),
                })).collect::<Vec<_>>(),
            }));
        }
    }
    println!("vs ctr pull: the baseline's time / this time at the same N (above 1: faster);");
    println!(
        "vs 1 node: this time / the same method's on one node; x image: registry sent / image size"
    );
    if let Ok(path) = std::env::var("TESSERA_BENCH_JSON") {
        let json = serde_json::json!({
            "scenario": "swarm",
            "files": swarm.files.len(),
            "layers": 4,
            "image_bytes": swarm.image_bytes,
            "plain_image_bytes": swarm.plain_image_bytes,
            "file_bytes": swarm.total(),
            "registry_cap": cap,
            "repetitions": reps,
            "nodes": nodes,
            "baseline": METHODS[0].1,
            "seconds": took.as_secs_f64(),
            "rows": rows,
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
}
