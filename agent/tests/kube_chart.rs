//! The Tessera Helm chart on a real Kubernetes node (issue 46): the control plane, a
//! kubelet and containerd 2 (`support::kube`), the chart installed with `helm` from
//! images built of this build's binaries (`support::chart`), and the node set up as
//! docs/operations.md tells an operator to: containerd restarted once after the init
//! container made the Tessera snapshotter its own, the kubelet's image service pointed
//! at the agent's CRI proxy.
//!
//! Needs root, `make kubernetes-deps`, `make containerd-deps`, `make chart-deps`, and
//! Debian's busybox-static, docker-registry, umoci, skopeo and
//! containernetworking-plugins (`make test-deps`).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::time::{Duration, Instant};

use support::chart::{
    agent_metrics, finish, is_ready, waiting_reason, NodePaths, Release, TestPod,
};
use support::fault_proxy::FaultProxy;
use support::kube::{KubeCluster, KubeOptions};
use support::oci::{self, build_files_image_with, pseudo_random, require_tool};
use support::registry::{Auth, Registry};

const USER: &str = "puller";
/// Distinctive, so that finding it anywhere is a finding.
const PASSWORD: &str = "pw-kube-chart-4d1e";

/// What the app prints: a line of a small file of its image.
const HELLO: &str = "hello from a lazily started private image";

/// The chart's values for the node's snapshotter and CRI proxy.
const SNAPSHOTTER_VALUES: &str = r#"agent:
  snapshotter:
    enabled: true
  criProxy:
    enabled: true
containerd:
  configureSnapshotter: true
"#;

/// A pod `name` running `image` (its `/bin/sh` prints the first line of /data/hello,
/// then waits), pulled at each start with `secret` as its pull secret if given.
fn app_pod(name: &str, image: &str, secret: Option<&str>) -> String {
    TestPod {
        pull_secret: secret,
        always_pull: true,
        ..TestPod::new(
            name,
            image,
            r#"trap 'exit 0' TERM; read l < /data/hello; echo "$l"; while :; do sleep 1; done"#,
        )
    }
    .manifest()
}

/// (a) A converted image in a private repository starts lazily through the chart's
/// snapshotter and CRI proxy with the pod's pull secret, the registry sending only a
/// fraction of the image; without the secret the pod stays in ErrImagePull.
#[test]
fn private_image_starts_lazily_through_the_chart_with_its_pull_secret() {
    require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("tkch")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start_with(Auth::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    });
    let proxy = FaultProxy::start(&registry.addr);
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let big = 24 << 20;
    let layout = t.path().join("layout");
    build_files_image_with(
        &layout,
        "amd64",
        &[
            vec![("bin/sh", busybox)],
            vec![
                ("data/hello", format!("{HELLO}\n").into_bytes()),
                ("data/big", pseudo_random(big, 46)),
            ],
        ],
        &["bin/sh"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    let creds = format!("{USER}:{PASSWORD}");
    let home = t.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    support::convert(
        &home,
        &format!("{}/src/app:v1", registry.addr),
        &format!("{}/private/app:v1", registry.addr),
        &["--src-creds", &creds, "--dest-creds", &creds],
    );
    let image = format!("{}/private/app:v1", proxy.addr);

    let mut cluster = KubeCluster::start(&KubeOptions::with_registry(&proxy.addr));
    let paths = NodePaths::of(&cluster);
    let release = Release::install(&cluster, "tessera", &paths, SNAPSHOTTER_VALUES);
    let node_name = cluster.nodes()[0].name.clone();
    // What an operator does once per node after installing (docs/operations.md):
    // restart containerd for the snapshotter the init container configured (and the
    // runtime handler the agent's pod waits for), and point the kubelet's image
    // service at the agent's CRI proxy.
    release.configure_node(&mut cluster, 0);
    let config =
        std::fs::read_to_string(cluster.nodes()[0].host_path(&paths.containerd_config)).unwrap();
    assert!(
        config.contains("snapshotter = \"tessera\"")
            && config.contains("[proxy_plugins.tessera]")
            && config.contains(".containerd.runtimes.tessera-native]"),
        "the init container did not configure the snapshotter:\n{config}"
    );
    cluster
        .node_mut(0)
        .set_image_service_endpoint(Some(&paths.root.join("run/tessera/cri.sock")));
    release.agent_pod_on(&node_name);

    // Without the secret: refused at the registry, the pod stays waiting for its image.
    cluster.kubectl_apply(&app_pod("no-secret", &image, None));
    release.wait_pod(
        "no-secret",
        Duration::from_secs(60),
        "in ErrImagePull",
        |p| {
            matches!(
                waiting_reason(p).as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        },
    );
    cluster.kubectl_ok(&["delete", "pod", "no-secret", "--wait=true"]);

    // With it: started lazily.
    cluster.kubectl_ok(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={}", proxy.addr),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={PASSWORD}"),
    ]);
    let before = proxy.blob_bytes();
    cluster.kubectl_apply(&app_pod("app", &image, Some("regcred")));
    release.wait_pod("app", Duration::from_secs(90), "Ready", is_ready);
    let logs = cluster.kubectl_ok(&["logs", "app"]);
    assert!(logs.contains(HELLO), "the app printed {logs:?}");
    let sent = proxy.blob_bytes() - before;
    eprintln!(
        "registry sent {:.1} MiB of blobs for the start of a {:.0} MiB image",
        sent as f64 / (1 << 20) as f64,
        big as f64 / (1 << 20) as f64
    );
    assert!(
        sent < big as u64 / 4,
        "the start fetched {sent} bytes: more than a start reads of a {big}-byte image"
    );
    // The snapshotter mounted it lazily (its bootstrap, no layer unpacked), and the
    // pull came through the CRI proxy with the pod's credentials.
    let metrics = agent_metrics(&cluster, 1);
    for line in [
        r#"tessera_agent_snapshotter_lazy_layers_total{kind="bootstrap"} 1"#,
        r#"tessera_agent_cri_pulls_total{credentials="yes",outcome="ok"} 1"#,
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }
    finish(cluster, release);
}

/// (c) Images nobody converted: a plain image with an index beside it (`tessera
/// index`) starts lazily through the snapshotter, and an ordinary image comes through
/// the agent's registry mirror (the chart's init container wrote containerd's
/// hosts.toml for the registry).
#[test]
fn indexed_and_ordinary_images_start_through_the_chart() {
    require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("tkch")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let big = 24 << 20;
    for (repo, seed) in [("plain/indexed", 47), ("plain/ordinary", 48)] {
        let layout = t.path().join(repo.replace('/', "-"));
        build_files_image_with(
            &layout,
            "amd64",
            &[
                vec![("bin/sh", busybox.clone())],
                vec![
                    ("data/hello", format!("{HELLO} ({repo})\n").into_bytes()),
                    ("data/big", pseudo_random(big, seed)),
                ],
            ],
            &["bin/sh"],
            serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
        );
        registry.push_layout(&layout, oci::TAG, repo);
    }
    let home = t.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    support::index(&home, &format!("{}/plain/indexed:v1", registry.addr), &[]);

    let mut cluster = KubeCluster::start(&KubeOptions::with_registry(&proxy.addr));
    let paths = NodePaths::of(&cluster);
    let values = format!(
        "{SNAPSHOTTER_VALUES}  configureMirror: true\n  registries:\n    - {addr}\n  insecure:\n    - {addr}\n",
        addr = proxy.addr
    );
    let release = Release::install(&cluster, "tessera", &paths, &values);
    release.configure_node(&mut cluster, 0);

    let before = proxy.blob_bytes();
    let indexed = format!("{}/plain/indexed:v1", proxy.addr);
    cluster.kubectl_apply(&app_pod("indexed", &indexed, None));
    release.wait_pod("indexed", Duration::from_secs(90), "Ready", is_ready);
    let logs = cluster.kubectl_ok(&["logs", "indexed"]);
    assert!(logs.contains("(plain/indexed)"), "the app printed {logs:?}");
    let sent = proxy.blob_bytes() - before;
    eprintln!(
        "indexed plain image: registry sent {:.1} MiB of blobs for its start",
        sent as f64 / (1 << 20) as f64
    );
    assert!(
        sent < big as u64 / 4,
        "the indexed image's start fetched {sent} bytes: it was pulled, not mounted lazily"
    );

    let ordinary = format!("{}/plain/ordinary:v1", proxy.addr);
    cluster.kubectl_apply(&app_pod("ordinary", &ordinary, None));
    release.wait_pod("ordinary", Duration::from_secs(90), "Ready", is_ready);
    let logs = cluster.kubectl_ok(&["logs", "ordinary"]);
    assert!(
        logs.contains("(plain/ordinary)"),
        "the app printed {logs:?}"
    );
    let metrics = agent_metrics(&cluster, 1);
    let mirrored: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("tessera_agent_mirror_blob_bytes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        mirrored >= big as f64,
        "the ordinary image's layers did not come through the mirror ({mirrored} bytes):\n{metrics}"
    );
    finish(cluster, release);
}

/// The mount points under `dir` in `node`'s mount namespace (its mount table's fifth
/// field), for what an uninstall leaves.
fn node_mounts_under(node: &support::kube::Node, dir: &std::path::Path) -> Vec<String> {
    let out = node
        .command("cat")
        .arg("/proc/self/mountinfo")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| std::path::Path::new(p).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

/// (i) `helm uninstall`, then the node steps of docs/operations.md ("Uninstall" and
/// the snapshotter's), leave the node as that page says: the cache, the hosts files
/// and empty directories stay; no mount, no process of Tessera's; containerd's config
/// back to what it was.
#[test]
fn uninstall_leaves_the_node_as_operations_md_says() {
    require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("tkch")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let layout = t.path().join("layout");
    build_files_image_with(
        &layout,
        "amd64",
        &[vec![
            ("bin/sh", busybox),
            ("data/hello", format!("{HELLO}\n").into_bytes()),
            ("data/big", pseudo_random(4 << 20, 49)),
        ]],
        &["bin/sh"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    let home = t.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    support::convert(
        &home,
        &format!("{}/src/app:v1", registry.addr),
        &format!("{}/lazy/app:v1", registry.addr),
        &[],
    );
    let image = format!("{}/lazy/app:v1", registry.addr);

    let mut cluster = KubeCluster::start(&KubeOptions::with_registry(&registry.addr));
    let paths = NodePaths::of(&cluster);
    let node_config = cluster.nodes()[0].host_path(&paths.containerd_config);
    let original_config = std::fs::read_to_string(&node_config).unwrap();
    let values = format!(
        "{SNAPSHOTTER_VALUES}  configureMirror: true\n  registries:\n    - {addr}\n  insecure:\n    - {addr}\n",
        addr = registry.addr
    );
    let mut release = Release::install(&cluster, "tessera", &paths, &values);
    release.configure_node(&mut cluster, 0);
    cluster.kubectl_apply(&app_pod("app", &image, None));
    release.wait_pod("app", Duration::from_secs(90), "Ready", is_ready);
    cluster.kubectl_ok(&["delete", "pod", "app", "--wait=true"]);
    release.assert_no_panics();

    let began = Instant::now();
    release.uninstall();
    eprintln!("helm uninstall: every pod gone in {:.1?}", began.elapsed());
    let left = cluster.kubectl_ok(&[
        "-n",
        "tessera-system",
        "get",
        "all,configmaps,secrets",
        "-o",
        "name",
    ]);
    let ours: Vec<&str> = left
        .lines()
        .filter(|l| !l.contains("kube-root-ca.crt"))
        .collect();
    assert!(ours.is_empty(), "helm uninstall left {ours:?}");
    let classes = cluster.kubectl_ok(&["get", "runtimeclasses", "-o", "name"]);
    assert!(classes.trim().is_empty(), "helm uninstall left {classes}");

    // The node steps, as an operator runs them with the agent image's binary.
    let node = &cluster.nodes()[0];
    let root = &paths.root;
    let snapshotter_root = root.join("var/lib/tessera/snapshotter");
    let tessera = env!("CARGO_BIN_EXE_tessera");
    let clean = node
        .command(tessera)
        .args(["snapshotter", "clean", "--json", "--remove", "--root"])
        .arg(&snapshotter_root)
        .arg("--socket")
        .arg(root.join("run/tessera/snapshotter.sock"))
        .output()
        .unwrap();
    assert!(
        clean.status.success(),
        "tessera snapshotter clean: {}",
        String::from_utf8_lossy(&clean.stderr)
    );
    let undo = node
        .command(tessera)
        .args(["containerd-config", "--undo", "--snapshotter-socket"])
        .arg(root.join("run/tessera/snapshotter.sock"))
        .arg("--containerd-config")
        .arg(&paths.containerd_config)
        .output()
        .unwrap();
    assert!(
        undo.status.success(),
        "tessera containerd-config --undo: {}",
        String::from_utf8_lossy(&undo.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&node_config).unwrap(),
        original_config,
        "containerd's config is not what it was before the chart"
    );
    cluster.node_mut(0).restart_containerd();
    let node = &cluster.nodes()[0];

    // What stays, as the table says: the cache, empty mount and socket directories,
    // the hosts files (still working: the registry is their fallback); nothing
    // mounted under the host root, no Tessera process on the node.
    let mounts = node_mounts_under(node, root);
    assert!(
        mounts.iter().all(|m| !m.contains("tessera")),
        "mounts left under {}: {mounts:#?}",
        root.display()
    );
    assert!(
        !node.host_path(&snapshotter_root).exists(),
        "--remove kept the snapshotter root"
    );
    let cache = node.host_path(root.join("var/lib/tessera/cache"));
    assert!(cache.is_dir(), "the cache is gone: {}", cache.display());
    let hosts = node.host_path(paths.certs_dir.join(&registry.addr).join("hosts.toml"));
    let text = std::fs::read_to_string(&hosts).unwrap();
    assert!(
        text.starts_with("# Written by"),
        "{}: {text}",
        hosts.display()
    );
    let procs = tessera_processes_of(node);
    assert!(
        procs.is_empty(),
        "Tessera processes left on the node: {procs:#?}"
    );
    // And the node still pulls the image through its hosts file's fallback.
    cluster.kubectl_apply(&app_pod(
        "after",
        &format!("{}/src/app:v1", registry.addr),
        None,
    ));
    release.wait_pod("after", Duration::from_secs(90), "Ready", is_ready);
    let footprint = cluster.footprint();
    drop(release);
    drop(cluster);
    footprint.assert_clean();
}

/// The command lines of Tessera's processes in `node`'s mount namespace.
fn tessera_processes_of(node: &support::kube::Node) -> Vec<String> {
    let ns_of = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let out = node
        .command("readlink")
        .arg("/proc/self/ns/mnt")
        .output()
        .unwrap();
    let node_ns = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| ns_of(pid).as_ref() == Some(&node_ns))
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("/usr/local/bin/tessera") || c.contains("fuse-keeper"))
        .collect()
}

/// A busybox image whose `/data/big` is `big` pseudo-random bytes (seed `seed`), with
/// the applets the tests run, pushed to `registry` as `repo:v1`.
fn push_reader_image(
    registry: &Registry,
    work: &std::path::Path,
    repo: &str,
    big: usize,
    seed: u64,
) {
    let tree = work.join(format!("{}-tree", repo.replace('/', "-")));
    let bin = tree.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(oci::which("busybox").unwrap(), bin.join("busybox")).unwrap();
    for applet in ["sh", "sleep", "sha256sum", "cat", "echo"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let data = tree.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("hello"), format!("{HELLO}\n")).unwrap();
    std::fs::write(data.join("big"), pseudo_random(big, seed)).unwrap();
    let layout = work.join(format!("{}-layout", repo.replace('/', "-")));
    oci::build_dirs_image(
        &layout,
        "amd64",
        &[&tree],
        serde_json::json!({"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, repo);
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The pids of `tessera agent` processes on node 1 of `cluster`: in its cgroup root
/// (the containers have mount namespaces of their own).
fn agent_pids(cluster: &KubeCluster) -> Vec<u32> {
    let node_cgroup = format!("/tsk{}-1/", cluster.addrs.slot);
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(&node_cgroup))
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/local/bin/tessera\0agent\0"))
        })
        .collect()
}

/// A node reading a lazily mounted image while the agent is taken away: the chart with
/// only the snapshotter, a pod `reader` of a converted busybox image whose `/data/big`
/// is 24 MiB, and the registry behind a proxy that can slow it down.
struct Reading {
    cluster: KubeCluster,
    release: Release,
    paths: NodePaths,
    proxy: FaultProxy,
    node_name: String,
    /// The sha256 of `/data/big`, hex.
    expected: String,
    _registry: Registry,
    _work: tempfile::TempDir,
}

impl Reading {
    fn start() -> Reading {
        require_tool("busybox");
        let work = tempfile::Builder::new()
            .prefix("tkch")
            .tempdir_in("/tmp")
            .unwrap();
        let registry = Registry::start();
        let proxy = FaultProxy::start(&registry.addr);
        let big = 24 << 20;
        push_reader_image(&registry, work.path(), "src/reader", big, 50);
        let expected = sha256_hex(&pseudo_random(big, 50));
        let home = work.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        support::convert(
            &home,
            &format!("{}/src/reader:v1", registry.addr),
            &format!("{}/lazy/reader:v1", registry.addr),
            &[],
        );
        let image = format!("{}/lazy/reader:v1", proxy.addr);

        let mut cluster = KubeCluster::start(&KubeOptions::with_registry(&proxy.addr));
        let paths = NodePaths::of(&cluster);
        let release = Release::install(&cluster, "tessera", &paths, &reader_values(""));
        let node_name = cluster.nodes()[0].name.clone();
        release.configure_node(&mut cluster, 0);
        cluster.kubectl_apply(&app_pod("reader", &image, None));
        release.wait_pod("reader", Duration::from_secs(90), "Ready", is_ready);
        Reading {
            cluster,
            release,
            paths,
            proxy,
            node_name,
            expected,
            _registry: registry,
            _work: work,
        }
    }

    /// Slows the registry to 256 KiB/s a response, starts reading `/data/big` in the
    /// pod, and returns once the read is under way: bytes flowing, the file not read
    /// yet (the test then takes the agent away in the middle of it).
    fn start_slow_read(&self) -> std::process::Child {
        self.proxy.inject(
            support::fault_proxy::Rule::new(support::fault_proxy::Fault::SlowBody {
                bytes_per_sec: 256 << 10,
            })
            .path("/blobs/")
            .times(u32::MAX),
        );
        let mut child = self
            .release
            .kubectl_command(&[
                "exec",
                "-n",
                "default",
                "reader",
                "--",
                "sha256sum",
                "/data/big",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.proxy.slow_bytes_sent() < 1 << 20 {
            assert!(
                Instant::now() < deadline,
                "the read fetched nothing from the registry in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the read finished before the test could take the agent away: slow the registry more"
        );
        child
    }

    /// The read's outcome: whether it went on across the agent's absence (else it
    /// failed and a second read must give the right bytes).
    fn read_went_on(&self, reader: std::process::Child) -> bool {
        let out = reader.wait_with_output().unwrap();
        self.proxy.clear();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.starts_with(&self.expected) {
            return true;
        }
        eprintln!(
            "the read across the agent's absence failed ({}); reading again",
            String::from_utf8_lossy(&out.stderr)
        );
        let again = self
            .cluster
            .kubectl_ok(&["exec", "reader", "--", "sha256sum", "/data/big"]);
        assert!(
            again.starts_with(&self.expected),
            "read again: {again} (expected {})",
            self.expected
        );
        false
    }

    /// How often the `agent` container of pod `pod` restarted.
    fn agent_restarts(&self, pod: &str) -> u32 {
        self.cluster
            .kubectl_ok(&[
                "-n",
                "tessera-system",
                "get",
                "pod",
                pod,
                "-o",
                "jsonpath={.status.containerStatuses[?(@.name==\"agent\")].restartCount}",
            ])
            .trim()
            .parse::<u32>()
            .unwrap()
    }

    /// The reader never restarted, and every FUSE mount under the host root answers
    /// (no stale mount).
    fn assert_reader_and_mounts_fine(&self) {
        let reader_restarts = self.cluster.kubectl_ok(&[
            "get",
            "pod",
            "reader",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ]);
        assert_eq!(reader_restarts.trim(), "0", "the reader restarted");
        let node = &self.cluster.nodes()[0];
        let table = node
            .command("cat")
            .arg("/proc/self/mountinfo")
            .output()
            .unwrap();
        let mut fuse = 0;
        for line in String::from_utf8_lossy(&table.stdout).lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let fstype = fields
                .iter()
                .skip_while(|f| **f != "-")
                .nth(1)
                .copied()
                .unwrap_or("");
            let mountpoint = fields.get(4).copied().unwrap_or("");
            if fstype.starts_with("fuse")
                && std::path::Path::new(mountpoint).starts_with(&self.paths.root)
            {
                fuse += 1;
                let stat = node.command("stat").arg(mountpoint).output().unwrap();
                assert!(
                    stat.status.success(),
                    "stale mount {mountpoint}: {}",
                    String::from_utf8_lossy(&stat.stderr)
                );
            }
        }
        assert!(fuse > 0, "no FUSE mount of the reader's image on the node");
    }

    fn finish(self) {
        self.cluster
            .kubectl_ok(&["delete", "pod", "reader", "--wait=true"]);
        finish(self.cluster, self.release);
    }
}

/// Only the snapshotter: no CRI proxy (the image is public) and no mirror; `agent`
/// (indented lines) added to the agent's values.
fn reader_values(agent: &str) -> String {
    format!(
        "agent:\n  snapshotter:\n    enabled: true\n  mirror:\n    enabled: false\n{agent}\
         containerd:\n  configureSnapshotter: true\n"
    )
}

/// (e) The agent killed with SIGKILL while a pod reads a file of its lazily mounted
/// image: the kubelet restarts the agent's container (on the native runtime: the
/// Tessera snapshotter that is containerd's default is down meanwhile), the FUSE
/// keeper held the mount's connection, the read completes with the right bytes (or
/// fails once and reads right again), the pod never restarts, and every mount on the
/// node still answers.
#[test]
fn a_pods_read_survives_the_agent_killed_mid_read() {
    let r = Reading::start();
    let agent_pod = r.release.agent_pod_on(&r.node_name);
    let restarts_before = r.agent_restarts(&agent_pod);
    let reader = r.start_slow_read();
    let pids = agent_pids(&r.cluster);
    assert_eq!(pids.len(), 1, "one agent on the node: {pids:?}");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let began = Instant::now();
    if r.read_went_on(reader) {
        eprintln!(
            "the read went on across the agent's SIGKILL ({:.1?} after it)",
            began.elapsed()
        );
    }

    // The agent came back (restarted in place).
    assert_eq!(
        r.release.agent_pod_on(&r.node_name),
        agent_pod,
        "the agent's pod was replaced, not its container restarted"
    );
    // The kubelet reports the restart a moment after it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.agent_restarts(&agent_pod) == restarts_before {
        assert!(
            Instant::now() < deadline,
            "the agent's restart count stayed {restarts_before}:\n{}",
            r.release.describe()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        r.agent_restarts(&agent_pod),
        restarts_before + 1,
        "the agent container restarted once for the kill"
    );
    r.assert_reader_and_mounts_fine();
    r.finish();
}

/// (d) `helm upgrade` that rolls the agent DaemonSet while a pod reads its image: the
/// old agent hands its mounts to the FUSE keeper (in the node DaemonSet, which the
/// upgrade does not roll), the new one takes them over, and the read goes on to the
/// right bytes without an error; no container restarts.
#[test]
fn a_helm_upgrade_rolls_the_agents_while_a_pod_reads() {
    let r = Reading::start();
    let old_agent = r.release.agent_pod_on(&r.node_name);
    let node_pod = r.release.ready_pod_on("node", &r.node_name);
    let reader = r.start_slow_read();
    let began = Instant::now();
    // A change of the agents' pod template: the DaemonSet rolls them.
    r.release.upgrade(&reader_values(
        "  podAnnotations:\n    example.com/rollout: \"2\"\n",
    ));
    eprintln!(
        "helm upgrade --wait: the agents rolled in {:.1?}",
        began.elapsed()
    );
    let new_agent = r.release.agent_pod_on(&r.node_name);
    assert_ne!(
        new_agent, old_agent,
        "the upgrade did not replace the agent's pod"
    );
    assert!(
        r.read_went_on(reader),
        "the read failed across the rollout (a rollout must hand the mounts over)"
    );
    eprintln!("the read went on across the rollout");
    assert_eq!(
        r.release.ready_pod_on("node", &r.node_name),
        node_pod,
        "the upgrade replaced the node pod (it holds the FUSE connections: OnDelete)"
    );
    assert_eq!(r.agent_restarts(&new_agent), 0, "the new agent restarted");
    r.assert_reader_and_mounts_fine();
    // The new agent serves the old mounts: a file not read yet arrives.
    let hello = r
        .cluster
        .kubectl_ok(&["exec", "reader", "--", "cat", "/data/hello"]);
    assert!(hello.contains(HELLO), "read {hello:?}");
    r.finish();
}
