//! Preheat through the real scheduler and agents on a network-namespace cluster: an
//! administrator asks (with `tessera-scheduler admin preheat`) for an image on 3 of 5
//! agents; those agents fetch it whole with their own registry access, and a later
//! mount on each reads everything from its cache: no origin bytes, no peer bytes.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use support::agent::AgentProcess;
use support::swarm::{admin_json, wait_registered, Swarm};

const ADMIN_TOKEN: &str = "preheat-admin-token-4e0c";

#[test]
fn a_preheated_image_mounts_with_no_origin_and_no_peer_bytes() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("admin.token");
    std::fs::write(&token, ADMIN_TOKEN).unwrap();
    let state = t.path().join("scheduler-state");
    let mut swarm = Swarm::new(
        4,
        4 << 20,
        "400mbit",
        &[
            "--lease-secs",
            "3",
            "--admin-listen",
            "0.0.0.0:7090",
            "--admin-token-file",
            support::s(&token),
            "--state-dir",
            support::s(&state),
        ],
    );
    let agents: Vec<AgentProcess> = (0..5).map(|_| swarm.agent(&[])).collect();
    for a in &agents {
        wait_registered(a);
    }
    let origin_at_start = swarm.origin_tx();

    // The job runs to the end by itself (`--wait`), bounded by its own timeout.
    let out = swarm.admin(
        &token,
        &[
            "preheat",
            &swarm.reference,
            "--count",
            "3",
            "--timeout-secs",
            "120",
            "--wait",
        ],
    );
    let job = admin_json(&out);
    assert!(
        out.status.success(),
        "preheat failed: {job}\n{}",
        swarm.scheduler.log_text()
    );
    assert_eq!(job["state"], "succeeded", "{job}");
    let chosen: Vec<String> = job["hosts"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(chosen.len(), 3, "{job}");
    for (host, part) in job["hosts"].as_object().unwrap() {
        assert_eq!(part["state"], "succeeded", "{host}: {part}");
        assert!(part["chunks_total"].as_u64().unwrap() > 0, "{part}");
        assert_eq!(part["chunks_done"], part["chunks_total"], "{host}: {part}");
        assert_eq!(part["bytes_done"], swarm.total(), "{host}: {part}");
    }
    // Three hosts preheated, but the registry sent the image about once: the
    // scheduler's single flight and the peers did the rest.
    let preheat_origin = swarm.origin_tx() - origin_at_start;
    assert!(
        preheat_origin < swarm.image_bytes * 2,
        "the preheat took {preheat_origin} bytes from the registry for a {} byte image",
        swarm.image_bytes
    );

    for (n, a) in agents.iter().enumerate() {
        let id = format!("agent{}", n + 1);
        let cached = a.status()["cache"]["bytes"].as_u64().unwrap();
        if !chosen.contains(&id) {
            assert_eq!(cached, 0, "{id} was not chosen but holds {cached} bytes");
            continue;
        }
        assert!(cached > 0, "{id} was preheated but its cache is empty");
        let before = swarm.origin_tx();
        let mnt = swarm.mount(a);
        swarm.read_all(&mnt);
        let pull = a.status()["mounts"][0]["pull"].clone();
        assert_eq!(pull["origin_bytes"], 0, "{id}: {pull}");
        assert_eq!(pull["peer_bytes"], 0, "{id}: {pull}");
        // Each chunk read from the disk once (the preheat kept none in memory).
        assert_eq!(pull["cache_bytes"], swarm.total(), "{id}: {pull}");
        // Only the manifest came from the registry: the bootstrap was preheated too.
        let mount_origin = swarm.origin_tx() - before;
        assert!(
            mount_origin < 64 << 10,
            "{id}: mounting took {mount_origin} bytes from the registry"
        );
    }

    // The scheduler knows the image now: used, and held whole, by the three hosts.
    let images = admin_json(&swarm.admin(&token, &["images"]));
    let image = &images[0];
    assert_eq!(image["hosts"], 3, "{images}");
    assert_eq!(image["complete_hosts"], 3, "{images}");
    assert!(
        image["image"]
            .as_str()
            .unwrap()
            .contains("tessera/app:v1@sha256:"),
        "{images}"
    );

    // A job that cannot succeed fails, saying which host failed and why.
    let missing = swarm
        .reference
        .replace("tessera/app:v1", "tessera/missing:v1");
    let out = swarm.admin(
        &token,
        &[
            "preheat",
            &missing,
            "--count",
            "1",
            "--timeout-secs",
            "60",
            "--wait",
        ],
    );
    assert!(!out.status.success());
    let failed = admin_json(&out);
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    let host = failed["hosts"].as_object().unwrap().keys().next().unwrap();
    assert!(
        error.contains(host.as_str()) && error.contains("missing"),
        "{error}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed"), "{stderr}");
    assert!(!swarm.scheduler.log_text().contains(ADMIN_TOKEN));
}
