//! The Tessera Helm chart's swarm on a real two-node Kubernetes cluster
//! (`support::kube`, `support::chart`): every node runs its own containerd, kubelet and
//! agent (host network, in a network namespace of its own from node 2 on), the
//! scheduler runs as the chart's StatefulSet, and containerd uses the agent's
//! snapshotter as docs/operations.md tells an operator to (the init container edits
//! its config, containerd is restarted once on each node).
//!
//! The registry (behind a `FaultProxy` that counts the blob bytes it sends) is reached
//! by every node and every agent on the control-plane address
//! (`KubeCluster::expose_registry`); the agents speak plain HTTP to it
//! (`agent.insecureRegistries`).
//!
//! Needs root, `make kubernetes-deps`, `make containerd-deps`, `make chart-deps`, and
//! Debian's busybox-static, docker-registry, umoci, skopeo and
//! containernetworking-plugins (`make test-deps`).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::chart::{metric_sum, NodePaths, Release, TestPod, NAMESPACE};
use support::fault_proxy::{Fault, FaultProxy, Rule};
use support::kube::KubeCluster;
use support::kube::KubeOptions;
use support::oci::{self, pseudo_random, require_tool};
use support::registry::Registry;

/// The big file every pod reads whole: enough chunks to tell peers from the origin,
/// little enough to stay quick.
const BIG: usize = 32 << 20;

/// How long a pod may take from creation to having read the big file.
const POD_DONE: Duration = Duration::from_secs(120);

/// busybox applets the pods use (a symlink each to `busybox`, which runs the applet
/// its name says).
const APPLETS: [&str; 5] = ["sh", "cat", "sha256sum", "sleep", "echo"];

/// A converted image in a registry two nodes reach, and a cluster of two nodes with
/// the chart installed and containerd using its snapshotter.
struct Swarm {
    cluster: KubeCluster,
    release: Release,
    /// Counts the registry's blob bytes (every node and agent reaches the registry
    /// through it).
    proxy: FaultProxy,
    /// The converted image as the nodes pull it (the control-plane address).
    image: String,
    /// sha256 of the big file, as `sha256sum` prints it.
    sum: String,
    _registry: Registry,
    _work: tempfile::TempDir,
}

impl Swarm {
    /// Builds and converts the image, starts two nodes, installs the chart with the
    /// snapshotter, `scheduler_replicas` and `extra_agent` (YAML lines under `agent:`,
    /// indented by two), and restarts each node's containerd for the snapshotter.
    fn start(scheduler_replicas: u32, extra_agent: &str) -> Swarm {
        require_tool("busybox");
        require_tool("curl");
        let work = tempfile::Builder::new()
            .prefix("tkcs")
            .tempdir_in("/tmp")
            .unwrap();
        let registry = Registry::start();
        let proxy = FaultProxy::start(&registry.addr);
        let big = pseudo_random(BIG, 52);
        let sum = format!("{:x}", Sha256::digest(&big));
        let layout = busybox_data_layout(work.path(), big);
        registry.push_layout(&layout, oci::TAG, "src/app");
        let home = work.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        support::convert(
            &home,
            &format!("{}/src/app:v1", registry.addr),
            &format!("{}/conv/app:v1", registry.addr),
            &[],
        );

        let began = Instant::now();
        let mut cluster = KubeCluster::start(&KubeOptions::default());
        cluster.add_node();
        let host = cluster.expose_registry(&proxy.addr);
        let paths = NodePaths::of(&cluster);
        let values = format!(
            r#"agent:
  snapshotter:
    enabled: true
  insecureRegistries:
    - "{host}"
{extra_agent}containerd:
  configureSnapshotter: true
scheduler:
  replicas: {scheduler_replicas}
"#
        );
        let release = Release::install(&cluster, "tessera", &paths, &values);
        for i in 0..cluster.nodes().len() {
            release.configure_node(&mut cluster, i);
            let node = &cluster.nodes()[i];
            let config = std::fs::read_to_string(node.host_path(&paths.containerd_config)).unwrap();
            assert!(
                config.contains("snapshotter = \"tessera\""),
                "the chart did not configure {}'s snapshotter:\n{config}",
                node.name
            );
        }
        eprintln!(
            "two nodes, chart installed, containerd restarted in {:.1?}",
            began.elapsed()
        );
        Swarm {
            cluster,
            release,
            proxy,
            image: format!("{host}/conv/app:v1"),
            sum,
            _registry: registry,
            _work: work,
        }
    }

    /// Creates pod `name` on `node`, which prints the big file's sha256 and ends.
    fn run_reader(&self, name: &str, node: &str) {
        self.cluster.kubectl_apply(
            &TestPod {
                node: Some(node),
                ..TestPod::new(name, &self.image, "sha256sum /data/big")
            }
            .manifest(),
        );
    }

    /// Waits for pod `name` to end, then checks that it ended well and printed the big
    /// file's sha256.
    fn wait_reader(&self, name: &str) {
        let phase = self.release.wait_pod(name, POD_DONE, "done", |p| {
            matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
        let logs = self.cluster.kubectl_ok(&["logs", name]);
        assert!(
            phase["status"]["phase"] == "Succeeded" && logs.contains(&self.sum),
            "pod {name} ended {} printing {logs:?}, not the big file's sha256 {}:\n{:#}\n{}",
            phase["status"]["phase"],
            self.sum,
            phase["status"],
            self.release.describe()
        );
    }

    /// Node `n`'s (1-based) agent's `tessera_agent_bytes_total` for `source`.
    fn agent_bytes(&self, n: u8, source: &str) -> f64 {
        metric_sum(
            &self.agent_metrics(n),
            "tessera_agent_bytes_total",
            &format!("source=\"{source}\""),
        )
    }

    /// Node `n`'s (1-based) agent's metrics, on the node's address (node 2's is routed
    /// from the test's network namespace).
    fn agent_metrics(&self, n: u8) -> String {
        let url = format!("http://{}:9464/metrics", self.cluster.addrs.node(n));
        curl(&["-sf", "--max-time", "5", &url])
            .unwrap_or_else(|e| panic!("GET {url}: {e}\n{}", self.release.describe()))
    }

    /// The chart's admin token, from its Secret.
    fn admin_token(&self) -> String {
        let b64 = self.cluster.kubectl_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "secret",
            "tessera-admin-tokens",
            "-o",
            "jsonpath={.data.admin-token}",
        ]);
        let out = Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(b64.trim().as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success(), "base64 -d of {b64:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Waits until `n` scheduler replicas are Ready, and returns them.
    fn wait_replicas(&self, n: usize, within: Duration) -> Vec<(String, String)> {
        let deadline = Instant::now() + within;
        loop {
            let ready = self.scheduler_pods();
            if ready.len() == n {
                return ready;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} scheduler replicas Ready after {within:?}:\n{}\n{}",
                ready.len(),
                self.release.describe(),
                self.cluster.logs_tail(40)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The scheduler's replicas: (pod name, pod IP) of each Ready one.
    fn scheduler_pods(&self) -> Vec<(String, String)> {
        let out = self.cluster.kubectl_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=scheduler",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ]);
        out.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[2] == "True").then(|| (f[0].to_owned(), f[1].to_owned()))
            })
            .collect()
    }

    /// `METHOD /api/v1/PATH` on the scheduler replica at `ip` with `token`, and its JSON.
    fn admin(
        &self,
        ip: &str,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> serde_json::Value {
        try_admin(ip, token, method, path, body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until `n` scheduler replicas are Ready, every one lists both nodes' agents
    /// as hosts, and both agents say (`tessera status`) they are registered with all
    /// `n`, as docs/operations.md has an operator check; returns the replicas.
    fn wait_swarm(&self, token: &str, n: usize, within: Duration) -> Vec<(String, String)> {
        let deadline = Instant::now() + within;
        loop {
            let replicas = self.wait_replicas(n, within);
            let hosts: Vec<usize> = replicas
                .iter()
                .map(|(_, ip)| {
                    try_admin(ip, token, "GET", "hosts", None)
                        .ok()
                        .and_then(|h| h.as_array().map(Vec::len))
                        .unwrap_or(0)
                })
                .collect();
            let agents: Vec<serde_json::Value> = ["node-1", "node-2"]
                .iter()
                .map(|node| self.agent_swarm_status(node))
                .collect();
            let registered = |a: &serde_json::Value| {
                a["schedulers"].as_u64() == Some(n as u64)
                    && a["schedulers_registered"].as_u64() == Some(n as u64)
            };
            if hosts.iter().all(|&h| h == 2) && agents.iter().all(registered) {
                return replicas;
            }
            assert!(
                Instant::now() < deadline,
                "the swarm is not whole after {within:?}: replicas {replicas:?} list \
                 {hosts:?} hosts; the agents' swarm status: {agents:?}\n{}\n--- scheduler \
                 logs ---\n{}",
                self.release.describe(),
                self.release
                    .logs("app.kubernetes.io/component=scheduler", "scheduler")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The `swarm` part of `tessera status --json` of the agent on `node`.
    fn agent_swarm_status(&self, node: &str) -> serde_json::Value {
        let out = self.release.tessera(node, &["status", "--json"]);
        assert!(
            out.status.success(),
            "tessera status on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        status["swarm"].clone()
    }

    /// The scheduler replica (pod name, and the blob's view) that tracks the big file's
    /// blob (the only one of at least [`BIG`] bytes) with a holder: the replica that
    /// blob's holders and fetchers talk to (agents shard blobs over the replicas,
    /// agent/src/peer/ring.rs).
    fn big_blob_owner(
        &self,
        replicas: &[(String, String)],
        token: &str,
    ) -> Option<(String, serde_json::Value)> {
        replicas.iter().find_map(|(pod, ip)| {
            let blobs = try_admin(ip, token, "GET", "blobs", None).ok()?;
            let big = blobs.as_array()?.iter().find(|b| {
                b["size"].as_u64().is_some_and(|s| s >= BIG as u64)
                    && b["holders"].as_u64().is_some_and(|h| h > 0)
            })?;
            Some((pod.clone(), big.clone()))
        })
    }
}

/// `METHOD /api/v1/PATH` on the scheduler replica at `ip` with `token`: its JSON, or
/// why there is none.
fn try_admin(
    ip: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<serde_json::Value, String> {
    let url = format!("http://{ip}:7090/api/v1/{path}");
    let auth = format!("Authorization: Bearer {token}");
    let mut args = vec!["-sS", "--max-time", "10", "-X", method, "-H", &auth];
    if let Some(body) = body {
        args.extend(["-H", "Content-Type: application/json", "--data", body]);
    }
    args.push(&url);
    let text = curl(&args).map_err(|e| format!("{method} {url}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{method} {url} answered {text:?}: {e}"))
}

/// `curl ARGS` from the test's network namespace: its stdout, or why it failed.
fn curl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("curl").args(args).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// An image of busybox (an applet per symlink) in one layer and `/data/big` in a
/// second, as an OCI layout under `work`, tagged [`oci::TAG`].
fn busybox_data_layout(work: &Path, big: Vec<u8>) -> std::path::PathBuf {
    let tree = work.join("busybox-tree");
    let bin = tree.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(oci::which("busybox").unwrap(), bin.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let data = work.join("data-tree");
    std::fs::create_dir_all(data.join("data")).unwrap();
    std::fs::write(data.join("data/big"), big).unwrap();
    let layout = work.join("layout");
    oci::build_dirs_image(
        &layout,
        "amd64",
        &[&tree, &data],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    layout
}

/// The end of every test ([`support::chart::finish`]), the registry's proxy gone with
/// the cluster.
fn finish(swarm: Swarm) {
    let Swarm {
        cluster,
        release,
        proxy,
        _registry,
        _work,
        ..
    } = swarm;
    support::chart::finish(cluster, release);
    drop(proxy);
}

fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
}

/// (b) The same converted image on two nodes: node 1's pod reads the big file from
/// the registry; node 2's reads it from node 1's agent, the registry sending next to
/// nothing.
#[test]
fn second_node_reads_the_image_from_the_first_nodes_agent() {
    let swarm = Swarm::start(1, "");

    let before = swarm.proxy.blob_bytes();
    let began = Instant::now();
    swarm.run_reader("reader-1", "node-1");
    swarm.wait_reader("reader-1");
    let first = swarm.proxy.blob_bytes() - before;
    let first_took = began.elapsed();

    let before = swarm.proxy.blob_bytes();
    let began = Instant::now();
    swarm.run_reader("reader-2", "node-2");
    swarm.wait_reader("reader-2");
    let second = swarm.proxy.blob_bytes() - before;
    let second_took = began.elapsed();

    let peer2 = swarm.agent_bytes(2, "peer");
    let origin2 = swarm.agent_bytes(2, "origin");
    let origin1 = swarm.agent_bytes(1, "origin");
    eprintln!(
        "node 1: {first_took:.1?}, registry sent {:.2} MiB (agent: {:.2} MiB from origin); \
         node 2: {second_took:.1?}, registry sent {:.2} MiB, agent: {:.2} MiB from peers, \
         {:.2} MiB from origin",
        mib(first as f64),
        mib(origin1),
        mib(second as f64),
        mib(peer2),
        mib(origin2)
    );
    assert!(
        first >= BIG as u64,
        "node 1's start fetched only {first} bytes from the registry for a {BIG}-byte file"
    );
    assert!(
        second < first / 10,
        "node 2's start fetched {second} bytes from the registry (node 1's: {first}): \
         not from node 1's agent\n{}",
        swarm.release.describe()
    );
    assert!(
        peer2 >= BIG as f64 * 0.9,
        "node 2's agent fetched {peer2} bytes from peers for a {BIG}-byte file:\n{}",
        swarm.agent_metrics(2)
    );
    finish(swarm);
}

/// (g) Preheat through the scheduler's admin API (its pod's IP, the chart's admin
/// token): both nodes fetch the image before any pod uses it; the pods then start and
/// read the big file with (almost) nothing from the registry.
#[test]
fn a_preheated_image_starts_with_almost_nothing_from_the_registry() {
    preheat_then_start(false);
}

/// (g), stricter: after the preheat neither node fetches the big file again, from the
/// origin or from a peer: each reads it from its own cache.
///
/// Not passing, so not run: the node that fetched the blob from the origin during the
/// preheat reads it again from the other node when its pod reads it (35,536,688 bytes
/// from the peer, none from its cache; the node that took it from the peer reads its
/// cache). docs/compatibility.md names it.
#[test]
#[ignore = "bug: the preheat's origin-fetching node does not keep the blob's chunks (docs/compatibility.md)"]
fn preheated_nodes_read_the_image_from_their_own_caches() {
    preheat_then_start(true);
}

/// The preheat of (g), then a reader pod on each node; `strict`: neither agent fetches
/// anything after the preheat.
fn preheat_then_start(strict: bool) {
    let swarm = Swarm::start(1, "");
    let token = swarm.admin_token();
    let replicas = swarm.wait_replicas(1, Duration::from_secs(60));
    let ip = &replicas[0].1;

    // Both agents registered.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let hosts = swarm.admin(ip, &token, "GET", "hosts", None);
        if hosts.as_array().is_some_and(|h| h.len() == 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not both agents registered: {hosts:#}\n{}",
            swarm.release.describe()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let before = swarm.proxy.blob_bytes();
    let began = Instant::now();
    let body = serde_json::json!({"image": swarm.image, "timeout_secs": 120}).to_string();
    let job = swarm.admin(ip, &token, "POST", "preheat", Some(&body));
    let id = job["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no job id in {job:#}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(150);
    let job = loop {
        let job = swarm.admin(ip, &token, "GET", &format!("preheat/{id}"), None);
        if matches!(job["state"].as_str(), Some("succeeded" | "failed")) {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "preheat {id} not done: {job:#}\n{}",
            swarm.release.describe()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let preheat = swarm.proxy.blob_bytes() - before;
    let preheat_took = began.elapsed();
    assert_eq!(
        job["state"],
        "succeeded",
        "{job:#}\n{}",
        swarm.release.describe()
    );
    assert_eq!(job["hosts"].as_object().unwrap().len(), 2, "{job:#}");
    for (host, part) in job["hosts"].as_object().unwrap() {
        assert_eq!(part["chunks_done"], part["chunks_total"], "{host}: {part}");
    }

    let fetched = |n| swarm.agent_bytes(n, "origin") + swarm.agent_bytes(n, "peer");
    let agents_before = [fetched(1), fetched(2)];
    let before = swarm.proxy.blob_bytes();
    let began = Instant::now();
    for n in 1..=2 {
        swarm.run_reader(&format!("reader-{n}"), &format!("node-{n}"));
    }
    for n in 1..=2 {
        swarm.wait_reader(&format!("reader-{n}"));
    }
    let start = swarm.proxy.blob_bytes() - before;
    let agents = [fetched(1) - agents_before[0], fetched(2) - agents_before[1]];
    eprintln!(
        "preheat of both nodes: {preheat_took:.1?}, registry sent {:.2} MiB; then both pods \
         read the big file in {:.1?}: registry sent {:.3} MiB, agents fetched {:.3} + {:.3} \
         MiB from origin and peers",
        mib(preheat as f64),
        began.elapsed(),
        mib(start as f64),
        mib(agents[0]),
        mib(agents[1])
    );
    assert!(
        preheat >= BIG as u64,
        "the preheat fetched only {preheat} bytes from the registry for a {BIG}-byte file"
    );
    assert!(
        start < 1 << 20,
        "the preheated pods' starts fetched {start} bytes from the registry\n{}",
        swarm.release.describe()
    );
    if strict {
        assert!(
            agents.iter().all(|&a| a < (1 << 20) as f64),
            "the agents fetched {agents:?} bytes from origin and peers after the preheat"
        );
    }
    finish(swarm);
}

/// How fast the registry sends each blob response while (f) wants pulls in progress:
/// reading the big file from it takes node 1 many seconds.
const SLOW: u64 = 256 << 10;

/// (f) Three scheduler replicas; while both nodes pull the image (the registry slowed
/// down), the replica that tracks the big file's blob is deleted. Both pods still read
/// the big file whole and right, with no agent fetching it from the registry more than
/// once; the StatefulSet brings the replica back, the agents register with it again
/// (docs/operations.md: replicas keep no swarm state, agents re-register and fetch from
/// the origin until then) and re-announce the blob to it (it owns it again).
#[test]
fn pulls_complete_when_a_scheduler_replica_is_deleted_mid_pull() {
    let swarm = Swarm::start(3, "");
    let token = swarm.admin_token();
    let replicas = swarm.wait_swarm(&token, 3, Duration::from_secs(90));

    swarm.proxy.inject(
        Rule::new(Fault::SlowBody {
            bytes_per_sec: SLOW,
        })
        .method("GET")
        .path("/blobs/")
        .times(u32::MAX),
    );
    let before = swarm.proxy.blob_bytes();
    let began = Instant::now();
    swarm.run_reader("reader-1", "node-1");
    wait_for("node 1 to read from the slowed registry", || {
        swarm.proxy.slow_bytes_sent() >= 2 << 20
    });
    let second_began = Instant::now();
    swarm.run_reader("reader-2", "node-2");
    let fetched2 = || swarm.agent_bytes(2, "peer") + swarm.agent_bytes(2, "origin");
    wait_for("node 2's agent to fetch some of the image", || {
        fetched2() >= (1 << 20) as f64
    });

    // The replica that matters: the one both nodes talk to about the big blob.
    wait_for("a replica to track the big file's blob", || {
        swarm.big_blob_owner(&replicas, &token).is_some()
    });
    let (victim, blob) = swarm.big_blob_owner(&replicas, &token).unwrap();
    let digest = blob["blob"].as_str().unwrap().to_owned();
    for reader in ["reader-1", "reader-2"] {
        let pod = swarm
            .cluster
            .kubectl_ok(&["get", "pod", reader, "-o", "json"]);
        let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
        assert_ne!(
            pod["status"]["phase"], "Succeeded",
            "{reader} is done before the replica goes: the registry is not slow enough"
        );
    }
    let slow_at_delete = swarm.proxy.slow_bytes_sent();
    let deleted = Instant::now();
    swarm
        .cluster
        .kubectl_ok(&["-n", NAMESPACE, "delete", "pod", &victim, "--wait=true"]);
    let deletion_took = deleted.elapsed();
    swarm.proxy.clear();

    swarm.wait_reader("reader-1");
    let first_took = began.elapsed();
    swarm.wait_reader("reader-2");
    let second_took = second_began.elapsed();
    let sent = swarm.proxy.blob_bytes() - before;

    let replicas = swarm.wait_swarm(&token, 3, Duration::from_secs(120));
    let whole_again = deleted.elapsed();
    let back = &replicas.iter().find(|(pod, _)| *pod == victim).unwrap().1;
    let deadline = Instant::now() + Duration::from_secs(30);
    let owned = loop {
        let blobs = swarm.admin(back, &token, "GET", "blobs", None);
        let owned = blobs
            .as_array()
            .and_then(|b| b.iter().find(|b| b["blob"] == digest.as_str()))
            .cloned();
        if owned.as_ref().is_some_and(|b| b["holders"] == 2) {
            break owned.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{victim} is back but its blob {digest} is not announced to it by both \
             nodes: {blobs:#}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    eprintln!(
        "deleted {victim} (tracking {digest}: {blob}) {:.1?} into node 1's pull, with \
         {:.2} MiB sent slowly; deletion took {deletion_took:.1?}, the swarm was whole \
         again {whole_again:.1?} after it. node 1's pod done by {first_took:.1?}, node \
         2's by {second_took:.1?}; registry sent {:.2} MiB; agents: node 1 {:.2} MiB \
         from origin, {:.2} MiB from peers; node 2 {:.2} MiB from origin, {:.2} MiB \
         from peers; back on {victim}: {owned}",
        deleted - began,
        mib(slow_at_delete as f64),
        mib(sent as f64),
        mib(swarm.agent_bytes(1, "origin")),
        mib(swarm.agent_bytes(1, "peer")),
        mib(swarm.agent_bytes(2, "origin")),
        mib(swarm.agent_bytes(2, "peer")),
    );
    // Each agent reads the image once, from peers or the registry: losing a replica
    // sends an agent to the origin for what it lacks, not back over what it has.
    assert!(
        sent < 2 * BIG as u64 + (8 << 20),
        "the registry sent {sent} bytes for two nodes reading a {BIG}-byte file\n{}",
        swarm.release.describe()
    );
    finish(swarm);
}

/// Waits up to a minute for `done`, panicking with `what` then.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "waited a minute for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
