//! The containerd harness itself (`support::containerd`), checked against the real
//! registry before tests of the agent as containerd's mirror build on it: a pulled and
//! unpacked image is the tree `umoci unpack` makes, with every snapshotter that works
//! here; a daemon in a cluster host's namespace pulls through that namespace (`ctr`
//! moves the bytes in containerd 1.6, the daemon in 2.x); `--hosts-dir` names
//! hosts; a mirror host sees `?ns=` and the `--user` credentials; nothing is left
//! behind, also after a panic.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use support::agent::is_mounted;
use support::containerd::{Containerd, Line, PullOptions, Snapshotter, NAMESPACE};
use support::fstree::{assert_trees_equal, CompareOptions};
use support::http::{self, Request, Server};
use support::netns::Cluster;
use support::oci::{self, build_files_image, build_layered_image, umoci_unpack_rootfs};
use support::registry::{Auth, Registry};

const USER: &str = "tessera";
const PASSWORD: &str = "pw-containerd-harness";

/// The manifest digest `tag` names in the OCI layout `layout`.
fn manifest_digest(layout: &Path, tag: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .unwrap()
        .to_owned()
}

/// A two-layer image of small files (the second overrides one file of the first and
/// names `repo`, so every repo's image has its own digests), pushed to `registry` as
/// `repo:v1`; returns the reference and the manifest digest.
fn push_files_image(registry: &Registry, work: &Path, repo: &str) -> (String, String) {
    let layout = work.join(format!("{}-layout", repo.replace('/', "-")));
    let digest = build_files_image(
        &layout,
        "amd64",
        &[
            vec![
                ("etc/app.conf", b"layer 1\n".to_vec()),
                ("bin/app", b"#!/bin/sh\n".to_vec()),
            ],
            vec![
                ("etc/app.conf", b"layer 2\n".to_vec()),
                ("etc/repo", repo.as_bytes().to_vec()),
            ],
        ],
    );
    registry.push_layout(&layout, oci::TAG, repo);
    (format!("{}/{repo}:{}", registry.addr, oci::TAG), digest)
}

/// Writes `dir/<registry_host>/hosts.toml`: one pull and resolve `host`, then the
/// upstream `server` (`ADDR` for `http://ADDR` each). Always both: containerd 1.6.20
/// rejects a file without a `[host]` table ("invalid `host` tree") and, logging it,
/// pulls as if there were no file.
fn write_hosts_toml(dir: &Path, registry_host: &str, server: &str, host: &str) {
    let d = dir.join(registry_host);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("hosts.toml"),
        format!(
            "server = \"http://{server}\"\n\n\
             [host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
}

/// `n` distinct `127.0.0.1:PORT`s where nothing listens (ports bound together, then
/// released).
fn dead_addrs(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
}

/// The four-layer reference image (whiteouts, an opaque directory, hardlinks, xattrs,
/// long names, odd modes and owners), pulled and unpacked by containerd with each
/// snapshotter this machine supports, mounted with `ctr image mount`, is exactly the
/// tree `umoci unpack` makes of the same layout.
#[test]
fn pulled_image_matches_umoci_with_every_snapshotter() {
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let image = build_layered_image(&work);
    let expected = umoci_unpack_rootfs(&image.layout, &image.tag, &t.path().join("umoci"));
    let digest = manifest_digest(&image.layout, &image.tag);
    let registry = Registry::start();
    registry.push_layout(&image.layout, &image.tag, "harness/layered");
    let reference = format!("{}/harness/layered:{}", registry.addr, image.tag);

    let snapshotters: Vec<Snapshotter> = [
        Snapshotter::Overlayfs,
        Snapshotter::OverlayfsOnTmpfs,
        Snapshotter::Native,
    ]
    .into_iter()
    .filter(|s| s.works(t.path()))
    .collect();
    eprintln!("snapshotters that work here: {snapshotters:?}");
    for snapshotter in snapshotters {
        let dir = t.path().join(format!("containerd-{snapshotter:?}"));
        let containerd = Containerd::start_with(&dir, None, snapshotter);
        containerd.pull_ok(&reference, &PullOptions::plain_http());
        assert_eq!(containerd.images(), std::slice::from_ref(&reference));
        assert!(containerd.content_exists(&digest), "{digest} not stored");

        let rootfs = t.path().join(format!("rootfs-{snapshotter:?}"));
        containerd.rootfs(&reference, &rootfs);
        assert!(is_mounted(&rootfs));
        assert_trees_equal(
            &expected,
            &rootfs,
            &CompareOptions {
                ignore_xattr_prefixes: Vec::new(),
                // containerd skips the layers' `.` entries ("file \".\" ignored:
                // resolved to root"), so the root keeps its snapshot directory's
                // mtime (unpack time), where umoci applies the entry's. Only the
                // mtime: owner and mode are checked below, everything under the root
                // by the comparison.
                compare_root_metadata: false,
                // containerd 2.2's native snapshotter (seen with 2.2.9) leaves each
                // directory a later layer changes with its unpack time; overlayfs
                // keeps the layers' mtimes on both lines, and so does 1.6's native.
                ignore_mtime_for_dirs: snapshotter == Snapshotter::Native
                    && containerd.line == Line::V2,
            },
        );
        let (e, a) = (
            std::fs::metadata(&expected).unwrap(),
            std::fs::metadata(&rootfs).unwrap(),
        );
        assert_eq!(
            (e.mode(), e.uid(), e.gid()),
            (a.mode(), a.uid(), a.gid()),
            "root directory"
        );
        containerd.unmount(&rootfs);
        assert!(!is_mounted(&rootfs));
        assert!(
            !containerd
                .snapshots()
                .iter()
                .any(|s| Path::new(s) == rootfs),
            "the view snapshot outlived unmount: {:?}",
            containerd.snapshots()
        );
    }
}

/// containerd on a cluster host: the daemon runs in the host's network namespace and
/// `ctr` too (in containerd 1.6 `ctr` does the download itself: a `ctr` in the test's
/// namespace pulls from the test's loopback even though the daemon cannot reach it; in
/// 2.x the daemon does, unless `ctr --local`);
/// the pull goes to a registry on another host, and the rootfs mounted from the
/// namespace is visible to the test.
#[test]
fn containerd_in_a_namespace_host_pulls_there() {
    let t = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new();
    let registry_host = cluster.add_host("registry");
    let node = cluster.add_host("node");
    let registry = Registry::start_in(&registry_host);
    let (reference, digest) = push_files_image(&registry, t.path(), "harness/files");

    let containerd = Containerd::start_in(&t.path().join("containerd"), &node);
    let net_ns = |pid: &str| std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
    let host_ns = std::fs::metadata(format!("/run/netns/{}", node.netns)).unwrap();
    let daemon_ns = net_ns(&containerd.pid().to_string());
    assert_eq!(
        (daemon_ns.dev(), daemon_ns.ino()),
        (host_ns.dev(), host_ns.ino()),
        "containerd is not in {}",
        node.netns
    );

    // Off loopback, `ctr` speaks HTTPS unless told otherwise.
    let out = containerd.pull(&reference, &PullOptions::default());
    assert!(
        !out.status.success(),
        "pulled over HTTPS from a plain registry"
    );
    containerd.pull_ok(&reference, &PullOptions::plain_http());
    assert!(containerd.content_exists(&digest));
    let rootfs = t.path().join("rootfs");
    containerd.rootfs(&reference, &rootfs);
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/app.conf")).unwrap(),
        "layer 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(rootfs.join("bin/app")).unwrap(),
        "#!/bin/sh\n"
    );
    containerd.unmount(&rootfs);

    // A registry on the test's loopback: the harness's `ctr` (in the node's namespace)
    // cannot reach it...
    let local = Registry::start();
    let (local_ref, local_digest) = push_files_image(&local, t.path(), "harness/local");
    let out = containerd.pull(&local_ref, &PullOptions::plain_http());
    assert!(
        !out.status.success(),
        "ctr in {} pulled from the test's 127.0.0.1",
        node.netns
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("connection refused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ...and a `ctr` in the test's namespace: in 1.6 it pulls into the same daemon,
    // which cannot reach the registry, because the download happens in `ctr`; in 2.x
    // `ctr` hands the pull to the daemon's transfer service, which fails the same way,
    // unless told `--local` (1.6's way).
    let ctr_here = |extra: &[&str]| {
        Command::new(containerd.line.program("ctr"))
            .arg("--address")
            .arg(&containerd.socket)
            .args(["--namespace", NAMESPACE, "image", "pull", "--plain-http"])
            .args(extra)
            .arg(&local_ref)
            .env("CONTAINERD_SNAPSHOTTER", containerd.snapshotter.name())
            .output()
            .unwrap()
    };
    let out = match containerd.line {
        Line::V1_6 => ctr_here(&[]),
        Line::V2 => {
            let daemon_side = ctr_here(&[]);
            assert!(
                !daemon_side.status.success()
                    && String::from_utf8_lossy(&daemon_side.stderr).contains("connection refused"),
                "the 2.x daemon in {} pulled from the test's 127.0.0.1: {}",
                node.netns,
                String::from_utf8_lossy(&daemon_side.stderr)
            );
            ctr_here(&["--local"])
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(containerd.content_exists(&local_digest));
}

/// `--hosts-dir` with `<registry>/hosts.toml` naming the registry itself as a pull and
/// resolve host (how the agent's mirror will be named). The file's `server` is a dead
/// address, so the pull can only succeed through the `[host]` entry; and when that
/// entry names a dead address too the same pull fails on both, so `ctr` really reads
/// the file named after the reference's `host:port` (without it, `ctr` would pull from
/// the loopback registry over plain HTTP by itself).
#[test]
fn hosts_dir_names_the_registry_as_a_host() {
    let t = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let (reference, digest) = push_files_image(&registry, t.path(), "harness/hosts");
    let [dead_server, dead_host]: [String; 2] = dead_addrs(2).try_into().unwrap();
    let containerd = Containerd::start(&t.path().join("containerd"));

    let nowhere = t.path().join("nowhere.d");
    write_hosts_toml(&nowhere, &registry.addr, &dead_server, &dead_host);
    let out = containerd.pull(
        &reference,
        &PullOptions {
            hosts_dir: Some(nowhere),
            ..PullOptions::default()
        },
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pulled through dead hosts: {stderr}");
    // Who tried each host says so: `ctr` in 1.6; in 2.x the daemon's transfer service,
    // which logs each failed host and hands `ctr` only the last error.
    let tried = match containerd.line {
        Line::V1_6 => stderr.into_owned(),
        Line::V2 => format!("{stderr}\n{}", containerd.log()),
    };
    for dead in [&dead_server, &dead_host] {
        assert!(
            tried.contains(&format!("dial tcp {dead}: connect: connection refused")),
            "{dead} not tried: {tried}"
        );
    }

    let hosts = t.path().join("hosts.d");
    write_hosts_toml(&hosts, &registry.addr, &dead_server, &registry.addr);
    containerd.pull_ok(
        &reference,
        &PullOptions {
            hosts_dir: Some(hosts),
            ..PullOptions::default()
        },
    );
    assert!(containerd.content_exists(&digest));
    let rootfs = t.path().join("rootfs");
    containerd.rootfs(&reference, &rootfs);
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/app.conf")).unwrap(),
        "layer 2\n"
    );

    // `remove_image` really forgets the blobs (GC ran): a pull would fetch again.
    containerd.unmount(&rootfs);
    containerd.remove_image(&reference);
    assert!(containerd.images().is_empty());
    assert!(!containerd.content_exists(&digest));
    assert!(
        containerd.snapshots().is_empty(),
        "{:?}",
        containerd.snapshots()
    );
}

/// One request as [`RecordingRelay`] passed it on.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    /// As sent, in order.
    headers: Vec<(String, String)>,
    authorization: Option<String>,
    /// The registry's answer.
    status: u16,
    /// The registry's `WWW-Authenticate`, if any.
    challenge: Option<String>,
}

/// A transparent HTTP relay in front of a registry that records what the client sent
/// (request line and headers) and what the registry answered: a stand-in for a mirror
/// host, to see what containerd sends a mirror.
struct RecordingRelay {
    addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _server: Server,
}

impl RecordingRelay {
    fn start(upstream: &str) -> RecordingRelay {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let server = {
            let (seen, upstream) = (Arc::clone(&seen), upstream.to_owned());
            Server::start("recording-relay", move |client| {
                relay(client, &upstream, &seen)
            })
        };
        RecordingRelay {
            addr: server.addr.clone(),
            seen,
            _server: server,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Passes one request upstream (`Connection: close`) and the raw response back.
fn relay(mut client: TcpStream, upstream: &str, seen: &Mutex<Vec<Seen>>) -> io::Result<()> {
    let Some(req) = Request::read(&mut http::reader(&client)?)? else {
        return Ok(());
    };
    let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.target);
    for (name, value) in &req.headers {
        if !["connection", "keep-alive"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(head.as_bytes())?;
    up.write_all(&req.body)?;
    let mut response = Vec::new();
    up.read_to_end(&mut response)?;
    let parsed = http::read_head(&mut &response[..])?.unwrap();
    seen.lock().unwrap().push(Seen {
        method: req.method.clone(),
        target: req.target.clone(),
        headers: req.headers.clone(),
        authorization: req.header("authorization").map(str::to_owned),
        status: parsed.start.split(' ').nth(1).unwrap().parse().unwrap(),
        challenge: http::header(&parsed.headers, "www-authenticate").map(str::to_owned),
    });
    client.write_all(&response)?;
    client.flush()
}

/// What containerd 1.6 sends a mirror host named in `hosts.toml` (the agent's mirror
/// will be one): every request carries `?ns=<the reference's registry>`; the first goes
/// without credentials, and after the registry's 401 with a `Basic` challenge, the
/// `--user` credentials follow to the mirror host. (1.6.20 also sends the manifest GET
/// without them first and takes a second 401; blobs then carry them at once.) Run
/// with `--nocapture` to see the requests.
#[test]
fn a_mirror_host_gets_ns_and_basic_credentials() {
    let t = tempfile::tempdir().unwrap();
    let registry = Registry::start_with(Auth::Basic {
        username: USER.to_owned(),
        password: PASSWORD.to_owned(),
    });
    let (reference, digest) = push_files_image(&registry, t.path(), "harness/mirrored");
    let mirror = RecordingRelay::start(&registry.addr);
    // The upstream `server` is dead: every byte has to come through the mirror.
    let hosts = t.path().join("hosts.d");
    write_hosts_toml(&hosts, &registry.addr, &dead_addrs(1)[0], &mirror.addr);
    let containerd = Containerd::start(&t.path().join("containerd"));
    containerd.pull_ok(
        &reference,
        &PullOptions {
            hosts_dir: Some(hosts),
            user: Some(format!("{USER}:{PASSWORD}")),
            ..PullOptions::default()
        },
    );
    assert!(containerd.content_exists(&digest));

    let seen = mirror.seen();
    for s in &seen {
        eprintln!("{} {} HTTP/1.1", s.method, s.target);
        for (name, value) in &s.headers {
            eprintln!("{name}: {value}");
        }
        eprintln!("  -> {} (WWW-Authenticate: {:?})\n", s.status, s.challenge);
    }
    let ns: String = form_urlencoded::byte_serialize(registry.addr.as_bytes()).collect();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    for s in &seen {
        assert!(
            s.target.ends_with(&format!("?ns={ns}")),
            "no ns query: {s:?}"
        );
        // Without credentials: challenged; with them: exactly `--user`'s, accepted.
        match s.authorization.as_deref() {
            None => assert!(
                s.status == 401 && s.challenge.as_deref().unwrap().starts_with("Basic "),
                "{s:?}"
            ),
            Some(auth) => assert!(auth == basic && s.status == 200, "{s:?}"),
        }
    }
    // Resolving starts with the tag's HEAD, sent without credentials, then again with
    // them after the challenge.
    let requests: Vec<_> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.authorization.is_some()))
        .collect();
    assert_eq!(
        requests[..2],
        [("HEAD", false), ("HEAD", true)],
        "{seen:#?}"
    );
    // Every object came through the mirror in the end.
    let served = |kind: &str| {
        seen.iter()
            .filter(|s| s.target.contains(kind) && s.status == 200)
            .count()
    };
    assert_eq!(served("/manifests/sha256:"), 1, "{seen:#?}");
    assert_eq!(served("/blobs/"), 3, "config and two layers: {seen:#?}");
}

/// A test that panics with containerd running and a rootfs mounted leaves nothing:
/// the daemon is killed and reaped, the rootfs and everything under its dir unmounted
/// (with overlayfs on a tmpfs where it works, so that there is a tmpfs to unmount).
#[test]
fn a_panicking_test_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let (reference, _) = push_files_image(&registry, t.path(), "harness/panic");
    let dir = t.path().join("containerd");
    let rootfs = t.path().join("rootfs");
    let panicked = {
        let (dir, rootfs) = (dir.clone(), rootfs.clone());
        std::thread::spawn(move || {
            std::fs::create_dir_all(&dir).unwrap();
            let snapshotter = if Snapshotter::OverlayfsOnTmpfs.works(&dir) {
                Snapshotter::OverlayfsOnTmpfs
            } else {
                Snapshotter::detect(&dir)
            };
            let containerd = Containerd::start_with(&dir, None, snapshotter);
            containerd.pull_ok(&reference, &PullOptions::plain_http());
            containerd.rootfs(&reference, &rootfs);
            assert!(is_mounted(&rootfs));
            std::panic::panic_any(containerd.pid());
        })
        .join()
        .unwrap_err()
    };
    let pid = *panicked.downcast_ref::<u32>().unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "containerd {pid} survived"
    );
    assert!(!is_mounted(&rootfs), "{} still mounted", rootfs.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let base = t.path().to_str().unwrap();
    assert!(
        !mountinfo.lines().any(|l| l.contains(base)),
        "mounts left under {base}:\n{mountinfo}"
    );
}
