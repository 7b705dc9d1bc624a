//! A registry-mirror test bed on a [`Cluster`]: a registry (its egress optionally
//! capped) holding a plain multi-layer OCI image of random files, optionally a
//! scheduler, and nodes — each a host with a `tessera agent` serving the mirror on
//! 127.0.0.1:7082 of its own namespace and a containerd pulling through it with the
//! `hosts.toml` that `tessera containerd-config` writes. Shared by the mirror tests and
//! the mirror benchmark.

use std::path::PathBuf;
use std::process::Output;

use super::agent::AgentProcess;
use super::containerd::{Containerd, PullOptions};
use super::fstree::{compare_trees, CompareOptions};
use super::netns::{Cluster, NetHost};
use super::oci::{build_files_image, pseudo_random, umoci_unpack_rootfs, TAG};
use super::registry::{Auth, Registry};
use super::scheduler::SchedulerProcess;
use super::{s, tessera_ok};

/// Where every node's agent serves the mirror (inside the node's own namespace).
pub const MIRROR: &str = "127.0.0.1:7082";

/// One node: its host, agent and containerd. Fields drop in order: containerd, then
/// the agent.
pub struct MirrorNode {
    pub containerd: Containerd,
    pub agent: AgentProcess,
    pub host: NetHost,
}

/// What the bed is made of.
pub struct BedOptions<'a> {
    /// Sizes of the image's layers (each one random file, so incompressible).
    pub layers: &'a [usize],
    /// Cap on the registry's egress (`tc` rate), if any.
    pub cap: Option<&'a str>,
    /// Start a scheduler (nodes then join its swarm).
    pub scheduler: bool,
    pub auth: Auth,
}

/// The registry, the image, the scheduler, and room for nodes. Fields drop in order:
/// processes before the namespaces they run in.
pub struct MirrorBed {
    pub scheduler: Option<SchedulerProcess>,
    pub registry: Registry,
    registry_host: NetHost,
    cluster: Cluster,
    /// containerd's hosts directory, as `tessera containerd-config` wrote it.
    pub hosts_dir: PathBuf,
    /// The image as pushed, for ground truth.
    pub layout: PathBuf,
    /// `IP:5000/plain/app:v1`.
    pub reference: String,
    /// Bytes of the image's blobs (layers and config).
    pub image_bytes: u64,
    nodes: usize,
    pub t: tempfile::TempDir,
}

impl MirrorBed {
    pub fn new(opts: BedOptions<'_>) -> MirrorBed {
        let t = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::new();
        let registry_host = cluster.add_host("registry");
        if let Some(cap) = opts.cap {
            registry_host.cap_egress(cap);
        }
        let registry = Registry::start_in_with(&registry_host, opts.auth);
        let scheduler = opts.scheduler.then(|| {
            let host = cluster.add_host("scheduler");
            SchedulerProcess::start_in(&host, t.path().join("scheduler.log"), &[])
        });
        let layers: Vec<Vec<(String, Vec<u8>)>> = opts
            .layers
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                vec![(
                    format!("layer{i}/data.bin"),
                    pseudo_random(size, 900 + i as u64),
                )]
            })
            .collect();
        let layout = t.path().join("layout");
        let as_refs: Vec<Vec<(&str, Vec<u8>)>> = layers
            .iter()
            .map(|files| files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect())
            .collect();
        build_files_image(&layout, "amd64", &as_refs);
        registry.push_layout(&layout, TAG, "plain/app");
        let image_bytes = std::fs::read_dir(layout.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let hosts_dir = t.path().join("certs.d");
        tessera_ok(&[
            "containerd-config",
            "--registry",
            &registry.addr,
            "--insecure",
            &registry.addr,
            "--mirror",
            &format!("http://{MIRROR}"),
            "--certs-dir",
            s(&hosts_dir),
            "--containerd-config",
            s(&t.path().join("no-containerd-config.toml")),
        ]);
        MirrorBed {
            reference: format!("{}/plain/app:{TAG}", registry.addr),
            scheduler,
            registry,
            registry_host,
            cluster,
            hosts_dir,
            layout,
            image_bytes,
            nodes: 0,
            t,
        }
    }

    /// A new node on its own host: an agent serving the mirror (in the swarm when
    /// there is a scheduler), with `extra` flags, and a containerd.
    pub fn node(&mut self, extra: &[&str]) -> MirrorNode {
        self.nodes += 1;
        let n = self.nodes;
        let host = self.cluster.add_host(&format!("node{n}"));
        let dir = self.t.path().join(format!("node{n}"));
        let peer_listen = format!("{}:7081", host.ip);
        let id = format!("node{n}");
        let config = self.t.path().join("agent.toml");
        // The upstream speaks plain HTTP: the agent must be told, as containerd is.
        std::fs::write(
            &config,
            format!("[registry]\ninsecure = [\"{}\"]\n", self.registry.addr),
        )
        .unwrap();
        let mut args = vec![
            "--config",
            s(&config),
            "--mirror-listen",
            MIRROR,
            "--host-id",
            &id,
        ];
        if let Some(scheduler) = &self.scheduler {
            args.extend_from_slice(&["--scheduler", &scheduler.url, "--peer-listen", &peer_listen]);
        }
        args.extend_from_slice(extra);
        let agent = AgentProcess::start_in(&dir.join("agent"), &host, &args);
        let containerd = Containerd::start_in(&dir.join("containerd"), &host);
        MirrorNode {
            containerd,
            agent,
            host,
        }
    }

    /// `ctr image pull --hosts-dir` of the image on `node`, as `user` (`name:password`)
    /// if given.
    pub fn pull(&self, node: &MirrorNode, user: Option<&str>) -> Output {
        node.containerd.pull(
            &self.reference,
            &PullOptions {
                hosts_dir: Some(self.hosts_dir.clone()),
                user: user.map(str::to_string),
                ..PullOptions::default()
            },
        )
    }

    /// Pulls on `node` and panics with both logs unless it succeeded.
    pub fn pull_ok(&self, node: &MirrorNode, user: Option<&str>) {
        let out = self.pull(node, user);
        assert!(
            out.status.success(),
            "ctr pull through the mirror failed: {}\n{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            node.agent.log()
        );
    }

    /// The unpacked snapshot on `node` equals `umoci unpack` of the image.
    pub fn assert_rootfs(&self, node: &MirrorNode) {
        // Beside this containerd's own files: a node may have several.
        let scratch = node.containerd.dir.with_extension("compare");
        let expected = umoci_unpack_rootfs(&self.layout, TAG, &scratch.join("expected"));
        let actual = scratch.join("rootfs");
        std::fs::create_dir_all(&actual).unwrap();
        node.containerd.rootfs(&self.reference, &actual);
        // containerd ignores the layers' `.` entries, so its root keeps the snapshot
        // directory's own metadata (the unpack time); everything under it must match.
        let opts = CompareOptions {
            compare_root_metadata: false,
            ..CompareOptions::default()
        };
        let differences = compare_trees(&expected, &actual, &opts);
        node.containerd.unmount(&actual);
        assert!(
            differences.is_empty(),
            "containerd's snapshot differs from the image: {differences:#?}"
        );
    }

    /// Bytes the registry has sent so far, counted on its own network interface.
    pub fn origin_tx(&self) -> u64 {
        self.registry_host.tx_bytes()
    }

    pub fn registry_host(&self) -> &NetHost {
        &self.registry_host
    }

    /// The layers' digests, from the pushed layout's manifest.
    pub fn layer_digests(&self) -> Vec<String> {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.layout.join("index.json")).unwrap())
                .unwrap();
        let manifest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.layout.join("blobs/sha256").join(&manifest[7..])).unwrap(),
        )
        .unwrap();
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.layout.join("blobs/sha256").join(&digest[7..])
    }
}

/// The value of a Prometheus sample (`name{labels}`) in `text`, 0 if absent.
pub fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}
