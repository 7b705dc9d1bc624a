//! The kubelet's image garbage collection on a node whose containerd uses the chart's
//! snapshotter (issue 46 (h)): the kubelet removes an image no pod uses, the agent lets
//! go of that image's chunks and the cache gives their disk back, while the chunks of a
//! running pod's image are never taken, however far the cache is past its capacity.
//!
//! What the product does (nothing here is special to the test): containerd removes the
//! removed image's snapshots through the snapshotter, whose removal of the image's
//! mount releases the mount's pin on the image's chunks (`cache/pins.rs`); the release
//! evicts what is then past the capacity, and whatever of the image is left is no
//! longer protected (`tessera cache prune`, the watermarks and later puts evict it).
//! Chunks another mounted image names stay pinned by that image.
//!
//! The kubelet runs image GC at its start and every 5 minutes after (hard-coded): the
//! test restarts the kubelet once the removed pod's container is gone, and the run 5
//! minutes later frees B (the run at the start has not listed the node's images yet),
//! so the test takes about 7 minutes. Its disk-usage pass, with thresholds of 1% and
//! 0%, measures the image filesystem holding the snapshotter's root, which `tessera
//! containerd-config --snapshotter-root` exports to containerd; without the export
//! containerd named a directory that does not exist, and only the age pass
//! (`imageMaximumGCAge` of 60 s) could free anything. The test checks the disk-usage
//! pass ran.
//!
//! Needs root, `make kubernetes-deps`, `make containerd-deps`, `make chart-deps`, and
//! Debian's busybox-static, docker-registry, umoci, skopeo and
//! containernetworking-plugins (`make test-deps`).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::chart::{agent_metrics, finish, metric_sum, NodePaths, Release, TestPod};
use support::fault_proxy::FaultProxy;
use support::kube::{ImageGc, KubeCluster, KubeOptions};
use support::oci::{self, pseudo_random, require_tool};
use support::registry::Registry;

/// Each image's own file: what the removed image frees.
const BIG: usize = 24 << 20;
/// A file both images hold, byte for byte (the same chunks in the cache): pinned by
/// the running pod's image, so never freed with the other.
const SHARED: usize = 8 << 20;
/// The agent's cache capacity: more than the running image reads (busybox, SHARED and
/// its BIG: ~34 MiB), less than both images together (~58 MiB).
const CAPACITY: u64 = 40 << 20;

/// busybox applets the pods use (a symlink each to `busybox`).
const APPLETS: [&str; 5] = ["sh", "cat", "sha256sum", "sleep", "echo"];

/// How long the kubelet may take to free the image after its restart: its first run
/// at the start cannot (nothing is old enough yet), the next is 5 minutes later.
const GC_WITHIN: Duration = Duration::from_secs(7 * 60);

/// One of the two images, converted, as the node pulls it.
struct App {
    /// `registry/conv/NAME:v1`.
    image: String,
    /// `/conv/NAME@`: in the agent's pin label (image by digest) and containerd's
    /// image names (`…/conv/NAME@sha256:…`), not in the other image's.
    repo: String,
    /// `sha256sum /data/big /data/shared` as the pod prints it.
    sums: [String; 2],
}

/// An image of busybox (an applet per symlink) in one layer and `/data/big` (from
/// `seed`) and `/data/shared` in a second, as an OCI layout under `work/name`.
fn layout(work: &Path, name: &str, seed: u64) -> (PathBuf, [String; 2]) {
    let dir = work.join(name);
    let bin = dir.join("busybox-tree/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(oci::which("busybox").unwrap(), bin.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let data = dir.join("data-tree/data");
    std::fs::create_dir_all(&data).unwrap();
    let big = pseudo_random(BIG, seed);
    let shared = pseudo_random(SHARED, 70);
    let sums = [
        format!("{:x}  /data/big", Sha256::digest(&big)),
        format!("{:x}  /data/shared", Sha256::digest(&shared)),
    ];
    std::fs::write(data.join("big"), big).unwrap();
    std::fs::write(data.join("shared"), shared).unwrap();
    let layout = dir.join("layout");
    oci::build_dirs_image(
        &layout,
        "amd64",
        &[&dir.join("busybox-tree"), &dir.join("data-tree")],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    (layout, sums)
}

/// A pod `name` of `app` that reads both its files whole (printing their sums), then
/// waits until it is deleted.
fn reader_pod(name: &str, app: &App) -> String {
    TestPod::new(
        name,
        &app.image,
        "trap 'exit 0' TERM; sha256sum /data/big /data/shared; echo read; while :; do sleep 1; done",
    )
    .manifest()
}

/// Waits until pod `name`'s log says it read both files, and checks their sums.
fn wait_read(cluster: &KubeCluster, release: &Release, name: &str, app: &App) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let logs = cluster.kubectl(&["logs", name]);
        let text = String::from_utf8_lossy(&logs.stdout).into_owned();
        if text.contains("read") {
            for sum in &app.sums {
                assert!(
                    text.contains(sum.as_str()),
                    "pod {name} printed {text:?}, not {sum:?}"
                );
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} did not read its files in 120 s:\n{}\n{}",
            cluster.kubectl_ok(&["get", "pod", name, "-o", "wide"]),
            release.describe()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `tessera cache usage --json` of node 1's agent.
fn cache_usage(release: &Release) -> serde_json::Value {
    let out = release.tessera("node-1", &["cache", "usage", "--json"]);
    assert!(
        out.status.success(),
        "tessera cache usage: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The pin set of `app`'s mount in a cache usage, if there is one.
fn pin_of(usage: &serde_json::Value, app: &App) -> Option<serde_json::Value> {
    let sets = usage["pinned"].as_array()?;
    let mut of_app = sets
        .iter()
        .filter(|s| s["label"].as_str().is_some_and(|l| l.contains(&app.repo)));
    let set = of_app.next().cloned();
    assert!(
        of_app.next().is_none(),
        "two pins of {}: {usage:#}",
        app.repo
    );
    set
}

fn num(v: &serde_json::Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{v} is not a number of bytes"))
}

/// Bytes of the chunk files on disk (`<cache>/chunks/data/`; what `du` would count
/// of them, less the blocks' rounding).
fn chunk_file_bytes(cache: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![cache.join("chunks/data")];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()));
        for e in entries.flatten() {
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// containerd's image names on node 1 (`ctr -n k8s.io images ls -q`).
fn images(cluster: &KubeCluster) -> Vec<String> {
    let out = cluster.nodes()[0].ctr(&["images", "ls", "-q"]);
    assert!(out.status.success(), "ctr images ls");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// How many of containerd's containers on node 1 are of an image of `repo`.
fn containers_of(cluster: &KubeCluster, repo: &str) -> usize {
    let out = cluster.nodes()[0].ctr(&["containers", "ls"]);
    assert!(out.status.success(), "ctr containers ls");
    let name = repo.trim_end_matches('@');
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("{name}:")) || l.contains(&format!("{name}@")))
        .count()
}

/// Node 1's agent's metric `name` (summed over its series with `label`).
fn agent_metric(cluster: &KubeCluster, name: &str, label: &str) -> f64 {
    metric_sum(&agent_metrics(cluster, 1), name, label)
}

/// The kubelet's log lines about image garbage collection.
fn kubelet_gc_lines(cluster: &KubeCluster) -> String {
    let log = std::fs::read_to_string(cluster.nodes()[0].dir.join("kubelet.log")).unwrap();
    log.lines()
        .filter(|l| {
            l.contains("Removing image to free bytes")
                || l.contains("over the high threshold")
                || l.contains("Image garbage collection failed")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// (h) Two converted images sharing a file: A's pod runs on, B's pod reads its files
/// and is deleted. The kubelet's image GC removes B; the agent releases B's chunks and
/// evicts them back to its capacity (the rest go with `tessera cache prune`), while
/// every chunk of A stays cached and A's pod reads its files again with nothing from
/// the registry.
#[test]
fn image_gc_frees_a_removed_images_chunks_and_never_a_running_pods() {
    require_tool("busybox");
    require_tool("curl");
    let work = tempfile::Builder::new()
        .prefix("tkgc")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);
    let home = work.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut apps = Vec::new();
    for (name, seed) in [("a", 71), ("b", 72)] {
        let (layout, sums) = layout(work.path(), name, seed);
        registry.push_layout(&layout, oci::TAG, &format!("src/{name}"));
        support::convert(
            &home,
            &format!("{}/src/{name}:v1", registry.addr),
            &format!("{}/conv/{name}:v1", registry.addr),
            &[],
        );
        apps.push(App {
            image: format!("{}/conv/{name}:v1", proxy.addr),
            repo: format!("/conv/{name}@"),
            sums,
        });
    }
    let (a, b) = (&apps[0], &apps[1]);

    let options = KubeOptions {
        plain_http_registries: vec![proxy.addr.clone()],
        image_gc: Some(ImageGc {
            high_threshold_percent: 1,
            low_threshold_percent: 0,
            minimum_age: Duration::from_secs(10),
            maximum_age: Duration::from_secs(60),
        }),
    };
    let mut cluster = KubeCluster::start(&options);
    let paths = NodePaths::of(&cluster);
    let values = format!(
        r#"agent:
  snapshotter:
    enabled: true
  cache:
    capacity: {}M
containerd:
  configureSnapshotter: true
"#,
        CAPACITY >> 20
    );
    let release = Release::install(&cluster, "tessera", &paths, &values);
    release.configure_node(&mut cluster, 0);
    let cache_dir = cluster.nodes()[0].host_path(paths.root.join("var/lib/tessera/cache"));

    cluster.kubectl_apply(&reader_pod("app-a", a));
    wait_read(&cluster, &release, "app-a", a);
    cluster.kubectl_apply(&reader_pod("app-b", b));
    wait_read(&cluster, &release, "app-b", b);

    // Both mounted: every chunk either read is pinned, the cache past its capacity.
    let before = cache_usage(&release);
    let a_before = pin_of(&before, a).unwrap_or_else(|| panic!("no pin of A: {before:#}"));
    let b_before = pin_of(&before, b).unwrap_or_else(|| panic!("no pin of B: {before:#}"));
    let bytes_before = num(&before["bytes"]);
    let a_bytes = num(&a_before["cached_bytes"]);
    assert!(
        a_bytes >= (BIG + SHARED) as u64 && a_bytes < CAPACITY,
        "A holds {a_bytes} bytes in the cache: {before:#}"
    );
    assert!(
        bytes_before > CAPACITY && before["pinned_over_capacity"] == true,
        "with both images read the cache should be past its capacity, all of it pinned: {before:#}"
    );
    let disk_before = chunk_file_bytes(&cache_dir);
    let registry_before = proxy.blob_bytes();
    let origin_before = agent_metric(&cluster, "tessera_agent_bytes_total", "source=\"origin\"");
    let evicted_before = agent_metric(&cluster, "tessera_agent_cache_evictions_total", "");

    // B's pod goes; the kubelet removes its container within a minute (container GC).
    cluster.kubectl_ok(&["delete", "pod", "app-b", "--wait=true"]);
    let deadline = Instant::now() + Duration::from_secs(150);
    while containers_of(&cluster, &b.repo) > 0 {
        assert!(
            Instant::now() < deadline,
            "B's container is still in containerd 150 s after its pod was deleted"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        pin_of(&cache_usage(&release), b).is_some(),
        "B's image is still on the node: its mount (and pin) must stay"
    );

    // The kubelet's image GC: its run 5 minutes after this restart frees B.
    cluster.node_mut(0).set_image_service_endpoint(None);
    let restarted = Instant::now();
    loop {
        let names = images(&cluster);
        if !names
            .iter()
            .any(|n| n.contains(&b.repo) || n.contains("/conv/b:"))
        {
            assert!(
                names.iter().any(|n| n.contains("/conv/a:")),
                "the kubelet removed A, whose pod runs: {names:?}\n{}",
                kubelet_gc_lines(&cluster)
            );
            break;
        }
        assert!(
            restarted.elapsed() < GC_WITHIN,
            "the kubelet did not remove B in {GC_WITHIN:?}: {names:?}\n{}",
            kubelet_gc_lines(&cluster)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let gc_took = restarted.elapsed();
    // The kubelet measured the image filesystem (the snapshotter's root, exported) and
    // found it over its 1% threshold: the disk-usage pass ran.
    assert!(
        kubelet_gc_lines(&cluster).contains("over the high threshold"),
        "the kubelet's disk-usage image GC never ran:\n{}",
        kubelet_gc_lines(&cluster)
    );
    let kubelet_log = std::fs::read_to_string(cluster.nodes()[0].dir.join("kubelet.log")).unwrap();
    assert!(
        !kubelet_log.contains("io.containerd.snapshotter.v1.tessera"),
        "the kubelet was given containerd's default path for the snapshotter, not its root"
    );
    // containerd removed B's snapshots as it removed the image: the agent's pin is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let usage = cache_usage(&release);
        if pin_of(&usage, b).is_none() {
            break usage;
        }
        assert!(
            Instant::now() < deadline,
            "B's pin outlived its image by 30 s: {usage:#}\n{}",
            release.describe()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let gc_lines = kubelet_gc_lines(&cluster);
    let bytes_after = num(&after["bytes"]);
    let disk_after = chunk_file_bytes(&cache_dir);
    let evicted =
        agent_metric(&cluster, "tessera_agent_cache_evictions_total", "") - evicted_before;
    let metric_bytes = agent_metric(&cluster, "tessera_agent_cache_bytes", "");
    eprintln!(
        "kubelet removed B {gc_took:.1?} after its restart; cache {:.1} MiB -> {:.1} MiB \
         (capacity {:.0} MiB), pinned {:.1} -> {:.1} MiB, chunk files on disk {:.1} -> \
         {:.1} MiB, {evicted} chunks evicted (tessera_agent_cache_bytes {:.1} MiB); B held \
         {:.1} MiB, A {:.1} MiB\n{gc_lines}",
        mib(bytes_before),
        mib(bytes_after),
        mib(CAPACITY),
        mib(num(&before["pinned_bytes"])),
        mib(num(&after["pinned_bytes"])),
        mib(disk_before),
        mib(disk_after),
        mib(metric_bytes as u64),
        mib(num(&b_before["cached_bytes"])),
        mib(a_bytes),
    );
    assert!(
        gc_lines.contains("Removing image to free bytes"),
        "B went, but not by the kubelet's image GC:\n{gc_lines}"
    );
    assert!(
        evicted > 0.0 && metric_bytes as u64 <= CAPACITY,
        "the agent's metrics show no eviction back to the capacity: {evicted} chunks \
         evicted, {metric_bytes} bytes cached"
    );
    let a_after = pin_of(&after, a).unwrap_or_else(|| panic!("A's pin is gone: {after:#}"));
    assert_eq!(
        a_after, a_before,
        "A's pin (and what of it is cached) changed with B's removal"
    );
    assert_eq!(
        num(&after["pinned_bytes"]),
        a_bytes,
        "only A's chunks are pinned now: {after:#}"
    );
    assert!(
        bytes_after <= CAPACITY && bytes_before - bytes_after >= bytes_before - CAPACITY,
        "the release of B's pin should have evicted the cache back to its capacity: \
         {bytes_before} -> {bytes_after} bytes"
    );
    assert!(
        disk_after + (bytes_before - CAPACITY) <= disk_before,
        "the chunk files on disk did not shrink with the cache: {disk_before} -> {disk_after}"
    );

    // What is left of B is no longer protected: a prune takes it and nothing of A's.
    let out = release.tessera("node-1", &["cache", "prune", "--json"]);
    assert!(
        out.status.success(),
        "tessera cache prune: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pruned: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = cache_usage(&release);
    eprintln!(
        "prune: {} chunks, {:.1} MiB; the cache holds {:.1} MiB, all of it A's",
        pruned["evicted_chunks"],
        mib(num(&pruned["evicted_bytes"])),
        mib(num(&last["bytes"]))
    );
    assert_eq!(num(&last["bytes"]), a_bytes, "after the prune: {last:#}");
    assert_eq!(pin_of(&last, a).as_ref(), Some(&a_before), "{last:#}");

    // A's pod reads its files again, past the page cache, with nothing from the
    // registry: its chunks were never taken.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let out = cluster.kubectl_ok(&[
        "exec",
        "app-a",
        "--",
        "sha256sum",
        "/data/big",
        "/data/shared",
    ]);
    for sum in &a.sums {
        assert!(
            out.contains(sum.as_str()),
            "A read again {out:?}, not {sum:?}"
        );
    }
    let registry_sent = proxy.blob_bytes() - registry_before;
    let origin = agent_metric(&cluster, "tessera_agent_bytes_total", "source=\"origin\"");
    eprintln!(
        "A read again: registry sent {registry_sent} bytes, agent fetched {} from origin",
        origin - origin_before
    );
    assert_eq!(registry_sent, 0, "A's data came from the registry again");
    assert_eq!(origin, origin_before, "the agent fetched A's chunks again");

    cluster.kubectl_ok(&["delete", "pod", "app-a", "--wait=true"]);
    finish(cluster, release);
}
