//! Containers restored instead of booted (issue 29): real containerd 1.6 with runc and
//! CRIU 4.2.1, a real registry, a scheduler and two agents, each node in a network
//! namespace of its own with its own containerd on the Tessera snapshotter.
//!
//! On node A, `tessera run` boots an HTTP server holding 16 MB of state from a
//! converted Python image (the image has no checkpoint yet), and `tessera checkpoint
//! --container` checkpoints it through containerd's task API into a referrer of the
//! image. The same `tessera run` then boots instead of restoring when the checkpoint's
//! chunks are corrupt in the registry, and when the checkpoint asked for records
//! another CRIU; and restores when it can. On node B, with A holding the chunks, the
//! clone is restored from peers: it answers with the checkpointed state and counter,
//! under its own hostname, and node B's traffic to the origin is near zero. Last, a
//! release's checkpoint is made as CI makes it (`tessera checkpoint --boot IMAGE
//! --ready http://…`), and node B's next `tessera run` restores that one.
//!
//! Needs CRIU 4.2.1 at target/tools/criu/criu (`make criu-deps`), containerd and runc,
//! python3 (its interpreter and standard library become the image), fuse3,
//! docker-registry and the iproute2 tools (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::containerd::NAMESPACE;
use support::netns::{Cluster, NetHost};
use support::oci::{build_dirs_image, run as run_ok};
use support::registry::{block_on, Registry};
use support::scheduler::SchedulerProcess;
use support::swarm::{admin_args, admin_json, peer_agent_args, wait_registered};
use support::tessera_node::TesseraNode;
use support::{criu, s, tessera};
use tessera_agent::registry::client::{ClientOptions, RegistryClient};
use tessera_agent::registry::reference::Reference;

/// The port the server listens on, in its node's network namespace.
const PORT: u16 = 8080;

/// A server whose state is worth restoring: 16 MB of random bytes made at start (their
/// sha256 recomputed on every request, so an answer proves the memory came back), a
/// request counter, and the hostname it runs under.
const SERVER: &str = r#"
import hashlib, http.server, os, socket, sys
state = bytearray(os.urandom(16 << 20))
count = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"{count} {hashlib.sha256(state).hexdigest()} {socket.gethostname()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"#;

/// A root filesystem with this machine's python3 (interpreter, the libraries it links,
/// the standard library without its tests and build files) and the server.
fn python_rootfs(root: &Path) {
    let python = std::fs::canonicalize("/usr/bin/python3").expect("python3 is installed");
    let copy = |from: &Path| {
        let to = root.join(from.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    copy(&python);
    let ldd = run_ok_output(Command::new("ldd").arg(&python));
    for lib in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        copy(&std::fs::canonicalize(lib).unwrap_or_else(|_| PathBuf::from(lib)));
        // The loader and libraries are found by the names ldd printed.
        let named = root.join(lib.trim_start_matches('/'));
        if !named.exists() {
            std::fs::create_dir_all(named.parent().unwrap()).unwrap();
            std::fs::copy(lib, &named).unwrap();
        }
    }
    let version = python.file_name().unwrap().to_str().unwrap().to_string();
    let dest = root.join("usr/lib");
    std::fs::create_dir_all(&dest).unwrap();
    run_ok(Command::new("sh").arg("-c").arg(format!(
        "tar -C /usr/lib -cf - --exclude=test --exclude='config-*' --exclude=__pycache__ \
         --exclude=idlelib --exclude=tkinter --exclude=ensurepip {version} | tar -C {} -xf -",
        dest.display()
    )));
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    let interpreter = root.join("usr/bin/python3");
    if !interpreter.exists() {
        std::os::unix::fs::symlink(&version, &interpreter).unwrap();
    }
    for dir in ["tmp", "app", "etc", "proc", "sys", "dev", "run"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("app/serve.py"), SERVER).unwrap();
    std::fs::write(root.join("etc/hostname"), "").unwrap();
}

fn run_ok_output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `GET /` on `ip:PORT`: the body.
fn get(ip: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((ip, PORT))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

/// The first answer of the server on `ip` within `within`: (count, state digest, hostname).
fn wait_for_answer(ip: &str, within: Duration) -> Option<(u64, String, String)> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(body) = get(ip) {
            let mut fields = body.split_whitespace();
            if let (Some(count), Some(state), Some(host)) =
                (fields.next(), fields.next(), fields.next())
            {
                return Some((count.parse().unwrap(), state.into(), host.into()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Starts node `name` in `host`: its agent in the swarm of `scheduler` (peers on), its
/// containerd on the agent's snapshotter.
fn start_node(
    work: &Path,
    host: NetHost,
    name: &str,
    config: &Path,
    registry: &Registry,
    scheduler: &SchedulerProcess,
) -> TesseraNode {
    let swarm = peer_agent_args(&scheduler.url, &host, name);
    let mut args = vec!["--config", s(config)];
    args.extend(swarm.iter().map(String::as_str));
    let node = TesseraNode::start(&work.join(name), &host, &registry.addr, &args);
    wait_registered(&node.agent);
    node
}

/// `tessera run ARGS` on `node` that must succeed: its summary.
fn tessera_run(node: &TesseraNode, config: &Path, args: &[&str]) -> serde_json::Value {
    let out = node
        .run_command(config, &criu(), args)
        .env("TESSERA_CONFIG", "/dev/null")
        .env("DOCKER_CONFIG", &node.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tessera run {args:?}: {}\n{}\nagent:\n{}\ncontainerd:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        node.agent.log(),
        node.containerd.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Flips bytes all through blob `digest` in the registry's storage; gives back what
/// it was.
fn corrupt(registry: &Registry, digest: &str) -> Vec<u8> {
    let path = registry.blob_path(digest);
    let original = std::fs::read(&path).unwrap();
    let mut bad = original.clone();
    for i in (0..bad.len()).step_by(4096) {
        bad[i] ^= 0xff;
    }
    std::fs::write(&path, bad).unwrap();
    original
}

#[test]
fn a_container_checkpointed_on_one_node_is_restored_on_another_from_peers() {
    let criu = criu();
    let mut cluster = Cluster::new();
    let registry_host = cluster.add_host("registry");
    let scheduler_host = cluster.add_host("scheduler");
    let host_a = cluster.add_host("node-a");
    let host_b = cluster.add_host("node-b");
    let registry = Registry::start_in(&registry_host);
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("tessera.toml");
    std::fs::write(
        &config,
        format!("[registry]\ninsecure = [\"{}\"]\n", registry.addr),
    )
    .unwrap();
    let client = RegistryClient::new(ClientOptions {
        plain_http: vec![registry.addr.clone()],
        ..ClientOptions::default()
    })
    .unwrap();

    // The app image: python and the server, converted.
    let rootfs = work.path().join("rootfs");
    python_rootfs(&rootfs);
    let layout = work.path().join("layout");
    build_dirs_image(
        &layout,
        "amd64",
        &[&rootfs],
        serde_json::json!({
            "Entrypoint": ["/usr/bin/python3", "/app/serve.py"],
            "Cmd": [PORT.to_string()],
            "WorkingDir": "/app",
        }),
    );
    registry.push_layout(&layout, support::oci::TAG, "app");
    let plain = format!("{}/app:{}", registry.addr, support::oci::TAG);
    let app = format!("{}/app:v1", registry.addr);
    support::convert(work.path(), &plain, &app, &["--config", s(&config)]);

    let token = work.path().join("admin.token");
    std::fs::write(&token, "container-restore-test-admin-token").unwrap();
    let state = work.path().join("scheduler-state");
    std::fs::create_dir_all(&state).unwrap();
    let scheduler = SchedulerProcess::start_in(
        &scheduler_host,
        work.path().join("scheduler.log"),
        &admin_args(&token, &state),
    );
    let a = start_node(
        work.path(),
        host_a,
        "node-a",
        &config,
        &registry,
        &scheduler,
    );
    let b = start_node(
        work.path(),
        host_b,
        "node-b",
        &config,
        &registry,
        &scheduler,
    );

    // No checkpoint yet: `tessera run` boots, and says why.
    let booted = tessera_run(
        &a,
        &config,
        &[&app, "web", "--log", s(&work.path().join("web.log"))],
    );
    assert_eq!(booted["outcome"]["how"], "booted", "{booted}");
    let why = booted["outcome"]["why"].as_str().unwrap();
    assert!(why.contains("no checkpoint"), "{why}");
    let (count, state_digest, hostname) =
        wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(60)).unwrap_or_else(|| {
            panic!(
                "the booted server never answered:\n{}",
                std::fs::read_to_string(work.path().join("web.log")).unwrap_or_default()
            )
        });
    assert_eq!((count, hostname.as_str()), (1, "web"));
    let (count, _, _) = wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(10)).unwrap();
    assert_eq!(count, 2);

    // A client holding a connection open: its socket is dumped established and comes
    // back closed (CRIU's tcp-close), so the restored server is not left waiting on a
    // peer that is gone (this one-threaded server reads it before any other request).
    let idle = TcpStream::connect((a.host.ip.to_string(), PORT)).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    // Checkpoint it through containerd (runc drives CRIU); it stops once dumped.
    let out = tessera()
        .args([
            "checkpoint",
            "--json",
            "--config",
            s(&config),
            "--criu",
            s(&criu),
        ])
        .args(["--container", "web", "--address", s(&a.containerd.socket)])
        .args(["--namespace", NAMESPACE])
        .env("TESSERA_CONFIG", "/dev/null")
        .env("DOCKER_CONFIG", work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "checkpoint --container: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.containerd.log()
    );
    let checkpoint: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(checkpoint["kind"], "container", "{checkpoint}");
    assert_eq!(checkpoint["container"], "web");
    assert!(
        checkpoint["subject"]
            .as_str()
            .unwrap()
            .contains("/app:v1@sha256:"),
        "a referrer of the app image: {checkpoint}"
    );
    let checkpoint_ref = checkpoint["reference"].as_str().unwrap().to_string();
    // The container's spec (command line, environment) is in the checkpoint's tree,
    // not in its metadata.
    let manifest = block_on(client.manifest(&Reference::parse(&checkpoint_ref).unwrap())).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let image_config = std::fs::read_to_string(registry.blob_path(config_digest)).unwrap();
    assert!(
        image_config.contains("\"kind\":\"container\""),
        "{image_config}"
    );
    assert!(
        !image_config.contains("serve.py") && !image_config.contains("\"spec\""),
        "{image_config}"
    );
    assert!(
        wait_for_answer(&a.host.ip.to_string(), Duration::from_millis(300)).is_none(),
        "the checkpointed server stopped"
    );
    a.remove("web");
    drop(idle);

    // Its chunks corrupt in the registry: the restore fails and the container boots.
    let data_blob = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let original = corrupt(&registry, &data_blob);
    let corrupt_run = tessera_run(&a, &config, &[&app, "web-c"]);
    std::fs::write(registry.blob_path(&data_blob), &original).unwrap();
    assert_eq!(corrupt_run["outcome"]["how"], "booted", "{corrupt_run}");
    let why = corrupt_run["outcome"]["why"].as_str().unwrap();
    assert!(
        why.starts_with("restoring ") && why.contains("failed"),
        "{why}"
    );
    let (count, _, hostname) =
        wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(60)).unwrap();
    assert_eq!((count, hostname.as_str()), (1, "web-c"), "a fresh boot");
    a.remove("web-c");

    // A checkpoint that records another CRIU: not restored, booted.
    let faked = retag_with_criu_version(&client, &checkpoint_ref, "ckpt-old-criu", "3.17.1");
    let incompatible = tessera_run(&a, &config, &[&app, "web-i", "--checkpoint", &faked]);
    assert_eq!(incompatible["outcome"]["how"], "booted", "{incompatible}");
    let why = incompatible["outcome"]["why"].as_str().unwrap();
    assert!(why.contains("CRIU 3.17.1"), "{why}");
    assert!(wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(60)).is_some());
    a.remove("web-i");

    // Restored on node A: the state and the counter come back, under a new hostname.
    let restored = tessera_run(&a, &config, &[&app, "web-a"]);
    assert_eq!(restored["outcome"]["how"], "restored", "{restored}");
    assert_eq!(restored["outcome"]["checkpoint"], checkpoint_ref.as_str());
    let answer = wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the restored server never answered\n{}", a.containerd.log()));
    assert_eq!(answer, (3, state_digest.clone(), "web-a".to_string()));
    wait_held(&token, &scheduler, &data_blob);

    // On node B, from node A: the same state, its own hostname, next to nothing from
    // the origin.
    let origin_before = registry.blob_bytes_sent(206) + registry.blob_bytes_sent(200);
    let clone = tessera_run(&b, &config, &[&app, "web-b"]);
    let origin_b = registry.blob_bytes_sent(206) + registry.blob_bytes_sent(200) - origin_before;
    assert_eq!(clone["outcome"]["how"], "restored", "{clone}");
    let answer = wait_for_answer(&b.host.ip.to_string(), Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the clone never answered\n{}", b.containerd.log()));
    assert_eq!(answer, (3, state_digest, "web-b".to_string()));
    let read = clone["checkpoint_bytes_read"].as_u64().unwrap();
    let from_peers = clone["peer_bytes"].as_u64().unwrap();
    assert!(read > 16 << 20, "CRIU read the 16 MB of state: {clone}");
    assert!(from_peers > 0, "the checkpoint came from node A: {clone}");
    assert!(
        origin_b < (read / 50),
        "node B took {origin_b} bytes from the origin for a {read}-byte restore: {clone}"
    );
    eprintln!(
        "node B restored from peers: {read} checkpoint bytes read, {from_peers} from peers, \
         {origin_b} blob bytes from the origin (rootfs included) in {:.2} s (mount {:.2} s, \
         restore {:.2} s)",
        clone["seconds"].as_f64().unwrap(),
        clone["mount_seconds"].as_f64().unwrap(),
        clone["restore_seconds"].as_f64().unwrap()
    );
    // The agent on B served the rootfs lazily too: no layer was downloaded by containerd.
    assert!(b.agent.status()["mounts"]
        .as_array()
        .is_some_and(|m| !m.is_empty()));
    b.remove("web-b");
    a.remove("web-a");

    // A release's checkpoint as CI makes it: boot, wait until ready, checkpoint, push.
    let out = tessera()
        .args([
            "checkpoint",
            "--json",
            "--config",
            s(&config),
            "--criu",
            s(&criu),
        ])
        .args(["--boot", &app, "--ready"])
        .arg(format!("http://{}:{PORT}/", a.host.ip))
        .args(["--ready-timeout", "60", "--record-working-set"])
        .args(["--socket", s(&a.agent.socket)])
        .args([
            "--address",
            s(&a.containerd.socket),
            "--namespace",
            NAMESPACE,
        ])
        .args(["--state-dir", s(&a.dir.join("run"))])
        .env("TESSERA_CONFIG", "/dev/null")
        .env("DOCKER_CONFIG", work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "checkpoint --boot: {}
{}",
        String::from_utf8_lossy(&out.stderr),
        a.containerd.log()
    );
    let release: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let release_ref = release["checkpoint"]["reference"].as_str().unwrap();
    assert_eq!(release["boot"]["outcome"]["how"], "booted", "{release}");
    assert_eq!(
        release["working_set"]["how"], "recorded",
        "CI recorded the release's working set too: {release}"
    );
    assert!(
        release["checkpoint"]["chunk_dict"].as_str() == Some(checkpoint_ref.as_str()),
        "built against the image's previous checkpoint: {release}"
    );
    assert!(
        a.containerd
            .ctr_ok(&["container", "ls", "-q"])
            .trim()
            .is_empty(),
        "the booted container is removed"
    );
    // Now the image's newest: B restores it, the probe's request already counted.
    let clone = tessera_run(&b, &config, &[&app, "web-b2"]);
    assert_eq!(clone["outcome"]["how"], "restored", "{clone}");
    assert_eq!(clone["outcome"]["checkpoint"], release_ref);
    let (count, _, hostname) = wait_for_answer(&b.host.ip.to_string(), Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the release's clone never answered\n{}", b.containerd.log()));
    assert_eq!((count, hostname.as_str()), (2, "web-b2"));
    b.remove("web-b2");

    // With CRIU's lazy pages: the memory arrives through `criu lazy-pages` reading the
    // mount (userfaultfd) while the clone already runs; `tessera run` returns once the
    // last page is in, and the clone's state is whole.
    let lazy = tessera_run(&b, &config, &[&app, "web-b3", "--lazy-pages"]);
    assert_eq!(lazy["outcome"]["how"], "restored", "{lazy}");
    assert_eq!(lazy["lazy_pages"], true, "{lazy}");
    let (count, digest, hostname) =
        wait_for_answer(&b.host.ip.to_string(), Duration::from_secs(10))
            .unwrap_or_else(|| panic!("the lazy clone never answered\n{}", b.containerd.log()));
    assert_eq!((count, hostname.as_str()), (2, "web-b3"));
    let (_, release_digest, _) =
        wait_for_answer(&b.host.ip.to_string(), Duration::from_secs(10)).unwrap();
    assert_eq!(digest, release_digest, "the state is whole");
    eprintln!(
        "lazy pages on node B: restore {:.2} s, every page in after {:.2} s",
        lazy["restore_seconds"].as_f64().unwrap(),
        lazy["pages_seconds"].as_f64().unwrap()
    );
    b.remove("web-b3");

    // The release's working set: node A restores it with lazy pages, recording which
    // of its chunks the restore and the first request (the probe) read, and pushes
    // that beside the checkpoint. Node B's next restore finds it and has its agent
    // fetch those chunks first (with nothing else prefetched here, to see them).
    let probe = format!("http://{}:{PORT}/", a.host.ip);
    let recording = tessera_run(
        &a,
        &config,
        &[
            &app,
            "web-a3",
            "--lazy-pages",
            "--record-working-set",
            &probe,
        ],
    );
    let recorded = &recording["working_set"];
    assert_eq!(
        recording["outcome"]["checkpoint"], release_ref,
        "{recording}"
    );
    assert_eq!(recorded["how"], "recorded", "{recording}");
    let chunks = recorded["chunks"].as_u64().unwrap();
    assert!(
        chunks > 0 && recorded["compressed_bytes"].as_u64().unwrap() > 0,
        "{recording}"
    );
    let (count, _, hostname) = wait_for_answer(&a.host.ip.to_string(), Duration::from_secs(10))
        .unwrap_or_else(|| {
            panic!(
                "the recording clone stopped answering\n{}",
                a.containerd.log()
            )
        });
    assert_eq!(
        (count, hostname.as_str()),
        (3, "web-a3"),
        "the probe's request was the clone's first"
    );
    a.remove("web-a3");
    let fetched = tessera_run(
        &b,
        &config,
        &[&app, "web-b4", "--lazy-pages", "--prefetch", "none"],
    );
    assert_eq!(fetched["outcome"]["how"], "restored", "{fetched}");
    assert_eq!(fetched["working_set"]["how"], "fetched", "{fetched}");
    assert_eq!(fetched["working_set"]["chunks"].as_u64(), Some(chunks));
    assert!(
        b.agent.log().contains(&format!("working_set={chunks}")),
        "node B's agent prefetched the working set:\n{}",
        b.agent.log()
    );
    let (count, digest, hostname) =
        wait_for_answer(&b.host.ip.to_string(), Duration::from_secs(10)).unwrap_or_else(|| {
            panic!(
                "the working-set clone never answered\n{}",
                b.containerd.log()
            )
        });
    assert_eq!((count, hostname.as_str()), (2, "web-b4"));
    assert_eq!(digest, release_digest, "the state is whole");
    b.remove("web-b4");
    for log in [a.agent.log(), b.agent.log(), scheduler.log_text()] {
        assert!(!log.contains("panicked at"), "{log}");
    }
}

/// Waits until the scheduler knows a host holding bytes of blob `digest`.
fn wait_held(token: &Path, scheduler: &SchedulerProcess, digest: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(support::scheduler::binary())
            .args(["admin", "--url", &format!("http://{}:7090", scheduler.ip())])
            .arg("--token-file")
            .arg(token)
            .args(["--json", "blobs"])
            .output()
            .unwrap();
        let blobs = admin_json(&out);
        let held = blobs.as_array().is_some_and(|l| {
            l.iter()
                .any(|b| b["blob"] == digest && b["holders"].as_u64() >= Some(1))
        });
        if held {
            return;
        }
        assert!(Instant::now() < deadline, "nobody holds {digest}: {blobs}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pushes checkpoint `reference`'s manifest again as `tag`, recording CRIU `version`.
fn retag_with_criu_version(
    client: &RegistryClient,
    reference: &str,
    tag: &str,
    version: &str,
) -> String {
    let r = Reference::parse(reference).unwrap();
    let manifest = block_on(client.manifest(&r)).unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    value["annotations"]["io.tessera.checkpoint.criu-version"] = version.into();
    let target = Reference {
        tag: Some(tag.to_string()),
        digest: None,
        ..r
    };
    block_on(client.push_manifest(
        &target,
        &manifest.media_type,
        serde_json::to_vec(&value).unwrap(),
    ))
    .unwrap();
    target.to_string()
}
