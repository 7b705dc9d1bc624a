//! The cache never evicts what runs: a real `tessera agent`, real FUSE mounts, a real
//! `docker-registry` behind the counting proxy, a cache smaller than two images.
//! While image A is mounted, reading all of image B evicts none of A's chunks (a
//! re-read of A sends no byte from the origin); once A is unmounted its chunks are
//! evictable, `tessera cache prune` evicts them, and `tessera cache usage` shows only
//! B's pins.
//!
//! Needs fuse3, docker-registry, umoci and skopeo (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::{Path, PathBuf};

use support::agent::{is_mounted, AgentProcess};
use support::fault_proxy::FaultProxy;
use support::oci::{self, build_files_image, pseudo_random};
use support::registry::Registry;
use support::{convert, s};

/// Files of one image: `count` files of 4 MiB pseudo-random (incompressible) bytes.
const FILE: usize = 4 << 20;

/// Builds an image of `count` files seeded from `seed`, converts it as
/// `tessera/NAME:v1` and returns its files and its reference through the proxy.
fn image(
    t: &Path,
    name: &str,
    count: u64,
    seed: u64,
    registry: &Registry,
    proxy: &FaultProxy,
) -> (Vec<(String, Vec<u8>)>, String) {
    let files: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| (format!("{name}/f{i:02}"), pseudo_random(FILE, seed + i)))
        .collect();
    let layout = t.join(format!("layout-{name}"));
    build_files_image(
        &layout,
        "amd64",
        &[files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect()],
    );
    registry.push_layout(&layout, oci::TAG, &format!("src/{name}"));
    convert(
        t,
        &format!("{}/src/{name}:v1", registry.addr),
        &format!("{}/tessera/{name}:v1", registry.addr),
        &[],
    );
    (files, format!("{}/tessera/{name}:v1", proxy.addr))
}

fn mountpoint(t: &Path, name: &str) -> PathBuf {
    let p = t.join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn read_all(mnt: &Path, files: &[(String, Vec<u8>)], agent: &AgentProcess) {
    for (path, data) in files {
        let got = std::fs::read(mnt.join(path));
        assert!(
            got.as_ref().is_ok_and(|got| got == data),
            "{path}: {:?}\nagent log:\n{}",
            got.map(|g| g.len()),
            agent.log()
        );
    }
}

/// `tessera cache usage --json`.
fn usage(agent: &AgentProcess) -> serde_json::Value {
    serde_json::from_slice(&agent.ok(&["cache", "usage", "--json"]).stdout).unwrap()
}

/// Each pin's label and cached bytes, from `usage`.
fn pins(usage: &serde_json::Value) -> Vec<(String, u64)> {
    usage["pinned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["label"].as_str().unwrap().to_string(),
                p["cached_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn mounted_images_are_never_evicted_and_unmounted_ones_are() {
    let t = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);
    // Two images of 24 MiB through a 40 MiB cache: without pins, reading B would
    // evict a third of A.
    let (a_files, a) = image(t.path(), "a", 6, 1000, &registry, &proxy);
    let (b_files, b) = image(t.path(), "b", 6, 2000, &registry, &proxy);
    let image_bytes = 6 * FILE as u64;
    let agent = AgentProcess::start(
        &t.path().join("agent"),
        &["--prefetch", "none", "--cache-capacity", "40M"],
    );
    let (mnt_a, mnt_b) = (mountpoint(t.path(), "a"), mountpoint(t.path(), "b"));
    agent.ok(&["mount", &a, s(&mnt_a)]);
    read_all(&mnt_a, &a_files, &agent);
    agent.ok(&["mount", &b, s(&mnt_b)]);
    read_all(&mnt_b, &b_files, &agent);

    // Both pinned in full, past the capacity (a running container must not fail).
    let u = usage(&agent);
    assert_eq!(u["pinned_bytes"], 2 * image_bytes, "{u}");
    assert_eq!(u["bytes"], 2 * image_bytes, "{u}");
    assert_eq!(u["pinned_over_capacity"], true, "{u}");
    let pinned = pins(&u);
    assert_eq!(pinned.len(), 2, "{u}");
    assert!(pinned.iter().all(|(_, bytes)| *bytes == image_bytes), "{u}");
    assert!(u["disk"]["size"].as_u64().unwrap() > 0, "{u}");
    assert_eq!(u["watermarks"]["high_percent"], 90, "{u}");
    let metrics = agent.metrics();
    let gauge = format!("tessera_agent_cache_pinned_bytes {}", 2 * image_bytes);
    assert!(metrics.contains(&gauge), "{gauge} missing from\n{metrics}");

    // A's chunks are all still in the cache: a second mount of A (pinning it twice)
    // reads it whole without a byte from the origin.
    let mnt_a2 = mountpoint(t.path(), "a2");
    agent.ok(&["mount", &a, s(&mnt_a2)]);
    let before = proxy.blob_bytes();
    read_all(&mnt_a2, &a_files, &agent);
    assert_eq!(proxy.blob_bytes() - before, 0, "A was re-fetched");
    assert_eq!(pins(&usage(&agent)).len(), 3);

    // Unmounted (both mounts of A), A's chunks are evictable: a prune takes them and
    // only them.
    agent.ok(&["umount", s(&mnt_a)]);
    assert_eq!(
        usage(&agent)["pinned_bytes"],
        2 * image_bytes,
        "A is mounted still"
    );
    agent.ok(&["umount", s(&mnt_a2)]);
    assert!(!is_mounted(&mnt_a) && !is_mounted(&mnt_a2));
    // Reading B again may already evict some of A to keep the capacity (the
    // passthrough copies of B's files made at their last close take room); the prune
    // takes what is left of it.
    read_all(&mnt_b, &b_files, &agent);
    let held = usage(&agent)["bytes"].as_u64().unwrap();
    assert!(held <= 2 * image_bytes && held > image_bytes, "held {held}");
    let pruned = agent.ok(&["cache", "prune", "--json"]);
    let pruned: serde_json::Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(pruned["evicted_bytes"], held - image_bytes, "{pruned}");
    let u = usage(&agent);
    assert_eq!(u["bytes"], image_bytes, "{u}");
    assert_eq!(u["pinned_bytes"], image_bytes, "{u}");
    assert_eq!(u["pinned_over_capacity"], false, "{u}");
    let pinned = pins(&u);
    assert_eq!(pinned.len(), 1, "{u}");
    assert!(pinned[0].0.starts_with(&b), "{u}");
    let human = String::from_utf8(agent.ok(&["cache", "usage"]).stdout).unwrap();
    assert!(human.contains("pinned by 1 mounts"), "{human}");

    // A is gone from the cache: mounted again by a restarted agent (the fetcher's
    // memory of recent chunks gone too), it comes from the origin.
    let mut agent = agent;
    agent.restart();
    assert!(!is_mounted(&mnt_b), "a stopped agent unmounts its mounts");
    assert_eq!(usage(&agent)["pinned_bytes"], 0);
    agent.ok(&["mount", &a, s(&mnt_a)]);
    let before = proxy.blob_bytes();
    read_all(&mnt_a, &a_files, &agent);
    let fetched = proxy.blob_bytes() - before;
    assert!(
        fetched >= image_bytes,
        "A was not evicted: {fetched} fetched"
    );
    agent.ok(&["umount", s(&mnt_a)]);
}
