//! The restore benchmark (issue 29): how long until a slow-booting service answers its
//! first request on a node, booted or restored from a checkpoint, side by side in one
//! run, the registry's egress capped (200 Mbit/s by default). The app is
//! `benches/app_image.sh`'s: the suite's image (Debian + a Python data stack) with
//! `/app/serve.py`, which imports the stack, builds an in-memory index of tens of MB and
//! answers `GET /doc/KEY` with one document's row of it and `GET /` with a checksum of
//! all of it. Every row's time runs from its first command to the first *correct*
//! answer (what the setup boot answered; any other answer fails the run):
//!
//! 1. boot with a full pull: `ctr image pull` of the plain image, then `ctr run` (runc,
//!    overlayfs), on a cold node (the baseline every ratio is against);
//! 2. boot with a lazy mount: the converted image pulled through containerd's CRI image
//!    service with the Tessera agent as its snapshotter, then `ctr run`;
//! 3. containerd's own restore: a container booted once (set-up, untimed) was
//!    checkpointed with `ctr containers checkpoint --task --rw` and pushed with
//!    `ctr images push`; on a cold node `ctr content fetch` of the checkpoint (`ctr
//!    image pull` fetches it too, then fails to unpack a checkpoint index in
//!    containerd 1.6), `ctr image pull` of the app image it names (a restore needs its
//!    rootfs), then `ctr containers restore --rw --live`;
//! 4. Tessera restore on a cold node: a new agent (its cache empty) serving containerd's
//!    snapshotter; `tessera run` restores the app image's newest checkpoint (made on
//!    node A by `tessera checkpoint --container`, a referrer of the app image) into a new
//!    container: runc's CRIU reads the checkpoint from the agent's lazy mount, the rootfs
//!    is the image's lazy mount through the Tessera snapshotter;
//! 5. the same with `tessera run --lazy-pages` (CRIU's lazy pages: the app runs before
//!    its memory has arrived; the answer is awaited while `tessera run` sends pages);
//! 6. the same as 5 with the checkpoint's working set fetched first (recorded in set-up
//!    on node A: `tessera run --lazy-pages --record-working-set`); rows 4, 5 and 7 run
//!    with `--no-working-set`;
//! 7. the same as 4 with a peer (node A, through the scheduler) holding the checkpoint
//!    and the app image's start-up chunks.
//!
//! Every row's first answer is to `GET /doc/doc-0012345` (one document of the index: a
//! few pages of the heap); `GET /` (the whole index's checksum) is asked right after,
//! and the time to it reported as the whole state's.
//!
//! Also reported: the checkpoints' sizes (CRIU's files, what the registry stores), the
//! bytes each row had the registry send (its interface's counter), and the dedup
//! between the checkpoints of v1 and v2 of the app (v2 differs in pandas): v2's
//! checkpoint built against v1's as its chunk dictionary (`--chunk-dict`), bytes
//! uploaded against bytes reused.
//!
//! Knobs: `TESSERA_BENCH_RESTORE_CAP` (default `200mbit`), `TESSERA_BENCH_REPS`
//! (default 3), `TESSERA_BENCH_IMAGE_SMALL=1` (the smoke image and a small index),
//! `TESSERA_BENCH_IMAGE_DIR` (another build of benches/image.sh), `TESSERA_BENCH_JSON`.
//! Needs root, containerd + ctr, runc, CRIU 4.2.1 (`make criu-deps`), umoci, skopeo,
//! docker-registry, iproute2, util-linux; fails naming what is missing.
//! `make bench-restore`.

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::containerd::{Containerd, NAMESPACE};
use support::cri::cri_pull;
use support::netns::{Cluster, NetHost};
use support::oci::run_output as run;
use support::registry::Registry;
use support::scheduler::SchedulerProcess;
use support::swarm::{
    admin_args, admin_json, peer_agent_args, wait_image_complete, wait_registered,
};
use support::tessera_node::{containerd_in, TesseraNode};
use support::{criu, repo_root, s};

/// The port `/app/serve.py` listens on (the image's command says so too).
const PORT: u16 = 8080;
/// The plain app image and its second version, and both converted.
const PLAIN: &str = "v1";
const PLAIN_V2: &str = "v2";
const CONVERTED: &str = "v1-tessera";
const CONVERTED_V2: &str = "v2-tessera";
/// Where `ctr containers checkpoint` + `ctr images push` put containerd's checkpoint.
const CTR_CHECKPOINT: &str = "v1-ctr-checkpoint";

// The rows, by the names report.py and check_results.py know.
const COLD_BOOT: &str = "boot: ctr pull + ctr run (cold node)";
const LAZY_BOOT: &str = "boot: tessera snapshotter, lazy (cold node)";
const CTR_RESTORE: &str = "ctr containers restore (checkpoint + image pulled)";
const TESSERA_COLD: &str = "tessera restore (cold node)";
const TESSERA_PEER: &str = "tessera restore, checkpoint on a peer";
const TESSERA_LAZY: &str = "tessera restore, lazy pages (cold node)";
const TESSERA_WORKING_SET: &str = "tessera restore, lazy pages + working set (cold node)";

/// The request every row's first answer is to: one document of the index (a few pages
/// of the app's heap), as a search service's requests are. `GET /` (a checksum of the
/// whole index, all of its memory) is asked right after, for the whole state.
const REQUEST: &str = "/doc/doc-0012345";

/// How long any app may take to answer after its row's start.
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// The app image's OCI layout (tags v1, v2), its description and unpacked size.
fn app_layout() -> (PathBuf, String, u64) {
    let out = run(Command::new("bash").arg(repo_root().join("benches/app_image.sh")));
    let dir = PathBuf::from(out.trim().lines().last().unwrap());
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    (
        dir.join("layout"),
        read("description"),
        read("unpacked-bytes").parse().unwrap(),
    )
}

/// `serve.py`'s mode: the full stack, or the smoke image's stdlib variant.
fn app_mode() -> &'static str {
    match std::env::var("TESSERA_BENCH_IMAGE_SMALL").as_deref() {
        Ok("1") => "small",
        _ => "full",
    }
}

/// Fails, naming the Debian package, when a tool the rows need is missing.
fn require_tools() {
    assert!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")),
        "the restore benchmark needs root (network namespaces, mounts, CRIU)"
    );
    for (tool, package) in [
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("umoci", "umoci"),
        ("skopeo", "skopeo"),
        ("docker-registry", "docker-registry"),
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("nsenter", "util-linux"),
        ("setsid", "util-linux"),
        ("fusermount3", "fuse3"),
        ("tar", "tar"),
    ] {
        assert!(
            support::oci::tool_available(tool),
            "`{tool}` not found: apt-get install {package} (or `make test-deps`)"
        );
    }
}

/// Empties the page cache, so a repetition reads from disk as a cold node would.
fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// `GET path` on `addr`: the body of a 200 answer.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: app\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    if !head.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!("answered {head:?}")));
    }
    Ok(body.to_string())
}

/// Polls the app on `ip` until it answers [`REQUEST`]; the answer (panics after
/// `ANSWER_WITHIN`).
fn wait_answer(ip: Ipv4Addr, what: &str) -> String {
    let addr = SocketAddr::from((ip, PORT));
    let deadline = Instant::now() + ANSWER_WITHIN;
    loop {
        if let Ok(body) = get(addr, REQUEST) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no answer on {addr} within {ANSWER_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The app's answers as its boot gave them: to [`REQUEST`] and to `GET /`.
#[derive(Debug, Clone)]
struct Expected {
    request: String,
    whole: String,
}

/// Waits for the app's first answer to [`REQUEST`] and checks it is the boot's.
fn wait_correct(ip: Ipv4Addr, expected: &Expected, what: &str) {
    let body = wait_answer(ip, what);
    assert_eq!(
        body.trim(),
        expected.request.trim(),
        "{what}: the first answer is not the document's row"
    );
}

/// Asks the app on `ip` for the whole index's checksum and checks it is the boot's:
/// every byte of its state is there.
fn check_whole(ip: Ipv4Addr, expected: &Expected, what: &str) {
    let body = get(SocketAddr::from((ip, PORT)), "/")
        .unwrap_or_else(|e| panic!("{what}: GET / after the first answer: {e}"));
    assert_eq!(
        body.trim(),
        expected.whole.trim(),
        "{what}: the answer to GET / is not the index's checksum"
    );
}

/// The cluster: the registry (its egress capped once set up), the cold node the rows
/// run on, a host for containerd's checkpoint set-up, and the scheduler and node A of
/// the peer row; node A also boots and checkpoints the app for rows 4 and 5.
struct Bed {
    registry_host: NetHost,
    node: NetHost,
    setup_host: NetHost,
    scheduler_host: NetHost,
    holder_host: NetHost,
    registry: Registry,
    /// `[registry] insecure` for the agents and the tessera commands.
    config: PathBuf,
    criu: PathBuf,
    mode: &'static str,
    work: tempfile::TempDir,
    /// Last: fields drop in order, the processes above before their namespaces.
    _cluster: Cluster,
}

impl Bed {
    fn new() -> Bed {
        let mut cluster = Cluster::new();
        let registry_host = cluster.add_host("registry");
        let node = cluster.add_host("node");
        let setup_host = cluster.add_host("setup");
        let scheduler_host = cluster.add_host("scheduler");
        let holder_host = cluster.add_host("node-a");
        let registry = Registry::start_in(&registry_host);
        let work = tempfile::tempdir().unwrap();
        let config = work.path().join("tessera.toml");
        // No eviction for a full disk (a machine shared with builds): node A must keep
        // what it holds for the peer row.
        std::fs::write(
            &config,
            format!(
                "cache_disk_high_percent = 100\n[registry]\ninsecure = [\"{}\"]\n",
                registry.addr
            ),
        )
        .unwrap();
        Bed {
            registry_host,
            node,
            setup_host,
            scheduler_host,
            holder_host,
            registry,
            config,
            criu: criu(),
            mode: app_mode(),
            work,
            _cluster: cluster,
        }
    }

    fn reference(&self, tag: &str) -> String {
        format!("{}/bench/app:{tag}", self.registry.addr)
    }

    fn convert(&self, src: &str, dst: &str) {
        run(support::tessera()
            .args(["convert", "--config", s(&self.config)])
            .args([&self.reference(src), &self.reference(dst)])
            .env("DOCKER_CONFIG", self.work.path()));
    }

    /// Bytes the registry's interface has sent.
    fn sent(&self) -> u64 {
        self.registry_host.tx_bytes()
    }

    /// Blob GETs in the registry's access log so far.
    fn blob_gets(&self) -> usize {
        let log = std::fs::read(&self.registry.log).unwrap_or_default();
        String::from_utf8_lossy(&log)
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/"))
            .count()
    }

    /// `tessera ARGS` in `host`'s network namespace, with the bench's config; its
    /// stdout as JSON (panics with its output on failure).
    fn tessera_json(&self, host: &NetHost, args: &[&str]) -> Value {
        let out = run(host
            .command(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .args(["--json", "--config", s(&self.config)])
            .env("DOCKER_CONFIG", self.work.path())
            .env("TESSERA_LOG", "warn"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("tessera {args:?}: {e}: {out}"))
    }

    /// A fresh directory of the work dir for `name`.
    fn dir(&self, name: &str) -> PathBuf {
        let dir = self.work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

/// What a row measured in one repetition.
#[derive(Default, Clone)]
struct Timing {
    /// Pull / mount: what comes before the app's process starts or is restored.
    fetch: f64,
    /// From then to the first correct answer.
    start: f64,
    /// Bytes the registry sent, and the blob GETs it answered.
    origin: u64,
    requests: u64,
    /// Tessera rows: chunk bytes (uncompressed) from peers (checkpoint and rootfs).
    peer: Option<u64>,
    /// Lazy pages: from the restore's start until the last page had arrived.
    pages: Option<f64>,
    /// From the row's start to the answer to `GET /` (the whole index), asked right
    /// after the first answer.
    whole: f64,
}

/// The registry's counters at a row's start.
struct Mark {
    sent: u64,
    gets: usize,
}

impl Mark {
    fn new(bed: &Bed) -> Mark {
        Mark {
            sent: bed.sent(),
            gets: bed.blob_gets(),
        }
    }

    fn timing(&self, bed: &Bed, fetch: f64, start: f64) -> Timing {
        Timing {
            fetch,
            start,
            origin: bed.sent() - self.sent,
            requests: (bed.blob_gets() - self.gets) as u64,
            peer: None,
            pages: None,
            whole: 0.0,
        }
    }
}

fn ctr_k8s_ok(containerd: &Containerd, args: &[&str]) -> String {
    let out = containerd.ctr_k8s(args);
    assert!(
        out.status.success(),
        "ctr {args:?} failed:\n{}\n{}\n--- containerd log ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        containerd.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ctr run -d --net-host` of the image's own command: the app in the node's network
/// namespace.
fn ctr_run(containerd: &Containerd, snapshotter: &str, reference: &str, id: &str) {
    ctr_k8s_ok(
        containerd,
        &[
            "run",
            "-d",
            "--net-host",
            "--snapshotter",
            snapshotter,
            reference,
            id,
        ],
    );
}

/// Row 1: `ctr image pull` of the plain image, `ctr run`, first answer.
fn cold_boot(bed: &Bed, expected: &Expected, rep: usize) -> Timing {
    let dir = bed.dir(&format!("cold-boot-{rep}"));
    let containerd = containerd_in(&dir, &bed.node, &bed.registry.addr, None);
    let reference = bed.reference(PLAIN);
    let mark = Mark::new(bed);
    let t = Instant::now();
    ctr_k8s_ok(&containerd, &["image", "pull", "--plain-http", &reference]);
    let fetch = t.elapsed().as_secs_f64();
    ctr_run(&containerd, "overlayfs", &reference, "app");
    wait_correct(bed.node.ip, expected, COLD_BOOT);
    let total = t.elapsed().as_secs_f64();
    check_whole(bed.node.ip, expected, COLD_BOOT);
    let mut timing = mark.timing(bed, fetch, total - fetch);
    timing.whole = t.elapsed().as_secs_f64();
    drop(containerd);
    discard(&dir);
    timing
}

/// Row 2: the converted image pulled through the CRI image service with the agent as
/// the snapshotter (nothing is downloaded at pull), `ctr run`, first answer.
fn lazy_boot(bed: &Bed, expected: &Expected, rep: usize) -> Timing {
    let dir = bed.dir(&format!("lazy-boot-{rep}"));
    let node = tessera_node(bed, &bed.node, &dir, &[]);
    let reference = bed.reference(CONVERTED);
    let mark = Mark::new(bed);
    let t = Instant::now();
    cri_pull(&node.containerd, &reference).unwrap_or_else(|e| panic!("CRI pull: {e}"));
    let fetch = t.elapsed().as_secs_f64();
    ctr_run(&node.containerd, "tessera", &reference, "app");
    wait_correct(bed.node.ip, expected, LAZY_BOOT);
    let total = t.elapsed().as_secs_f64();
    check_whole(bed.node.ip, expected, LAZY_BOOT);
    let mut timing = mark.timing(bed, fetch, total - fetch);
    timing.whole = t.elapsed().as_secs_f64();
    drop(node);
    discard(&dir);
    timing
}

/// containerd's checkpoint of the booted app (set-up of row 3): the sizes of what it
/// pushed.
struct CtrCheckpoint {
    /// CRIU's files (the checkpoint's `criu.checkpoint` tar) and every blob of the
    /// checkpoint but the app image's (CRIU's files, the rw layer, spec, options).
    criu_bytes: u64,
    registry_bytes: u64,
    /// Seconds `ctr containers checkpoint` took, and its push.
    seconds: f64,
    push_seconds: f64,
}

/// Boots the plain image on the set-up host, checkpoints it with `ctr containers
/// checkpoint --task --rw` (it goes on running) and pushes the checkpoint.
fn ctr_checkpoint(bed: &Bed, expected: &Expected) -> CtrCheckpoint {
    let dir = bed.dir("ctr-checkpoint");
    let containerd = containerd_in(&dir, &bed.setup_host, &bed.registry.addr, None);
    let reference = bed.reference(PLAIN);
    ctr_k8s_ok(&containerd, &["image", "pull", "--plain-http", &reference]);
    ctr_run(&containerd, "overlayfs", &reference, "app");
    wait_correct(bed.setup_host.ip, expected, "ctr checkpoint set-up");
    let checkpoint = bed.reference(CTR_CHECKPOINT);
    let t = Instant::now();
    ctr_k8s_ok(
        &containerd,
        &[
            "containers",
            "checkpoint",
            "--task",
            "--rw",
            "app",
            &checkpoint,
        ],
    );
    let seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    ctr_k8s_ok(
        &containerd,
        &["images", "push", "--plain-http", &checkpoint],
    );
    let push_seconds = t.elapsed().as_secs_f64();
    // The checkpoint is an index: CRIU's tar, the rw layer, the spec, the runtime
    // options, and the app image's manifest (already in the registry).
    let index: Value = serde_json::from_str(&run(Command::new("curl").args([
        "-sf",
        "-H",
        "Accept: application/vnd.oci.image.index.v1+json",
        &format!(
            "http://{}/v2/bench/app/manifests/{CTR_CHECKPOINT}",
            bed.registry.addr
        ),
    ])))
    .unwrap();
    let mut criu_bytes = 0;
    let mut registry_bytes = 0;
    for m in index["manifests"].as_array().unwrap() {
        let media = m["mediaType"].as_str().unwrap_or_default();
        let size = m["size"].as_u64().unwrap();
        if media.contains("checkpoint") {
            registry_bytes += size;
        }
        if media.contains("criu") {
            criu_bytes += size;
        }
    }
    assert!(criu_bytes > 0, "no CRIU blob in the checkpoint: {index}");
    CtrCheckpoint {
        criu_bytes,
        registry_bytes,
        seconds,
        push_seconds,
    }
}

/// Row 3: on a cold node, the checkpoint fetched, the app image pulled (its rootfs),
/// `ctr containers restore --rw --live`, first answer.
fn ctr_restore(bed: &Bed, expected: &Expected, rep: usize) -> Timing {
    let dir = bed.dir(&format!("ctr-restore-{rep}"));
    let containerd = containerd_in(&dir, &bed.node, &bed.registry.addr, None);
    let checkpoint = bed.reference(CTR_CHECKPOINT);
    let mark = Mark::new(bed);
    let t = Instant::now();
    ctr_k8s_ok(
        &containerd,
        &["content", "fetch", "--plain-http", &checkpoint],
    );
    ctr_k8s_ok(
        &containerd,
        &["image", "pull", "--plain-http", &bed.reference(PLAIN)],
    );
    let fetch = t.elapsed().as_secs_f64();
    ctr_k8s_ok(
        &containerd,
        &[
            "containers",
            "restore",
            "--rw",
            "--live",
            "app",
            &checkpoint,
        ],
    );
    wait_correct(bed.node.ip, expected, CTR_RESTORE);
    let total = t.elapsed().as_secs_f64();
    check_whole(bed.node.ip, expected, CTR_RESTORE);
    let mut timing = mark.timing(bed, fetch, total - fetch);
    timing.whole = t.elapsed().as_secs_f64();
    drop(containerd);
    discard(&dir);
    timing
}

/// A node that runs containers from lazy mounts ([`TesseraNode`]) with the bench's
/// config, `agent_args` added (the swarm's, for the peer rows).
fn tessera_node(bed: &Bed, host: &NetHost, dir: &Path, agent_args: &[&str]) -> TesseraNode {
    let config = ["--config", s(&bed.config)];
    TesseraNode::start(
        dir,
        host,
        &bed.registry.addr,
        &[&config[..], agent_args].concat(),
    )
}

/// `tessera run --json` of app image `tag` as container `id` on `node` (in its network
/// namespace), `extra` flags added: it restores the image's newest checkpoint, or boots.
fn run_command(bed: &Bed, node: &TesseraNode, tag: &str, id: &str, extra: &[&str]) -> Command {
    let image = bed.reference(tag);
    let mut cmd = node.run_command(&bed.config, &bed.criu, &[extra, &[&image, id]].concat());
    cmd.env("DOCKER_CONFIG", bed.work.path())
        .env("TESSERA_LOG", "warn");
    cmd
}

/// [`run_command`] without extra flags, run to its end: its summary.
fn run_json(bed: &Bed, node: &TesseraNode, tag: &str, id: &str) -> Value {
    let out = run(&mut run_command(bed, node, tag, id, &[]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("tessera run: {e}: {out}"))
}

/// Chunk bytes `node`'s agent got from peers for the mounts it still has.
fn peer_bytes(node: &TesseraNode) -> u64 {
    node.agent.status()["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["pull"]["peer_bytes"].as_u64())
        .sum()
}

/// A checkpoint `tessera checkpoint` made: its summary.
struct TesseraCheckpoint {
    summary: Value,
}

impl TesseraCheckpoint {
    fn reference(&self) -> &str {
        self.summary["reference"].as_str().unwrap()
    }

    fn bytes(&self, key: &str) -> u64 {
        self.summary[key].as_u64().unwrap_or(0)
    }
}

/// Boots app image `tag` on node A with `tessera run` (it has no checkpoint yet),
/// waits for its answer, and checkpoints the container with `tessera checkpoint
/// --container` (containerd's task API; runc drives CRIU) for the image, `extra` flags
/// added (`--chunk-dict`); the container stops once dumped and is removed. Returns the
/// checkpoint, the answers, and the boot's seconds (node A, registry uncapped).
fn boot_and_checkpoint(
    bed: &Bed,
    peers: &Peers,
    tag: &str,
    extra: &[&str],
) -> (TesseraCheckpoint, Expected, f64) {
    let node = &peers.node_a;
    let id = format!("app-{tag}");
    let t = Instant::now();
    let booted = run_json(bed, node, tag, &id);
    assert_eq!(booted["outcome"]["how"], "booted", "{booted}");
    let request = wait_answer(bed.holder_host.ip, &format!("boot of {tag} on node A"));
    let boot_seconds = t.elapsed().as_secs_f64();
    let addr = SocketAddr::from((bed.holder_host.ip, PORT));
    assert_eq!(get(addr, REQUEST).unwrap(), request);
    let answer = Expected {
        request,
        whole: get(addr, "/").unwrap(),
    };
    assert_eq!(get(addr, "/").unwrap(), answer.whole);
    let scratch = bed.dir(&format!("checkpoint-{tag}"));
    let args = [
        "checkpoint",
        "--criu",
        s(&bed.criu),
        "--container",
        &id,
        "--address",
        s(&node.containerd.socket),
        "--namespace",
        NAMESPACE,
        "--for",
        &bed.reference(tag),
        "--work-dir",
        s(&scratch),
    ];
    let summary = bed.tessera_json(&bed.holder_host, &[&args[..], extra].concat());
    node.remove(&id);
    (TesseraCheckpoint { summary }, answer, boot_seconds)
}

/// Node A restores app image `tag`'s newest checkpoint with lazy pages and records its
/// working set: the checkpoint's chunks read until the app answered [`REQUEST`]
/// (`tessera run --record-working-set`), pushed beside the checkpoint. Returns the
/// run's `working_set` summary.
fn record_working_set(bed: &Bed, peers: &Peers, tag: &str, expected: &Expected) -> Value {
    let node = &peers.node_a;
    let probe = format!("http://{}:{PORT}{REQUEST}", bed.holder_host.ip);
    let out = run(&mut run_command(
        bed,
        node,
        tag,
        "app-recording",
        &["--lazy-pages", "--record-working-set", &probe],
    ));
    let summary: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("tessera run: {e}: {out}"));
    assert_eq!(
        summary["working_set"]["how"], "recorded",
        "the working set: {summary}"
    );
    wait_correct(bed.holder_host.ip, expected, "the recording restore");
    check_whole(bed.holder_host.ip, expected, "the recording restore");
    node.remove("app-recording");
    summary["working_set"].clone()
}

/// The peer row's scheduler and node A. Node A boots the app from its lazy mount and
/// checkpoints it (so its cache holds the app image's start-up chunks), then reads the
/// whole checkpoint through a mount of it (so it holds all of the checkpoint).
struct Peers {
    token: PathBuf,
    node_a: TesseraNode,
    scheduler: SchedulerProcess,
}

impl Peers {
    fn start(bed: &Bed) -> Peers {
        let token = bed.work.path().join("admin.token");
        std::fs::write(&token, "restore-bench-admin-token").unwrap();
        let state = bed.dir("scheduler-state");
        let scheduler = SchedulerProcess::start_in(
            &bed.scheduler_host,
            bed.work.path().join("scheduler.log"),
            &admin_args(&token, &state),
        );
        let args = peer_agent_args(&scheduler.url, &bed.holder_host, "a");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let node_a = tessera_node(bed, &bed.holder_host, &bed.dir("node-a"), &args);
        wait_registered(&node_a.agent);
        Peers {
            token,
            node_a,
            scheduler,
        }
    }

    /// Node A reads all of the checkpoint through a mount of it, then waits until the
    /// scheduler knows a host holding it whole.
    fn hold(&self, bed: &Bed, checkpoint: &str) {
        let mnt = bed.dir("node-a-checkpoint");
        let agent = &self.node_a.agent;
        agent.ok(&["mount", checkpoint, s(&mnt)]);
        read_tree(&mnt);
        agent.ok(&["umount", s(&mnt)]);
        wait_image_complete(Duration::from_secs(60), || self.admin(&["images"]));
    }

    fn admin(&self, args: &[&str]) -> Value {
        let out = Command::new(support::scheduler::binary())
            .args([
                "admin",
                "--url",
                &format!("http://{}:7090", self.scheduler.ip()),
            ])
            .arg("--token-file")
            .arg(&self.token)
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        let value = admin_json(&out);
        assert!(out.status.success(), "admin {args:?}: {value}");
        value
    }
}

/// Reads every file under `dir` (`tar`, piped here: GNU tar reads no file data when its
/// archive is /dev/null).
fn read_tree(dir: &Path) {
    let mut child = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run tar");
    std::io::copy(&mut child.stdout.take().unwrap(), &mut std::io::sink()).unwrap();
    assert!(child.wait().unwrap().success(), "tar of {}", dir.display());
}

/// How a Tessera row restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restore {
    /// The whole checkpoint fetched ahead of CRIU, from the registry.
    Cold,
    /// CRIU's lazy pages, from the registry.
    Lazy,
    /// CRIU's lazy pages, the checkpoint's recorded working set fetched first.
    WorkingSet,
    /// The whole checkpoint ahead of CRIU, from node A.
    Peer,
}

/// Rows 4 to 7: on the cold node, a new agent (in the swarm with node A for the peer
/// row) and containerd on its snapshotter; `tessera run` (with `--lazy-pages` for the
/// lazy rows; without the checkpoint's working set but in its row) restores the app
/// image's newest checkpoint into a new container; first answer. The answer is awaited
/// while `tessera run` runs: with lazy pages it returns only once every page has
/// arrived, and the app answers before that.
fn tessera_restore(
    bed: &Bed,
    peers: Option<&Peers>,
    how: Restore,
    expected: &Expected,
    rep: usize,
) -> Timing {
    let (label, name, extra): (_, _, &[&str]) = match how {
        Restore::Peer => (TESSERA_PEER, "peer", &["--no-working-set"]),
        Restore::Lazy => (TESSERA_LAZY, "lazy", &["--lazy-pages", "--no-working-set"]),
        Restore::WorkingSet => (TESSERA_WORKING_SET, "working-set", &["--lazy-pages"]),
        Restore::Cold => (TESSERA_COLD, "cold", &["--no-working-set"]),
    };
    let peers = peers.filter(|_| how == Restore::Peer);
    let dir = bed.dir(&format!("tessera-{name}-{rep}"));
    let swarm = peers.map(|p| peer_agent_args(&p.scheduler.url, &bed.node, &format!("b{rep}")));
    let args: Vec<&str> = swarm.iter().flatten().map(String::as_str).collect();
    let node = tessera_node(bed, &bed.node, &dir, &args);
    if peers.is_some() {
        wait_registered(&node.agent);
    }
    let mut cmd = run_command(bed, &node, CONVERTED, "app", extra);
    let mark = Mark::new(bed);
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera run");
    let addr = SocketAddr::from((bed.node.ip, PORT));
    let body = loop {
        if let Ok(body) = get(addr, REQUEST) {
            break body;
        }
        if matches!(child.try_wait(), Ok(Some(status)) if !status.success()) {
            let out = child.wait_with_output().unwrap();
            panic!(
                "{label}: tessera run failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            t.elapsed() < ANSWER_WITHIN,
            "{label}: no answer on {addr} within {ANSWER_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let total = t.elapsed().as_secs_f64();
    assert_eq!(
        body.trim(),
        expected.request.trim(),
        "{label}: the first answer is not the document's row"
    );
    check_whole(bed.node.ip, expected, label);
    let whole = t.elapsed().as_secs_f64();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{label}: tessera run: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        run["outcome"]["how"], "restored",
        "{label}: tessera run did not restore: {run}"
    );
    let fetched_first = run["working_set"]["how"] == "fetched";
    assert_eq!(
        fetched_first,
        how == Restore::WorkingSet,
        "{label}: the working set: {run}"
    );
    // Its own figures: the checkpoint's mount and runc's restore (the task created and
    // started), before which the app cannot answer.
    let seconds = |key: &str| run[key].as_f64().unwrap_or(0.0);
    let fetch = (seconds("mount_seconds") + seconds("restore_seconds")).min(total);
    let mut timing = mark.timing(bed, fetch, total - fetch);
    timing.peer = Some(run["peer_bytes"].as_u64().unwrap_or(0) + peer_bytes(&node));
    timing.pages = run["pages_seconds"].as_f64();
    timing.whole = whole;
    drop(node);
    discard(&dir);
    timing
}

/// Removes a repetition's directory once its daemons are gone: unpacked images and
/// caches of every row would otherwise fill the disk before the run ends (and an agent
/// on a disk above its high watermark evicts what it holds).
fn discard(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("restore bench: could not remove {}: {e}", dir.display());
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A row's medians over the repetitions.
struct Row {
    label: &'static str,
    fetch: f64,
    start: f64,
    total: f64,
    origin: f64,
    requests: f64,
    peer: Option<f64>,
    pages: Option<f64>,
    whole: f64,
}

impl Row {
    fn new(label: &'static str, runs: &[Timing]) -> Row {
        let med = |f: &dyn Fn(&Timing) -> f64| median(runs.iter().map(f).collect());
        let peers: Vec<f64> = runs
            .iter()
            .filter_map(|t| t.peer.map(|p| p as f64))
            .collect();
        Row {
            label,
            fetch: med(&|t| t.fetch),
            start: med(&|t| t.start),
            total: med(&|t| t.fetch + t.start),
            origin: med(&|t| t.origin as f64),
            requests: med(&|t| t.requests as f64),
            peer: (!peers.is_empty()).then(|| median(peers)),
            pages: {
                let pages: Vec<f64> = runs.iter().filter_map(|t| t.pages).collect();
                (!pages.is_empty()).then(|| median(pages))
            },
            whole: med(&|t| t.whole),
        }
    }
}

fn mib(b: f64) -> f64 {
    b / f64::from(1 << 20)
}

/// Every log under the work dir that says a daemon panicked (the agents', the
/// scheduler's, containerd's): the run fails on any. Logs sit near the top of their
/// daemon's directory; image trees, caches and mounts are not walked.
fn panicked_logs(dir: &Path) -> Vec<PathBuf> {
    const SKIP: [&str; 9] = [
        "root",
        "state",
        "snapshots",
        "snapshotter",
        "cache",
        "upper",
        "work",
        "approot",
        "mnt",
    ];
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < 4 && !SKIP.contains(&name.as_str()) {
                stack.push((path, depth + 1));
            } else if kind.is_file()
                && name.ends_with(".log")
                && String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default())
                    .contains("panicked at")
            {
                found.push(path);
            }
        }
    }
    found
}

fn main() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let cap = env("TESSERA_BENCH_RESTORE_CAP", "200mbit");
    let reps: usize = env("TESSERA_BENCH_REPS", "3")
        .parse()
        .expect("TESSERA_BENCH_REPS: a number");
    require_tools();
    let criu_dir = criu().parent().unwrap().to_path_buf();
    // runc (started by containerd's shim) finds CRIU on PATH.
    let path = format!("{}:{}", criu_dir.display(), env("PATH", "/usr/bin:/bin"));
    std::env::set_var("PATH", path);
    let (layout, description, unpacked) = app_layout();

    let bed = Bed::new();
    for tag in [PLAIN, PLAIN_V2] {
        bed.registry.push_layout(&layout, tag, "bench/app");
    }
    bed.convert(PLAIN, CONVERTED);
    bed.convert(PLAIN_V2, CONVERTED_V2);
    // Set-up, the link uncapped: node A boots v1 and checkpoints it, then v2 against
    // v1's checkpoint; containerd checkpoints its own container.
    let peers = Peers::start(&bed);
    let (v1, expected, setup_boot) = boot_and_checkpoint(&bed, &peers, CONVERTED, &[]);
    let (v2, _, _) = boot_and_checkpoint(
        &bed,
        &peers,
        CONVERTED_V2,
        &["--chunk-dict", v1.reference()],
    );
    peers.hold(&bed, v1.reference());
    let working_set = record_working_set(&bed, &peers, CONVERTED, &expected);
    let ctr = ctr_checkpoint(&bed, &expected);
    bed.registry_host.cap_egress(&cap);

    let bed = &bed;
    let expected = &expected;
    type Method<'a> = (&'static str, Box<dyn Fn(usize) -> Timing + 'a>);
    let methods: Vec<Method> = vec![
        (COLD_BOOT, Box::new(|rep| cold_boot(bed, expected, rep))),
        (LAZY_BOOT, Box::new(|rep| lazy_boot(bed, expected, rep))),
        (CTR_RESTORE, Box::new(|rep| ctr_restore(bed, expected, rep))),
        (
            TESSERA_COLD,
            Box::new(|rep| tessera_restore(bed, None, Restore::Cold, expected, rep)),
        ),
        (
            TESSERA_LAZY,
            Box::new(|rep| tessera_restore(bed, None, Restore::Lazy, expected, rep)),
        ),
        (
            TESSERA_WORKING_SET,
            Box::new(|rep| tessera_restore(bed, None, Restore::WorkingSet, expected, rep)),
        ),
        (
            TESSERA_PEER,
            Box::new(|rep| tessera_restore(bed, Some(&peers), Restore::Peer, expected, rep)),
        ),
    ];
    let mut runs: Vec<Vec<Timing>> = vec![Vec::new(); methods.len()];
    // Interleaved, so a machine that slows down slows every row alike.
    for rep in 0..reps {
        for (i, (label, method)) in methods.iter().enumerate() {
            drop_caches();
            let timing = method(rep);
            eprintln!(
                "restore bench: rep {rep} {label}: {:.2} s ({:.1} MiB from the registry)",
                timing.fetch + timing.start,
                mib(timing.origin as f64)
            );
            runs[i].push(timing);
        }
    }
    let rows: Vec<Row> = methods
        .iter()
        .zip(&runs)
        .map(|((label, _), r)| Row::new(label, r))
        .collect();
    let panicked = panicked_logs(bed.work.path());
    assert!(panicked.is_empty(), "a daemon panicked: see {panicked:?}");

    let result = Results {
        cap: &cap,
        reps,
        description: &description,
        unpacked,
        mode: bed.mode,
        answer: expected,
        working_set: &working_set,
        setup_boot,
        rows: &rows,
        v1: &v1,
        v2: &v2,
        ctr: &ctr,
    };
    result.print();
    if let Ok(path) = std::env::var("TESSERA_BENCH_JSON") {
        std::fs::write(&path, serde_json::to_vec_pretty(&result.json()).unwrap()).unwrap();
    }
}

/// Everything the run measured, for the tables and the JSON.
struct Results<'a> {
    cap: &'a str,
    reps: usize,
    description: &'a str,
    unpacked: u64,
    mode: &'a str,
    answer: &'a Expected,
    /// The working set node A recorded (`tessera run`'s `working_set`).
    working_set: &'a Value,
    setup_boot: f64,
    rows: &'a [Row],
    v1: &'a TesseraCheckpoint,
    v2: &'a TesseraCheckpoint,
    ctr: &'a CtrCheckpoint,
}

/// The Tessera rows on a cold node (the checkpoint from the registry only).
const COLD_ROWS: [&str; 3] = [TESSERA_COLD, TESSERA_LAZY, TESSERA_WORKING_SET];

/// How the Tessera rows restore, in words for the report.
const TESSERA_PATH: &str =
    "containerd: `tessera checkpoint --container` on node A (containerd's task \
     API, runc drives CRIU), `tessera run` on the restoring node (the image's newest checkpoint \
     restored by runc from the agent's lazy mount into a new container whose rootfs is the \
     image's lazy mount through the Tessera snapshotter)";

impl Results<'_> {
    fn row(&self, label: &str) -> &Row {
        self.rows.iter().find(|r| r.label == label).unwrap()
    }

    /// The cold boot's total / `label`'s: how many times sooner it answers.
    fn sooner(&self, label: &str) -> f64 {
        self.row(COLD_BOOT).total / self.row(label).total.max(1e-9)
    }

    /// The cold-node Tessera row that answered first.
    fn best_cold(&self) -> &'static str {
        COLD_ROWS
            .into_iter()
            .min_by(|a, b| self.row(a).total.total_cmp(&self.row(b).total))
            .unwrap()
    }

    /// Issue 29's targets: (what, measured, limit), met when measured ≥ limit.
    fn targets(&self) -> Vec<(String, f64, f64)> {
        COLD_ROWS
            .into_iter()
            .flat_map(|row| {
                [
                    (
                        format!("{row}: ≥ 10× sooner than a cold boot ({COLD_BOOT})"),
                        self.sooner(row),
                        10.0,
                    ),
                    (
                        format!("{row}: ≥ 2× sooner than containerd's own restore ({CTR_RESTORE})"),
                        self.row(CTR_RESTORE).total / self.row(row).total.max(1e-9),
                        2.0,
                    ),
                ]
            })
            .collect()
    }

    fn headline(&self) -> String {
        format!(
            "restore on a cold node: {:.1}× sooner than a cold boot",
            self.sooner(self.best_cold())
        )
    }

    /// The recorded working set's stored bytes.
    fn working_set_bytes(&self) -> u64 {
        self.working_set["compressed_bytes"].as_u64().unwrap_or(0)
    }

    fn print(&self) {
        println!(
            "restore: {} ({:.0} MiB unpacked), registry egress capped at {}, median of {}",
            self.description,
            mib(self.unpacked as f64),
            self.cap,
            self.reps
        );
        println!("{} (the row: {})", self.headline(), self.best_cold());
        println!();
        println!("| method | fetch s | start s | first answer s | vs cold boot | whole state s | registry sent | origin requests | from peers |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in self.rows {
            println!(
                "| {} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.1} MiB | {:.0} | {} |",
                r.label,
                r.fetch,
                r.start,
                r.total,
                self.sooner(r.label),
                r.whole,
                mib(r.origin),
                r.requests,
                r.peer
                    .map_or_else(|| "–".into(), |p| format!("{:.1} MiB", mib(p)))
            );
        }
        println!(
            "first answer: GET {REQUEST}; whole state: GET / (the whole index's checksum), asked right after"
        );
        println!(
            "working set (recorded on node A until the first answer): {} chunks, {:.1} MiB stored",
            self.working_set["chunks"],
            mib(self.working_set_bytes() as f64)
        );
        println!("tessera rows: {TESSERA_PATH}");
        println!(
            "checkpoints: tessera {:.1} MiB of CRIU files, {:.1} MiB stored in the registry; \
             containerd {:.1} MiB of CRIU files, {:.1} MiB in the registry",
            mib(self.v1.bytes("dumped_bytes") as f64),
            mib(self.v1.bytes("stored_bytes") as f64),
            mib(self.ctr.criu_bytes as f64),
            mib(self.ctr.registry_bytes as f64)
        );
        println!(
            "dedup: v2's checkpoint against v1's: {:.1} MiB uploaded, {:.1} MiB reused",
            mib(self.v2.bytes("pushed_bytes") as f64),
            mib(self.v2.bytes("reused_bytes") as f64)
        );
        for (what, measured, limit) in self.targets() {
            let verdict = if measured >= limit { "met" } else { "missed" };
            println!("{what}: {measured:.2}x (target {limit:.0}x): {verdict}");
        }
    }

    fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut row = json!({
                    "method": r.label,
                    "fetch_seconds": r.fetch,
                    "start_seconds": r.start,
                    "total_seconds": r.total,
                    "vs_cold_boot": self.sooner(r.label),
                    "registry_bytes": r.origin,
                    "origin_requests": r.requests,
                    "whole_seconds": r.whole,
                });
                if let Some(p) = r.peer {
                    row["peer_bytes"] = json!(p);
                }
                if let Some(p) = r.pages {
                    row["pages_seconds"] = json!(p);
                }
                row
            })
            .collect();
        let checkpoint = |c: &TesseraCheckpoint| {
            json!({
                "criu_bytes": c.bytes("dumped_bytes"),
                "stored_bytes": c.bytes("stored_bytes"),
                "pushed_bytes": c.bytes("pushed_bytes"),
                "reused_bytes": c.bytes("reused_bytes"),
                "dict_chunks": c.summary["build"]["dict_chunks"],
                "unique_chunks": c.summary["build"]["unique_chunks"],
                "dump_seconds": c.summary["dump_seconds"],
                "build_seconds": c.summary["build_seconds"],
                "push_seconds": c.summary["push_seconds"],
            })
        };
        json!({
            "scenario": "restore",
            "image": self.description,
            "image_unpacked_bytes": self.unpacked,
            "app_mode": self.mode,
            "app_request": REQUEST,
            "app_answer": self.answer.request.trim(),
            "app_whole_answer": self.answer.whole.trim(),
            "setup_boot_seconds": self.setup_boot,
            "registry_cap": self.cap,
            "repetitions": self.reps,
            "rows": rows,
            "baseline": COLD_BOOT,
            "headline": self.headline(),
            "headline_row": self.best_cold(),
            "tessera_path": "containerd",
            "tessera_path_note": TESSERA_PATH,
            "working_set": {
                "chunks": self.working_set["chunks"],
                "stored_bytes": self.working_set_bytes(),
                "ready_seconds": self.working_set["ready_seconds"],
            },
            "checkpoint": {
                "tessera": checkpoint(self.v1),
                "containerd": {
                    "criu_bytes": self.ctr.criu_bytes,
                    "registry_bytes": self.ctr.registry_bytes,
                    "checkpoint_seconds": self.ctr.seconds,
                    "push_seconds": self.ctr.push_seconds,
                },
            },
            "dedup": {
                "v1": checkpoint(self.v1),
                "v2": checkpoint(self.v2),
                "v2_chunk_dict": self.v2.summary["chunk_dict"],
            },
            "targets": self.targets().iter().map(|(what, measured, limit)| json!({
                "target": what,
                "measured": measured,
                "limit": limit,
                "unit": "x",
                "met": measured >= limit,
            })).collect::<Vec<_>>(),
        })
    }
}
