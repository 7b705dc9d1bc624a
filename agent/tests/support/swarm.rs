//! A P2P test bed on a [`Cluster`]: a registry (egress capped) holding one image of
//! random files, plain (`src/app:v1`) and converted (`tessera/app:v1`), a scheduler,
//! and agents added one host each. Shared by the P2P tests and the swarm benchmark.

use std::path::{Path, PathBuf};

use super::agent::AgentProcess;
use super::netns::{Cluster, NetHost};
use super::oci::{self, build_files_image, pseudo_random};
use super::registry::Registry;
use super::scheduler::SchedulerProcess;
use super::{s, tessera};

/// A registry holding one converted image, a scheduler, and room for agents.
/// Fields drop in order: processes before the namespaces they run in.
pub struct Swarm {
    pub scheduler: SchedulerProcess,
    /// More scheduler replicas (none unless made with [`Swarm::with_replicas`]).
    pub replicas: Vec<SchedulerProcess>,
    /// Kept for its lifetime: dropping it stops the registry.
    registry: Registry,
    registry_host: NetHost,
    cluster: Cluster,
    /// Agent config naming the registry as plain HTTP.
    config: PathBuf,
    pub reference: String,
    pub files: Vec<(String, Vec<u8>)>,
    /// Compressed size of the converted image (blobs, bootstrap, config).
    pub image_bytes: u64,
    /// The plain OCI image the converted one was made from (`src/app:v1`).
    pub plain_reference: String,
    /// Its size: manifest, config and layers.
    pub plain_image_bytes: u64,
    agents: usize,
    t: tempfile::TempDir,
}

impl Swarm {
    /// `count` files of `size` random bytes, converted; the registry capped at `cap`.
    pub fn new(count: u64, size: usize, cap: &str, scheduler_args: &[&str]) -> Swarm {
        Swarm::with_replicas(count, size, cap, 1, scheduler_args)
    }

    /// As [`Swarm::new`], with `replicas` schedulers (each on its own host); agents
    /// are given all of them.
    pub fn with_replicas(
        count: u64,
        size: usize,
        cap: &str,
        replicas: usize,
        scheduler_args: &[&str],
    ) -> Swarm {
        Swarm::build(count, size, cap, replicas, 1, scheduler_args)
    }

    /// As [`Swarm::new`], the files spread over `layers` layers of the plain image (as
    /// real images are made; containerd fetches layers in parallel).
    pub fn layered(count: u64, size: usize, layers: usize, cap: &str) -> Swarm {
        Swarm::build(count, size, cap, 1, layers, &[])
    }

    fn build(
        count: u64,
        size: usize,
        cap: &str,
        replicas: usize,
        layers: usize,
        scheduler_args: &[&str],
    ) -> Swarm {
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
        let replicas = (1..replicas.max(1))
            .map(|i| {
                let host = cluster.add_host(&format!("scheduler{i}"));
                SchedulerProcess::start_in(
                    &host,
                    t.path().join(format!("scheduler{i}.log")),
                    scheduler_args,
                )
            })
            .collect();
        let files: Vec<(String, Vec<u8>)> = (0..count)
            .map(|i| (format!("data/file{i:02}.bin"), pseudo_random(size, 700 + i)))
            .collect();
        let layout = t.path().join("layout");
        let per_layer = files.len().div_ceil(layers.max(1)).max(1);
        let as_layers: Vec<Vec<(&str, Vec<u8>)>> = files
            .chunks(per_layer)
            .map(|c| c.iter().map(|(p, d)| (p.as_str(), d.clone())).collect())
            .collect();
        build_files_image(&layout, "amd64", &as_layers);
        registry.push_layout(&layout, oci::TAG, "src/app");
        let plain_image_bytes = std::fs::read_dir(layout.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
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
            replicas,
            image_bytes: summary["pushed_bytes"].as_u64().unwrap(),
            reference: format!("{}/tessera/app:v1", registry.addr),
            plain_reference: format!("{}/src/app:{}", registry.addr, oci::TAG),
            plain_image_bytes,
            registry,
            registry_host,
            cluster,
            config,
            files,
            agents: 0,
            t,
        }
    }

    /// `tessera index` of the plain image (issue 22): it can then be mounted lazily.
    pub fn index_plain(&self) {
        let out = tessera()
            .args(["index", "--json", "--config"])
            .arg(&self.config)
            .arg(&self.plain_reference)
            .env("DOCKER_CONFIG", self.t.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "index: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A new agent on its own host, in the swarm, with `extra` flags.
    pub fn agent(&mut self, extra: &[&str]) -> AgentProcess {
        let host = self.host();
        self.agent_in(&host, extra)
    }

    /// A new host in the cluster (for agents one after another, or a containerd).
    pub fn host(&mut self) -> NetHost {
        self.cluster.add_host("node")
    }

    /// A new agent (own id, files and cache) on `host`, in the swarm, with `extra`
    /// flags; the host's previous agent, if any, must have stopped.
    pub fn agent_in(&mut self, host: &NetHost, extra: &[&str]) -> AgentProcess {
        self.agents += 1;
        let n = self.agents;
        let id = format!("agent{n}");
        let schedulers: Vec<&str> = std::iter::once(&self.scheduler)
            .chain(&self.replicas)
            .map(|s| s.url.as_str())
            .collect();
        let swarm = peer_agent_args(&schedulers.join(","), host, &id);
        let mut args = vec!["--config", s(&self.config)];
        args.extend(swarm.iter().map(String::as_str));
        args.extend_from_slice(extra);
        AgentProcess::start_in(&self.t.path().join(&id), host, &args)
    }

    /// The swarm's scratch directory (removed with it).
    pub fn dir(&self) -> &Path {
        self.t.path()
    }

    /// Mounts the image through `agent`; returns the mountpoint.
    pub fn mount(&self, agent: &AgentProcess) -> PathBuf {
        let mnt = agent.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        agent.ok(&["mount", &self.reference, s(&mnt)]);
        mnt
    }

    /// Reads every file through `mnt` and compares it with the original.
    pub fn read_all(&self, mnt: &Path) {
        for (path, data) in &self.files {
            let got = std::fs::read(mnt.join(path)).unwrap();
            assert!(
                got == *data,
                "{path} read through {} differs",
                mnt.display()
            );
        }
    }

    pub fn total(&self) -> u64 {
        self.files.iter().map(|(_, d)| d.len() as u64).sum()
    }

    /// The origin registry (its access log is the tests' ground truth).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// `tessera-scheduler admin --json ARGS` against the swarm's scheduler, started
    /// with [`admin_args`] and the same `token`.
    pub fn admin(&self, token: &Path, args: &[&str]) -> std::process::Output {
        std::process::Command::new(super::scheduler::binary())
            .args([
                "admin",
                "--url",
                &format!("http://{}:7090", self.scheduler.ip()),
                "--token-file",
            ])
            .arg(token)
            .arg("--json")
            .args(args)
            .output()
            .unwrap()
    }

    /// Bytes the registry has sent so far, counted on its own network interface.
    pub fn origin_tx(&self) -> u64 {
        self.registry_host.tx_bytes()
    }
}

/// An agent's flags for a swarm: `schedulers` (a URL, or several comma-separated),
/// peers served on port 7081 of `host`, host id `id`, zone `z1`, no prefetch (a test
/// reads what it wants fetched).
pub fn peer_agent_args(schedulers: &str, host: &NetHost, id: &str) -> Vec<String> {
    [
        "--prefetch",
        "none",
        "--scheduler",
        schedulers,
        "--peer-listen",
        &format!("{}:7081", host.ip),
        "--host-id",
        id,
        "--zone",
        "z1",
    ]
    .map(String::from)
    .to_vec()
}

/// Scheduler arguments for its admin API on port 7090 with the token in `token`, and
/// its state (the blocklist) in `state`: a test's own, or schedulers of tests running
/// at once would share the default one and its lock.
pub fn admin_args<'a>(token: &'a Path, state: &'a Path) -> [&'a str; 6] {
    [
        "--admin-listen",
        "0.0.0.0:7090",
        "--admin-token-file",
        s(token),
        "--state-dir",
        s(state),
    ]
}

/// What an admin command printed, as JSON (panics with its output otherwise).
pub fn admin_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits until `agent` is registered with the scheduler, every replica of it (or fails
/// after 20 s).
pub fn wait_registered(agent: &AgentProcess) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let all = |s: &serde_json::Value| {
        s["registered"] == true && s["schedulers_registered"] == s["schedulers"]
    };
    while !all(&agent.status()["swarm"]) {
        assert!(
            std::time::Instant::now() < deadline,
            "agent never registered:\n{}",
            agent.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits up to `limit` until the scheduler's `images` view (what `images` fetches
/// from its admin API) counts a host holding an image whole; panics with the view
/// otherwise.
pub fn wait_image_complete(
    limit: std::time::Duration,
    mut images: impl FnMut() -> serde_json::Value,
) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let view = images();
        let complete = view
            .as_array()
            .is_some_and(|l| l.iter().any(|i| i["complete_hosts"].as_u64() >= Some(1)));
        if complete {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no host holds the image whole after {limit:?}: {view}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
