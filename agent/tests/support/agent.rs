//! A real `tessera agent` daemon per test: its own socket, cache and config in a temp
//! dir, no credentials of this machine; stopped (SIGTERM, then SIGKILL) and its mounts
//! cleared when dropped, even after a failed assertion.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::netns::NetHost;
use super::tessera;

pub struct AgentProcess {
    child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub metrics: String,
    extra: Vec<String>,
    /// Runs in this cluster host's network namespace, if set.
    host: Option<NetHost>,
    /// Started under `prlimit --nofile=N:N`, if set.
    open_files: Option<u64>,
    /// The subcommand with its own flags: `agent`, or `store --root PATH`.
    command: Vec<String>,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("find a free port")
        .port()
}

impl AgentProcess {
    /// Starts an agent whose files live under `dir`, with `extra` flags.
    pub fn start(dir: &Path, extra: &[&str]) -> AgentProcess {
        AgentProcess::launch(dir, format!("127.0.0.1:{}", free_port()), None, extra)
    }

    /// Starts an agent serving containerd's snapshots API on
    /// [`snapshotter_socket`](Self::snapshotter_socket) (its root `dir/snapshotter`),
    /// with P2P and prefetch off and `extra` flags; returns once the socket answers.
    pub fn start_snapshotter(dir: &Path, extra: &[&str]) -> AgentProcess {
        let (socket, root) = (dir.join("snap.sock"), dir.join("snapshotter"));
        let mut args = vec![
            "--no-p2p",
            "--prefetch",
            "none",
            "--snapshotter-socket",
            socket.to_str().expect("utf-8"),
            "--snapshotter-root",
            root.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        let agent = AgentProcess::start(dir, &args);
        agent.wait_for_socket(&socket);
        agent
    }

    /// Where an agent made by [`start_snapshotter`](Self::start_snapshotter) serves
    /// the snapshotter.
    pub fn snapshotter_socket(&self) -> PathBuf {
        self.dir.join("snap.sock")
    }

    /// Starts an agent in `host`'s network namespace (its files, socket and mounts are
    /// still on this machine's filesystem, so the test uses them as usual); metrics on
    /// `host.ip:9464`.
    pub fn start_in(dir: &Path, host: &NetHost, extra: &[&str]) -> AgentProcess {
        AgentProcess::launch(dir, format!("{}:9464", host.ip), Some(host), extra)
    }

    /// Starts an agent (as [`start`](Self::start)) whose open-file limit, soft and
    /// hard, is `open_files` (`prlimit`, util-linux).
    pub fn start_with_open_files(dir: &Path, open_files: u64, extra: &[&str]) -> AgentProcess {
        let mut agent = AgentProcess::new(dir, format!("127.0.0.1:{}", free_port()), None, extra);
        agent.open_files = Some(open_files);
        agent.spawn();
        agent
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn launch(dir: &Path, metrics: String, host: Option<&NetHost>, extra: &[&str]) -> AgentProcess {
        let mut agent = AgentProcess::new(dir, metrics, host, extra);
        agent.spawn();
        agent
    }

    fn new(dir: &Path, metrics: String, host: Option<&NetHost>, extra: &[&str]) -> AgentProcess {
        std::fs::create_dir_all(dir).expect("agent dir");
        AgentProcess {
            child: None,
            dir: dir.to_path_buf(),
            socket: dir.join("agent.sock"),
            cache_dir: dir.join("cache"),
            metrics,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            host: host.cloned(),
            open_files: None,
            command: vec!["agent".into()],
        }
    }

    /// Starts `tessera store --root ROOT` (the agent run for the additional layer
    /// store) with `extra` agent flags, as [`start`](Self::start) starts an agent.
    pub fn start_store(dir: &Path, root: &Path, extra: &[&str]) -> AgentProcess {
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut agent = AgentProcess::new(dir, metrics, None, extra);
        agent.command = vec!["store".into(), "--root".into(), root.display().to_string()];
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .expect("agent log");
        let mut command = match (&self.host, self.open_files) {
            (Some(h), _) => h.command(env!("CARGO_BIN_EXE_tessera")),
            (None, Some(n)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_tessera"));
                c
            }
            (None, None) => tessera(),
        };
        let child = command
            .args(&self.command)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .arg("--metrics-listen")
            .arg(&self.metrics)
            .args(&self.extra)
            .env("DOCKER_CONFIG", &self.dir)
            .env_remove("TESSERA_CONFIG")
            .env("TESSERA_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start tessera agent");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "agent did not listen on {} within 20 s:\n{}",
            self.socket.display(),
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// `tessera CMD ARGS --socket S`, whatever its outcome.
    pub fn run(&self, args: &[&str]) -> Output {
        tessera()
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("run tessera")
    }

    /// Like [`run`](Self::run), panicking with the agent's log if it fails.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tessera {args:?} failed: {}\nstderr: {}\nagent log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        out
    }

    /// `tessera status --json`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_slice(&self.ok(&["status", "--json"]).stdout).expect("status JSON")
    }

    /// The Prometheus text of the metrics endpoint.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics).expect("connect to metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    /// Waits until `socket` (one of the agent's listeners) accepts connections; a killed
    /// agent leaves its socket files behind, so their presence says nothing.
    pub fn wait_for_socket(&self, socket: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the agent did not listen on {} within 20 s:\n{}",
                socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Seconds FUSE reads have waited for data so far
    /// (`tessera_agent_fuse_read_seconds_sum`).
    pub fn fuse_read_seconds(&self) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix("tessera_agent_fuse_read_seconds_sum "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Kills the agent with SIGKILL (a crash: mounts are left behind).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the agent again with the same files (after [`kill9`](Self::kill9) or a stop).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Sends `signal` (`"TERM"`, `"INT"`) and waits up to `within` for the agent to
    /// exit: its exit status, or `None` when it was still running (it is then killed).
    pub fn signal_and_wait(
        &mut self,
        signal: &str,
        within: Duration,
    ) -> Option<std::process::ExitStatus> {
        super::signal_and_wait(self.child.take()?, signal, within)
    }

    /// SIGTERM, and SIGKILL if it has not exited within 10 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
        // No panic, ever: a test whose agent panicked fails, whatever it asserted.
        let log = self.log();
        if log.contains("panicked at") && !std::thread::panicking() {
            panic!("the agent panicked:\n{log}");
        }
        // Whatever a failed test left mounted under this agent's dir.
        if let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") {
            for line in table.lines() {
                if let Some(mp) = line.split(' ').nth(4) {
                    if Path::new(mp).starts_with(&self.dir) {
                        let _ = Command::new("fusermount3").args(["-u", "-z", mp]).status();
                    }
                }
            }
        }
    }
}

/// Whether `path` is a mount point in this process's mount table.
pub fn is_mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy();
    table
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}
