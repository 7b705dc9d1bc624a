//! The CRI image-service proxy end to end: a private repository on a real
//! `docker-registry` with htpasswd auth (behind the counting proxy), the agent with its
//! snapshotter and `--cri-listen`, a real containerd 1.6 with its CRI plugin and runc,
//! and `PullImage` sent to the agent's socket with a pull secret's credentials, as the
//! kubelet sends them when its `--image-service-endpoint` names the agent. The node
//! itself has no credentials anywhere.
//!
//! Needs containerd, runc, fuse3, docker-registry, umoci, skopeo and busybox-static
//! (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::{Path, PathBuf};

use base64::Engine;
use support::agent::AgentProcess;
use support::containerd::Containerd;
use support::cri::cri_pull_at;
use support::fault_proxy::FaultProxy;
use support::oci::{self, build_files_image_with, pseudo_random, require_tool};
use support::registry::{Auth, Registry};
use support::{convert, s};
use tessera_proto::cri::AuthConfig;

const USER: &str = "puller";
/// Distinctive, so that finding it anywhere is a finding.
const PASSWORD: &str = "pw-7f3a9c1e-never-logged";

fn auth(password: &str) -> AuthConfig {
    AuthConfig {
        username: USER.into(),
        password: password.into(),
        ..AuthConfig::default()
    }
}

/// Every regular file under `dir` (sockets and the like skipped), recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            if kind.is_dir() {
                // The lazy mounts' trees are the image, not the agent's state.
                if !support::agent::is_mounted(&path) {
                    todo.push(path);
                }
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A private image, pulled through the agent's CRI proxy with a pull secret, is mounted
/// lazily with those credentials (the node has none) and a container reads it; a pull
/// of the same image without credentials, or with wrong ones, is refused although its
/// chunks are on the node; the password is in no log and no file of the agent's.
#[test]
fn private_image_pulled_through_the_cri_proxy_mounts_lazily_with_the_pods_credentials() {
    require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("tcri")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start_with(Auth::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    });
    let proxy = FaultProxy::start(&registry.addr);
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let layout = t.path().join("layout");
    build_files_image_with(
        &layout,
        "amd64",
        &[
            vec![("bin/sh", busybox)],
            vec![
                ("data/hello", b"hello from a private image\n".to_vec()),
                ("data/big", pseudo_random(6 << 20, 11)),
            ],
        ],
        &["bin/sh"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    let creds = format!("{USER}:{PASSWORD}");
    let home = t.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    convert(
        &home,
        &format!("{}/src/app:v1", registry.addr),
        &format!("{}/private/app:v1", registry.addr),
        &["--src-creds", &creds, "--dest-creds", &creds],
    );
    let image = format!("{}/private/app:v1", proxy.addr);

    let containerd_dir = t.path().join("containerd");
    std::fs::create_dir_all(&containerd_dir).unwrap();
    let containerd_socket = containerd_dir
        .canonicalize()
        .unwrap()
        .join("containerd.sock");
    let agent_dir = t.path().join("agent");
    let cri_socket = agent_dir.join("cri.sock");
    let agent = AgentProcess::start_snapshotter(
        &agent_dir,
        &[
            "--cri-listen",
            s(&cri_socket),
            "--cri-containerd",
            s(&containerd_socket),
        ],
    );
    let snap_socket = agent.snapshotter_socket();
    agent.wait_for_socket(&cri_socket);
    let containerd = Containerd::start_cri_tessera(&containerd_dir, &snap_socket, &proxy.addr);
    let logs = || {
        format!(
            "containerd log:\n{}\nagent log:\n{}",
            containerd.log(),
            agent.log()
        )
    };

    // Without credentials: the registry says no, through the proxy as without it.
    let refused = cri_pull_at(&cri_socket, &image, None);
    assert!(refused.is_err(), "a pull without credentials: {refused:?}");

    let pulled = cri_pull_at(&cri_socket, &image, Some(auth(PASSWORD)))
        .unwrap_or_else(|e| panic!("CRI pull with the pod's credentials: {e}\n{}", logs()));
    assert!(pulled.starts_with("sha256:"), "{pulled}");
    let metrics = agent.metrics();
    // The refused pull without credentials is counted as failed (containerd's code).
    let refused_counted = metrics.lines().any(|l| {
        l.starts_with(r#"tessera_agent_cri_pulls_total{credentials="no",outcome="#)
            && !l.contains(r#"outcome="ok""#)
            && l.ends_with(" 1")
    });
    assert!(
        metrics.contains(r#"tessera_agent_cri_pulls_total{credentials="yes",outcome="ok"} 1"#)
            && refused_counted,
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tessera_agent_snapshotter_lazy_layers_total{kind="bootstrap"} 1"#),
        "the image was mounted lazily, not unpacked:\n{metrics}\n{}",
        logs()
    );
    let blob_layers: Vec<String> = proxy
        .log()
        .iter()
        .filter(|l| l.target.contains("/blobs/"))
        .map(|l| l.target.clone())
        .collect();
    assert!(
        blob_layers.len() <= 3,
        "the pull fetched the config and the bootstrap only: {blob_layers:#?}"
    );

    // A container reads the image: chunks fetched from the origin with the pod's
    // credentials, kept by the agent (its docker config is empty).
    let before = proxy.blob_bytes();
    let out = containerd.ctr_k8s(&[
        "run",
        "--rm",
        "--snapshotter",
        "tessera",
        &image,
        "c1",
        "/bin/sh",
        "-c",
        "read l < /data/hello; echo \"$l\"",
    ]);
    assert!(
        out.status.success(),
        "ctr run: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from a private image\n"
    );
    assert!(
        proxy.blob_bytes() > before,
        "the container's reads came from the origin"
    );

    // Everything is on the node now; still, a pull without credentials or with wrong
    // ones is refused: containerd asks the registry, as it would without the proxy.
    for (what, auth) in [("no", None), ("wrong", Some(auth("not-the-password")))] {
        let again = cri_pull_at(&cri_socket, &image, auth);
        assert!(
            again.is_err(),
            "a pull with {what} credentials of a cached private image: {again:?}"
        );
    }
    // The wrong credentials did not replace the good ones: the mount still reads what
    // nobody read yet (the end of the big file) from the origin.
    let status = agent.status();
    let mountpoint = PathBuf::from(status["mounts"][0]["mountpoint"].as_str().unwrap());
    let before = proxy.blob_bytes();
    let tail = {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(mountpoint.join("data/big")).unwrap();
        f.seek(SeekFrom::End(-4096)).unwrap();
        let mut tail = vec![0; 4096];
        f.read_exact(&mut tail)
            .unwrap_or_else(|e| panic!("read the mount after a refused pull: {e}\n{}", logs()));
        tail
    };
    assert_eq!(tail, pseudo_random(6 << 20, 11)[(6 << 20) - 4096..]);
    assert!(
        proxy.blob_bytes() > before,
        "the end of the big file came from the origin"
    );

    // The password is in no log, and no file under the agent's state.
    let encoded = base64::engine::general_purpose::STANDARD.encode(&creds);
    for (what, text) in [
        ("agent log", agent.log()),
        ("containerd log", containerd.log()),
    ] {
        assert!(
            !text.contains(PASSWORD) && !text.contains(&encoded),
            "the password is in the {what}"
        );
    }
    let files = files_under(&agent_dir);
    assert!(files.len() > 3, "the agent keeps state there: {files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !contains(&bytes, PASSWORD.as_bytes()) && !contains(&bytes, encoded.as_bytes()),
            "the password is in {}",
            file.display()
        );
    }

    // Uninstalling: the agent stops and its snapshotter mounts stay for the next one
    // (held by the FUSE keeper); `tessera snapshotter clean --remove` leaves nothing
    // mounted or running.
    drop(containerd);
    let mut agent = agent;
    agent.stop();
    let root = agent_dir.join("snapshotter");
    assert!(
        support::agent::is_mounted(&mountpoint),
        "the snapshotter's mount outlives the agent"
    );
    let out = support::tessera()
        .args(["snapshotter", "clean", "--json", "--remove", "--root"])
        .arg(&root)
        .arg("--socket")
        .arg(&snap_socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "snapshotter clean: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["unmounted"].as_array().unwrap().len(),
        1,
        "{summary}"
    );
    assert_eq!(summary["keeper_stopped"], true, "{summary}");
    assert_eq!(summary["removed"], true, "{summary}");
    assert!(!root.exists());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !table.contains(agent_dir.to_str().unwrap()),
        "still mounted under the agent's dir:\n{table}"
    );
    let keepers = std::process::Command::new("pgrep")
        .args(["-f", &format!("fuse-keeper --socket {}", root.display())])
        .output()
        .unwrap();
    assert!(
        keepers.stdout.is_empty(),
        "a FUSE keeper still runs: {}",
        String::from_utf8_lossy(&keepers.stdout)
    );
}
