//! The real `tessera-scheduler` binary in a cluster host's network namespace, killed
//! when dropped. It is another package's binary, so it is found beside `tessera` in the
//! same target directory (`cargo test --workspace` builds both).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::netns::NetHost;

pub struct SchedulerProcess {
    /// Behind a lock so a test can kill it while other threads use the cluster.
    child: Mutex<Option<Child>>,
    host: NetHost,
    args: Vec<String>,
    /// `http://IP:7080`, for `tessera agent --scheduler`.
    pub url: String,
    pub log: PathBuf,
}

/// The `tessera-scheduler` binary of this build.
pub fn binary() -> PathBuf {
    let path =
        std::path::Path::new(env!("CARGO_BIN_EXE_tessera")).with_file_name("tessera-scheduler");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p tessera-scheduler, or run the whole workspace's tests)",
        path.display()
    );
    path
}

impl SchedulerProcess {
    /// Starts the scheduler on `host.ip:7080` with `extra` flags; logs go to `log`.
    pub fn start_in(host: &NetHost, log: PathBuf, extra: &[&str]) -> SchedulerProcess {
        let mut s = SchedulerProcess {
            child: Mutex::new(None),
            host: host.clone(),
            args: extra.iter().map(|a| a.to_string()).collect(),
            url: format!("http://{}:7080", host.ip),
            log,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("scheduler log");
        let child = self
            .host
            .command(binary())
            .args(["--listen", &format!("{}:7080", self.host.ip)])
            .args(&self.args)
            .env("TESSERA_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start tessera-scheduler");
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let addr = format!("{}:7080", self.host.ip);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the scheduler did not listen on {addr}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits up to `within` for it to exit: its exit status, or
    /// `None` when it was still running (it is then killed).
    pub fn terminate(&self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        super::signal_and_wait(child, "TERM", within)
    }

    /// Kills it (SIGKILL): everything it knew is gone.
    pub fn kill9(&self) {
        let taken = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = taken {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Starts it again, empty, on the same address.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Starts it again with other flags (e.g. a certificate made for its address).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.args = extra.iter().map(|a| a.to_string()).collect();
        self.restart();
    }

    /// The address it listens on.
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.host.ip
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        self.kill9();
        // No panic, ever: a test whose scheduler panicked fails, whatever it asserted.
        let log = self.log_text();
        if log.contains("panicked at") && !std::thread::panicking() {
            panic!("the scheduler panicked:\n{log}");
        }
    }
}
