//! Checkpoints end to end (issue 29, first step): a Python HTTP server holding 20 MB of
//! state is dumped by CRIU 4.2.1 through `tessera checkpoint`, pushed to a real
//! registry, and brought back by `tessera restore` from a real agent's lazy FUSE
//! mount; the restored server answers with the same state and its counter continues.
//! A checkpoint whose manifest records another CRIU version is refused before anything
//! is mounted.
//!
//! Checkpoints of an app image (issue 29, second step): `checkpoint --for APP` pushes
//! them as OCI referrers of the app image, `restore --for APP` restores the newest one
//! this node can restore (or exits 3, "no usable checkpoint: boot the image"), and a
//! second checkpoint uploads only what changed since the first (what the registry
//! stored is counted in its storage directory).
//!
//! Needs CRIU 4.2.1 at target/tools/criu/criu (`make criu-deps`), python3, setsid
//! (util-linux), fuse3 and docker-registry (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};

use support::agent::{free_port, AgentProcess};
use support::oci::{self, build_files_image};
use support::registry::{block_on, client, Registry};
use support::{criu, s, tessera};
use tessera_agent::registry::reference::Reference;
use tessera_agent::registry::referrers::{self, Artifact, Descriptor};

/// A server whose state is worth restoring: 20 MB of random bytes made at start (their
/// sha256 recomputed on every request, so an answer proves the memory came back) and
/// a request counter.
const SERVER: &str = r#"
import hashlib, http.server, os, sys
state = bytearray(os.urandom(20 << 20))
count = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"{count} {hashlib.sha256(state).hexdigest()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"#;

/// Kills a process (SIGKILL) when dropped, even after a failed assertion: the server
/// the test started, or the tree CRIU restored.
struct Killer {
    pid: u32,
    /// The server as started, to reap; a restored tree is not our child.
    child: Option<Child>,
}

impl Killer {
    fn kill(&mut self) {
        // A child already reaped (CRIU killed it) is not signalled: its pid may be a
        // restored tree's by now, which its own guard ends.
        if let Some(child) = &mut self.child {
            if matches!(child.try_wait(), Ok(Some(_))) {
                self.child = None;
                return;
            }
        }
        let _ = Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the server in a session of its own (`setsid` execs in place, so the child is
/// python itself) and waits for its first answer.
fn start_server(port: u16) -> (Killer, String) {
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap();
    let child = Command::new("setsid")
        .args([python, "-c", SERVER, &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the python server");
    let server = Killer {
        pid: child.id(),
        child: Some(child),
    };
    let first = wait_for_answer(port, Duration::from_secs(30)).expect("the server answers");
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", server.pid)).unwrap();
    assert!(comm.starts_with("python"), "pid {} is {comm:?}", server.pid);
    (server, first)
}

/// `GET /` on 127.0.0.1:`port`: the body.
fn get(port: u16) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
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

fn wait_for_answer(port: u16, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(body) = get(port) {
            return Some(body);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The counter and the state's digest of an answer.
fn parse_answer(body: &str) -> (u64, String) {
    let (count, digest) = body.split_once(' ').expect("COUNT SHA256");
    (count.parse().expect("a counter"), digest.to_string())
}

/// `tessera ARGS` without this machine's credentials or config.
fn run(home: &Path, args: &[&str]) -> Output {
    tessera()
        .args(args)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .env("TESSERA_LOG", "info")
        .output()
        .expect("run tessera")
}

fn json_of(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON summary")
}

/// Pushes `reference`'s manifest again as `tag` with its CRIU version annotation set to
/// `version`, as a checkpoint made by another CRIU would carry it.
fn retag_with_criu_version(reference: &str, tag: &str, version: &str) -> String {
    let r = Reference::parse(reference).unwrap();
    let client = client();
    let manifest = block_on(client.manifest(&r)).unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    assert_eq!(
        value["annotations"]["io.tessera.checkpoint.criu-version"], "4.2.1",
        "the checkpoint records the CRIU that made it"
    );
    value["annotations"]["io.tessera.checkpoint.criu-version"] = version.into();
    let target = Reference {
        tag: Some(tag.to_string()),
        digest: None,
        ..r.clone()
    };
    block_on(client.push_manifest(
        &target,
        &manifest.media_type,
        serde_json::to_vec(&value).unwrap(),
    ))
    .unwrap();
    target.to_string()
}

#[test]
fn a_checkpointed_server_restores_from_a_lazy_mount_with_its_state() {
    let criu = criu();
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let registry = Registry::start();
    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let port = free_port();
    let (mut server, first) = start_server(port);
    let (count, state) = parse_answer(&first);
    assert_eq!(count, 1, "{first}");
    let second = get(port).unwrap();
    assert_eq!(parse_answer(&second), (2, state.clone()));

    // No such process: a clear error, nothing pushed.
    let none = format!("{}/checkpoints/none:v1", registry.addr);
    let out = run(
        home,
        &["checkpoint", "--pid", "4194305", "--criu", s(&criu), &none],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no process 4194305"),
        "{stderr}"
    );

    // --leave-running: dumped and pushed, and the server goes on serving.
    let pid = server.pid.to_string();
    let v0 = format!("{}/checkpoints/server:v0", registry.addr);
    let args = ["checkpoint", "--json", "--leave-running", "--pid", &pid];
    let out = run(home, &[&args[..], &["--criu", s(&criu), &v0]].concat());
    let kept = json_of(&out, "tessera checkpoint --leave-running");
    assert_eq!(kept["left_running"], true);
    assert_eq!(parse_answer(&get(port).unwrap()), (3, state.clone()));

    // Checkpoint: CRIU dumps the server and stops it; the dump is pushed.
    let reference = format!("{}/checkpoints/server:v1", registry.addr);
    let started = Instant::now();
    let out = run(
        home,
        &[
            "checkpoint",
            "--json",
            "--pid",
            &pid,
            "--criu",
            s(&criu),
            &reference,
        ],
    );
    let checkpoint_wall = started.elapsed();
    let summary = json_of(&out, "tessera checkpoint");
    let dumped = summary["dumped_bytes"].as_u64().unwrap();
    let stored = summary["stored_bytes"].as_u64().unwrap();
    assert!(
        dumped > 20 << 20,
        "the 20 MB of state are dumped: {summary}"
    );
    assert!(stored > 0 && summary["pushed_bytes"].as_u64().unwrap() > 0);
    assert_eq!(summary["left_running"], false);
    assert_eq!(summary["criu_version"], "4.2.1");
    assert_eq!(summary["process"], "python3");
    // CRIU killed it: reap it, so its pid is free for the restore.
    let deadline = Instant::now() + Duration::from_secs(10);
    let child = server.child.as_mut().unwrap();
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the server still runs after the dump"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(get(port).is_err(), "the port is closed after the dump");

    // A checkpoint that records another CRIU is refused before anything is mounted.
    let old = retag_with_criu_version(&reference, "v1-criu-3.17", "3.17.1");
    let out = tessera()
        .args(["restore", "--criu", s(&criu), &old, "--socket"])
        .arg(&agent.socket)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an incompatible checkpoint restored");
    assert!(
        stderr.contains("cannot be restored here")
            && stderr.contains("CRIU 3.17.1")
            && stderr.contains("this node's CRIU is 4.2.1")
            && stderr.contains("--criu PATH"),
        "{stderr}"
    );
    assert!(get(port).is_err(), "nothing was restored");
    assert_eq!(agent.status()["mounts"].as_array().unwrap().len(), 0);

    // Restore from the lazy mount: the same state, the counter continues.
    let started = Instant::now();
    let out = tessera()
        .args([
            "restore",
            "--json",
            "--criu",
            s(&criu),
            &reference,
            "--socket",
        ])
        .arg(&agent.socket)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .env("TESSERA_LOG", "info")
        .output()
        .unwrap();
    let restore_wall = started.elapsed();
    let restored = json_of(&out, "tessera restore");
    let restored_pid = u32::try_from(restored["pid"].as_u64().unwrap()).unwrap();
    let _restored_guard = Killer {
        pid: restored_pid,
        child: None,
    };
    let answer =
        wait_for_answer(port, Duration::from_secs(10)).expect("the restored server answers");
    let first_answer = started.elapsed();
    assert_eq!(
        parse_answer(&answer),
        (4, state.clone()),
        "the restored server has the dumped state and counter"
    );
    assert_eq!(parse_answer(&get(port).unwrap()), (5, state));
    assert_eq!(restored_pid, server.pid, "CRIU restores the tree's own pid");
    let read = restored["bytes_read"].as_u64().unwrap();
    assert!(
        read > 20 << 20,
        "CRIU read the pages through the mount: {restored}"
    );
    assert!(
        restored["origin_wire_bytes"].as_u64().unwrap() > 0,
        "the chunks came from the registry: {restored}"
    );
    // The mount is gone once CRIU is done with it.
    assert_eq!(agent.status()["mounts"].as_array().unwrap().len(), 0);

    eprintln!(
        "checkpoint: {:.1} MiB dumped, {:.1} MiB stored; dump {:.2} s, build {:.2} s, push {:.2} s ({:.2} s wall)\n\
         restore: {:.2} s wall (mount {:.2} s, criu restore {:.2} s), {:.1} MiB read through the mount, \
         {:.1} MiB from the origin on the wire; first answer {:.2} s after the restore began",
        dumped as f64 / 1048576.0,
        stored as f64 / 1048576.0,
        summary["dump_seconds"].as_f64().unwrap(),
        summary["build_seconds"].as_f64().unwrap(),
        summary["push_seconds"].as_f64().unwrap(),
        checkpoint_wall.as_secs_f64(),
        restore_wall.as_secs_f64(),
        restored["mount_seconds"].as_f64().unwrap(),
        restored["restore_seconds"].as_f64().unwrap(),
        read as f64 / 1048576.0,
        restored["origin_wire_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        first_answer.as_secs_f64()
    );
}

/// A tree CRIU restored: killed and reaped when dropped. The test process makes itself
/// the child subreaper ([`become_subreaper`]), so the tree, orphaned when `criu`
/// exits, is its child: reaped, its pid is free for the next restore (this machine's
/// init does not reap orphans).
struct Restored {
    pid: u32,
}

impl Restored {
    fn kill(&self) {
        let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) else {
            return;
        };
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

impl Drop for Restored {
    fn drop(&mut self) {
        self.kill();
    }
}

fn become_subreaper() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .expect("become the child subreaper");
}

/// Every blob file in the registry's storage and its size: what it has received.
fn stored_blobs(registry: &Registry) -> BTreeMap<String, u64> {
    let root = registry
        .storage_dir()
        .join("docker/registry/v2/blobs/sha256");
    let mut blobs = BTreeMap::new();
    for prefix in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for blob in std::fs::read_dir(prefix.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(meta) = std::fs::metadata(blob.path().join("data")) {
                let hex = blob.file_name().to_string_lossy().into_owned();
                blobs.insert(hex, meta.len());
            }
        }
    }
    blobs
}

/// Bytes of the blobs in `after` that were not in `before`.
fn new_bytes(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(hex, _)| !before.contains_key(*hex))
        .map(|(_, size)| size)
        .sum()
}

/// `tessera restore ARGS --socket SOCKET`.
fn restore(home: &Path, socket: &Path, args: &[&str]) -> Output {
    tessera()
        .arg("restore")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .env("TESSERA_LOG", "info")
        .output()
        .unwrap()
}

/// Pushes a checkpoint-typed referrer of `app` (no layers) that records CRIU
/// `criu_version` and was made at `created`: what a checkpoint made elsewhere looks
/// like to `restore --for`.
fn push_foreign_checkpoint(app: &str, criu_version: &str, created: &str) -> String {
    let r = Reference::parse(app).unwrap();
    let client = client();
    let manifest = block_on(client.manifest(&r)).unwrap();
    let subject = Descriptor {
        media_type: manifest.media_type.clone(),
        digest: manifest.digest.clone(),
        size: manifest.bytes.len() as u64,
        artifact_type: None,
        annotations: BTreeMap::new(),
    };
    let artifact = Artifact {
        subject: &subject,
        artifact_type: "application/vnd.tessera.checkpoint.v1",
        layers: &[],
        annotations: BTreeMap::from([
            (
                "io.tessera.checkpoint.criu-version".to_string(),
                criu_version.to_string(),
            ),
            (
                "org.opencontainers.image.created".to_string(),
                created.to_string(),
            ),
        ]),
    };
    block_on(referrers::push(&client, &r, &artifact))
        .unwrap()
        .digest
}

fn assert_no_usable_checkpoint(out: &Output, why: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "no usable checkpoint exits 3: {stderr}"
    );
    assert!(
        stderr.contains("no usable checkpoint: boot the image"),
        "{stderr}"
    );
    for w in why {
        assert!(stderr.contains(w), "{w:?} not in {stderr}");
    }
}

#[test]
fn checkpoints_of_an_app_image_are_its_referrers_and_share_chunks() {
    let criu = criu();
    become_subreaper();
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let registry = Registry::start();
    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let socket = agent.socket.clone();

    // The "app images": the server's source in a small image, and another one that
    // will never be checkpointed here.
    let layout = t.path().join("app");
    build_files_image(
        &layout,
        "amd64",
        &[vec![("app/server.py", SERVER.as_bytes().to_vec())]],
    );
    registry.push_layout(&layout, oci::TAG, "apps/server");
    let app = format!("{}/apps/server:{}", registry.addr, oci::TAG);
    let other_layout = t.path().join("other");
    build_files_image(
        &other_layout,
        "amd64",
        &[vec![("app/other", b"x".to_vec())]],
    );
    registry.push_layout(&other_layout, oci::TAG, "apps/other");
    let other = format!("{}/apps/other:{}", registry.addr, oci::TAG);
    let app_digest = block_on(client().manifest(&Reference::parse(&app).unwrap()))
        .unwrap()
        .digest;

    // No checkpoint yet: the typed answer, exit code 3, "boot the image".
    let out = restore(home, &socket, &["--criu", s(&criu), "--for", &app]);
    assert_no_usable_checkpoint(&out, &["has no checkpoint"]);

    let port = free_port();
    let (mut server, first) = start_server(port);
    let (_, state) = parse_answer(&first);
    assert_eq!(parse_answer(&get(port).unwrap()), (2, state.clone()));
    let pid = server.pid.to_string();

    // First checkpoint, for the app image: it stops the server.
    let before = stored_blobs(&registry);
    let args = ["checkpoint", "--json", "--pid", &pid, "--criu", s(&criu)];
    let out = run(home, &[&args[..], &["--for", &app]].concat());
    let first_cp = json_of(&out, "tessera checkpoint --for");
    let after_first = stored_blobs(&registry);
    let first_uploaded = new_bytes(&before, &after_first);
    let first_ref = first_cp["reference"].as_str().unwrap().to_string();
    assert!(
        first_cp["subject"].as_str().unwrap().ends_with(&app_digest),
        "the checkpoint is about the app image's manifest: {first_cp}"
    );
    assert!(first_ref.contains("/apps/server@sha256:"), "{first_ref}");
    assert!(
        first_cp["chunk_dict"].is_null(),
        "nothing to dedup against yet"
    );
    let child = server.child.as_mut().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server runs after the dump");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The checkpoint manifest carries the subject and artifactType.
    let first_manifest: serde_json::Value = serde_json::from_slice(
        &block_on(client().manifest(&Reference::parse(&first_ref).unwrap()))
            .unwrap()
            .bytes,
    )
    .unwrap();
    assert_eq!(first_manifest["subject"]["digest"], app_digest.as_str());
    assert_eq!(
        first_manifest["artifactType"],
        "application/vnd.tessera.checkpoint.v1"
    );

    // restore --for: the one checkpoint, from the lazy mount, with its state.
    let out = restore(
        home,
        &socket,
        &["--json", "--criu", s(&criu), "--for", &app],
    );
    let restored = json_of(&out, "tessera restore --for");
    let restored_tree = Restored {
        pid: u32::try_from(restored["pid"].as_u64().unwrap()).unwrap(),
    };
    assert_eq!(restored["image"], first_ref.as_str(), "{restored}");
    assert!(restored["for_image"]
        .as_str()
        .unwrap()
        .ends_with(&app_digest));
    let answer =
        wait_for_answer(port, Duration::from_secs(10)).expect("the restored server answers");
    assert_eq!(parse_answer(&answer), (3, state.clone()));
    // A request changes a little state (the counter) before the second checkpoint.
    assert_eq!(parse_answer(&get(port).unwrap()), (4, state.clone()));

    // Second checkpoint, left running: built against the first, it uploads little.
    let pid = restored_tree.pid.to_string();
    let args = ["checkpoint", "--json", "--leave-running", "--pid", &pid];
    let out = run(
        home,
        &[&args[..], &["--criu", s(&criu), "--for", &app]].concat(),
    );
    let second_cp = json_of(&out, "second tessera checkpoint --for");
    let after_second = stored_blobs(&registry);
    let second_uploaded = new_bytes(&after_first, &after_second);
    let second_ref = second_cp["reference"].as_str().unwrap().to_string();
    assert_eq!(
        second_cp["chunk_dict"],
        first_ref.as_str(),
        "the app image's newest checkpoint is the chunk dictionary: {second_cp}"
    );
    assert!(second_cp["build"]["dict_chunks"].as_u64().unwrap() > 0);
    assert!(
        second_uploaded * 3 < first_uploaded,
        "the second checkpoint stored {second_uploaded} new bytes, the first {first_uploaded}"
    );
    // The summary's uploaded bytes are what the registry received, but for the
    // referrers tag's index (distribution 2.8 has no referrers API), a few hundred bytes.
    let pushed = second_cp["pushed_bytes"].as_u64().unwrap();
    assert!(
        pushed <= second_uploaded && second_uploaded - pushed < 64 << 10,
        "summary {pushed} bytes uploaded, registry {second_uploaded} new bytes"
    );
    // The second image references the first one's blob: one layer more.
    let second_manifest: serde_json::Value = serde_json::from_slice(
        &block_on(client().manifest(&Reference::parse(&second_ref).unwrap()))
            .unwrap()
            .bytes,
    )
    .unwrap();
    let layers = |m: &serde_json::Value| -> BTreeSet<String> {
        m["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    };
    let first_blob = first_manifest["layers"][0]["digest"].as_str().unwrap();
    assert!(
        layers(&second_manifest).contains(first_blob),
        "the second checkpoint references the first one's blob"
    );
    assert_eq!(
        parse_answer(&get(port).unwrap()).0,
        5,
        "it was left running"
    );

    // A newer checkpoint made by another CRIU is skipped: the newest usable one wins.
    let foreign = push_foreign_checkpoint(&app, "3.17.1", "2999-01-01T00:00:00.000Z");
    drop(restored_tree);
    assert!(get(port).is_err(), "the restored server is gone");
    let out = restore(
        home,
        &socket,
        &["--json", "--criu", s(&criu), "--for", &app],
    );
    let restored = json_of(&out, "tessera restore --for (newest)");
    let _restored_tree = Restored {
        pid: u32::try_from(restored["pid"].as_u64().unwrap()).unwrap(),
    };
    assert_eq!(restored["image"], second_ref.as_str(), "{restored}");
    let skipped = restored["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{restored}");
    assert!(
        skipped[0].as_str().unwrap().contains(&foreign),
        "{restored}"
    );
    let answer =
        wait_for_answer(port, Duration::from_secs(10)).expect("the newest checkpoint answers");
    assert_eq!(
        parse_answer(&answer),
        (5, state),
        "restored from the second checkpoint (the first would answer 3)"
    );
    assert_eq!(agent.status()["mounts"].as_array().unwrap().len(), 0);

    // An image whose only checkpoint this node cannot restore: exit 3, and why.
    push_foreign_checkpoint(&other, "3.17.1", "2025-01-01T00:00:00.000Z");
    let out = restore(home, &socket, &["--criu", s(&criu), "--for", &other]);
    assert_no_usable_checkpoint(&out, &["none of its 1 checkpoints", "CRIU 3.17.1"]);

    eprintln!(
        "first checkpoint: {:.1} MiB dumped, {:.2} MiB uploaded (registry: {:.2} MiB new blobs)\n\
         second checkpoint: {:.1} MiB dumped, {:.2} MiB uploaded (registry: {:.2} MiB new blobs), \
         {:.2} MiB reused, {} of {} chunks from the first",
        first_cp["dumped_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        first_cp["pushed_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        first_uploaded as f64 / 1048576.0,
        second_cp["dumped_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        second_cp["pushed_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        second_uploaded as f64 / 1048576.0,
        second_cp["reused_bytes"].as_u64().unwrap() as f64 / 1048576.0,
        second_cp["build"]["dict_chunks"],
        second_cp["build"]["unique_chunks"],
    );
}
