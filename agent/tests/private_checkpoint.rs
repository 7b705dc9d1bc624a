//! Private images and checkpoints among peers (issue 29, "Security"): the chunks of an
//! image whose registry wants credentials go, from a node's cache or from its peer
//! service, only to nodes that prove they read its manifest from the registry; an
//! image anyone may pull goes peer to peer as before. Real agents, a real scheduler and
//! two real registries (one behind basic auth, one open), each on its own host of a
//! cluster of network namespaces. No CRIU is needed: what makes an image restricted is
//! its repository, or the checkpoint annotations on its manifest (a converted image's
//! manifest pushed again with them stands for a checkpoint here).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use support::agent::AgentProcess;
use support::netns::{Cluster, NetHost};
use support::oci::{self, build_files_image, pseudo_random};
use support::registry::{Auth, Registry};
use support::scheduler::SchedulerProcess;
use support::swarm::{peer_agent_args, wait_registered};
use support::{s, tessera};
use tessera_agent::peer::access::AccessKey;
use tessera_agent::registry::client::{ClientOptions, Credential, RegistryClient};
use tessera_agent::registry::image::{self as registry_image, Layers};
use tessera_agent::registry::reference::{Platform, Reference};
use tessera_proto::pb;
use tessera_proto::pb::peer_service_client::PeerServiceClient;

const USER: &str = "ckpt-owner";
const PASSWORD: &str = "s3cret-never-in-a-log";

/// Everything the test starts; fields drop in order: agents and services before the
/// namespaces they run in.
struct Bed {
    agents: Vec<AgentProcess>,
    scheduler: SchedulerProcess,
    private: Registry,
    public: Registry,
    /// Dropped last: the namespaces everything above runs in.
    _cluster: Cluster,
    /// `[registry] insecure` for both registries.
    config: PathBuf,
    t: tempfile::TempDir,
}

/// `count` files of `size` random bytes from `seed` on.
fn files(count: u64, size: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| (format!("data/f{i:02}.bin"), pseudo_random(size, seed + i)))
        .collect()
}

fn docker_config(dir: &Path, registry: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        dir.join("config.json"),
        serde_json::json!({"auths": {registry: {"auth": auth}}}).to_string(),
    )
    .unwrap();
}

impl Bed {
    /// Pushes `files` as `src/NAME` to `registry` and converts it to `REPO:v1` there.
    fn image(
        &self,
        registry: &Registry,
        files: &[(String, Vec<u8>)],
        name: &str,
        repo: &str,
    ) -> String {
        let layout = self.t.path().join(format!("layout-{name}"));
        let layer: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
        build_files_image(&layout, "amd64", &[layer]);
        registry.push_layout(&layout, oci::TAG, &format!("src/{name}"));
        let home = self.t.path().join("converter");
        docker_config(&home, &self.private.addr);
        let out = tessera()
            .args(["convert", "--json", "--config"])
            .arg(&self.config)
            .arg(format!("{}/src/{name}:{}", registry.addr, oci::TAG))
            .arg(format!("{}/{repo}:v1", registry.addr))
            .env("DOCKER_CONFIG", &home)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "convert: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!("{}/{repo}:v1", registry.addr)
    }

    /// An agent named `id` on `host` in the swarm; with the private registry's
    /// credentials in its `config.json` when `credentials`.
    fn agent(&self, host: &NetHost, id: &str, credentials: bool) -> AgentProcess {
        let dir = self.t.path().join(id);
        std::fs::create_dir_all(&dir).unwrap();
        if credentials {
            docker_config(&dir, &self.private.addr);
        } else {
            let _ = std::fs::remove_file(dir.join("config.json"));
        }
        let swarm = peer_agent_args(&self.scheduler.url, host, id);
        let mut args = vec!["--config", s(&self.config)];
        args.extend(swarm.iter().map(String::as_str));
        AgentProcess::start_in(&dir, host, &args)
    }
}

fn mount(agent: &AgentProcess, image: &str, name: &str) -> std::process::Output {
    let mnt = agent.dir.join(name);
    std::fs::create_dir_all(&mnt).unwrap();
    agent.run(&["mount", image, s(&mnt)])
}

/// Mounts `image` on `agent` as `name`, which must succeed, and checks every file of
/// `files` reads back exactly.
fn mount_and_read(agent: &AgentProcess, image: &str, name: &str, files: &[(String, Vec<u8>)]) {
    let out = mount(agent, image, name);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log()
    );
    read_all(&agent.dir.join(name), files);
}

fn read_all(mnt: &Path, files: &[(String, Vec<u8>)]) {
    for (path, data) in files {
        let got = std::fs::read(mnt.join(path)).unwrap();
        assert!(
            got == *data,
            "{path} read through {} differs",
            mnt.display()
        );
    }
}

/// The pull figures of `agent`'s mount of `image`.
fn pull(agent: &AgentProcess, image: &str) -> serde_json::Value {
    let status = agent.status();
    let mounts = status["mounts"].as_array().unwrap();
    mounts
        .iter()
        .find(|m| m["image"] == image)
        .unwrap_or_else(|| panic!("no mount of {image}: {status}"))["pull"]
        .clone()
}

/// A counter of the agent's `/metrics` (0 when absent).
fn counter(agent: &AgentProcess, name: &str) -> u64 {
    agent
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

const REFUSED: &str = "tessera_agent_peer_requests_refused_total";

/// What the test knows of an image from its registry: its manifest's bytes, its blob
/// and the digests of its chunks.
struct Known {
    manifest_digest: String,
    manifest: Vec<u8>,
    blob: String,
    chunks: Vec<[u8; 32]>,
}

fn known(image: &str, private: &Registry) -> Known {
    let mut credentials = std::collections::HashMap::new();
    credentials.insert(
        private.addr.clone(),
        Credential::Basic {
            username: USER.into(),
            password: PASSWORD.into(),
        },
    );
    let reference = Reference::parse(image).unwrap();
    let registry = reference.registry.clone();
    let client = RegistryClient::new(ClientOptions {
        plain_http: vec![registry],
        credentials,
        ..Default::default()
    })
    .unwrap();
    support::registry::block_on(async {
        let platform: Platform = "linux/amd64".parse().unwrap();
        let img = registry_image::resolve_platform(&client, &reference, &platform)
            .await
            .unwrap();
        let location = registry_image::locate_bootstrap(&client, &img, Layers::All)
            .await
            .unwrap();
        let bytes = registry_image::bootstrap_bytes_at(&client, &img, &location.layer)
            .await
            .unwrap();
        let bootstrap = rafs_format::reader::Bootstrap::from_bytes(
            bytes,
            rafs_format::reader::Verify::Checksum,
        )
        .unwrap();
        let blobs = bootstrap.blobs().unwrap();
        let chunks: Vec<_> = (0..bootstrap.chunk_count())
            .map(|c| bootstrap.chunk(c).unwrap())
            .collect();
        let blob = blobs[chunks[0].blob_index as usize].oci_digest();
        Known {
            manifest_digest: img.raw.digest.clone(),
            manifest: img.raw.bytes.clone(),
            blob,
            chunks: chunks.iter().take(3).map(|c| c.digest).collect(),
        }
    })
}

/// Pushes `image`'s manifest again as `TAG` in its repository, with the annotations
/// `tessera checkpoint` writes: a checkpoint, on a registry anyone may read.
fn as_checkpoint(image: &str, tag: &str) -> String {
    let reference = Reference::parse(image).unwrap();
    let client = RegistryClient::new(ClientOptions {
        plain_http: vec![reference.registry.clone()],
        ..Default::default()
    })
    .unwrap();
    support::registry::block_on(async {
        let raw = client.manifest(&reference).await.unwrap();
        let mut manifest: serde_json::Value = serde_json::from_slice(&raw.bytes).unwrap();
        manifest["annotations"]["io.tessera.checkpoint.criu-version"] = "4.2.1".into();
        manifest["annotations"]["io.tessera.checkpoint.process"] = "python3".into();
        let tagged = Reference {
            tag: Some(tag.into()),
            digest: None,
            ..reference.clone()
        };
        client
            .push_manifest(
                &tagged,
                &raw.media_type,
                serde_json::to_vec(&manifest).unwrap(),
            )
            .await
            .unwrap();
        format!("{}/{}:{tag}", reference.registry, reference.repository)
    })
}

/// A `FetchChunks` straight to `host`'s peer service: the chunks it streamed, or the
/// code of the status it refused with.
fn fetch_direct(
    host: &NetHost,
    digests: &[[u8; 32]],
    access: Option<pb::ChunkAccess>,
) -> Result<usize, tonic::Code> {
    support::registry::block_on(async {
        let mut client = PeerServiceClient::connect(format!("http://{}:7081", host.ip))
            .await
            .unwrap();
        let request = pb::FetchChunksRequest {
            digest_algorithm: "sha256".into(),
            digests: digests.iter().map(|d| d.to_vec()).collect(),
            accept_encodings: Vec::new(),
            access,
        };
        let mut stream = client
            .fetch_chunks(request)
            .await
            .map_err(|e| e.code())?
            .into_inner();
        let mut got = 0;
        while let Some(_chunk) = stream.message().await.map_err(|e| e.code())? {
            got += 1;
        }
        Ok(got)
    })
}

/// A proof made with the key of `manifest` (whatever bytes the caller has).
fn access(
    manifest: &[u8],
    manifest_digest: &str,
    requester: &str,
    server: &str,
    blob: &str,
) -> pb::ChunkAccess {
    let key = AccessKey::of_manifest(manifest);
    pb::ChunkAccess {
        requester: requester.into(),
        blob: blob.into(),
        proofs: vec![pb::AccessProof {
            manifest: manifest_digest.into(),
            proof: key.proof(requester, server, blob).to_vec(),
        }],
    }
}

/// Waits until the scheduler has heard that some agent holds chunks (the agents
/// announce as they verify; the reads above made them hold everything).
fn settle() {
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
fn a_private_image_goes_only_to_nodes_that_prove_access() {
    let t = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new();
    let private_host = cluster.add_host("private-registry");
    let public_host = cluster.add_host("public-registry");
    let scheduler_host = cluster.add_host("scheduler");
    let host_a = cluster.add_host("node-a");
    let host_b = cluster.add_host("node-b");
    let private = Registry::start_in_with(
        &private_host,
        Auth::Basic {
            username: USER.into(),
            password: PASSWORD.into(),
        },
    );
    let public = Registry::start_in(&public_host);
    let scheduler =
        SchedulerProcess::start_in(&scheduler_host, t.path().join("scheduler.log"), &[]);
    let config = t.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[registry]\ninsecure = [\"{}\", \"{}\"]\n",
            private.addr, public.addr
        ),
    )
    .unwrap();
    let mut bed = Bed {
        agents: Vec::new(),
        scheduler,
        private,
        public,
        _cluster: cluster,
        config,
        t,
    };
    // Different bytes: no chunk of one is a chunk of the other.
    let secret = files(4, 3 << 20, 100);
    let open = files(3, 2 << 20, 900);
    let total = |f: &[(String, Vec<u8>)]| f.iter().map(|(_, d)| d.len() as u64).sum::<u64>();
    let private_image = bed.image(&bed.private, &secret, "secret", "private/ckpt");
    let public_image = bed.image(&bed.public, &open, "open", "tessera/app");
    let k = known(&private_image, &bed.private);

    // Node A has the credentials: it mounts and reads the private image from the
    // origin; its chunks are in its cache and announced.
    let a = bed.agent(&host_a, "node-a", true);
    wait_registered(&a);
    mount_and_read(&a, &private_image, "private", &secret);
    assert_eq!(pull(&a, &private_image)["origin_bytes"], total(&secret));
    bed.agents.push(a);
    settle();

    // Node B without credentials: the registry refuses the mount, and the error says
    // which repository and what to do.
    let b = bed.agent(&host_b, "node-b", false);
    wait_registered(&b);
    let out = mount(&b, &private_image, "private");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "a node without credentials mounted a private image"
    );
    assert!(said.contains("private/ckpt"), "{said}");
    assert!(said.contains("credentials"), "{said}");
    assert!(!said.contains(PASSWORD));
    drop(b);

    // Straight to A's peer service: no proof, a proof from bytes that are not the
    // manifest, a proof made for another server: refused, and counted.
    let a = &bed.agents[0];
    let refused_before = counter(a, REFUSED);
    let denied = |r: Result<usize, tonic::Code>| {
        let code = r.expect_err("A served chunks of a private image without a proof");
        assert_eq!(code, tonic::Code::PermissionDenied);
    };
    // node-b asking node-a (or `server`), proving with `manifest`'s bytes.
    let ask = |manifest: &[u8], server: &str| {
        let proof = access(manifest, &k.manifest_digest, "node-b", server, &k.blob);
        fetch_direct(&host_a, &k.chunks, Some(proof))
    };
    denied(fetch_direct(&host_a, &k.chunks, None));
    denied(ask(br#"{"schemaVersion":2,"I":"guessed"}"#, "node-a"));
    denied(ask(&k.manifest, "node-c"));
    assert_eq!(counter(a, REFUSED), refused_before + 3);
    // Whoever has the manifest's bytes (it was read from the registry with the
    // credentials) can prove it.
    let served = ask(&k.manifest, "node-a").unwrap();
    assert_eq!(served, k.chunks.len());
    let log = a.log();
    assert!(!log.contains(PASSWORD), "a credential in A's log");

    // Node B with credentials mounts it and reads its chunks from A: the registry
    // sends the manifest and the bootstrap, no chunk.
    let b = bed.agent(&host_b, "node-b", true);
    wait_registered(&b);
    let ranges_before = bed.private.blob_bytes_sent(206);
    mount_and_read(&b, &private_image, "private", &secret);
    let p = pull(&b, &private_image);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], total(&secret), "{p}");
    assert_eq!(bed.private.blob_bytes_sent(206) - ranges_before, 0);
    assert_eq!(
        counter(&bed.agents[0], REFUSED),
        refused_before + 3,
        "B's proofs were refused"
    );
    bed.agents.push(b);

    // The access keys on A's disk are root-only.
    let records = bed.agents[0].cache_dir.join("access");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&records), 0o700);
    let kept: Vec<PathBuf> = std::fs::read_dir(&records)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|f| mode(f) == 0o600), "{kept:?}");

    // A restarted without credentials: the chunks are still in its cache, but it
    // cannot mount the image again; and its peer service still asks for proofs.
    {
        let a = &mut bed.agents[0];
        std::fs::remove_file(a.dir.join("config.json")).unwrap();
        a.restart();
        wait_registered(a);
        // A gauge: named as it is, no `_total`.
        let cached = counter(a, "tessera_agent_cache_bytes");
        assert!(cached >= total(&secret), "A's cache holds {cached} bytes");
        let out = mount(a, &private_image, "private-again");
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !out.status.success(),
            "A mounted a private image without credentials"
        );
        assert!(
            said.contains("private/ckpt") && said.contains("credentials"),
            "{said}"
        );
    }
    denied(fetch_direct(&host_a, &k.chunks, None));
    assert_eq!(counter(&bed.agents[0], REFUSED), 1);

    // A public image goes peer to peer with no proof, as before.
    let a = &bed.agents[0];
    let b = &bed.agents[1];
    mount_and_read(a, &public_image, "public", &open);
    settle();
    mount_and_read(b, &public_image, "public", &open);
    let p = pull(b, &public_image);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], total(&open), "{p}");
    let open_known = known(&public_image, &bed.private);
    assert_eq!(
        fetch_direct(&host_a, &open_known.chunks, None).unwrap(),
        open_known.chunks.len()
    );
    assert_eq!(counter(a, REFUSED), 1);

    // A checkpoint is restricted wherever it is pushed: on the open registry, A
    // (without credentials, none needed) mounts it and refuses its chunks without a
    // proof; B, which read its manifest too, gets them from A with one.
    let frozen = files(3, 2 << 20, 5000);
    let plain = bed.image(&bed.public, &frozen, "frozen", "ckpt/app");
    let checkpoint = as_checkpoint(&plain, "checkpoint");
    mount_and_read(a, &checkpoint, "checkpoint", &frozen);
    settle();
    let c = known(&checkpoint, &bed.private);
    denied(fetch_direct(&host_a, &c.chunks, None));
    assert_eq!(counter(a, REFUSED), 2);
    mount_and_read(b, &checkpoint, "checkpoint", &frozen);
    let p = pull(b, &checkpoint);
    assert_eq!(p["origin_bytes"], 0, "{p}");
    assert_eq!(p["peer_bytes"], total(&frozen), "{p}");
    assert_eq!(
        counter(a, REFUSED),
        2,
        "B's proofs for the checkpoint were refused"
    );
}

/// What `tessera checkpoint` writes is what makes an image a checkpoint to the peer
/// service (the two modules sit in different layers, so the constants are copies).
#[test]
fn checkpoints_are_recognised_by_what_tessera_checkpoint_writes() {
    use tessera_agent::checkpoint;
    use tessera_agent::peer::access;
    assert_eq!(
        access::CHECKPOINT_ARTIFACT_TYPE,
        checkpoint::app::ARTIFACT_TYPE
    );
    for annotation in [
        checkpoint::node::CRIU_VERSION_ANNOTATION,
        checkpoint::node::KERNEL_ANNOTATION,
        checkpoint::PROCESS_ANNOTATION,
    ] {
        assert!(
            annotation.starts_with(access::CHECKPOINT_ANNOTATION_PREFIX),
            "{annotation}"
        );
    }
}
