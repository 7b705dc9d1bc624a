//! Helpers shared by the agent's integration tests.

#![allow(dead_code)]

pub mod agent;
pub mod chart;
pub mod containerd;
pub mod cri;
pub mod fault_proxy;
pub mod fstree;
pub mod http;
pub mod kube;
pub mod mirror;
pub mod netns;
pub mod oci;
pub mod podman;
pub mod registry;
pub mod scheduler;
pub mod small_disk;
pub mod swarm;
pub mod tessera_node;
pub mod tls;
pub mod token_server;

use std::path::Path;
use std::process::{Command, Output};

/// The `tessera` binary built for this test run.
/// The repository's root (scripts and benchmarks live there).
pub fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate sits in the repository")
        .to_path_buf()
}

/// CRIU 4.2.1 as `make criu-deps` builds it (the checkpoint tests and benchmark).
pub fn criu() -> std::path::PathBuf {
    let criu = repo_root().join("target/tools/criu/criu");
    assert!(
        criu.is_file(),
        "{} is missing: run `make criu-deps` (CRIU 4.2.1; Debian's criu fails on this kernel)",
        criu.display()
    );
    criu
}

pub fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

/// Runs `tessera ARGS`, panicking with its output if it fails.
pub fn tessera_ok(args: &[&str]) -> Output {
    let out = tessera().args(args).output().expect("run tessera");
    assert!(
        out.status.success(),
        "tessera {args:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `tessera convert --json SRC DST ARGS` isolated from this machine's credentials and
/// config (`DOCKER_CONFIG=home`); returns its summary, panicking if it fails.
pub fn convert(home: &Path, src: &str, dst: &str, args: &[&str]) -> serde_json::Value {
    let out = tessera()
        .args(["convert", "--json", src, dst])
        .args(args)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .output()
        .expect("run tessera convert");
    assert!(
        out.status.success(),
        "convert failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("convert --json prints JSON")
}

/// `tessera index --json SRC ARGS` isolated like [`convert`]; returns its summary,
/// panicking if it fails.
pub fn index(home: &Path, src: &str, args: &[&str]) -> serde_json::Value {
    let out = tessera()
        .args(["index", "--json", src])
        .args(args)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", "/dev/null")
        .output()
        .expect("run tessera index");
    assert!(
        out.status.success(),
        "index failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("index --json prints JSON")
}

/// Runs `tessera build --json --out OUT ARGS` and returns the parsed summary.
pub fn build(out: &Path, args: &[&str]) -> serde_json::Value {
    let out_s = out.to_str().expect("utf-8 path");
    let mut full = vec!["build", "--json", "--out", out_s];
    full.extend_from_slice(args);
    let o = tessera_ok(&full);
    serde_json::from_slice(&o.stdout).expect("build --json prints JSON")
}

/// Path as `&str` (test paths are temp dirs, always UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Sends `signal` (`"TERM"`, `"INT"`) to `child` and waits up to `within` for it to
/// exit: its exit status, or `None` when it was still running (it is then killed).
pub fn signal_and_wait(
    mut child: std::process::Child,
    signal: &str,
    within: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status();
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
