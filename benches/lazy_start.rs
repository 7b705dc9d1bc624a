//! The lazy-start benchmark: how long until a realistic image's application has started
//! on a node, side by side in one run, with the registry's egress capped:
//!
//! 1. `skopeo copy` + `umoci unpack`, then the start-up (the baseline);
//! 2. `ctr image pull` (containerd fetches and unpacks), then the start-up;
//! 3. `tessera mount` of the converted image, then the start-up reading through the
//!    lazy mount, with an empty cache;
//! 4. the same with the image converted with the start-up's prefetch list (recorded by
//!    `tessera mount --record` in a first run), fetched in the background at mount;
//! 5. the Kubernetes path: the plain image pulled through containerd's CRI image
//!    service (as the kubelet pulls it) with the default overlayfs snapshotter, then
//!    the start-up in a container (`ctr run`, runc);
//! 6. and 7. the same with the converted image (without, then with, the prefetch list)
//!    and the Tessera agent as containerd's snapshotter: nothing is downloaded at pull;
//! 8. (issue 21) `tessera mount` on an agent whose cache already holds the whole image
//!    (the start-up ran through it, then every file was read), page cache dropped;
//! 9. every chunk on a peer: a scheduler and two agents, each in a network namespace of
//!    its own; node A preheated with the whole image through the scheduler's admin API,
//!    then node B, its cache empty, mounts and starts;
//! 10. nydusd (FUSE, registry backend, blobcache) on a Nydus image of the same tree
//!     (`nydus-image create`, RAFS v6, zstd, 1 MiB chunks), its blob in the same
//!     registry behind the same link: cold, with the same prefetch list (nydus's own
//!     `--prefetch-policy fs` and `fs_prefetch`), and over a full blobcache;
//! 11. `tar -c` of the image's two largest trees (the Python stack, `/usr/lib`) through
//!     the native directory, a fresh Tessera mount over a full cache and a fresh nydusd
//!     over a full blobcache, page cache dropped; then again on the same mount (page
//!     cache warm);
//! 12. (issue 22) `tessera mount` of the plain image itself, never converted, through
//!     the index `tessera index` pushed beside it, cold; and of a copy indexed with the
//!     start-up's prefetch list. Before the link is capped, `tessera index` is timed
//!     against `gzip -dc` of the same layers, and the index's size is noted;
//! 13. (issue 26) Podman: `podman pull` + `podman run` of the start-up (runc), with
//!     storage of its own per repetition; the plain image through Podman's own pull
//!     (it downloads and unpacks every layer), then the converted image with Podman's
//!     `storage.conf` naming a fresh agent's additional layer store (`--store-root`,
//!     cache empty): the pull fetches the manifest and config, the layers are the
//!     store's, and the start-up's reads fetch the data.
//!
//! The start-up is the image's own `/app/start.py` run with `chroot` in an overlay
//! whose lower layer is what each method produced (a directory, containerd's snapshot,
//! the lazy mount): the same program on the same kind of root for every method. Every
//! repetition starts from the state its row names: new caches for cold rows, new
//! containerd, the page cache dropped. Prints Markdown tables (median seconds, ratios
//! against the baseline and against nydusd, each of issue 21's targets with its
//! verdict) and, with `TESSERA_BENCH_JSON=FILE`, writes the figures as JSON.
//!
//! The image is `benches/image.sh`'s (~1 GB: Debian + a Python data stack), built once
//! and cached (`TESSERA_BENCH_IMAGE_DIR` names another build);
//! `TESSERA_BENCH_IMAGE_SMALL=1` uses its smoke-size variant. Knobs:
//! `TESSERA_BENCH_LAZY_CAP` (registry egress, default `200mbit`),
//! `TESSERA_BENCH_REPS` (default 3), `TESSERA_BENCH_LAZY_AGENT_CONFIG` (TOML added to
//! the agents' config, for experiments), `TESSERA_BENCH_LAZY_CONVERT_ARGS` (more
//! `tessera convert` arguments, e.g. `--chunk-size 256K`), `TESSERA_BENCH_LAZY_ONLY`
//! (run only the methods whose name contains one of its comma-separated parts, e.g.
//! `tessera mount,nydusd,tar`; no JSON without the baseline), `TESSERA_BENCH_NYDUS=off`
//! (no nydusd rows: CI does not build nydus) and `TESSERA_NYDUS_BIN_DIR` (default
//! `target/tools/nydus/bin`, `make nydus-deps`). The Podman rows need `podman`
//! (`make test-deps`). `make bench-lazy-start` (root).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "nydus.rs"]
mod nydus;
use nydus::NYDUS_CREATE_OPTIONS;

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::agent::{is_mounted, AgentProcess};
use support::containerd::{plain_http_hosts, Containerd, PullOptions, Snapshotter};
use support::cri::cri_pull;
use support::netns::{Cluster, NetHost};
use support::oci::run_output as run;
use support::podman::Podman;
use support::registry::Registry;
use support::scheduler::SchedulerProcess;
use support::swarm::{
    admin_args, admin_json, peer_agent_args, wait_image_complete, wait_registered,
};
use support::{repo_root, s, tessera};

/// The converted image, and the same converted with the start-up's prefetch list.
const CONVERTED: &str = "v1-tessera";
const WITH_LIST: &str = "v1-prefetch";
/// The plain image (indexed by `tessera index`, issue 22), and a copy of it in a
/// repository of its own, indexed with the start-up's prefetch list (an image has one
/// index per repository: the newest referrer of its manifest).
const PLAIN: &str = "v1";
const PLAIN_LISTED: &str = "bench/listed:v1";

/// The start-up in a container (`ctr run`, `podman run`): its environment, as the
/// image's own would set it for `chroot`, and its command.
const CONTAINER_ENV: [&str; 6] = [
    "--env",
    "HOME=/tmp",
    "--env",
    "MPLCONFIGDIR=/tmp/matplotlib",
    "--env",
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
];
const START_UP: [&str; 2] = ["/usr/bin/python3", "/app/start.py"];

// Rows that ratios and targets name.
const BASELINE: &str = "skopeo copy + umoci unpack";
const TESSERA_COLD: &str = "tessera mount (cold)";
const TESSERA_LIST: &str = "tessera mount + prefetch list";
const TESSERA_FULL: &str = "tessera mount, full local cache";
const TESSERA_PEER: &str = "tessera mount, every chunk on a peer";
const INDEX_COLD: &str = "tessera mount, plain image + index (cold)";
const INDEX_LIST: &str = "tessera mount, plain image + index + prefetch list";
const NYDUS_COLD: &str = "nydusd (cold)";
const NYDUS_LIST: &str = "nydusd + prefetch list";
const NYDUS_FULL: &str = "nydusd, full local blobcache";
const TAR_NATIVE: &str = "tar: native dir";
const TAR_TESSERA: &str = "tar: tessera mount, full local cache";
const TAR_NYDUS: &str = "tar: nydusd, full local blobcache";
/// The Kubernetes baseline's name (benches/scenarios/lazy_start.py compares the
/// snapshotter's rows with it).
const CRI_OVERLAYFS: &str = "containerd CRI pull + container (overlayfs)";
/// Podman's rows (issue 26): its own pull of the plain image, and the converted image
/// through the agent's additional layer store; "podman" selects both
/// (`TESSERA_BENCH_LAZY_ONLY`).
const PODMAN_PLAIN: &str = "podman pull + run (plain image)";
const PODMAN_STORE: &str = "podman pull + run, converted image via the tessera layer store";
/// Each Tessera row and the nydusd row measured the same way (its "vs nydusd").
const NYDUS_PAIRS: [(&str, &str); 4] = [
    (TESSERA_COLD, NYDUS_COLD),
    (TESSERA_LIST, NYDUS_LIST),
    (TESSERA_FULL, NYDUS_FULL),
    (TAR_TESSERA, TAR_NYDUS),
];
/// The image's two largest trees (benches/image.sh: the Python stack, and the OS's
/// libraries with Python's standard library), relative to its root.
const TAR_TREES: [&str; 2] = ["opt/app/site-packages", "usr/lib"];

/// The benchmark image's OCI layout (built by `benches/image.sh` if not cached).
fn image_layout() -> (PathBuf, u64, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("benches/image.sh"));
    // An image built before (benches/image.sh DIR) instead of the cached default.
    if let Some(dir) = std::env::var_os("TESSERA_BENCH_IMAGE_DIR") {
        cmd.arg(dir);
    }
    let out = run(&mut cmd);
    let dir = PathBuf::from(out.trim());
    let unpacked = std::fs::read_to_string(dir.join("unpacked-bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let description = std::fs::read_to_string(dir.join("description"))
        .unwrap_or_default()
        .trim()
        .to_string();
    (dir.join("layout"), unpacked, description)
}

/// Empties the page cache, so a repetition reads from disk as a cold node would.
fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Runs the image's start-up in an overlay over `lower` (read-only for every method);
/// returns how long it took.
fn start_up(lower: &Path, work: &Path) -> Duration {
    let [upper, scratch, merged] = ["upper", "scratch", "merged"].map(|d| work.join(d));
    for d in [&upper, &scratch, &merged] {
        std::fs::create_dir_all(d).unwrap();
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        scratch.display()
    );
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged));
    let started = Instant::now();
    let out = Command::new("chroot")
        .arg(&merged)
        .args(START_UP)
        .env_clear()
        .env("HOME", "/tmp")
        .env("MPLCONFIGDIR", "/tmp/matplotlib")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    let took = started.elapsed();
    let _ = Command::new("umount").arg(&merged).status();
    assert!(
        out.status.success(),
        "start-up failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Seconds to `tar -c` `trees` (relative to `root`), and the archive's bytes. The
/// archive is piped here and thrown away: GNU tar does not read file data at all when
/// its archive is /dev/null (`tar -cf /dev/null` times the walk, not the reads).
fn tar_trees(root: &Path, trees: &[&str]) -> (f64, u64) {
    let started = Instant::now();
    let mut child = Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg("-")
        .args(trees)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tar");
    let bytes = std::io::copy(&mut child.stdout.take().unwrap(), &mut std::io::sink()).unwrap();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "tar of {trees:?} in {} failed: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (took, bytes)
}

/// The cluster: the registry (egress capped once set up), the node the cold methods
/// run on, and hosts of their own for the agent with the full cache and for the peer
/// row's scheduler, node A and node B.
struct Bed {
    registry_host: NetHost,
    node: NetHost,
    cache_node: NetHost,
    scheduler_host: NetHost,
    holder_host: NetHost,
    peer_host: NetHost,
    registry: Registry,
    /// `[registry] insecure` for the agents and convert.
    config: PathBuf,
    work: tempfile::TempDir,
    /// Last: fields drop in order, the processes above before their namespaces.
    _cluster: Cluster,
}

/// Where the registry's counters stood: the bytes its interface had sent and the length
/// of its access log.
struct Mark {
    tx: u64,
    log: usize,
}

impl Bed {
    /// Puts a repetition's directory out of the way until the run ends (the whole work
    /// directory goes then). Not deleted now: on ext4 without a journal, as here,
    /// creating files right after deleting tens of thousands scans the recently freed
    /// inodes, which made the next repetition's cache writes slower (the peer row's
    /// second and third repetitions by about a second).
    fn discard(&self, dir: &Path) {
        let trash = self.work.path().join("trash");
        let _ = std::fs::create_dir_all(&trash);
        let n = std::fs::read_dir(&trash).map_or(0, Iterator::count);
        if std::fs::rename(dir, trash.join(n.to_string())).is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    fn new() -> Bed {
        let mut cluster = Cluster::new();
        let registry_host = cluster.add_host("registry");
        let node = cluster.add_host("node");
        let cache_node = cluster.add_host("cache-node");
        let scheduler_host = cluster.add_host("scheduler");
        let holder_host = cluster.add_host("node-a");
        let peer_host = cluster.add_host("node-b");
        let registry = Registry::start_in(&registry_host);
        let work = tempfile::tempdir().unwrap();
        let config = work.path().join("tessera.toml");
        // Extra agent configuration for experiments (TOML, e.g. "[fetch]\nmerge_bytes = 0").
        let extra = std::env::var("TESSERA_BENCH_LAZY_AGENT_CONFIG").unwrap_or_default();
        std::fs::write(
            &config,
            format!("{extra}\n[registry]\ninsecure = [\"{}\"]\n", registry.addr),
        )
        .unwrap();
        Bed {
            registry_host,
            node,
            cache_node,
            scheduler_host,
            holder_host,
            peer_host,
            registry,
            config,
            work,
            _cluster: cluster,
        }
    }

    /// `tag` of `bench/app`, or `repo:tag` when it names a repository.
    fn reference(&self, tag: &str) -> String {
        match tag.contains('/') {
            true => format!("{}/{tag}", self.registry.addr),
            false => format!("{}/bench/app:{tag}", self.registry.addr),
        }
    }

    /// `tessera index` of `tag` (see [`Bed::reference`]): its summary and wall time.
    fn index(&self, tag: &str, extra: &[&str]) -> (Value, f64) {
        let t = Instant::now();
        let out = run(tessera()
            .args(["index", "--json", "--config", s(&self.config)])
            .args(extra)
            .arg(self.reference(tag))
            .env("DOCKER_CONFIG", self.work.path()));
        (
            serde_json::from_str(&out).unwrap(),
            t.elapsed().as_secs_f64(),
        )
    }

    fn convert(&self, src: &str, dst: &str, extra: &[&str]) {
        let knob = std::env::var("TESSERA_BENCH_LAZY_CONVERT_ARGS").unwrap_or_default();
        run(tessera()
            .args(["convert", "--config", s(&self.config)])
            .args(knob.split_whitespace())
            .args(extra)
            .args([&self.reference(src), &self.reference(dst)])
            .env("DOCKER_CONFIG", self.work.path()));
    }

    /// A fresh agent on the node, its cache empty.
    fn agent(&self, name: &str) -> AgentProcess {
        AgentProcess::start_in(
            &self.work.path().join(name),
            &self.node,
            &["--config", s(&self.config)],
        )
    }

    fn mark(&self) -> Mark {
        Mark {
            tx: self.registry_host.tx_bytes(),
            log: std::fs::read(&self.registry.log).unwrap_or_default().len(),
        }
    }

    /// Bytes the registry sent since `mark` (its interface's counter), and the blob
    /// GETs it answered (its access log): the origin's bytes and requests.
    fn since(&self, mark: &Mark) -> (u64, u64) {
        let sent = self.registry_host.tx_bytes() - mark.tx;
        (sent, self.blob_gets_since(mark, "") as u64)
    }

    /// The blob GETs the registry answered since `mark` whose access-log line contains
    /// `agent` (a user agent; `""`: all of them).
    fn blob_gets_since(&self, mark: &Mark, agent: &str) -> usize {
        let log = std::fs::read(&self.registry.log).unwrap_or_default();
        String::from_utf8_lossy(log.get(mark.log..).unwrap_or_default())
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/") && l.contains(agent))
            .count()
    }
}

/// One method's figures from one repetition, in seconds and bytes.
#[derive(Default, Clone)]
struct Timing {
    fetch: f64,
    start: f64,
    origin: u64,
    /// Blob GETs the registry answered (its access log).
    requests: u64,
    /// Time FUSE reads waited for data during the start-up (the agent's
    /// `tessera_agent_fuse_read_seconds` sum): where a lazy start's time goes.
    read_wait: Option<f64>,
    /// Chunk bytes (uncompressed) a Tessera mount got from peers and from the origin
    /// (its pull summary).
    peer: Option<u64>,
    origin_chunks: Option<u64>,
    /// nydusd's registry backend: bytes and requests (`/api/v1/metrics/backend`).
    backend: Option<(u64, u64)>,
    /// Tar rows: the same tar again on the same mount (page cache warm), and the
    /// archive's bytes; `start` is the first tar.
    again: Option<f64>,
    archive: Option<u64>,
}

impl Timing {
    fn total(&self) -> f64 {
        self.fetch + self.start
    }
}

fn skopeo_umoci(bed: &Bed, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("skopeo-{rep}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mark = bed.mark();
    let t = Instant::now();
    run(Command::new("skopeo")
        .args(["copy", "-q", "--insecure-policy", "--src-tls-verify=false"])
        .arg(format!("docker://{}", bed.reference("v1")))
        .arg(format!("oci:{}:v1", dir.join("layout").display())));
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", dir.join("layout").display()))
        .arg(dir.join("bundle")));
    let fetch = t.elapsed().as_secs_f64();
    let (origin, requests) = bed.since(&mark);
    let start = start_up(&dir.join("bundle/rootfs"), &dir.join("run")).as_secs_f64();
    bed.discard(&dir);
    Timing {
        fetch,
        start,
        origin,
        requests,
        ..Timing::default()
    }
}

fn ctr_pull(bed: &Bed, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("containerd-{rep}"));
    let containerd = Containerd::start_in(&dir, &bed.node);
    let mark = bed.mark();
    let t = Instant::now();
    containerd.pull_ok(&bed.reference("v1"), &PullOptions::plain_http());
    let fetch = t.elapsed().as_secs_f64();
    let (origin, requests) = bed.since(&mark);
    let rootfs = dir.join("rootfs");
    containerd.rootfs(&bed.reference("v1"), &rootfs);
    let start = start_up(&rootfs, &dir.join("run")).as_secs_f64();
    containerd.unmount(&rootfs);
    drop(containerd);
    bed.discard(&dir);
    Timing {
        fetch,
        start,
        origin,
        requests,
        ..Timing::default()
    }
}

/// The pull summary of `agent`'s mount at `mnt` (`tessera status --json`).
fn pull_of(agent: &AgentProcess, mnt: &Path) -> Value {
    let status = agent.status();
    let mounts = status["mounts"].as_array().cloned().unwrap_or_default();
    let mut mount = mounts
        .into_iter()
        .find(|m| m["mountpoint"].as_str() == Some(s(mnt)))
        .unwrap_or_else(|| panic!("{} is not in the agent's status: {status}", mnt.display()));
    mount["pull"].take()
}

/// `agent` mounts `tag` at `mnt` and the start-up runs on it (`work` holds the
/// overlay); the figures of that, read-wait counted from `waited_before` seconds.
fn mount_and_start(bed: &Bed, agent: &AgentProcess, tag: &str, mnt: &Path, work: &Path) -> Timing {
    std::fs::create_dir_all(mnt).unwrap();
    let waited_before = agent.fuse_read_seconds().unwrap_or(0.0);
    let mark = bed.mark();
    let t = Instant::now();
    agent.ok(&["mount", &bed.reference(tag), s(mnt)]);
    let fetch = t.elapsed().as_secs_f64();
    let start = start_up(mnt, work).as_secs_f64();
    let (origin, requests) = bed.since(&mark);
    let pull = pull_of(agent, mnt);
    let read_wait = agent.fuse_read_seconds().map(|w| w - waited_before);
    agent.ok(&["umount", s(mnt)]);
    Timing {
        fetch,
        start,
        origin,
        requests,
        read_wait,
        peer: pull["peer_bytes"].as_u64(),
        origin_chunks: pull["origin_bytes"].as_u64(),
        ..Timing::default()
    }
}

fn tessera_mount(bed: &Bed, tag: &str, rep: usize) -> Timing {
    let name = format!("agent-{}-{rep}", tag.replace(['/', ':'], "-"));
    let agent = bed.agent(&name);
    let dir = agent.dir.clone();
    let timing = mount_and_start(bed, &agent, tag, &dir.join("mnt"), &dir.join("run"));
    drop(agent);
    bed.discard(&dir);
    timing
}

/// An agent (on a host of its own, alive for the whole run) whose cache holds all of
/// the converted image: the start-up ran through a mount of it, then every file was
/// read (`tar`); all before the link is capped.
fn full_cache_agent(bed: &Bed) -> AgentProcess {
    let agent = AgentProcess::start_in(
        &bed.work.path().join("full-cache"),
        &bed.cache_node,
        &["--config", s(&bed.config)],
    );
    let mnt = agent.dir.join("fill");
    std::fs::create_dir_all(&mnt).unwrap();
    agent.ok(&["mount", &bed.reference(CONVERTED), s(&mnt)]);
    start_up(&mnt, &agent.dir.join("fill-run"));
    tar_trees(&mnt, &["."]);
    agent.ok(&["umount", s(&mnt)]);
    agent
}

/// The start-up on a new mount of the agent whose cache holds the whole image (the
/// page cache was dropped before).
fn tessera_full_cache(bed: &Bed, agent: &AgentProcess, rep: usize) -> Timing {
    let (mnt, work) = (
        agent.dir.join(format!("mnt-{rep}")),
        agent.dir.join(format!("run-{rep}")),
    );
    let timing = mount_and_start(bed, agent, CONVERTED, &mnt, &work);
    bed.discard(&work);
    timing
}

/// `tar -c` of the largest trees twice, through `root`: the page cache as it is (the
/// caller dropped it), then warm.
fn tar_twice(root: &Path) -> (f64, f64, u64) {
    let (cold, bytes) = tar_trees(root, &TAR_TREES);
    let (warm, _) = tar_trees(root, &TAR_TREES);
    (cold, warm, bytes)
}

fn tar_native(tree: &Path) -> Timing {
    drop_caches();
    let (cold, warm, bytes) = tar_twice(tree);
    Timing {
        start: cold,
        again: Some(warm),
        archive: Some(bytes),
        ..Timing::default()
    }
}

/// The tar through a new mount of the agent whose cache holds the whole image.
fn tar_tessera(bed: &Bed, agent: &AgentProcess, rep: usize) -> Timing {
    let mnt = agent.dir.join(format!("tar-{rep}"));
    std::fs::create_dir_all(&mnt).unwrap();
    let mark = bed.mark();
    let t = Instant::now();
    agent.ok(&["mount", &bed.reference(CONVERTED), s(&mnt)]);
    let fetch = t.elapsed().as_secs_f64();
    drop_caches();
    let (cold, warm, bytes) = tar_twice(&mnt);
    let (origin, requests) = bed.since(&mark);
    agent.ok(&["umount", s(&mnt)]);
    Timing {
        fetch,
        start: cold,
        origin,
        requests,
        again: Some(warm),
        archive: Some(bytes),
        ..Timing::default()
    }
}

/// The image's tree as umoci unpacks it: what the Tessera image was converted from,
/// nydus-image's source and the native tar's.
fn unpack_native(layout: &Path, dir: &Path) -> PathBuf {
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(dir));
    dir.join("rootfs")
}

/// nydusd and nydus-image 2.2 (`make nydus-deps`), or `None` with
/// `TESSERA_BENCH_NYDUS=off`; fails naming `make nydus-deps` when they are missing.
fn nydus_bin() -> Option<PathBuf> {
    match std::env::var("TESSERA_BENCH_NYDUS").as_deref() {
        Ok("off") => None,
        Ok("on") | Err(_) => {
            let dir = std::env::var_os("TESSERA_NYDUS_BIN_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join("target/tools/nydus/bin"));
            for tool in ["nydusd", "nydus-image"] {
                assert!(
                    dir.join(tool).is_file(),
                    "missing {} (nydus 2.2.0, the side-by-side rows): run make nydus-deps \
                     (or set TESSERA_NYDUS_BIN_DIR; TESSERA_BENCH_NYDUS=off measures Tessera alone)",
                    dir.join(tool).display()
                );
            }
            Some(dir)
        }
        Ok(other) => panic!("TESSERA_BENCH_NYDUS={other}: on or off"),
    }
}

/// A Nydus image of the native tree: its bootstrap (a local file, as nydusd takes it)
/// and its one blob, pushed to the bench registry.
struct NydusImage {
    bootstrap: PathBuf,
    /// The repository the blob is in (`nydus/…`).
    repo: String,
    blob_bytes: u64,
    /// Built with `--prefetch-policy fs` and the start-up's files (the bootstrap's
    /// prefetch table): nydusd runs it with `fs_prefetch` on.
    prefetch: bool,
}

/// Builds a Nydus image of `tree` (with the prefetch list `list`, read from stdin as
/// nydus-image wants it) and pushes its blob to the registry as repository `nydus/NAME`.
fn nydus_image(bed: &Bed, bin: &Path, tree: &Path, name: &str, list: Option<&Path>) -> NydusImage {
    let dir = bed.work.path().join(format!("nydus-{name}"));
    let blobs = dir.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let (bootstrap, summary) = (dir.join("bootstrap"), dir.join("build.json"));
    let mut cmd = Command::new(bin.join("nydus-image"));
    cmd.arg("create")
        .args(NYDUS_CREATE_OPTIONS)
        .args(["--log-level", "warn"])
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--blob-dir")
        .arg(&blobs)
        .arg("--output-json")
        .arg(&summary);
    match list {
        Some(list) => {
            cmd.args(["--prefetch-policy", "fs"])
                .stdin(std::fs::File::open(list).unwrap());
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    run(cmd.arg(tree));
    // With --blob-dir the blob file is named by its sha256, which the bootstrap records
    // as its blob id and nydusd fetches as /v2/<repo>/blobs/sha256:<blob id>.
    let built: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let ids = built["blobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(ids.len(), 1, "nydus-image made {ids:?}, one blob expected");
    let blob = ids[0].as_str().unwrap().to_string();
    let repo = format!("nydus/{name}");
    let file = blobs.join(&blob);
    let blob_bytes = std::fs::metadata(&file).unwrap().len();
    push_blob(bed, &repo, &file, &blob);
    bed.discard(&blobs);
    NydusImage {
        bootstrap,
        repo,
        blob_bytes,
        prefetch: list.is_some(),
    }
}

/// Pushes `file` as blob `sha256:HEX` of `repo`: the distribution API's monolithic
/// upload (POST opens an upload, PUT `?digest=` sends every byte and closes it; the
/// registry refuses it if the bytes do not match the digest).
fn push_blob(bed: &Bed, repo: &str, file: &Path, hex: &str) {
    let addr = &bed.registry.addr;
    let head = run(Command::new("curl")
        .args(["-sf", "-X", "POST", "-D", "-", "-o", "/dev/null"])
        .arg(format!("http://{addr}/v2/{repo}/blobs/uploads/")));
    let location = head
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            key.eq_ignore_ascii_case("location")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("the registry opened no upload for {repo}: {head}"));
    let mut url = if location.starts_with('/') {
        format!("http://{addr}{location}")
    } else {
        location
    };
    url.push(if url.contains('?') { '&' } else { '?' });
    url.push_str(&format!("digest=sha256:{hex}"));
    run(Command::new("curl")
        .args([
            "-sf",
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/octet-stream",
            "-T",
        ])
        .arg(file)
        .arg(&url));
}

/// The nydusd side: its binaries, both images and a blobcache holding the whole
/// plain one.
struct Nydus {
    bin: PathBuf,
    /// As cargo installed it (the binaries themselves print "unknown").
    version: String,
    plain: NydusImage,
    listed: NydusImage,
    full_cache: PathBuf,
}

impl Nydus {
    /// Builds both images from `tree` and pushes their blobs, then fills a blobcache
    /// with every file of the plain one (read through a first nydusd): before the link
    /// is capped.
    fn new(bed: &Bed, bin: PathBuf, tree: &Path, list: &Path) -> Nydus {
        let plain = nydus_image(bed, &bin, tree, "app", None);
        let listed = nydus_image(bed, &bin, tree, "app-prefetch", Some(list));
        let full_cache = bed.work.path().join("nydus-full-blobcache");
        {
            let daemon = Nydusd::start(
                bed,
                &bin,
                &plain,
                &full_cache,
                &bed.work.path().join("nydusd-fill"),
            );
            tar_trees(&daemon.mnt, &["."]);
        }
        let version = std::fs::read_to_string(bin.join("../.crates.toml"))
            .ok()
            .and_then(|t| {
                let at = t.find("nydus-rs ")? + "nydus-rs ".len();
                t[at..].split_whitespace().next().map(String::from)
            })
            .unwrap_or_else(|| "unknown".into());
        Nydus {
            bin,
            version,
            plain,
            listed,
            full_cache,
        }
    }
}

/// nydusd (FUSE) serving a Nydus image in the node's network namespace, its blobcache
/// in a given directory; unmounted and stopped when dropped, also after a failure.
struct Nydusd {
    child: Child,
    mnt: PathBuf,
    api: PathBuf,
    log: PathBuf,
}

/// nydusd's v1 JSON config: the registry backend on `registry`, a blobcache in
/// `cache`, nydus's defaults otherwise (reads amplified to 128 KiB, chunk digests not
/// validated, 8 prefetch threads merging up to 128 KiB); `fs_prefetch` for an image
/// with a prefetch table, limited to that table (given `fs_prefetch`, nydusd's
/// `prefetch_all` defaults to true: every other chunk after it).
fn nydusd_config(registry: &str, image: &NydusImage, cache: &Path) -> Value {
    json!({
        "device": {
            "backend": {"type": "registry",
                        "config": {"scheme": "http", "host": registry,
                                   "repo": image.repo, "skip_verify": true}},
            "cache": {"type": "blobcache", "config": {"work_dir": cache}}
        },
        "mode": "direct",
        "fs_prefetch": {"enable": image.prefetch, "prefetch_all": false}
    })
}

impl Nydusd {
    /// Starts nydusd on `image` with its blobcache in `cache`, files in `dir`; returns
    /// once the mount is served. `--rlimit-nofile 0` keeps the open-files limit as it
    /// is (nydusd's default raises it to 1,000,000, which fails with EPERM where the
    /// hard limit is lower, as in a container).
    fn start(bed: &Bed, bin: &Path, image: &NydusImage, cache: &Path, dir: &Path) -> Nydusd {
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(cache).unwrap();
        let config = dir.join("nydusd.json");
        std::fs::write(
            &config,
            nydusd_config(&bed.registry.addr, image, cache).to_string(),
        )
        .unwrap();
        let (api, log) = (dir.join("api.sock"), dir.join("nydusd.log"));
        let child = bed
            .node
            .command(bin.join("nydusd"))
            .arg("--config")
            .arg(&config)
            .arg("--bootstrap")
            .arg(&image.bootstrap)
            .arg("--mountpoint")
            .arg(&mnt)
            .arg("--apisock")
            .arg(&api)
            .args(["--log-level", "warn", "--rlimit-nofile", "0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start nydusd");
        let mut daemon = Nydusd {
            child,
            mnt,
            api,
            log,
        };
        daemon.wait_mounted();
        daemon
    }

    /// Polled finely: the wait is part of nydusd's mount time. Its API socket appears
    /// once the mount is served.
    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(is_mounted(&self.mnt) && self.api.exists()) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "nydusd exited ({status}) before mounting:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "nydusd did not mount {} in 30 s:\n{}",
                self.mnt.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What its registry backend has fetched: bytes and requests.
    fn backend(&self) -> (u64, u64) {
        let out = run(Command::new("curl")
            .args(["-sf", "--unix-socket"])
            .arg(&self.api)
            .arg("http://localhost/api/v1/metrics/backend"));
        let m: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("nydusd's backend metrics ({e}): {out}"));
        let n = |key: &str| m[key].as_u64().unwrap_or_else(|| panic!("no {key} in {m}"));
        (n("read_amount_total"), n("read_count"))
    }
}

impl Drop for Nydusd {
    /// Unmounts first (a read in flight then fails rather than hangs), then ends the
    /// daemon: SIGTERM, SIGKILL after 5 s; a mount a dead nydusd left is unmounted lazily.
    fn drop(&mut self) {
        if Command::new("umount")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status()
            .map_or(true, |s| !s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// nydusd started on `image` with its blobcache in `cache` (a fresh one when `None`),
/// then the start-up on its mount.
fn nydusd_start_up(
    bed: &Bed,
    nydus: &Nydus,
    image: &NydusImage,
    cache: Option<&Path>,
    name: &str,
) -> Timing {
    let dir = bed.work.path().join(name);
    let fresh = dir.join("blobcache");
    let mark = bed.mark();
    let t = Instant::now();
    let daemon = Nydusd::start(bed, &nydus.bin, image, cache.unwrap_or(&fresh), &dir);
    let fetch = t.elapsed().as_secs_f64();
    let start = start_up(&daemon.mnt, &dir.join("run")).as_secs_f64();
    let (origin, requests) = bed.since(&mark);
    let backend = daemon.backend();
    drop(daemon);
    bed.discard(&dir);
    Timing {
        fetch,
        start,
        origin,
        requests,
        backend: Some(backend),
        ..Timing::default()
    }
}

/// The tar through a new nydusd over the blobcache that holds the whole image.
fn tar_nydusd(bed: &Bed, nydus: &Nydus, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("nydusd-tar-{rep}"));
    let mark = bed.mark();
    let t = Instant::now();
    let daemon = Nydusd::start(bed, &nydus.bin, &nydus.plain, &nydus.full_cache, &dir);
    let fetch = t.elapsed().as_secs_f64();
    drop_caches();
    let (cold, warm, bytes) = tar_twice(&daemon.mnt);
    let (origin, requests) = bed.since(&mark);
    let backend = daemon.backend();
    drop(daemon);
    bed.discard(&dir);
    Timing {
        fetch,
        start: cold,
        origin,
        requests,
        backend: Some(backend),
        again: Some(warm),
        archive: Some(bytes),
        ..Timing::default()
    }
}

/// The peer row's cluster parts: the scheduler's admin token (the hosts are the bed's).
struct Peers {
    token: PathBuf,
}

impl Peers {
    fn new(bed: &Bed) -> Peers {
        let token = bed.work.path().join("admin.token");
        std::fs::write(&token, "lazy-start-bench-admin-token").unwrap();
        Peers { token }
    }

    /// An agent in the swarm on `host`, as `support::swarm` starts them.
    fn agent(
        bed: &Bed,
        scheduler: &SchedulerProcess,
        host: &NetHost,
        dir: &Path,
        id: &str,
    ) -> AgentProcess {
        let swarm = peer_agent_args(&scheduler.url, host, id);
        let mut args = vec!["--config", s(&bed.config)];
        args.extend(swarm.iter().map(String::as_str));
        AgentProcess::start_in(dir, host, &args)
    }

    /// `tessera-scheduler admin --json ARGS` against `scheduler`.
    fn admin(&self, scheduler: &SchedulerProcess, args: &[&str]) -> Value {
        let out = Command::new(support::scheduler::binary())
            .args(["admin", "--url", &format!("http://{}:7090", scheduler.ip())])
            .arg("--token-file")
            .arg(&self.token)
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        let value = admin_json(&out);
        assert!(
            out.status.success(),
            "admin {args:?}: {value}\n{}",
            scheduler.log_text()
        );
        value
    }

    /// Waits until the scheduler knows a host holding every blob of the image whole.
    fn wait_complete(&self, scheduler: &SchedulerProcess) {
        wait_image_complete(Duration::from_secs(60), || {
            self.admin(scheduler, &["images"])
        });
    }
}

/// Node B's start-up with every chunk on a peer: a fresh scheduler; node A (its cache
/// empty) registers and is preheated with the whole image through the admin API,
/// through the capped link; the page cache is dropped; then node B, its cache empty,
/// mounts and starts.
fn tessera_from_peer(bed: &Bed, peers: &Peers, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("peers-{rep}"));
    let state = dir.join("scheduler-state");
    std::fs::create_dir_all(&state).unwrap();
    let scheduler = SchedulerProcess::start_in(
        &bed.scheduler_host,
        dir.join("scheduler.log"),
        &admin_args(&peers.token, &state),
    );
    let holder = Peers::agent(
        bed,
        &scheduler,
        &bed.holder_host,
        &dir.join("a"),
        &format!("a{rep}"),
    );
    wait_registered(&holder);
    let job = peers.admin(
        &scheduler,
        &[
            "preheat",
            &bed.reference(CONVERTED),
            "--count",
            "1",
            "--timeout-secs",
            "1800",
            "--wait",
        ],
    );
    assert_eq!(job["state"], "succeeded", "preheat: {job}");
    peers.wait_complete(&scheduler);
    // As if node A had fetched the image long ago: its chunks come from its disk.
    drop_caches();
    let node = Peers::agent(
        bed,
        &scheduler,
        &bed.peer_host,
        &dir.join("b"),
        &format!("b{rep}"),
    );
    wait_registered(&node);
    let timing = mount_and_start(bed, &node, CONVERTED, &dir.join("b/mnt"), &dir.join("run"));
    drop(node);
    drop(holder);
    drop(scheduler);
    bed.discard(&dir);
    timing
}

/// The Kubernetes path: the image pulled through containerd's CRI image service (as
/// the kubelet pulls), then the start-up as a container (`ctr run`, runc) from it;
/// with the CRI plugin's default snapshotter (overlayfs: containerd downloads and
/// unpacks every layer) or the Tessera agent's (the converted image is mounted).
fn cri_run(bed: &Bed, tag: &str, tessera_snapshotter: bool, rep: usize) -> Timing {
    let kind = if tessera_snapshotter {
        "tessera"
    } else {
        "overlayfs"
    };
    let name = format!("cri-{kind}-{rep}");
    let dir = bed.work.path().join(&name);
    let hosts = dir.join("certs.d");
    plain_http_hosts(&hosts, &bed.registry.addr);
    let socket = dir.join("agent/snap.sock");
    let agent = tessera_snapshotter.then(|| {
        let agent = AgentProcess::start_in(
            &dir.join("agent"),
            &bed.node,
            &[
                "--config",
                s(&bed.config),
                "--snapshotter-socket",
                s(&socket),
                "--snapshotter-root",
                s(&dir.join("agent/snapshotter")),
            ],
        );
        agent.wait_for_socket(&socket);
        agent
    });
    let snapshotter = if tessera_snapshotter {
        Snapshotter::Tessera
    } else {
        Snapshotter::Overlayfs
    };
    let proxy = socket.clone();
    let containerd = Containerd::start_cri(
        &dir.join("containerd"),
        Some(&bed.node),
        snapshotter,
        &hosts,
        move |config| {
            if tessera_snapshotter {
                run(tessera()
                    .args(["containerd-config", "--snapshotter-socket", s(&proxy)])
                    .args(["--containerd-config", s(config)]));
            }
        },
    );
    let reference = bed.reference(tag);
    let mark = bed.mark();
    let t = Instant::now();
    cri_pull(&containerd, &reference)
        .unwrap_or_else(|e| panic!("CRI pull: {e}\n{}", containerd.log()));
    let fetch = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut args = vec!["run", "--rm", "--snapshotter", snapshotter.name()];
    args.extend(CONTAINER_ENV);
    args.extend([&reference[..], &name[..]]);
    args.extend(START_UP);
    let out = containerd.ctr_k8s(&args);
    let start = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "the start-up in a container failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (origin, requests) = bed.since(&mark);
    let read_wait = agent.as_ref().and_then(AgentProcess::fuse_read_seconds);
    drop(containerd);
    drop(agent);
    bed.discard(&dir);
    Timing {
        fetch,
        start,
        origin,
        requests,
        read_wait,
        ..Timing::default()
    }
}

/// Podman's path (issue 26): `podman pull`, then the start-up as a container (`podman
/// run`, runc), Podman's storage new for the repetition. The plain image through
/// Podman's own pull (every layer downloaded and unpacked into its overlay storage),
/// or the converted image with `storage.conf` naming a fresh agent's additional layer
/// store: Podman takes every layer from the store (the bootstrap layer's `diff` is the
/// agent's lazy mount) and fetches only the manifest and config.
fn podman_run(bed: &Bed, via_store: bool, rep: usize) -> Timing {
    let kind = if via_store { "store" } else { "plain" };
    let dir = bed.work.path().join(format!("podman-{kind}-{rep}"));
    let store = dir.join("store");
    let agent = via_store.then(|| {
        let agent = AgentProcess::start_in(
            &dir.join("agent"),
            &bed.node,
            &["--config", s(&bed.config), "--store-root", s(&store)],
        );
        assert!(
            is_mounted(&store),
            "the agent's layer store is not mounted:\n{}",
            agent.log()
        );
        agent
    });
    // Declared after the agent, so dropped before it, also after a failure: no
    // container or image is left on the store's mounts when the agent stops.
    let podman = Podman::new_in(
        &dir.join("podman"),
        via_store.then_some(store.as_path()),
        &bed.node,
    );
    let reference = bed.reference(if via_store { CONVERTED } else { PLAIN });
    let mark = bed.mark();
    let t = Instant::now();
    podman.ok(&["pull", "--quiet", "--tls-verify=false", &reference]);
    let fetch = t.elapsed().as_secs_f64();
    if via_store {
        // Podman's own blob GETs (its user agent is containers/image's): the config
        // alone, or the layers did not come from the store and the row measures
        // something else.
        let gets = bed.blob_gets_since(&mark, "containers/");
        assert_eq!(
            gets,
            1,
            "podman fetched {gets} blobs, the config alone expected; the agent's log:\n{}",
            agent.as_ref().map(AgentProcess::log).unwrap_or_default()
        );
    }
    let t = Instant::now();
    let mut args = vec!["run", "--rm", "--pull", "never"];
    args.extend(CONTAINER_ENV);
    args.push(&reference);
    args.extend(START_UP);
    let out = podman.run(&args);
    let start = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "the start-up in a Podman container failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (origin, requests) = bed.since(&mark);
    let read_wait = agent.as_ref().and_then(AgentProcess::fuse_read_seconds);
    drop(podman);
    drop(agent);
    bed.discard(&dir);
    Timing {
        fetch,
        start,
        origin,
        requests,
        read_wait,
        ..Timing::default()
    }
}

/// Seconds a link of `cap` (`200mbit`, `1gbit`, `800kbit`) needs for `bytes`: the
/// least time any method can fetch them in.
fn link_seconds(bytes: f64, cap: &str) -> f64 {
    let (number, unit) = cap.split_at(cap.find(|c: char| c.is_alphabetic()).unwrap_or(cap.len()));
    let scale = match unit {
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        other => panic!("TESSERA_BENCH_LAZY_CAP: unit {other:?} (kbit, mbit or gbit)"),
    };
    bytes * 8.0
        / (number
            .parse::<f64>()
            .expect("TESSERA_BENCH_LAZY_CAP: a rate")
            * scale)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What a method measures: a start-up (the main table) or the tar (a table of its own).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    StartUp,
    Tar,
}

struct Method<'a> {
    label: &'static str,
    kind: Kind,
    run: Box<dyn Fn(usize) -> Timing + 'a>,
}

fn method<'a>(label: &'static str, kind: Kind, run: impl Fn(usize) -> Timing + 'a) -> Method<'a> {
    Method {
        label,
        kind,
        run: Box::new(run),
    }
}

/// One method's medians over the repetitions.
struct Row {
    label: &'static str,
    kind: Kind,
    fetch: f64,
    start: f64,
    total: f64,
    origin: f64,
    requests: f64,
    read_wait: Option<f64>,
    peer: Option<f64>,
    origin_chunks: Option<f64>,
    backend: Option<(f64, f64)>,
    again: Option<f64>,
    archive: Option<f64>,
}

impl Row {
    fn new(m: &Method, runs: &[Timing]) -> Row {
        let med = |f: &dyn Fn(&Timing) -> f64| median(runs.iter().map(f).collect());
        let opt = |f: &dyn Fn(&Timing) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median(v))
        };
        Row {
            label: m.label,
            kind: m.kind,
            fetch: med(&|t| t.fetch),
            start: med(&|t| t.start),
            total: med(&Timing::total),
            origin: med(&|t| t.origin as f64),
            requests: med(&|t| t.requests as f64),
            read_wait: opt(&|t| t.read_wait),
            peer: opt(&|t| t.peer.map(|b| b as f64)),
            origin_chunks: opt(&|t| t.origin_chunks.map(|b| b as f64)),
            backend: opt(&|t| t.backend.map(|b| b.0 as f64))
                .zip(opt(&|t| t.backend.map(|b| b.1 as f64))),
            again: opt(&|t| t.again),
            archive: opt(&|t| t.archive.map(|b| b as f64)),
        }
    }
}

/// One of issue 21's targets: `measured` must not exceed `limit`.
struct Target {
    what: String,
    measured: f64,
    limit: f64,
    /// `x` for ratios, `requests` for counts.
    unit: &'static str,
}

impl Target {
    /// A time ratio that must not exceed `limit`.
    fn ratio(what: impl Into<String>, measured: f64, limit: f64) -> Self {
        Target {
            what: what.into(),
            measured,
            limit,
            unit: "x",
        }
    }

    /// A count of origin requests that must not exceed `limit`.
    fn requests(what: impl Into<String>, measured: f64, limit: f64) -> Self {
        Target {
            unit: "requests",
            ..Target::ratio(what, measured, limit)
        }
    }

    /// A percentage that must not exceed `limit`.
    fn percent(what: impl Into<String>, measured: f64, limit: f64) -> Self {
        Target {
            unit: "%",
            ..Target::ratio(what, measured, limit)
        }
    }

    fn met(&self) -> bool {
        self.measured <= self.limit
    }

    fn show(&self, v: f64) -> String {
        match self.unit {
            "x" => format!("{v:.2}x"),
            "%" => format!("{v:.2}%"),
            _ => format!("{v:.0} {}", self.unit),
        }
    }
}

/// The targets whose rows ran.
fn targets(rows: &[Row], cap: &str, indexing: Option<&Indexing>) -> Vec<Target> {
    let row = |label: &str| rows.iter().find(|r| r.label == label);
    let mut out = Vec::new();
    if let (Some(index), Some(converted)) = (row(INDEX_COLD), row(TESSERA_COLD)) {
        let what = format!("{INDEX_COLD}: total ≤ 1.3× {TESSERA_COLD}'s (issue 22)");
        out.push(Target::ratio(what, index.total / converted.total, 1.3));
    }
    if let Some(i) = indexing {
        let what = "the index: ≤ 3% of the image's compressed layers (issue 22)";
        let percent = 100.0 * i.index_bytes as f64 / i.layer_bytes as f64;
        out.push(Target::percent(what, percent, 3.0));
        let what = "tessera index: ≤ 1.25× the time of gzip -dc of the layers, i.e. ≥ 0.8× its speed (issue 22)";
        out.push(Target::ratio(what, i.seconds / i.gunzip_seconds, 1.25));
    }
    if let Some(full) = row(TESSERA_FULL) {
        let what = format!("{TESSERA_FULL}: no blob fetched from the origin");
        out.push(Target::requests(what, full.requests, 0.0));
    }
    if let (Some(peer), Some(full)) = (row(TESSERA_PEER), row(TESSERA_FULL)) {
        let what = format!("{TESSERA_PEER}: total ≤ 1.3× {TESSERA_FULL}'s");
        out.push(Target::ratio(what, peer.total / full.total, 1.3));
    }
    if let (Some(peer), Some(cold)) = (row(TESSERA_PEER), row(TESSERA_COLD)) {
        let what =
            format!("{TESSERA_PEER}: total ≤ 0.35× {TESSERA_COLD}'s (through the capped origin)");
        out.push(Target::ratio(what, peer.total / cold.total, 0.35));
    }
    if let (Some(list), Some(nydus)) = (row(TESSERA_LIST), row(NYDUS_LIST)) {
        let what = format!("{TESSERA_LIST}: origin requests ≤ {NYDUS_LIST}'s");
        out.push(Target::requests(what, list.requests, nydus.requests));
    }
    if let Some(list) = row(TESSERA_LIST) {
        let what = format!("{TESSERA_LIST}: total ≤ 1.1× the link time for the bytes sent");
        let link = link_seconds(list.origin, cap).max(1e-9);
        out.push(Target::ratio(what, list.total / link, 1.1));
    }
    if let (Some(t), Some(n)) = (row(TAR_TESSERA), row(TAR_NYDUS)) {
        let what = |cache| {
            format!("tar through tessera, page cache {cache}: no slower than nydusd (time ratio)")
        };
        out.push(Target::ratio(what("cold"), t.start / n.start, 1.0));
        out.push(Target::ratio(
            what("warm"),
            t.again.unwrap() / n.again.unwrap(),
            1.0,
        ));
    }
    out
}

/// nydusd's time / this row's, for a Tessera row with a nydusd counterpart that ran
/// (above 1: Tessera is faster); for tar rows, cold and warm.
fn vs_nydusd(rows: &[Row], row: &Row) -> Option<(f64, Option<f64>)> {
    let (_, theirs) = NYDUS_PAIRS.iter().find(|(ours, _)| *ours == row.label)?;
    let n = rows.iter().find(|r| r.label == *theirs)?;
    Some(match row.kind {
        Kind::StartUp => (n.total / row.total, None),
        Kind::Tar => (n.start / row.start, Some(n.again? / row.again?)),
    })
}

/// Podman's plain pull's total / its total through the layer store, when both ran
/// (above 1: the store is faster).
fn vs_podman_plain(rows: &[Row]) -> Option<f64> {
    let total = |label| rows.iter().find(|r| r.label == label).map(|r| r.total);
    Some(total(PODMAN_PLAIN)? / total(PODMAN_STORE)?.max(1e-9))
}

fn mib(b: f64) -> f64 {
    b / f64::from(1 << 20)
}

/// Comma-separated parts of `TESSERA_BENCH_LAZY_ONLY`; empty: everything.
fn selection() -> Vec<String> {
    std::env::var("TESSERA_BENCH_LAZY_ONLY")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// What indexing the plain image took (issue 22's targets): `tessera index` (pull,
/// build, push; the registry uncapped) against `gzip -dc` of the same layers.
struct Indexing {
    seconds: f64,
    gunzip_seconds: f64,
    index_bytes: u64,
    layer_bytes: u64,
}

/// Indexes the plain image, and its copy with the start-up's prefetch list; times
/// `gzip -dc` of its layers beside it.
fn index_plain(bed: &Bed, layout: &Path, record: &Path) -> Indexing {
    let (summary, seconds) = bed.index(PLAIN, &[]);
    let (repo, tag) = PLAIN_LISTED.split_once(':').unwrap();
    bed.registry.push_layout(layout, tag, repo);
    bed.index(PLAIN_LISTED, &["--prefetch-list", s(record)]);
    let image = &summary["images"][0];
    Indexing {
        seconds,
        gunzip_seconds: gunzip_seconds(layout),
        index_bytes: image["index_bytes"].as_u64().unwrap(),
        layer_bytes: image["layer_bytes"].as_u64().unwrap(),
    }
}

/// Seconds `gzip -dc` takes over the layers of the layout's image tagged `v1` (the
/// one pushed).
fn gunzip_seconds(layout: &Path) -> f64 {
    let blob = |digest: &str| layout.join("blobs/sha256").join(&digest["sha256:".len()..]);
    let json =
        |path: PathBuf| -> Value { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let index = json(layout.join("index.json"));
    let tagged = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == PLAIN)
        .expect("the layout has an image tagged v1");
    let manifest = json(blob(tagged["digest"].as_str().unwrap()));
    let t = Instant::now();
    for layer in manifest["layers"].as_array().unwrap() {
        let file = std::fs::File::open(blob(layer["digest"].as_str().unwrap())).unwrap();
        let ok = Command::new("gzip")
            .arg("-dc")
            .stdin(file)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "gzip -dc of a layer failed");
    }
    t.elapsed().as_secs_f64()
}

/// The start-up's files, in first-read order, recorded through a lazy mount of the
/// converted image: the file and how many it names.
fn record_start_up(bed: &Bed) -> (PathBuf, usize) {
    let record = bed.work.path().join("startup.txt");
    let agent = bed.agent("record");
    let mnt = bed.work.path().join("record/mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    agent.ok(&[
        "mount",
        &bed.reference(CONVERTED),
        s(&mnt),
        "--record",
        s(&record),
    ]);
    start_up(&mnt, &bed.work.path().join("record/run"));
    agent.ok(&["umount", s(&mnt)]);
    let recorded = std::fs::read_to_string(&record).unwrap().lines().count();
    (record, recorded)
}

fn main() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let cap = env("TESSERA_BENCH_LAZY_CAP", "200mbit");
    let reps: usize = env("TESSERA_BENCH_REPS", "3")
        .parse()
        .expect("TESSERA_BENCH_REPS: a number");
    let only = selection();
    let selected = |label: &str| only.is_empty() || only.iter().any(|o| label.contains(o.as_str()));
    let nydus_rows = [NYDUS_COLD, NYDUS_LIST, NYDUS_FULL, TAR_NYDUS];
    let nydus_off = std::env::var("TESSERA_BENCH_NYDUS").as_deref() == Ok("off");
    let nydus_bin = if nydus_rows.iter().any(|l| selected(l)) {
        nydus_bin()
    } else {
        None
    };
    let nydus_on = nydus_bin.is_some();
    let wanted = |label: &str| selected(label) && (nydus_on || !nydus_rows.contains(&label));
    if wanted(PODMAN_PLAIN) || wanted(PODMAN_STORE) {
        Podman::require();
    }
    let (layout, unpacked, description) = image_layout();

    let bed = Bed::new();
    bed.registry.push_layout(&layout, "v1", "bench/app");
    bed.convert("v1", CONVERTED, &[]);
    let (record, recorded) = record_start_up(&bed);
    bed.convert("v1", WITH_LIST, &["--prefetch-list", s(&record)]);
    let indexing =
        (wanted(INDEX_COLD) || wanted(INDEX_LIST)).then(|| index_plain(&bed, &layout, &record));
    // Set up uncapped, before anything is measured.
    let native = (wanted(TAR_NATIVE) || nydus_on)
        .then(|| unpack_native(&layout, &bed.work.path().join("native")));
    let full_cache = (wanted(TESSERA_FULL) || wanted(TAR_TESSERA)).then(|| full_cache_agent(&bed));
    let nydus = nydus_bin.map(|bin| Nydus::new(&bed, bin, native.as_ref().unwrap(), &record));
    let peers = wanted(TESSERA_PEER).then(|| Peers::new(&bed));
    bed.registry_host.cap_egress(&cap);

    let (bed, full, nydus, native) = (&bed, full_cache.as_ref(), nydus.as_ref(), native.as_ref());
    let up = Kind::StartUp;
    let methods = vec![
        method(BASELINE, up, |rep| skopeo_umoci(bed, rep)),
        method("ctr image pull", up, |rep| ctr_pull(bed, rep)),
        method(TESSERA_COLD, up, |rep| tessera_mount(bed, CONVERTED, rep)),
        method(TESSERA_LIST, up, |rep| tessera_mount(bed, WITH_LIST, rep)),
        method(TESSERA_FULL, up, |rep| {
            tessera_full_cache(bed, full.unwrap(), rep)
        }),
        method(INDEX_COLD, up, |rep| tessera_mount(bed, PLAIN, rep)),
        method(INDEX_LIST, up, |rep| tessera_mount(bed, PLAIN_LISTED, rep)),
        method(TESSERA_PEER, up, |rep| {
            tessera_from_peer(bed, peers.as_ref().unwrap(), rep)
        }),
        method(NYDUS_COLD, up, |rep| {
            let n = nydus.unwrap();
            nydusd_start_up(bed, n, &n.plain, None, &format!("nydusd-cold-{rep}"))
        }),
        method(NYDUS_LIST, up, |rep| {
            let n = nydus.unwrap();
            nydusd_start_up(bed, n, &n.listed, None, &format!("nydusd-list-{rep}"))
        }),
        method(NYDUS_FULL, up, |rep| {
            let n = nydus.unwrap();
            nydusd_start_up(
                bed,
                n,
                &n.plain,
                Some(&n.full_cache),
                &format!("nydusd-full-{rep}"),
            )
        }),
        method(CRI_OVERLAYFS, up, |rep| cri_run(bed, "v1", false, rep)),
        method("tessera snapshotter: CRI pull + container", up, |rep| {
            cri_run(bed, CONVERTED, true, rep)
        }),
        method(
            "tessera snapshotter + prefetch list: CRI pull + container",
            up,
            |rep| cri_run(bed, WITH_LIST, true, rep),
        ),
        method(PODMAN_PLAIN, up, |rep| podman_run(bed, false, rep)),
        method(PODMAN_STORE, up, |rep| podman_run(bed, true, rep)),
        method(TAR_NATIVE, Kind::Tar, |_| tar_native(native.unwrap())),
        method(TAR_TESSERA, Kind::Tar, |rep| {
            tar_tessera(bed, full.unwrap(), rep)
        }),
        method(TAR_NYDUS, Kind::Tar, |rep| {
            tar_nydusd(bed, nydus.unwrap(), rep)
        }),
    ];
    let methods: Vec<_> = methods.into_iter().filter(|m| wanted(m.label)).collect();
    let mut runs: Vec<Vec<Timing>> = vec![Vec::new(); methods.len()];
    // Interleaved, so a machine that slows down slows every method alike.
    for rep in 0..reps {
        for (i, m) in methods.iter().enumerate() {
            drop_caches();
            runs[i].push((m.run)(rep));
        }
    }
    let rows: Vec<Row> = methods
        .iter()
        .zip(&runs)
        .map(|(m, r)| Row::new(m, r))
        .collect();
    let baseline = rows.iter().find(|r| r.label == BASELINE).map(|r| r.total);
    let targets = targets(&rows, &cap, indexing.as_ref());
    let context = Context {
        cap: &cap,
        reps,
        unpacked,
        description: &description,
        recorded,
        baseline,
        nydus,
        nydus_off,
        indexing: indexing.as_ref(),
    };
    print_tables(&context, &rows, &targets);
    if let (Ok(path), Some(_)) = (std::env::var("TESSERA_BENCH_JSON"), baseline) {
        let json = results_json(&context, &rows, &targets);
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
}

/// What the run was, for the tables and the JSON.
struct Context<'a> {
    cap: &'a str,
    reps: usize,
    unpacked: u64,
    description: &'a str,
    recorded: usize,
    /// The baseline's total, when it ran.
    baseline: Option<f64>,
    nydus: Option<&'a Nydus>,
    nydus_off: bool,
    indexing: Option<&'a Indexing>,
}

fn print_tables(c: &Context, rows: &[Row], targets: &[Target]) {
    print_start_up(c, rows);
    print_notes(c, rows);
    print_tar(rows);
    print_targets(targets);
}

fn dash() -> String {
    "–".to_string()
}

fn print_start_up(c: &Context, rows: &[Row]) {
    println!(
        "lazy start: a {:.0} MiB image ({}), registry egress capped at {}, median of {}; the start-up reads {} files",
        mib(c.unpacked as f64),
        c.description,
        c.cap,
        c.reps,
        c.recorded
    );
    match (c.nydus, c.nydus_off) {
        (Some(n), _) => println!(
            "nydusd: nydus-rs {} (nydus-image create {}; blob {:.1} MiB, with the prefetch list {:.1} MiB)",
            n.version,
            NYDUS_CREATE_OPTIONS.join(" "),
            mib(n.plain.blob_bytes as f64),
            mib(n.listed.blob_bytes as f64)
        ),
        (None, true) => println!("nydusd: not run (TESSERA_BENCH_NYDUS=off)"),
        (None, false) => println!("nydusd: not run (no nydusd row selected)"),
    }
    if let Some(i) = c.indexing {
        println!(
            "tessera index: {:.2} s (gzip -dc of the layers: {:.2} s); index {:.2} MiB for {:.1} MiB of layers ({:.2}%)",
            i.seconds,
            i.gunzip_seconds,
            mib(i.index_bytes as f64),
            mib(i.layer_bytes as f64),
            100.0 * i.index_bytes as f64 / i.layer_bytes as f64
        );
    }
    println!();
    println!("| method | fetch / mount s | start-up s | total s | vs skopeo+umoci | registry sent | origin requests | from peers | vs nydusd |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows.iter().filter(|r| r.kind == Kind::StartUp) {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} | {:.1} MiB | {:.0} | {} | {} |",
            r.label,
            r.fetch,
            r.start,
            r.total,
            c.baseline
                .map_or_else(dash, |b| format!("{:.2}x", b / r.total.max(1e-9))),
            mib(r.origin),
            r.requests,
            r.peer.map_or_else(dash, |p| format!("{:.1} MiB", mib(p))),
            vs_nydusd(rows, r).map_or_else(dash, |(v, _)| format!("{v:.2}x")),
        );
    }
    println!("ratios: the other's total / this total (above 1: this row is faster); origin requests: blob GETs in the registry's access log");
}

/// Where each start-up's time and bytes went.
fn print_notes(c: &Context, rows: &[Row]) {
    if let Some(ratio) = vs_podman_plain(rows) {
        let row = |label| rows.iter().find(|r| r.label == label).unwrap();
        println!(
            "podman: through the tessera layer store {:.2} s, its own pull of the plain image {:.2} s: {ratio:.2}x",
            row(PODMAN_STORE).total,
            row(PODMAN_PLAIN).total
        );
    }
    for r in rows.iter().filter(|r| r.kind == Kind::StartUp) {
        if let Some(wait) = r.read_wait {
            println!(
                "{}: the start-up waited {wait:.2} s of its {:.2} s for data; the capped link needs {:.2} s for the {:.1} MiB sent",
                r.label,
                r.start,
                link_seconds(r.origin, c.cap),
                mib(r.origin)
            );
        }
        if let (Some(peer), Some(origin)) = (r.peer, r.origin_chunks) {
            println!(
                "{}: chunks (uncompressed) {:.1} MiB from peers, {:.1} MiB from the origin",
                r.label,
                mib(peer),
                mib(origin)
            );
        }
        if let Some((bytes, requests)) = r.backend {
            println!(
                "{}: nydusd's registry backend fetched {:.1} MiB in {requests:.0} requests",
                r.label,
                mib(bytes)
            );
        }
    }
}

fn print_tar(rows: &[Row]) {
    let tar: Vec<&Row> = rows.iter().filter(|r| r.kind == Kind::Tar).collect();
    if !tar.is_empty() {
        println!();
        println!(
            "| tar -c of /{} through | page cache cold s | page cache warm s | MB/s cold | MB/s warm | vs nydusd cold | vs nydusd warm | registry sent |",
            TAR_TREES.join(", /")
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in tar {
            let (archive, warm) = (r.archive.unwrap_or(0.0), r.again.unwrap_or(f64::NAN));
            let ratio = vs_nydusd(rows, r);
            println!(
                "| {} | {:.2} | {warm:.2} | {:.0} | {:.0} | {} | {} | {:.1} MiB |",
                r.label,
                r.start,
                archive / 1e6 / r.start,
                archive / 1e6 / warm,
                ratio.map_or_else(dash, |(v, _)| format!("{v:.2}x")),
                ratio
                    .and_then(|(_, w)| w)
                    .map_or_else(dash, |w| format!("{w:.2}x")),
                mib(r.origin)
            );
        }
    }
}

fn print_targets(targets: &[Target]) {
    if !targets.is_empty() {
        println!();
        println!("| target | measured | limit | verdict |");
        println!("|---|---:|---:|---|");
        for t in targets {
            println!(
                "| {} | {} | {} | {} |",
                t.what,
                t.show(t.measured),
                t.show(t.limit),
                if t.met() { "met" } else { "**missed**" }
            );
        }
    }
}

fn results_json(c: &Context, rows: &[Row], targets: &[Target]) -> Value {
    let baseline = c.baseline.unwrap_or(f64::NAN);
    let start_rows: Vec<Value> = rows
        .iter()
        .filter(|r| r.kind == Kind::StartUp)
        .map(|r| {
            let mut row = json!({
                "method": r.label,
                "fetch_seconds": r.fetch,
                "start_seconds": r.start,
                "total_seconds": r.total,
                "vs_baseline": baseline / r.total.max(1e-9),
                "registry_bytes": r.origin,
                "origin_requests": r.requests,
                "link_seconds": link_seconds(r.origin, c.cap),
            });
            if let Some(wait) = r.read_wait {
                row["read_wait_seconds"] = json!(wait);
            }
            if let (Some(peer), Some(origin)) = (r.peer, r.origin_chunks) {
                row["peer_bytes"] = json!(peer);
                row["origin_chunk_bytes"] = json!(origin);
            }
            if let Some((bytes, requests)) = r.backend {
                row["nydusd_backend"] = json!({"bytes": bytes, "requests": requests});
            }
            if let Some((v, _)) = vs_nydusd(rows, r) {
                row["vs_nydusd"] = json!(v);
            }
            if let Some(v) = vs_podman_plain(rows).filter(|_| r.label == PODMAN_STORE) {
                row["vs_podman_plain"] = json!(v);
            }
            row
        })
        .collect();
    let tar_rows: Vec<Value> = rows
        .iter()
        .filter(|r| r.kind == Kind::Tar)
        .map(|r| {
            let mut row = json!({
                "method": r.label,
                "mount_seconds": r.fetch,
                "cold_seconds": r.start,
                "warm_seconds": r.again,
                "archive_bytes": r.archive,
                "registry_bytes": r.origin,
                "origin_requests": r.requests,
            });
            if let Some((cold, Some(warm))) = vs_nydusd(rows, r) {
                row["vs_nydusd_cold"] = json!(cold);
                row["vs_nydusd_warm"] = json!(warm);
            }
            row
        })
        .collect();
    let nydusd = match (c.nydus, c.nydus_off) {
        (Some(n), _) => json!({
            "version": n.version,
            "image": format!("nydus-image create {}", NYDUS_CREATE_OPTIONS.join(" ")),
            "blob_bytes": n.plain.blob_bytes,
            "prefetch_blob_bytes": n.listed.blob_bytes,
            // As the prefetch-list rows ran it, the run's address and paths left out.
            "config": nydusd_config("<registry>", &n.listed, Path::new("<blobcache dir>")),
        }),
        (None, true) => json!({"skipped": "TESSERA_BENCH_NYDUS=off"}),
        (None, false) => json!({"skipped": "no nydusd row selected"}),
    };
    json!({
        "scenario": "lazy_start",
        "image": c.description,
        "image_unpacked_bytes": c.unpacked,
        "registry_cap": c.cap,
        "repetitions": c.reps,
        "startup_files": c.recorded,
        "rows": start_rows,
        "tar_trees": TAR_TREES.map(|t| format!("/{t}")),
        "tar_rows": tar_rows,
        "nydusd": nydusd,
        "index": c.indexing.map(|i| json!({
            "seconds": i.seconds,
            "gunzip_seconds": i.gunzip_seconds,
            "index_bytes": i.index_bytes,
            "layer_bytes": i.layer_bytes,
        })),
        "targets": targets.iter().map(|t| json!({
            "target": t.what,
            "measured": t.measured,
            "limit": t.limit,
            "unit": t.unit,
            "met": t.met(),
        })).collect::<Vec<_>>(),
    })
}
