//! Peer-to-peer on a simulated cluster: every agent, the scheduler and the registry in
//! its own network namespace with its own address (veth + bridge, `support::netns`),
//! the registry's egress capped by `tc`. Origin traffic is measured on the registry's
//! own interface; every byte read is compared with the image's files.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::agent::AgentProcess;
use support::swarm::{admin_args, admin_json, wait_image_complete, wait_registered, Swarm};

fn pull(agent: &AgentProcess) -> serde_json::Value {
    agent.status()["mounts"][0]["pull"].clone()
}

/// Where each agent's bytes came from, for messages.
fn sources(agents: &[AgentProcess]) -> Vec<String> {
    agents
        .iter()
        .map(|a| {
            let p = pull(a);
            format!("origin {} peer {}", p["origin_bytes"], p["peer_bytes"])
        })
        .collect()
}

/// Every mount reads every file at once and compares it, each starting at a different
/// file as real workloads would, while `meanwhile` runs beside them.
fn read_all_at_once(swarm: &Swarm, mounts: &[PathBuf], meanwhile: impl FnOnce() + Send) {
    let barrier = std::sync::Barrier::new(mounts.len() + 1);
    std::thread::scope(|scope| {
        for (n, mnt) in mounts.iter().enumerate() {
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                for k in 0..swarm.files.len() {
                    let (path, data) = &swarm.files[(k + n) % swarm.files.len()];
                    let got = std::fs::read(mnt.join(path)).unwrap();
                    assert!(got == *data, "agent {n}: {path} differs");
                }
            });
        }
        let barrier = &barrier;
        scope.spawn(move || {
            barrier.wait();
            meanwhile();
        });
    });
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

    // The scheduler stops cleanly on SIGTERM with agents connected (no panic: checked
    // when it is dropped).
    let status = swarm
        .scheduler
        .terminate(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("the scheduler did not exit within 5 s of SIGTERM"));
    assert!(status.success(), "scheduler exit status {status}");
}

/// A plain image with an index (never converted) is shared like a converted one: the
/// second agent gets every chunk its reads need from the first, none from the origin,
/// and no checkpoint window either (peers send chunks inflated and verified).
#[test]
fn an_indexed_plain_image_is_shared_through_peers() {
    let mut swarm = Swarm::new(4, 4 << 20, "400mbit", &[]);
    swarm.index_plain();
    let first = swarm.agent(&[]);
    let second = swarm.agent(&[]);
    wait_registered(&first);
    wait_registered(&second);
    let mount = |agent: &AgentProcess| {
        let mnt = agent.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        agent.ok(&["mount", &swarm.plain_reference, mnt.to_str().unwrap()]);
        mnt
    };

    swarm.read_all(&mount(&first));
    // The files' chunks and the checkpoints' windows, from the origin.
    let first_origin = pull(&first)["origin_bytes"].as_u64().unwrap();
    assert!(first_origin >= swarm.total(), "{first_origin}");

    let before = swarm.origin_tx();
    swarm.read_all(&mount(&second));
    let second_origin = swarm.origin_tx() - before;
    let p = pull(&second);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    assert_eq!(p["verification_failures"], 0, "{p}");
    assert!(
        second_origin < 256 << 10,
        "the registry sent {second_origin} bytes for the second agent (data {} bytes)",
        swarm.total()
    );
}

/// Agents busy with the start-up pattern — many small files, each fetched and announced
/// on its own — keep their leases: three agents read 300 files of 16 KiB through a
/// registry capped at 8 Mbit/s (about five seconds) with a 2 s lease, and the scheduler
/// expires none of them (heartbeats used to wait while announcements kept coming).
#[test]
fn busy_agents_keep_their_leases() {
    let mut swarm = Swarm::new(300, 16 << 10, "8mbit", &["--lease-secs", "2"]);
    let agents: Vec<AgentProcess> = (0..3).map(|_| swarm.agent(&[])).collect();
    for a in &agents {
        wait_registered(a);
    }
    let mounts: Vec<PathBuf> = agents.iter().map(|a| swarm.mount(a)).collect();
    let started = std::time::Instant::now();
    read_all_at_once(&swarm, &mounts, || {});
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(4),
        "the reads took {took:?}: not long enough for two 2 s leases to matter"
    );
    let log = swarm.scheduler.log_text();
    assert!(
        !log.contains("leases expired"),
        "a busy agent lost its lease:\n{log}"
    );
    for a in &agents {
        assert!(!a.log().contains("lost the scheduler"), "{}", a.log());
    }
}

/// Twelve agents start reading the same image at the same moment through a capped
/// registry: the registry sends the image about once (≤ 1.2× its compressed size), and
/// every agent reads every byte correctly.
#[test]
fn a_swarm_pulls_the_image_about_once() {
    let mut swarm = Swarm::new(6, 8 << 20, "200mbit", &[]);
    let agents: Vec<AgentProcess> = (0..12).map(|_| swarm.agent(&[])).collect();
    for a in &agents {
        wait_registered(a);
    }
    let mounts: Vec<PathBuf> = agents.iter().map(|a| swarm.mount(a)).collect();
    let before = swarm.origin_tx();
    read_all_at_once(&swarm, &mounts, || {});
    let egress = swarm.origin_tx() - before;
    let ratio = egress as f64 / swarm.image_bytes as f64;
    let sources = sources(&agents);
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
    // Once they notice (a heartbeat fails), not even the holders they remember are
    // asked: without a scheduler, nobody hears about bad peers.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while late
        .iter()
        .any(|a| a.status()["swarm"]["registered"] != false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler's death went unnoticed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// With a bearer token and TLS on the scheduler and every peer service, the swarm works
/// as before; an agent without the token is refused by the scheduler and still reads
/// everything (from the origin).
#[test]
fn a_token_and_tls_protect_the_swarm() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "p2p-secret\n").unwrap();
    // The certificate names the peers (dialled by IP, checked against one name) and
    // the scheduler's address, known once the cluster exists.
    let mut swarm = Swarm::new(2, 4 << 20, "400mbit", &[]);
    let ip = swarm.scheduler.ip().to_string();
    let certs = support::tls::make_certs(&dir.path().join("certs"), &["tessera-peer"], &[&ip]);
    swarm.scheduler.restart_with(&[
        "--token-file",
        support::s(&token),
        "--tls-cert",
        support::s(&certs.cert),
        "--tls-key",
        support::s(&certs.key),
    ]);
    swarm.scheduler.url = swarm.scheduler.url.replace("http://", "https://");
    let secure = [
        "--p2p-token-file",
        support::s(&token),
        "--p2p-tls-ca",
        support::s(&certs.ca),
        "--p2p-tls-cert",
        support::s(&certs.cert),
        "--p2p-tls-key",
        support::s(&certs.key),
        "--p2p-tls-server-name",
        "tessera-peer",
    ];
    let first = swarm.agent(&secure);
    let second = swarm.agent(&secure);
    let outsider = swarm.agent(&secure[2..]); // TLS but no token.
    wait_registered(&first);
    wait_registered(&second);
    let mnt = swarm.mount(&first);
    swarm.read_all(&mnt);
    let mnt = swarm.mount(&second);
    swarm.read_all(&mnt);
    let p = pull(&second);
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");

    let mnt = swarm.mount(&outsider);
    swarm.read_all(&mnt);
    let p = pull(&outsider);
    assert_eq!(p["origin_bytes"], swarm.total(), "{p}");
    assert_eq!(outsider.status()["swarm"]["registered"], false);
    assert!(
        outsider.log().contains("bearer token"),
        "{}",
        outsider.log()
    );
    assert!(
        !outsider.log().contains("p2p-secret")
            && !swarm.scheduler.log_text().contains("p2p-secret")
    );
}

/// The image's layer digests, from its manifest in the registry (following an index
/// to its first manifest).
fn layer_digests(reference: &str) -> Vec<(String, u64)> {
    let (registry, rest) = reference.split_once('/').unwrap();
    let (repo, tag) = rest.rsplit_once(':').unwrap();
    let get = |what: &str| -> serde_json::Value {
        let out = std::process::Command::new("curl")
            .args(["-sf", "-H"])
            .arg("Accept: application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json")
            .arg(format!("http://{registry}/v2/{repo}/manifests/{what}"))
            .output()
            .expect("curl is needed (apt-get install curl; make test installs it)");
        assert!(out.status.success(), "GET manifest {what}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let mut manifest = get(tag);
    if let Some(first) = manifest["manifests"].get(0) {
        manifest = get(first["digest"].as_str().unwrap());
    }
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_string(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Three scheduler replicas without shared state: agents place each blob on one by
/// consistent hashing, so killing the replica that owns the image's data blob in the
/// middle of a swarm pull moves only that blob to the next replica; every read
/// completes correctly and the registry still sends the image about once, not once
/// per agent.
#[test]
fn a_scheduler_replica_killed_mid_swarm_moves_only_its_blobs() {
    let mut swarm = Swarm::with_replicas(6, 8 << 20, "200mbit", 3, &["--lease-secs", "3"]);
    let agents: Vec<AgentProcess> = (0..6).map(|_| swarm.agent(&[])).collect();
    for a in &agents {
        wait_registered(a);
    }
    assert_eq!(agents[0].status()["swarm"]["schedulers"], 3);
    let schedulers: Vec<&support::scheduler::SchedulerProcess> = std::iter::once(&swarm.scheduler)
        .chain(&swarm.replicas)
        .collect();
    let mut urls: Vec<String> = schedulers.iter().map(|s| s.url.clone()).collect();
    urls.sort();
    let ring = tessera_agent::peer::ring::Ring::new(&urls);
    let (data_blob, _) = layer_digests(&swarm.reference)
        .into_iter()
        .max_by_key(|(_, size)| *size)
        .unwrap();
    let owner = &urls[ring.owner(&data_blob, |_| true).unwrap()];
    let victim = schedulers.iter().find(|s| &s.url == owner).unwrap();

    let mounts: Vec<PathBuf> = agents.iter().map(|a| swarm.mount(a)).collect();
    let before = swarm.origin_tx();
    // Mid-swarm: once a third of the image has left the registry.
    read_all_at_once(&swarm, &mounts, || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while swarm.origin_tx() - before < swarm.image_bytes / 3
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        victim.kill9();
    });
    let egress = swarm.origin_tx() - before;
    let ratio = egress as f64 / swarm.image_bytes as f64;
    let sources = sources(&agents);
    assert!(
        ratio <= 2.0,
        "6 agents made the registry send {egress} bytes, {ratio:.2}x the {}-byte image, with a replica killed; per agent: {sources:?}",
        swarm.image_bytes
    );
    let peer_bytes: u64 = agents
        .iter()
        .map(|a| pull(a)["peer_bytes"].as_u64().unwrap())
        .sum();
    assert!(
        peer_bytes >= swarm.total() * 3,
        "the swarm served only {peer_bytes} bytes peer to peer: {sources:?}"
    );
    // Every agent notices the loss (heartbeats are a second apart) and keeps the rest.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for a in &agents {
        while a.status()["swarm"]["schedulers_registered"] != 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "{}",
                a.status()["swarm"]
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(a.status()["swarm"]["registered"], true);
    }
    eprintln!(
        "3 replicas, one killed mid-swarm: registry egress {ratio:.3}x the image; {sources:?}"
    );
}

/// One byte accounting, with the registry's access log as ground truth: two agents'
/// origin wire bytes sum to the chunk bytes the registry sent; the reader's peer bytes
/// equal the server's uploaded bytes; a read from the disk cache counts no more cache
/// bytes than the bytes read (the kernel reads a chunk in many requests); the bytes
/// stored equal the chunk files on disk; /metrics says what `tessera status` says.
#[test]
fn byte_counters_agree_with_the_registry_and_each_other() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("admin.token");
    std::fs::write(&token, DROP_ADMIN_TOKEN).unwrap();
    let state = t.path().join("scheduler-state");
    let mut swarm = Swarm::new(6, 3 << 20, "400mbit", &admin_args(&token, &state));
    // Every read reaches the agents to be counted (passthrough reads do not).
    let mut first = swarm.agent(&["--passthrough", "false"]);
    let second = swarm.agent(&["--passthrough", "false"]);
    wait_registered(&first);
    wait_registered(&second);
    let total = swarm.total();

    let mnt = swarm.mount(&first);
    swarm.read_all(&mnt);
    let mnt = swarm.mount(&second);
    swarm.read_all(&mnt);
    let (p1, p2) = (pull(&first), pull(&second));
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    assert_eq!(n(&p1["origin_bytes"]), total, "{p1}");
    assert_eq!(
        (n(&p2["origin_bytes"]), n(&p2["peer_bytes"])),
        (0, total),
        "{p2}"
    );
    let chunk_bytes_sent = swarm.registry().blob_bytes_sent(206);
    assert_eq!(
        n(&p1["origin_wire_bytes"]) + n(&p2["origin_wire_bytes"]),
        chunk_bytes_sent,
        "origin wire bytes against the registry's access log"
    );
    assert_eq!(
        n(&first.status()["swarm"]["uploaded_bytes"]),
        n(&p2["peer_bytes"]),
        "uploaded by the server, fetched from peers by the reader"
    );
    // The scheduler's stats are the sums of what the agents count (reports are sent
    // in the background: a few seconds at most).
    let agents = (
        n(&p1["origin_bytes"]) + n(&p2["origin_bytes"]),
        n(&p1["peer_bytes"]) + n(&p2["peer_bytes"]),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let scheduler = loop {
        let stats = admin_json(&swarm.admin(&token, &["stats"]));
        let seen = (n(&stats["origin_bytes"]), n(&stats["peer_bytes"]));
        if seen == agents || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(scheduler, agents, "the scheduler's (origin, peer) bytes");
    for agent in [&first, &second] {
        let status = agent.status();
        let cache = &status["cache"];
        let on_disk: u64 = chunk_files(agent).iter().map(|(_, size)| size).sum();
        assert_eq!(n(&cache["bytes"]), on_disk, "{status}");
        assert_eq!(n(&cache["stored_bytes"]), on_disk, "{status}");
        let metrics = agent.metrics();
        let find = |name: &str| -> Option<u64> {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        };
        let metric = |name: &str| find(name).unwrap_or_else(|| panic!("no {name} in\n{metrics}"));
        let p = &status["mounts"][0]["pull"];
        for source in ["origin", "peer", "cache"] {
            // A source never used has no series yet.
            let series = format!("tessera_agent_bytes_total{{source=\"{source}\"}} ");
            assert_eq!(
                find(&series).unwrap_or(0),
                n(&p[format!("{source}_bytes")]),
                "{series}"
            );
        }
        assert_eq!(
            metric("tessera_agent_read_bytes_total "),
            n(&status["mounts"][0]["bytes_read"])
        );
        assert_eq!(metric("tessera_agent_cache_stored_bytes_total "), on_disk);
    }

    // A new agent process reads everything from its disk: each chunk once.
    first.restart();
    let mnt = swarm.mount(&first);
    swarm.read_all(&mnt);
    let status = first.status();
    let (m, p) = (&status["mounts"][0], &status["mounts"][0]["pull"]);
    assert_eq!(n(&p["cache_bytes"]), total, "{status}");
    assert!(
        n(&p["cache_bytes"]) <= n(&m["bytes_read"]),
        "cache bytes beyond the bytes read: {status}"
    );
    assert_eq!((n(&p["origin_bytes"]), n(&p["peer_bytes"])), (0, 0), "{p}");
}

const DROP_ADMIN_TOKEN: &str = "dropped-chunks-admin-token-7b1d";

/// The scheduler's view of host `id` (its admin API, through the scheduler binary).
fn scheduler_host(swarm: &Swarm, token: &Path, id: &str) -> serde_json::Value {
    admin_json(&swarm.admin(token, &["host", id]))
}

/// The chunk files in an agent's cache, sorted by path, with their sizes.
fn chunk_files(agent: &AgentProcess) -> Vec<(PathBuf, u64)> {
    // A reader is answered before its chunk is stored: wait (at most 10 s) until the
    // stores have settled, with no chunk half-written (a temp file, renamed a moment
    // later) and the same files twice in a row.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = listed_chunk_files(agent);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = listed_chunk_files(agent);
        let writing = now.iter().any(|(path, _)| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-"))
        });
        if (now == last && !writing) || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn listed_chunk_files(agent: &AgentProcess) -> Vec<(PathBuf, u64)> {
    let mut files = Vec::new();
    let mut dirs = vec![agent.cache_dir.join("chunks").join("data")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            // A temp file may be renamed between the listing and the stat.
            let Ok(meta) = e.metadata() else {
                continue;
            };
            if meta.is_dir() {
                dirs.push(e.path());
            } else {
                files.push((e.path(), meta.len()));
            }
        }
    }
    files.sort();
    files
}

/// Waits up to 10 s for the scheduler's `bytes_held` of `id` to come within 3% of
/// `expected`; the last value seen.
fn wait_bytes_held(swarm: &Swarm, token: &Path, id: &str, expected: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = scheduler_host(swarm, token, id)["bytes_held"]
            .as_u64()
            .unwrap();
        if held.abs_diff(expected) <= expected / 33 || std::time::Instant::now() > deadline {
            return held;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A serving peer whose chunk files are corrupted on disk (a quarter of them) drops
/// them when a second node asks for them, and tells the scheduler at once: its
/// `bytes_held` follows what it still holds on disk, and a third node's read asks it
/// for none of the dropped chunks (its cache sees no request for a chunk it lacks).
#[test]
fn a_peer_that_drops_corrupt_chunks_is_no_longer_advertised_for_them() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("admin.token");
    std::fs::write(&token, DROP_ADMIN_TOKEN).unwrap();
    let state = t.path().join("scheduler-state");
    let mut swarm = Swarm::new(6, 8 << 20, "400mbit", &admin_args(&token, &state));
    let seed = swarm.agent(&[]);
    let second = swarm.agent(&[]);
    let third = swarm.agent(&[]);
    for a in [&seed, &second, &third] {
        wait_registered(a);
    }
    let mnt = swarm.mount(&seed);
    swarm.read_all(&mnt); // From the origin: the seed is the only holder.
    let files = chunk_files(&seed);
    let on_disk: u64 = files.iter().map(|(_, size)| size).sum();
    let held = wait_bytes_held(&swarm, &token, "agent1", on_disk);
    assert!(
        held.abs_diff(on_disk) <= on_disk / 33,
        "before any drop the scheduler says the seed holds {held} bytes, its disk {on_disk}"
    );

    // Every fourth chunk file corrupted in place (same size: only the digest shows it).
    let corrupted: Vec<&(PathBuf, u64)> = files.iter().step_by(4).collect();
    for (path, _) in &corrupted {
        let mut data = std::fs::read(path).unwrap();
        data[0] ^= 0xff;
        std::fs::write(path, data).unwrap();
    }
    let mnt = swarm.mount(&second);
    swarm.read_all(&mnt);
    let p = pull(&second);
    assert_eq!(p["verification_failures"], 0, "{p}");
    // The seed finds those it is asked for (once it lacked some it is down-ranked and
    // asked less, so not necessarily all twelve) and drops them.
    let seed_cache = seed.status()["cache"].clone();
    let found = seed_cache["verification_failures"].as_u64().unwrap();
    assert!(
        found >= 1,
        "the seed was never asked for a corrupted chunk: {seed_cache}"
    );
    let on_disk: u64 = chunk_files(&seed).iter().map(|(_, size)| size).sum();
    let held = wait_bytes_held(&swarm, &token, "agent1", on_disk);
    assert!(
        held.abs_diff(on_disk) <= on_disk / 33,
        "after dropping {found} corrupt chunks the scheduler says the seed holds {held} bytes, its disk {on_disk}"
    );
    eprintln!("seed dropped {found} corrupt chunks; scheduler: {held} bytes held, disk: {on_disk}");

    // The third node reads: the seed's cache is asked for nothing it lacks.
    let misses = seed.status()["cache"]["misses"].as_u64().unwrap();
    let mnt = swarm.mount(&third);
    swarm.read_all(&mnt);
    let p = pull(&third);
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    let asked_missing = seed.status()["cache"]["misses"].as_u64().unwrap() - misses;
    assert_eq!(
        asked_missing, 0,
        "the third node asked the seed for {asked_missing} chunks it had dropped"
    );
}

/// A peer whose small cache evicts most of what it read tells the scheduler with its
/// next announcement or heartbeat: its `bytes_held` follows what is left on disk, and
/// a second node's read asks it for none of the evicted chunks.
#[test]
fn an_evicting_peer_is_no_longer_advertised_for_what_it_evicted() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("admin.token");
    std::fs::write(&token, DROP_ADMIN_TOKEN).unwrap();
    // A 3 s lease: heartbeats, which carry evictions, every second.
    let state = t.path().join("scheduler-state");
    let mut args = vec!["--lease-secs", "3"];
    args.extend(admin_args(&token, &state));
    let mut swarm = Swarm::new(6, 8 << 20, "400mbit", &args);
    let seed = swarm.agent(&["--cache-capacity", "16M"]);
    let reader = swarm.agent(&[]);
    for a in [&seed, &reader] {
        wait_registered(a);
    }
    let mnt = swarm.mount(&seed);
    swarm.read_all(&mnt);
    // Mounted, the image is pinned; its unmount evicts down to the capacity.
    seed.ok(&["umount", mnt.to_str().unwrap()]);
    let cache = seed.status()["cache"].clone();
    assert!(cache["evictions"].as_u64().unwrap() > 0, "{cache}");
    let on_disk: u64 = chunk_files(&seed).iter().map(|(_, size)| size).sum();
    let held = wait_bytes_held(&swarm, &token, "agent1", on_disk);
    assert!(
        held.abs_diff(on_disk) <= on_disk / 33,
        "after evictions the scheduler says the seed holds {held} bytes, its disk {on_disk}"
    );

    let misses = seed.status()["cache"]["misses"].as_u64().unwrap();
    let mnt = swarm.mount(&reader);
    swarm.read_all(&mnt);
    let asked_missing = seed.status()["cache"]["misses"].as_u64().unwrap() - misses;
    assert_eq!(
        asked_missing, 0,
        "the reader asked the seed for {asked_missing} chunks it had evicted"
    );
    let p = pull(&reader);
    assert!(p["peer_bytes"].as_u64().unwrap() > 0, "{p}");
}

const AHEAD_ADMIN_TOKEN: &str = "fetch-ahead-admin-token-3c9e";

/// A listing's files are fetched ahead from a peer holding the whole image: once the
/// second agent has read one file (and so met the holder), listing the directory brings
/// every other file's chunk from the peer before it is read, and the registry sends
/// none of it.
#[test]
fn a_listing_fetches_its_files_ahead_from_a_whole_image_holder() {
    let t = tempfile::tempdir().unwrap();
    let token = t.path().join("admin.token");
    std::fs::write(&token, AHEAD_ADMIN_TOKEN).unwrap();
    let state = t.path().join("scheduler-state");
    // Files of 512 KiB: one chunk each, so no read-ahead within a file can fetch them.
    let mut swarm = Swarm::new(6, 512 << 10, "400mbit", &admin_args(&token, &state));
    let holder = swarm.agent(&[]);
    let reader = swarm.agent(&[]);
    wait_registered(&holder);
    wait_registered(&reader);
    swarm.read_all(&swarm.mount(&holder));
    wait_image_complete(Duration::from_secs(30), || {
        admin_json(&swarm.admin(&token, &["images"]))
    });

    let before = swarm.origin_tx();
    let mnt = swarm.mount(&reader);
    let (first, data) = &swarm.files[0];
    assert!(std::fs::read(mnt.join(first)).unwrap() == *data);
    let listed = std::fs::read_dir(mnt.join("data")).unwrap().count();
    assert_eq!(listed, swarm.files.len());
    // Nothing else is read: the rest must arrive on its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pull(&reader)["peer_bytes"].as_u64() < Some(swarm.total()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the listed files were not fetched ahead: {}; metrics:\n{}",
            pull(&reader),
            reader.metrics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ahead = reader
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("tessera_agent_fetched_ahead_chunks_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert_eq!(ahead, Some(swarm.files.len() as u64 - 1));
    swarm.read_all(&mnt);
    let p = pull(&reader);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], swarm.total(), "{p}");
    let sent = swarm.origin_tx() - before;
    assert!(
        sent < 256 << 10,
        "the registry sent {sent} bytes for the reader"
    );
}
