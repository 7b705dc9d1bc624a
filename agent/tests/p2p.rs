//! Peer-to-peer on a simulated cluster: every agent, the scheduler and the registry in
//! its own network namespace with its own address (veth + bridge, `support::netns`),
//! the registry's egress capped by `tc`. Origin traffic is measured on the registry's
//! own interface; every byte read is compared with the image's files.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::agent::AgentProcess;
use support::netns::{Cluster, NetHost};
use support::oci::{self, build_files_image, pseudo_random};
use support::registry::Registry;
use support::scheduler::SchedulerProcess;
use support::{s, tessera};

/// A registry holding one converted image, a scheduler, and room for agents.
/// Fields drop in order: processes before the namespaces they run in.
struct Swarm {
    scheduler: SchedulerProcess,
    /// Kept for its lifetime: dropping it stops the registry.
    _registry: Registry,
    registry_host: NetHost,
    cluster: Cluster,
    /// Agent config naming the registry as plain HTTP.
    config: PathBuf,
    reference: String,
    files: Vec<(String, Vec<u8>)>,
    /// Compressed size of the converted image (blobs, bootstrap, config).
    image_bytes: u64,
    agents: usize,
    t: tempfile::TempDir,
}

impl Swarm {
    /// `count` files of `size` random bytes, converted; the registry capped at `cap`.
    fn new(count: u64, size: usize, cap: &str, scheduler_args: &[&str]) -> Swarm {
        let t = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::new();
        let registry_host = cluster.add_host("registry");
        registry_host.cap_egress(cap);
        let registry = Registry::start_in(&registry_host);
        let scheduler_host = cluster.add_host("scheduler");
        let scheduler = SchedulerProcess::start_in(
            &scheduler_host,
            t.path().join("scheduler.log"),
            scheduler_args,
        );
        let files: Vec<(String, Vec<u8>)> = (0..count)
            .map(|i| (format!("data/file{i:02}.bin"), pseudo_random(size, 700 + i)))
            .collect();
        let layout = t.path().join("layout");
        build_files_image(
            &layout,
            "amd64",
            &[files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect()],
        );
        registry.push_layout(&layout, oci::TAG, "src/app");
        let config = t.path().join("agent.toml");
        std::fs::write(
            &config,
            format!("[registry]\ninsecure = [\"{}\"]\n", registry.addr),
        )
        .unwrap();
        let out = tessera()
            .args(["convert", "--json", "--config"])
            .arg(&config)
            .arg(format!("{}/src/app:v1", registry.addr))
            .arg(format!("{}/tessera/app:v1", registry.addr))
            .env("DOCKER_CONFIG", t.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "convert: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        Swarm {
            scheduler,
            image_bytes: summary["pushed_bytes"].as_u64().unwrap(),
            reference: format!("{}/tessera/app:v1", registry.addr),
            _registry: registry,
            registry_host,
            cluster,
            config,
            files,
            agents: 0,
            t,
        }
    }

    /// A new agent on its own host, in the swarm, with `extra` flags.
    fn agent(&mut self, extra: &[&str]) -> AgentProcess {
        self.agents += 1;
        let n = self.agents;
        let host = self.cluster.add_host(&format!("agent{n}"));
        let peer_listen = format!("{}:7081", host.ip);
        let id = format!("agent{n}");
        let mut args = vec![
            "--config",
            s(&self.config),
            "--prefetch",
            "none",
            "--scheduler",
            &self.scheduler.url,
            "--peer-listen",
            &peer_listen,
            "--host-id",
            &id,
            "--zone",
            "z1",
        ];
        args.extend_from_slice(extra);
        AgentProcess::start_in(&self.t.path().join(&id), &host, &args)
    }

    /// Mounts the image through `agent`; returns the mountpoint.
    fn mount(&self, agent: &AgentProcess) -> PathBuf {
        let mnt = agent.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        agent.ok(&["mount", &self.reference, s(&mnt)]);
        mnt
    }

    /// Reads every file through `mnt` and compares it with the original.
    fn read_all(&self, mnt: &Path) {
        for (path, data) in &self.files {
            let got = std::fs::read(mnt.join(path)).unwrap();
            assert!(
                got == *data,
                "{path} read through {} differs",
                mnt.display()
            );
        }
    }

    fn total(&self) -> u64 {
        self.files.iter().map(|(_, d)| d.len() as u64).sum()
    }

    /// Bytes the registry has sent so far, counted on its own network interface.
    fn origin_tx(&self) -> u64 {
        self.registry_host.tx_bytes()
    }
}

fn pull(agent: &AgentProcess) -> serde_json::Value {
    agent.status()["mounts"][0]["pull"].clone()
}

/// Waits until `agent` is registered with the scheduler (or fails after 20 s).
fn wait_registered(agent: &AgentProcess) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while agent.status()["swarm"]["registered"] != true {
        assert!(
            std::time::Instant::now() < deadline,
            "agent never registered:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The second agent reads the image the first has read: its data comes from the
/// first agent, and the registry sends (almost) nothing for it — the manifest and the
/// bootstrap only.
#[test]
fn the_second_agent_reads_from_the_first() {
    let mut swarm = Swarm::new(4, 8 << 20, "400mbit", &[]);
    let first = swarm.agent(&[]);
    let second = swarm.agent(&[]);
    wait_registered(&first);
    wait_registered(&second);

    let before = swarm.origin_tx();
    let mnt = swarm.mount(&first);
    swarm.read_all(&mnt);
    let first_origin = swarm.origin_tx() - before;
    assert!(
        first_origin >= swarm.total(),
        "the first agent's data must come from the origin ({first_origin} bytes sent)"
    );
    assert_eq!(pull(&first)["origin_bytes"], swarm.total());

    let before = swarm.origin_tx();
    let mnt = swarm.mount(&second);
    swarm.read_all(&mnt);
    let second_origin = swarm.origin_tx() - before;
    let p = pull(&second);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    assert_eq!(p["verification_failures"], 0, "{p}");
    // The manifest, the bootstrap and TCP/HTTP overhead: a tiny fraction of the data.
    assert!(
        second_origin < 256 << 10,
        "the registry sent {second_origin} bytes for the second agent (data {} bytes)",
        swarm.total()
    );
    assert!(first.status()["swarm"]["uploaded_bytes"].as_u64().unwrap() >= swarm.total());
}

/// Twelve agents start reading the same image at the same moment through a capped
/// registry: the registry sends the image about once (≤ 1.2× its compressed size), and
/// every agent reads every byte correctly.
#[test]
fn a_swarm_pulls_the_image_about_once() {
    let mut swarm = Swarm::new(6, 8 << 20, "200mbit", &["--origin-fetchers", "1"]);
    let agents: Vec<AgentProcess> = (0..12).map(|_| swarm.agent(&[])).collect();
    for a in &agents {
        wait_registered(a);
    }
    let mounts: Vec<PathBuf> = agents.iter().map(|a| swarm.mount(a)).collect();
    let before = swarm.origin_tx();
    let barrier = std::sync::Barrier::new(mounts.len());
    std::thread::scope(|scope| {
        for (n, mnt) in mounts.iter().enumerate() {
            let (swarm, barrier) = (&swarm, &barrier);
            scope.spawn(move || {
                barrier.wait();
                // Different agents start at different files, as real workloads would.
                for k in 0..swarm.files.len() {
                    let (path, data) = &swarm.files[(k + n) % swarm.files.len()];
                    let got = std::fs::read(mnt.join(path)).unwrap();
                    assert!(got == *data, "agent {n}: {path} differs");
                }
            });
        }
    });
    let egress = swarm.origin_tx() - before;
    let ratio = egress as f64 / swarm.image_bytes as f64;
    let sources: Vec<String> = agents
        .iter()
        .map(|a| {
            let p = pull(a);
            format!("origin {} peer {}", p["origin_bytes"], p["peer_bytes"])
        })
        .collect();
    assert!(
        ratio <= 1.2,
        "12 agents made the registry send {egress} bytes, {ratio:.2}x the {}-byte image; per agent: {sources:?}",
        swarm.image_bytes
    );
    for a in &agents {
        assert_eq!(pull(a)["verification_failures"], 0);
    }
    eprintln!("swarm of 12: registry egress {ratio:.3}x the image; {sources:?}");
}

/// A peer serving corrupted bytes (the test-only fault switch): readers still get
/// correct data from another source, report the peer, and it stops being chosen.
#[test]
fn a_corrupting_peer_is_reported_and_avoided() {
    let mut swarm = Swarm::new(4, 4 << 20, "400mbit", &[]);
    let liar = swarm.agent(&["--fault-corrupt-uploads"]);
    let victim = swarm.agent(&[]);
    let later = swarm.agent(&[]);
    for a in [&liar, &victim, &later] {
        wait_registered(a);
    }
    let mnt = swarm.mount(&liar);
    swarm.read_all(&mnt); // From the origin: it is the only holder now.

    // The liar is the only peer holding the image: the victim is sent to it, detects
    // every bad chunk, and still reads correct data (from the origin).
    let mnt = swarm.mount(&victim);
    swarm.read_all(&mnt);
    let p = pull(&victim);
    assert!(
        p["verification_failures"].as_u64().unwrap() >= 1,
        "the victim never met the liar: {p}"
    );
    assert!(swarm
        .scheduler
        .log_text()
        .contains("peer served bytes that failed verification"));

    // Another reader: the liar is excluded, the honest victim serves everything.
    let liar_uploaded = liar.status()["swarm"]["uploaded_bytes"].as_u64().unwrap();
    let mnt = swarm.mount(&later);
    swarm.read_all(&mnt);
    let p = pull(&later);
    assert_eq!(
        p["verification_failures"], 0,
        "the liar was chosen again: {p}"
    );
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    assert_eq!(
        liar.status()["swarm"]["uploaded_bytes"].as_u64().unwrap(),
        liar_uploaded,
        "the excluded liar still served chunks"
    );
}

/// A peer killed mid-transfer: reads complete from others. The scheduler killed
/// mid-swarm: reads complete from the origin; after a restart it relearns the hosts
/// and what they hold, so a new agent reads from peers again.
#[test]
fn killed_peers_and_a_killed_scheduler_do_not_stop_reads() {
    let mut swarm = Swarm::new(4, 8 << 20, "400mbit", &["--lease-secs", "6"]);
    // A slow seed (4 MiB/s uploads), so there is time to kill it mid-transfer.
    let mut seed = swarm.agent(&["--upload-rate", "4M"]);
    let readers: Vec<AgentProcess> = (0..2).map(|_| swarm.agent(&[])).collect();
    wait_registered(&seed);
    let mnt = swarm.mount(&seed);
    swarm.read_all(&mnt);
    for r in &readers {
        wait_registered(r);
    }
    let mounts: Vec<PathBuf> = readers.iter().map(|r| swarm.mount(r)).collect();
    std::thread::scope(|scope| {
        for mnt in &mounts {
            let swarm = &swarm;
            scope.spawn(move || swarm.read_all(mnt));
        }
        // Mid-transfer: 64 MiB at 4 MiB/s takes many seconds.
        std::thread::sleep(Duration::from_secs(2));
        let uploaded = seed.status()["swarm"]["uploaded_bytes"].as_u64().unwrap();
        assert!(
            uploaded > 0 && uploaded < 2 * swarm.total(),
            "the seed should be mid-transfer, but has uploaded {uploaded} bytes"
        );
        seed.kill9();
    });
    for r in &readers {
        assert_eq!(pull(r)["verification_failures"], 0);
    }

    // The scheduler dies while two new agents read: they fall back to the origin.
    let late: Vec<AgentProcess> = (0..2).map(|_| swarm.agent(&[])).collect();
    for a in &late {
        wait_registered(a);
    }
    let mounts: Vec<PathBuf> = late.iter().map(|a| swarm.mount(a)).collect();
    let (head, tail) = swarm.files.split_at(2);
    let read = |mnt: &Path, files: &[(String, Vec<u8>)]| {
        for (path, data) in files {
            assert!(std::fs::read(mnt.join(path)).unwrap() == *data, "{path}");
        }
    };
    std::thread::scope(|scope| {
        for mnt in &mounts {
            scope.spawn(move || read(mnt, head));
        }
    });
    swarm.scheduler.kill9();
    std::thread::scope(|scope| {
        for mnt in &mounts {
            scope.spawn(move || read(mnt, tail));
        }
    });
    for a in &late {
        let p = pull(a);
        assert_eq!(p["verification_failures"], 0);
        assert!(
            p["peer_bytes"].as_u64().unwrap() > 0 && p["origin_bytes"].as_u64().unwrap() > 0,
            "peers before the scheduler died, the origin after: {p}"
        );
        assert_eq!(a.status()["swarm"]["registered"], false);
    }

    // Restarted, empty: the agents re-register and re-announce what they hold.
    swarm.scheduler.restart();
    for a in readers.iter().chain(&late) {
        wait_registered(a);
    }
    let newcomer = swarm.agent(&[]);
    wait_registered(&newcomer);
    let before = swarm.origin_tx();
    let mnt = swarm.mount(&newcomer);
    swarm.read_all(&mnt);
    let p = pull(&newcomer);
    assert_eq!(
        p["origin_bytes"], 0,
        "the restarted scheduler forgot the holders: {p}"
    );
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    assert!(swarm.origin_tx() - before < 256 << 10);
}
