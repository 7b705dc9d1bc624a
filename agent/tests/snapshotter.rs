//! The containerd snapshotter end to end: a real containerd 1.6 with its CRI plugin and
//! runc, the `tessera agent` as its proxy snapshotter, images pulled through the CRI
//! image service as the kubelet pulls them (a tonic client of the CRI API) or with
//! `tessera pull` (no CRI), containers started from them with `ctr run`, and a real `docker-registry` behind the fault
//! proxy, which counts what the origin sends.
//!
//! Needs containerd, runc, fuse3, docker-registry, umoci, skopeo and busybox-static
//! (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::agent::{is_mounted, AgentProcess};
use support::containerd::{Containerd, NAMESPACE};
use support::cri::cri_pull;
use support::fault_proxy::FaultProxy;
use support::oci::{self, build_files_image_with, pseudo_random, require_tool};
use support::registry::Registry;
use support::{convert, s};

/// What the test container prints: a line of a file from the image, then a line it
/// wrote to its writable layer and read back (shell builtins only: the image's one
/// program is busybox as `/bin/sh`).
const SCRIPT: &str = r#"read l < /data/hello; echo "$l"; echo "written by $1" > /data/new; read n < /data/new; echo "$n""#;

/// One node at a time: each test runs containers with a containerd of its own, and
/// several at once on 2 cores have lost a container's output (ctr succeeding with an
/// empty stdout) in CI.
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One node: a registry (behind the counting proxy), the agent with its snapshotter,
/// and containerd configured to use it.
/// Fields drop in order: containerd (and its containers), the agent (and its mounts),
/// the files, then the turn of the next test's node.
struct Node {
    containerd: Containerd,
    agent: AgentProcess,
    proxy: FaultProxy,
    registry: Registry,
    t: tempfile::TempDir,
    /// `tessera/app:v1` through the proxy (converted) and `src/app:v1` (plain OCI).
    tessera_ref: String,
    plain_ref: String,
    /// Digests of the converted image's blob layers (never fetched by a pull).
    blob_layers: Vec<String>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Temp dirs under /tmp keep the unix socket paths short.
fn node() -> Node {
    // A test that failed holding it poisons it; the next one still runs.
    let turn = ONE_NODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("tsnap")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);

    // Layer 0: busybox as /bin/sh; layer 1: a small file to read and a large one
    // nobody reads (a lazy start must not fetch it).
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let layout = t.path().join("layout");
    build_files_image_with(
        &layout,
        "amd64",
        &[
            // busybox runs the applet its name says; the copies share every chunk.
            vec![("bin/sh", busybox.clone()), ("bin/sleep", busybox)],
            vec![
                ("data/hello", b"hello from the image\n".to_vec()),
                ("data/later", b"read after the agent restarted\n".to_vec()),
                ("data/crash", b"read after the agent crashed\n".to_vec()),
                ("data/big", pseudo_random(6 << 20, 7)),
            ],
        ],
        &["bin/sh", "bin/sleep"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    convert(
        t.path(),
        &format!("{}/src/app:v1", registry.addr),
        &format!("{}/tessera/app:v1", registry.addr),
        &[],
    );

    let agent = AgentProcess::start_snapshotter(&t.path().join("agent"), &[]);
    // containerd's config made to use the snapshotter as a user would; it reaches the
    // proxy over plain HTTP.
    let containerd = Containerd::start_cri_tessera(
        &t.path().join("containerd"),
        &agent.snapshotter_socket(),
        &proxy.addr,
    );

    let manifest = manifest_json(&registry.addr, "tessera/app");
    let blob_layers = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["mediaType"] == "application/vnd.oci.image.layer.tessera.blob.v1")
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert!(
        !blob_layers.is_empty(),
        "the converted image has blob layers: {manifest}"
    );
    Node {
        tessera_ref: format!("{}/tessera/app:v1", proxy.addr),
        plain_ref: format!("{}/src/app:v1", proxy.addr),
        t,
        registry,
        proxy,
        agent,
        containerd,
        blob_layers,
        _turn: turn,
    }
}

/// The image manifest `repo:v1` of the registry at `addr`, as JSON.
fn manifest_json(addr: &str, repo: &str) -> serde_json::Value {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ])
        .arg(format!("http://{addr}/v2/{repo}/manifests/v1"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until containerd reaches the snapshotter again after the agent restarted:
/// containerd redials a proxy plugin with a backoff of up to 3 s.
fn wait_for_containerd_to_reconnect(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = node
            .containerd
            .ctr_k8s(&["snapshot", "--snapshotter", "tessera", "ls"]);
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "containerd does not reach the snapshotter: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the test script in a new container `name` from `image` with the Tessera
/// snapshotter; returns its output.
fn run_container(node: &Node, image: &str, name: &str) -> String {
    ctr_script(
        node,
        &["run", "--rm", "--snapshotter", "tessera", image, name],
        SCRIPT,
        name,
    )
}

/// Runs a script in the running container `container` (`ctr task exec`).
fn exec(node: &Node, container: &str, id: &str, script: &str) -> String {
    ctr_script(
        node,
        &["task", "exec", "--exec-id", id, container],
        script,
        id,
    )
}

/// `ctr -n k8s.io ARGS /bin/sh -c SCRIPT sh NAME` (the script sees NAME as `$1`);
/// its output, or a panic with ctr's output and both daemons' logs.
fn ctr_script(node: &Node, args: &[&str], script: &str, name: &str) -> String {
    let mut all = args.to_vec();
    all.extend(["/bin/sh", "-c", script, "sh", name]);
    let out = node.containerd.ctr_k8s(&all);
    assert!(
        out.status.success(),
        "ctr {args:?}: {}\n{}\ncontainerd log:\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.containerd.log(),
        node.agent.log()
    );
    String::from_utf8(out.stdout).unwrap()
}

fn expected_output(name: &str) -> String {
    format!("hello from the image\nwritten by {name}\n")
}

/// Requests for `/blobs/<digest>` the proxy answered.
fn blob_fetches(proxy: &FaultProxy, digest: &str) -> usize {
    proxy
        .log()
        .iter()
        .filter(|l| l.method == "GET" && l.target.contains(&format!("/blobs/{digest}")))
        .count()
}

/// A converted image pulled through CRI is mounted, not downloaded: the origin sends
/// the manifest, the config and the bootstrap, none of the blob layers; a container
/// runs from it, reads a file of the image and writes to its own layer. The plain OCI
/// original pulled with the same snapshotter is unpacked as usual and runs the same.
#[test]
fn cri_pull_of_a_tessera_image_downloads_no_layers_and_containers_run() {
    let mut node = node();

    let image_id = cri_pull(&node.containerd, &node.tessera_ref).unwrap_or_else(|e| {
        panic!(
            "CRI pull: {e}\ncontainerd log:\n{}\nagent log:\n{}",
            node.containerd.log(),
            node.agent.log()
        )
    });
    assert!(image_id.starts_with("sha256:"), "{image_id}");
    for blob in &node.blob_layers {
        assert_eq!(
            blob_fetches(&node.proxy, blob),
            0,
            "a pull through the Tessera snapshotter fetched blob layer {blob}:\n{:#?}",
            node.proxy.log()
        );
    }
    let pulled: u64 = node.proxy.blob_bytes();
    assert!(
        pulled < 1 << 20,
        "the pull fetched {pulled} blob bytes; the config and bootstrap are a few KiB:\n{:#?}",
        node.proxy.log()
    );
    let metrics = node.agent.metrics();
    for (line, why) in [
        (
            r#"tessera_agent_snapshotter_lazy_layers_total{kind="bootstrap"} 1"#,
            "the bootstrap layer was mounted",
        ),
        (
            &format!(
                r#"tessera_agent_snapshotter_lazy_layers_total{{kind="blob"}} {}"#,
                node.blob_layers.len()
            ),
            "every blob layer was skipped",
        ),
    ] {
        assert!(metrics.contains(line), "{why}: no {line} in\n{metrics}");
    }
    // The image is one lazy mount in the snapshotter's root.
    let status = node.agent.status();
    let mounts = status["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1, "{status}");
    let mountpoint = PathBuf::from(mounts[0]["mountpoint"].as_str().unwrap());
    assert!(mountpoint.starts_with(node.agent.dir.join("snapshotter")));
    assert!(is_mounted(&mountpoint));

    let before_run = node.proxy.blob_bytes();
    assert_eq!(
        run_container(&node, &node.tessera_ref, "c1"),
        expected_output("c1")
    );
    let read = node.proxy.blob_bytes() - before_run;
    assert!(
        read > 0,
        "running the container read chunks from the origin"
    );
    assert!(
        read < 5 << 20,
        "the container read busybox and a small file, not the 6 MiB file: {read} bytes"
    );
    // A second container from the same image: the same mount, its own writable layer.
    assert_eq!(
        run_container(&node, &node.tessera_ref, "c2"),
        expected_output("c2")
    );
    assert_eq!(node.agent.status()["mounts"].as_array().unwrap().len(), 1);
    // The image's lazy snapshot reports the bytes of its chunks the cache holds (what
    // the containers read), the blob layers' snapshots nothing.
    let usage = node
        .containerd
        .ctr_k8s(&["snapshots", "--snapshotter", "tessera", "usage"]);
    let usage = String::from_utf8_lossy(&usage.stdout).into_owned();
    let sized: Vec<&str> = usage
        .lines()
        .filter(|l| l.starts_with("sha256:"))
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|size| size.parse::<f64>().ok())
                .is_some_and(|size| size > 0.0)
        })
        .collect();
    assert_eq!(
        sized.len(),
        1,
        "one committed snapshot holds bytes:\n{usage}"
    );

    // A container that keeps running while the agent restarts.
    let started = node.containerd.ctr_k8s(&[
        "run",
        "-d",
        "--snapshotter",
        "tessera",
        &node.tessera_ref,
        "long",
        "/bin/sleep",
        "3600",
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    assert_eq!(exec(&node, "long", "e1", SCRIPT), expected_output("e1"));

    // The agent restarts (SIGTERM, a new process): the FUSE keeper held the mount's
    // connection, the new agent serves it, and the running container reads a file it
    // never read before, through the same mount, and writes to its layer.
    node.agent.restart();
    let socket = node.agent.dir.join("snap.sock");
    node.agent.wait_for_socket(&socket);
    wait_for_containerd_to_reconnect(&node);
    assert!(
        node.agent
            .log()
            .contains("took over the mount the previous agent left"),
        "{}",
        node.agent.log()
    );
    assert!(is_mounted(&mountpoint));
    let restored = r#"tessera_agent_snapshotter_restored_mounts_total{kind="taken_over"} 1"#;
    assert!(
        node.agent.metrics().contains(restored),
        "{}",
        node.agent.metrics()
    );
    let after =
        r#"read l < /data/later; echo "$l"; echo more >> /data/new; read n < /data/new; echo "$n""#;
    assert_eq!(
        exec(&node, "long", "e2", after),
        "read after the agent restarted\nwritten by e1\n"
    );
    // A new container from the same image starts too.
    assert_eq!(
        run_container(&node, &node.tessera_ref, "c3"),
        expected_output("c3")
    );
    // A crash (SIGKILL) is survived the same way.
    node.agent.kill9();
    node.agent.restart();
    node.agent.wait_for_socket(&socket);
    wait_for_containerd_to_reconnect(&node);
    let after_crash = r#"read l < /data/crash; echo "$l""#;
    assert_eq!(
        exec(&node, "long", "e3", after_crash),
        "read after the agent crashed\n"
    );
    for args in [
        &["task", "kill", "-s", "SIGKILL", "long"][..],
        &["task", "delete", "-f", "long"],
        &["container", "delete", "long"],
    ] {
        let out = node.containerd.ctr_k8s(args);
        assert!(
            out.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The plain OCI original: containerd downloads and unpacks it into the snapshotter.
    let before_plain = node.proxy.log().len();
    cri_pull(&node.containerd, &node.plain_ref).unwrap_or_else(|e| {
        panic!(
            "CRI pull of the plain image: {e}\n{}",
            node.containerd.log()
        )
    });
    assert!(
        node.proxy.log()[before_plain..]
            .iter()
            .filter(|l| l.target.contains("/blobs/"))
            .count()
            >= 3,
        "the plain image's config and two layers were downloaded"
    );
    assert_eq!(
        run_container(&node, &node.plain_ref, "p1"),
        expected_output("p1")
    );
    assert_eq!(
        node.agent.status()["mounts"].as_array().unwrap().len(),
        1,
        "a plain image is not mounted lazily"
    );

    // Removing the image (the CRI plugin names it by tag, by digest and by id) and
    // collecting garbage releases the lazy mount.
    let names = node.containerd.ctr_k8s(&["image", "ls", "-q"]);
    let names = String::from_utf8(names.stdout).unwrap();
    for name in names
        .lines()
        .filter(|n| n.contains("/tessera/app") || *n == image_id)
    {
        let rm = node.containerd.ctr_k8s(&["image", "rm", "--sync", name]);
        assert!(
            rm.status.success(),
            "ctr image rm {name}: {}",
            String::from_utf8_lossy(&rm.stderr)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while is_mounted(&mountpoint) {
        assert!(
            Instant::now() < deadline,
            "the image's mount outlived its image:\nimages: {}\nsnapshots: {}\n{}",
            String::from_utf8_lossy(&node.containerd.ctr_k8s(&["image", "ls", "-q"]).stdout),
            String::from_utf8_lossy(
                &node
                    .containerd
                    .ctr_k8s(&["snapshot", "--snapshotter", "tessera", "ls"])
                    .stdout
            ),
            node.agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = (&node.t, &node.registry);
}

/// A plain image with an index beside it (`tessera index`), never converted, pulled
/// through CRI: no layer is downloaded, each layer's snapshot is a lazy mount of the
/// tree of the layers up to it, and a container runs from it. Another plain image,
/// not indexed, that starts with the same layer builds on that layer's snapshot and
/// sees exactly that layer under its own: nothing of the indexed image's upper layer.
#[test]
fn cri_pull_of_an_indexed_plain_image_downloads_no_layers_and_shares_them_rightly() {
    let node = node();
    support::index(
        node.t.path(),
        &format!("{}/src/app:v1", node.registry.addr),
        &[],
    );
    let manifest = manifest_json(&node.registry.addr, "src/app");
    let layers: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(layers.len(), 2);

    cri_pull(&node.containerd, &node.plain_ref).unwrap_or_else(|e| {
        panic!(
            "CRI pull: {e}\ncontainerd log:\n{}\nagent log:\n{}",
            node.containerd.log(),
            node.agent.log()
        )
    });
    for layer in &layers {
        assert_eq!(
            blob_fetches(&node.proxy, layer),
            0,
            "the pull downloaded layer {layer}:\n{:#?}",
            node.proxy.log()
        );
    }
    let metrics = node.agent.metrics();
    for line in [
        r#"tessera_agent_snapshotter_lazy_layers_total{kind="layer_prefix"} 1"#,
        r#"tessera_agent_snapshotter_lazy_layers_total{kind="bootstrap"} 1"#,
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }
    assert_eq!(node.agent.status()["mounts"].as_array().unwrap().len(), 2);
    let before_run = node.proxy.blob_bytes();
    assert_eq!(
        run_container(&node, &node.plain_ref, "i1"),
        expected_output("i1")
    );
    let read = node.proxy.blob_bytes() - before_run;
    assert!(
        read > 0 && read < 5 << 20,
        "the container read busybox and a small file, not the 6 MiB file: {read} bytes"
    );

    // Another plain image on the same first layer (byte for byte), not indexed.
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let layout = node.t.path().join("other");
    build_files_image_with(
        &layout,
        "amd64",
        &[
            vec![("bin/sh", busybox.clone()), ("bin/sleep", busybox)],
            vec![("data/hello", b"hello from the other image\n".to_vec())],
        ],
        &["bin/sh", "bin/sleep"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    node.registry.push_layout(&layout, oci::TAG, "src/other");
    let other = format!("{}/src/other:v1", node.proxy.addr);
    let other_manifest = manifest_json(&node.registry.addr, "src/other");
    assert_eq!(
        other_manifest["layers"][0]["digest"], layers[0],
        "the two images share their first layer"
    );
    let before_other = node.proxy.log().len();
    cri_pull(&node.containerd, &other).unwrap_or_else(|e| {
        panic!(
            "CRI pull of the other image: {e}\n{}\n{}",
            node.containerd.log(),
            node.agent.log()
        )
    });
    // The shared layer's snapshot was there already: only the other layer came.
    let fetched_by_pull: Vec<String> = node.proxy.log()[before_other..]
        .iter()
        .filter(|l| l.method == "GET" && l.target.contains("/blobs/"))
        .map(|l| l.target.clone())
        .collect();
    assert!(
        !fetched_by_pull.iter().any(|t| t.contains(&layers[0])),
        "{fetched_by_pull:?}"
    );
    assert_eq!(
        fetched_by_pull.len(),
        2,
        "its config and layer: {fetched_by_pull:?}"
    );
    let script = r#"read l < /data/hello; echo "$l"; if [ -e /data/big ]; then echo "the indexed image's upper layer shows"; fi"#;
    let out = ctr_script(
        &node,
        &["run", "--rm", "--snapshotter", "tessera", &other, "o1"],
        script,
        "o1",
    );
    assert_eq!(out, "hello from the other image\n");
    assert!(!node.agent.log().contains("panicked at"));
}

/// `tessera pull --address SOCKET --namespace tessera-test ARGS IMAGE` against the
/// node's containerd, isolated from this machine's credentials and config; its output.
fn tessera_pull(node: &Node, image: &str, args: &[&str]) -> std::process::Output {
    support::tessera()
        .args(["pull", "--address", s(&node.containerd.socket)])
        .args(["--namespace", NAMESPACE])
        .args(args)
        .arg(image)
        .env("DOCKER_CONFIG", node.t.path())
        .env("TESSERA_CONFIG", "/dev/null")
        .output()
        .unwrap()
}

/// The digests of `/blobs/` the proxy was asked for (any method) from the `from`-th
/// request on.
fn blobs_requested(proxy: &FaultProxy, from: usize) -> Vec<String> {
    proxy.log()[from..]
        .iter()
        .filter_map(|l| l.target.split("/blobs/").nth(1))
        .map(|d| d.split('?').next().unwrap().to_string())
        .collect()
}

/// `tessera pull` puts a converted image into containerd without the CRI plugin, with
/// the snapshot labels the Tessera snapshotter reads: the origin sends the manifest,
/// the config and the bootstrap, no blob layer; `ctr run --snapshotter tessera` starts
/// a container from it at once, which reads a file of the image lazily. A second pull
/// finds every layer there and downloads nothing more than the first. A plain image
/// with an index (`tessera index`) is pulled and run the same way.
#[test]
fn tessera_pull_then_ctr_run_starts_a_tessera_image_with_no_layer_downloaded() {
    let node = node();
    let manifest = manifest_json(&node.registry.addr, "tessera/app");
    let config = manifest["config"]["digest"].as_str().unwrap().to_string();
    let bootstrap = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["mediaType"] == "application/vnd.oci.image.layer.tessera.bootstrap.v1+zstd")
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .unwrap();
    let layers = manifest["layers"].as_array().unwrap().len();

    let out = tessera_pull(&node, &node.tessera_ref, &["--json"]);
    assert!(
        out.status.success(),
        "tessera pull: {}\ncontainerd log:\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.containerd.log(),
        node.agent.log()
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["image"], node.tessera_ref.as_str(), "{summary}");
    assert_eq!(summary["layers"], layers, "{summary}");
    assert_eq!(summary["lazy"], layers, "{summary}");
    assert_eq!(summary["present"], 0, "{summary}");
    let progress = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        progress.matches("lazy, nothing downloaded").count(),
        layers,
        "a progress line per layer: {progress}"
    );

    // The origin sent the config (to `tessera pull`) and the bootstrap (to the agent).
    let fetched = blobs_requested(&node.proxy, 0);
    for blob in &node.blob_layers {
        assert_eq!(
            blob_fetches(&node.proxy, blob),
            0,
            "tessera pull fetched blob layer {blob}:\n{:#?}",
            node.proxy.log()
        );
    }
    assert!(
        fetched.iter().all(|d| *d == config || *d == bootstrap),
        "only the config and the bootstrap were fetched: {fetched:?}"
    );
    assert!(
        fetched.contains(&config) && fetched.contains(&bootstrap),
        "{fetched:?}"
    );
    assert!(node.proxy.blob_bytes() < 1 << 20, "{:#?}", node.proxy.log());
    let metrics = node.agent.metrics();
    for line in [
        r#"tessera_agent_snapshotter_lazy_layers_total{kind="bootstrap"} 1"#.to_string(),
        format!(
            r#"tessera_agent_snapshotter_lazy_layers_total{{kind="blob"}} {}"#,
            node.blob_layers.len()
        ),
    ] {
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
    let images = node.containerd.ctr_ok(&["image", "ls", "-q"]);
    assert!(
        images.lines().any(|l| l == node.tessera_ref),
        "containerd has the image by its name: {images}"
    );
    let leases = node.containerd.ctr_ok(&["leases", "ls", "-q"]);
    assert!(
        !leases.contains("tessera-pull"),
        "the lease was let go: {leases}"
    );

    // A container from it, with no CRI involved.
    let before_run = node.proxy.log().len();
    let out = node.containerd.ctr(&[
        "run",
        "--rm",
        "--snapshotter",
        "tessera",
        &node.tessera_ref,
        "c1",
        "/bin/sh",
        "-c",
        r#"read l < /data/hello; echo "$l""#,
    ]);
    assert!(
        out.status.success(),
        "ctr run: {}\n{}\ncontainerd log:\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.containerd.log(),
        node.agent.log()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from the image\n"
    );
    // The container's reads are chunks (Range requests), not whole layers.
    let run_log = &node.proxy.log()[before_run..];
    assert!(
        run_log
            .iter()
            .filter(|l| l.target.contains("/blobs/"))
            .all(|l| l.range.is_some()),
        "{run_log:#?}"
    );
    let read: u64 = run_log.iter().map(|l| l.body_bytes).sum();
    assert!(
        read < 5 << 20,
        "the container read busybox and a small file, not the 6 MiB file: {read} bytes"
    );

    // Pulling again finds every layer: nothing more than the manifest and config.
    let before_again = node.proxy.log().len();
    let out = tessera_pull(&node, &node.tessera_ref, &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["present"], layers, "{summary}");
    assert_eq!(
        blobs_requested(&node.proxy, before_again),
        [config],
        "{:#?}",
        &node.proxy.log()[before_again..]
    );

    // A plain image with an index beside it is pulled the same way: no layer fetched
    // whole, and a container reads it.
    support::index(
        node.t.path(),
        &format!("{}/src/app:v1", node.registry.addr),
        &[],
    );
    let plain_layers: Vec<String> = manifest_json(&node.registry.addr, "src/app")["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    let out = tessera_pull(&node, &node.plain_ref, &["--json"]);
    assert!(
        out.status.success(),
        "tessera pull of the indexed image: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.agent.log()
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["lazy"], plain_layers.len(), "{summary}");
    for layer in &plain_layers {
        assert_eq!(
            blob_fetches(&node.proxy, layer),
            0,
            "the pull fetched layer {layer}:\n{:#?}",
            node.proxy.log()
        );
    }
    let out = node.containerd.ctr(&[
        "run",
        "--rm",
        "--snapshotter",
        "tessera",
        &node.plain_ref,
        "i1",
        "/bin/sh",
        "-c",
        r#"read l < /data/hello; echo "$l""#,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from the image\n",
        "{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.agent.log()
    );
}

/// `tessera pull` of a plain image (neither converted nor indexed) fails saying so and
/// what to run instead, having downloaded no layer and left no image, snapshot or
/// lease behind; without containerd at the address, or without the snapshotter in
/// containerd's config, it says what to do.
#[test]
fn tessera_pull_of_a_plain_image_fails_with_what_to_run_instead() {
    let node = node();
    let manifest = manifest_json(&node.registry.addr, "src/app");
    let layers: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();

    let out = tessera_pull(&node, &node.plain_ref, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for words in [
        "neither converted",
        "nor indexed",
        "ctr image pull",
        "tessera convert",
        "tessera index",
        node.plain_ref.as_str(),
    ] {
        assert!(stderr.contains(words), "{words:?} not in: {stderr}");
    }
    for layer in &layers {
        assert_eq!(
            blob_fetches(&node.proxy, layer),
            0,
            "{:#?}",
            node.proxy.log()
        );
    }
    let images = node.containerd.ctr_ok(&["image", "ls", "-q"]);
    assert!(images.trim().is_empty(), "no image record: {images}");
    let snapshots = node
        .containerd
        .ctr_ok(&["snapshot", "--snapshotter", "tessera", "ls"]);
    assert!(
        !snapshots.contains("extract-"),
        "the prepared snapshot was removed: {snapshots}"
    );
    let leases = node.containerd.ctr_ok(&["leases", "ls", "-q"]);
    assert!(
        !leases.contains("tessera-pull"),
        "the lease was let go: {leases}"
    );

    // No containerd at the address.
    let out = support::tessera()
        .args(["pull", "--address"])
        .arg(node.t.path().join("nothing.sock"))
        .arg(&node.tessera_ref)
        .env("DOCKER_CONFIG", node.t.path())
        .env("TESSERA_CONFIG", "/dev/null")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("is containerd running") && stderr.contains("nothing.sock"),
        "{stderr}"
    );

    // A snapshotter containerd's config does not name.
    let out = tessera_pull(&node, &node.tessera_ref, &["--snapshotter", "nosuch"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("tessera containerd-config") && stderr.contains("nosuch"),
        "{stderr}"
    );
    let _ = &node.blob_layers;
}
