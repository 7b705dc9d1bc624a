//! A real CNCF distribution registry (Debian `docker-registry`) on 127.0.0.1 with its
//! own storage in a temp dir, started per test and killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::oci::{require_tool, run};

pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Registry {
    /// Starts a registry and waits until `/v2/` answers.
    pub fn start() -> Registry {
        require_tool("docker-registry");
        let dir = tempfile::tempdir().expect("temp dir");
        // A free port: bind port 0, note it, release it for the registry.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                dir.path().join("storage").display()
            ),
        )
        .expect("write registry config");
        let log = dir.path().join("registry.log");
        let child = Command::new("docker-registry")
            .args(["serve", config.to_str().expect("utf-8")])
            .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("registry.err")).expect("log"),
            ))
            .spawn()
            .expect("start docker-registry");
        let registry = Registry {
            child,
            addr,
            _dir: dir,
            log,
        };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(&self.addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "docker-registry did not listen on {} within 20 s",
            self.addr
        );
    }

    /// Pushes `layout:tag` to `repo:tag` on this registry with skopeo.
    pub fn push_layout(&self, layout: &Path, tag: &str, repo: &str) {
        require_tool("skopeo");
        run(Command::new("skopeo").args([
            "copy",
            "--insecure-policy",
            "--dest-tls-verify=false",
            &format!("oci:{}:{tag}", layout.display()),
            &format!("docker://{}/{repo}:{tag}", self.addr),
        ]));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
