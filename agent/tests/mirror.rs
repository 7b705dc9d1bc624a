//! The registry mirror with real containerd: `ctr image pull --hosts-dir` through
//! `tessera agent --mirror-listen`, on nodes that are network namespaces, each with its
//! own containerd (root, state and socket in a temp dir) and agent, against the real
//! distribution registry and scheduler.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use support::containerd::Line;
use support::mirror::{metric, BedOptions, MirrorBed, MirrorNode, MIRROR};
use support::oci::{build_files_image, pseudo_random, TAG};
use support::registry::Auth;
use support::swarm::wait_registered;

/// Three layers: pieces are 4 MiB, so the first spans two, the second three (the last
/// one short), the third is smaller than a piece.
const LAYERS: &[usize] = &[6 << 20, (9 << 20) + 12_345, 300_000];

fn layer_bytes() -> u64 {
    LAYERS.iter().map(|&l| l as u64).sum()
}

fn bed(scheduler: bool, auth: Auth) -> MirrorBed {
    MirrorBed::new(BedOptions {
        layers: LAYERS,
        cap: None,
        scheduler,
        auth,
    })
}

/// Blob bytes `node`'s mirror served from `source`.
fn served(node: &MirrorNode, source: &str) -> f64 {
    metric(
        &node.agent.metrics(),
        &format!("tessera_agent_mirror_blob_bytes_total{{source=\"{source}\"}}"),
    )
}

/// Blob requests `node`'s mirror answered with `code`.
fn blob_requests(node: &MirrorNode, code: u16) -> f64 {
    metric(
        &node.agent.metrics(),
        &format!("tessera_agent_mirror_requests_total{{kind=\"blob\",code=\"{code}\"}}"),
    )
}

/// `curl` inside `node`'s namespace against its mirror: (status, headers, body).
fn curl(node: &MirrorNode, bed: &MirrorBed, path: &str, args: &[&str]) -> (u16, String, Vec<u8>) {
    let headers = node.agent.dir.join("curl-headers");
    let url = format!(
        "http://{MIRROR}/v2/plain/app/{path}?ns={}",
        bed.registry.addr
    );
    let out = node
        .host
        .command("curl")
        .args(["-s", "-D"])
        .arg(&headers)
        .args(args)
        .arg(&url)
        .output()
        .expect("run curl (Debian curl)");
    let head = std::fs::read_to_string(&headers).unwrap_or_default();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head, out.stdout)
}

#[test]
fn ctr_pulls_a_multi_layer_image_through_the_mirror() {
    let mut bed = bed(false, Auth::None);
    let node = bed.node(&[]);
    bed.pull_ok(&node, None);
    bed.assert_rootfs(&node);
    // Every blob came through the mirror (3 layers and the config), from the origin.
    assert!(blob_requests(&node, 200) >= 4.0, "{}", node.agent.metrics());
    assert!(served(&node, "origin") >= layer_bytes() as f64);
    assert_eq!(served(&node, "cache"), 0.0);

    // Range requests are honoured, across a piece boundary too.
    let layer = &bed.layer_digests()[1];
    let bytes = std::fs::read(bed.blob_path(layer)).unwrap();
    let (start, end) = ((4 << 20) - 1000, (4 << 20) + 5000);
    let (status, head, body) = curl(
        &node,
        &bed,
        &format!("blobs/{layer}"),
        &["-r", &format!("{start}-{}", end - 1)],
    );
    assert_eq!(status, 206, "{head}");
    assert!(
        head.to_ascii_lowercase().contains(&format!(
            "content-range: bytes {start}-{}/{}",
            end - 1,
            bytes.len()
        )),
        "{head}"
    );
    assert!(body == bytes[start..end], "the range's bytes differ");

    // Another containerd on the node: the blobs come from the agent's cache.
    let origin_before = served(&node, "origin");
    let second =
        support::containerd::Containerd::start_in(&node.agent.dir.join("containerd-2"), &node.host);
    let again = MirrorNode {
        containerd: second,
        agent: node.agent,
        host: node.host,
    };
    bed.pull_ok(&again, None);
    bed.assert_rootfs(&again);
    assert_eq!(
        served(&again, "origin"),
        origin_before,
        "nothing more from the origin"
    );
    assert!(served(&again, "cache") >= layer_bytes() as f64);
}

#[test]
fn a_second_node_pulls_from_the_first_not_the_origin() {
    let mut bed = bed(true, Auth::None);
    let first = bed.node(&[]);
    let second = bed.node(&[]);
    wait_registered(&first.agent);
    wait_registered(&second.agent);
    bed.pull_ok(&first, None);
    // What the first node verified is announced as soon as each blob completes.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let before = bed.origin_tx();
    bed.pull_ok(&second, None);
    let origin = bed.origin_tx() - before;
    bed.assert_rootfs(&second);
    assert!(
        origin * 20 < bed.image_bytes,
        "the second pull took {origin} bytes from the origin (image: {} bytes)",
        bed.image_bytes
    );
    assert!(served(&second, "peer") >= layer_bytes() as f64 * 0.95);
    assert_eq!(served(&second, "origin"), 0.0);
}

#[test]
fn a_corrupting_peer_does_not_spoil_the_pull() {
    let mut bed = bed(true, Auth::None);
    let liar = bed.node(&["--fault-corrupt-uploads"]);
    let victim = bed.node(&[]);
    wait_registered(&liar.agent);
    wait_registered(&victim.agent);
    bed.pull_ok(&liar, None);
    std::thread::sleep(std::time::Duration::from_millis(500));
    bed.pull_ok(&victim, None);
    bed.assert_rootfs(&victim);
    let failures = metric(
        &victim.agent.metrics(),
        "tessera_agent_mirror_verification_failures_total{source=\"peer\"}",
    );
    assert!(failures >= 1.0, "{}", victim.agent.metrics());
    // The pieces the liar spoiled came from the origin instead; no response was cut.
    assert!(served(&victim, "origin") > 0.0);
    assert_eq!(
        metric(
            &victim.agent.metrics(),
            "tessera_agent_mirror_aborted_responses_total"
        ),
        0.0
    );
    assert!(victim.agent.log().contains("failed verification"));
}

#[test]
fn a_blob_failing_its_digest_is_cut_off_and_nothing_of_it_is_kept() {
    let mut bed = bed(false, Auth::None);
    let node = bed.node(&[]);
    // The registry's copy of the second layer goes bad (it does not check on read).
    let layer = bed.layer_digests()[1].clone();
    let hex = &layer[7..];
    let stored = bed.registry.blob_path(&layer);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[(5 << 20) + 7] ^= 0x55;
    std::fs::write(&stored, &bytes).unwrap();

    let out = bed.pull(&node, None);
    assert!(
        !out.status.success(),
        "a pull of a corrupted blob succeeded"
    );
    let metrics = node.agent.metrics();
    assert!(
        metric(&metrics, "tessera_agent_mirror_aborted_responses_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "tessera_agent_mirror_verification_failures_total{source=\"origin\"}"
        ) >= 1.0
    );
    // No piece table, and none of its pieces (good or bad) in the cache.
    assert!(!node.agent.cache_dir.join("pieces").join(hex).exists());
    let pieces: Vec<String> = bytes
        .chunks(4 << 20)
        .map(|p| {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(p))
        })
        .collect();
    let mut cached = Vec::new();
    let mut dirs = vec![node.agent.cache_dir.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else {
                cached.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    for piece in &pieces {
        assert!(
            !cached.contains(piece),
            "a piece of the bad blob stayed cached"
        );
    }
    assert!(node.agent.log().contains("does not match its digest"));
}

#[test]
fn pulls_go_on_without_p2p_and_without_the_scheduler() {
    let mut bed = bed(true, Auth::None);
    let solo = bed.node(&["--no-p2p"]);
    bed.pull_ok(&solo, None);
    bed.assert_rootfs(&solo);
    assert!(
        blob_requests(&solo, 200) >= 4.0,
        "the pull went around the mirror"
    );
    assert!(served(&solo, "origin") >= layer_bytes() as f64);

    let orphan = bed.node(&[]);
    wait_registered(&orphan.agent);
    bed.scheduler.as_ref().unwrap().kill9();
    bed.pull_ok(&orphan, None);
    bed.assert_rootfs(&orphan);
    assert!(
        blob_requests(&orphan, 200) >= 4.0,
        "the pull went around the mirror"
    );
    assert!(served(&orphan, "origin") >= layer_bytes() as f64);
}

#[test]
fn private_images_need_credentials_even_when_peers_hold_them() {
    let (user, password) = ("puller", "s3cret-Pa55word");
    let mut bed = bed(
        true,
        Auth::Basic {
            username: user.into(),
            password: password.into(),
        },
    );
    let creds = format!("{user}:{password}");
    let holder = bed.node(&[]);
    let other = bed.node(&[]);
    wait_registered(&holder.agent);
    wait_registered(&other.agent);
    bed.pull_ok(&holder, Some(&creds));
    bed.assert_rootfs(&holder);
    std::thread::sleep(std::time::Duration::from_millis(500));

    // Without credentials: refused, on a node that holds nothing and on the one that
    // holds every blob.
    let out = bed.pull(&other, None);
    assert!(
        !out.status.success(),
        "a pull without credentials succeeded"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The mirror's 401 with a Basic challenge, in each line's words.
    let refused = match other.containerd.line {
        Line::V1_6 => "401",
        Line::V2 => "authorization failed: no basic auth credentials",
    };
    assert!(
        stderr.contains(refused),
        "ctr should say the mirror refused it ({refused}): {stderr}"
    );
    let layer = &bed.layer_digests()[0];
    for node in [&other, &holder] {
        for args in [vec![], vec!["-u", "puller:wrong"]] {
            let (status, head, body) = curl(node, &bed, &format!("blobs/{layer}"), &args);
            assert_eq!(status, 401, "{head}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: basic"),
                "{head}"
            );
            assert!(
                body.len() < 1000,
                "blob bytes were sent without credentials"
            );
        }
    }
    let (status, _, body) = curl(&holder, &bed, &format!("blobs/{layer}"), &["-u", &creds]);
    assert_eq!(status, 200);
    assert!(body == std::fs::read(bed.blob_path(layer)).unwrap());

    // With credentials the other node pulls, from its peer.
    bed.pull_ok(&other, Some(&creds));
    bed.assert_rootfs(&other);
    assert!(served(&other, "peer") >= layer_bytes() as f64 * 0.95);

    // No credential reached the scheduler, a peer or a log.
    let basic = base64_encode(&creds);
    let scheduler_log =
        std::fs::read_to_string(&bed.scheduler.as_ref().unwrap().log).unwrap_or_default();
    for (what, text) in [
        ("scheduler log", scheduler_log),
        ("holder's log", holder.agent.log()),
        ("other's log", other.agent.log()),
    ] {
        assert!(!text.contains(password), "the password is in the {what}");
        assert!(
            !text.contains(&basic),
            "the basic credential is in the {what}"
        );
    }
}

/// The digest the mirror on `node` resolves the image's tag to.
fn tag_digest(node: &MirrorNode, bed: &MirrorBed) -> String {
    let (status, head, _) = curl(
        node,
        bed,
        &format!("manifests/{TAG}"),
        &[
            "-I",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ],
    );
    assert_eq!(status, 200, "{head}");
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("docker-content-digest:")
                .map(|d| d.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no digest in {head}"))
}

/// A tag that moves in the registry is resolved again at the next pull. With
/// `--mirror-last-known-secs`, a node whose registry is down still pulls the tag's
/// last known image from what the swarm holds (here its own cache); without it, the
/// pull fails, as it would without the mirror.
#[test]
fn tags_are_resolved_at_every_pull_and_the_last_known_serves_while_the_registry_is_down() {
    let mut bed = bed(false, Auth::None);
    let node = bed.node(&["--mirror-last-known-secs", "600"]);
    let plain = bed.node(&[]);
    bed.pull_ok(&node, None);
    let first = tag_digest(&node, &bed);

    // The tag moves: a different image pushed under it.
    let moved = bed.t.path().join("moved");
    build_files_image(
        &moved,
        "amd64",
        &[vec![("moved/data.bin", pseudo_random(300_000, 4242))]],
    );
    bed.registry.push_layout(&moved, TAG, "plain/app");
    let second = tag_digest(&node, &bed);
    assert_ne!(first, second, "the mirror answered the tag's old digest");
    bed.pull_ok(&node, None);
    bed.pull_ok(&plain, None);
    let listed = node.containerd.ctr_ok(&["image", "ls"]);
    assert!(
        listed.contains(&second),
        "ctr pulled the moved tag: {listed}"
    );

    // The registry goes down. A new containerd on each node pulls the tag again.
    bed.registry.stop();
    let fresh = |n: &MirrorNode, name: &str| {
        support::containerd::Containerd::start_in(&n.agent.dir.join(name), &n.host)
    };
    let node = MirrorNode {
        containerd: fresh(&node, "containerd-down"),
        agent: node.agent,
        host: node.host,
    };
    bed.pull_ok(&node, None);
    let listed = node.containerd.ctr_ok(&["image", "ls"]);
    assert!(listed.contains(&second), "the last known digest: {listed}");
    assert!(
        metric(
            &node.agent.metrics(),
            "tessera_agent_mirror_last_known_answers_total"
        ) > 0.0,
        "{}",
        node.agent.metrics()
    );
    let plain = MirrorNode {
        containerd: fresh(&plain, "containerd-down"),
        agent: plain.agent,
        host: plain.host,
    };
    let out = bed.pull(&plain, None);
    assert!(
        !out.status.success(),
        "without the knob, a pull while the registry is down fails"
    );
}

fn base64_encode(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}
