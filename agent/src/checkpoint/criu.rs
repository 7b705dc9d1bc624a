//! The `criu` binary as `tessera checkpoint` and `tessera restore` run it: its version,
//! a dump of a process tree, a detached restore. CRIU's own log goes to a work dir of
//! ours, never into the images dir (a dump's images become the checkpoint image; a
//! restore reads them from a read-only lazy mount).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// The flags every dump uses: a process tree started from a shell or in its own
/// session (`--shell-job`), and established TCP connections allowed in it
/// (`--tcp-established`; a restore closes them).
const DUMP_FLAGS: &[&str] = &["--shell-job", "--tcp-established"];

/// The flags every restore uses: the tree detached from `criu` once it runs, and the
/// connections that were established at the dump closed (the app reconnects), since a
/// clone must not resume another node's TCP streams. Listening sockets are restored.
const RESTORE_FLAGS: &[&str] = &["--shell-job", "--restore-detached", "--tcp-close"];

/// What to do when no usable CRIU is found, for every error that says so.
pub const CRIU_HINT: &str = "build CRIU 4.2.1 with `make criu-deps` (it lands in \
     target/tools/criu/criu) and pass it with --criu PATH; Debian bookworm's criu 3.17 \
     fails `criu check` on recent kernels";

/// The log of `criu lazy-pages`, in its work dir.
pub const LAZY_PAGES_LOG: &str = "lazy-pages.log";

/// A CRIU version, as `criu --version` prints it (`Version: 4.2.1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriuVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl CriuVersion {
    /// Parses `4.2.1` or `4.2` (patch 0).
    pub fn parse(s: &str) -> Option<CriuVersion> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        parts.next().is_none().then_some(CriuVersion {
            major,
            minor,
            patch,
        })
    }

    /// Whether a checkpoint dumped by `self` can be restored by `other`: CRIU's image
    /// format is kept within a minor series, so major and minor must be equal.
    pub fn restores_with(&self, other: &CriuVersion) -> bool {
        self.major == other.major && self.minor == other.minor
    }
}

impl std::fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One `criu` binary.
#[derive(Debug, Clone)]
pub struct Criu {
    pub path: PathBuf,
    /// Flags added to every dump and restore (`--ext-unix-sk`, `--tcp-established`…
    /// whatever the process tree needs beyond [`DUMP_FLAGS`] / [`RESTORE_FLAGS`]).
    pub extra_args: Vec<String>,
}

impl Criu {
    pub fn new(path: impl Into<PathBuf>) -> Criu {
        Criu {
            path: path.into(),
            extra_args: Vec::new(),
        }
    }

    /// `criu --version`, parsed.
    pub fn version(&self) -> Result<CriuVersion> {
        let out = Command::new(&self.path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Criu {
                action: "--version".into(),
                reason: format!("cannot run {}: {e}; {CRIU_HINT}", self.path.display()),
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("Version:"))
            .and_then(CriuVersion::parse)
            .ok_or_else(|| Error::Criu {
                action: "--version".into(),
                reason: format!(
                    "{} printed no version it could parse ({:?}); {CRIU_HINT}",
                    self.path.display(),
                    text.trim()
                ),
            })
    }

    /// Dumps process tree `pid` into `images` (an empty directory), CRIU's log in
    /// `work`. Without `leave_running` the tree is killed once dumped.
    pub fn dump(&self, pid: u32, images: &Path, work: &Path, leave_running: bool) -> Result<()> {
        let mut args: Vec<String> = vec!["dump".into(), "-t".into(), pid.to_string()];
        args.extend(DUMP_FLAGS.iter().map(|s| s.to_string()));
        if leave_running {
            args.push("--leave-running".into());
        }
        self.run("dump", args, images, work, "dump.log")
    }

    /// Restores the tree dumped in `images` (read only), detached; CRIU's log and the
    /// pid file in `work`. Returns the restored root process's pid.
    pub fn restore(&self, images: &Path, work: &Path) -> Result<u32> {
        let pidfile = work.join("restore.pid");
        let mut args: Vec<String> = vec!["restore".into()];
        args.extend(RESTORE_FLAGS.iter().map(|s| s.to_string()));
        args.push("--pidfile".into());
        args.push(pidfile.display().to_string());
        self.run("restore", args, images, work, "restore.log")?;
        let text = std::fs::read_to_string(&pidfile).map_err(|e| Error::io("read", &pidfile, e))?;
        text.trim().parse().map_err(|_| Error::Criu {
            action: "restore".into(),
            reason: format!("its pid file {} holds {text:?}", pidfile.display()),
        })
    }

    /// Starts `criu lazy-pages` on the images in `images`, listening in `work` (where
    /// the restoring CRIU, given `--lazy-pages` and the same work dir, finds it): it
    /// serves the restored tree's page faults from the images through userfaultfd and
    /// sends the pages nobody asked for after, then exits. Returns once it listens.
    /// With `log_faults` its log ([`LAZY_PAGES_LOG`] in `work`) names every fault.
    pub fn lazy_pages(&self, images: &Path, work: &Path, log_faults: bool) -> Result<LazyPages> {
        let socket = work.join("lazy-pages.socket");
        let log = work.join(LAZY_PAGES_LOG);
        let child = Command::new(&self.path)
            .arg("lazy-pages")
            .arg("-D")
            .arg(images)
            .arg("-W")
            .arg(work)
            // At its debug level it logs every page fault (`#PF at`): a working set's
            // record (`working_set`).
            .arg(if log_faults { "-v4" } else { "-v2" })
            .arg("-o")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::Criu {
                action: "lazy-pages".into(),
                reason: format!("could not run {}: {e}; {CRIU_HINT}", self.path.display()),
            })?;
        let mut daemon = LazyPages { child, log };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                return Err(Error::Criu {
                    action: "lazy-pages".into(),
                    reason: format!("it exited ({status}); its log: {}", daemon.log.display()),
                });
            }
            if std::time::Instant::now() >= deadline {
                daemon.stop();
                return Err(Error::Criu {
                    action: "lazy-pages".into(),
                    reason: format!(
                        "it did not listen within 10 s; its log: {}",
                        daemon.log.display()
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(daemon)
    }

    fn run(
        &self,
        action: &str,
        mut args: Vec<String>,
        images: &Path,
        work: &Path,
        log_name: &str,
    ) -> Result<()> {
        args.extend(["-D".into(), images.display().to_string()]);
        args.extend(["-W".into(), work.display().to_string()]);
        let log = work.join(log_name);
        args.extend(["-o".into(), log.display().to_string()]);
        args.extend(self.extra_args.iter().cloned());
        tracing::info!(criu = %self.path.display(), ?args, "running criu");
        let out = Command::new(&self.path)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Criu {
                action: action.into(),
                reason: format!("cannot run {}: {e}; {CRIU_HINT}", self.path.display()),
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Criu {
            action: action.into(),
            reason: format!(
                "{} {} failed ({}); the end of its log:\n{}",
                self.path.display(),
                args.join(" "),
                out.status,
                log_tail(&log, &out.stderr)
            ),
        })
    }
}

/// The lines of CRIU's log worth reading after a failure: its errors, else its last
/// lines (and its stderr, where a failure to start it is written).
fn log_tail(log: &Path, stderr: &[u8]) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("Error") || l.contains("error"))
        .collect();
    let pick = if errors.is_empty() { &lines } else { &errors };
    let mut tail: Vec<&str> = pick.iter().rev().take(12).rev().copied().collect();
    let stderr = String::from_utf8_lossy(stderr);
    tail.extend(stderr.lines().take(12));
    if tail.is_empty() {
        return "(CRIU logged nothing)".into();
    }
    tail.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare_by_major_minor() {
        let v = CriuVersion::parse("4.2.1").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (4, 2, 1));
        assert_eq!(CriuVersion::parse(" 3.17 ").unwrap().to_string(), "3.17.0");
        assert!(CriuVersion::parse("4").is_none());
        assert!(CriuVersion::parse("4.x.1").is_none());
        assert!(CriuVersion::parse("4.2.1.5").is_none());
        assert!(v.restores_with(&CriuVersion::parse("4.2.9").unwrap()));
        assert!(!v.restores_with(&CriuVersion::parse("4.1.1").unwrap()));
        assert!(!v.restores_with(&CriuVersion::parse("3.2.1").unwrap()));
    }

    #[test]
    fn a_missing_binary_is_a_criu_error_saying_what_to_do() {
        let e = Criu::new("/nonexistent/criu").version().unwrap_err();
        assert!(matches!(&e, Error::Criu { action, .. } if action == "--version"));
        assert!(e.to_string().contains("make criu-deps"), "{e}");
    }
}

/// A running `criu lazy-pages` ([`Criu::lazy_pages`]): the restored tree's memory
/// arrives through it, so the images it reads must stay until it exits. Killed when
/// dropped, if still running.
#[derive(Debug)]
pub struct LazyPages {
    child: std::process::Child,
    log: PathBuf,
}

impl LazyPages {
    /// Waits up to `limit` for it to exit, all pages sent: whether it did so cleanly
    /// (else it is killed, and the restored tree's unsent pages are lost to it).
    pub fn wait(&mut self, limit: std::time::Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(Error::Criu {
                        action: "lazy-pages".into(),
                        reason: format!("it exited ({status}); its log: {}", self.log.display()),
                    })
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(None) | Err(_) => {
                    self.stop();
                    return Err(Error::Criu {
                        action: "lazy-pages".into(),
                        reason: format!(
                            "it had not sent every page after {limit:?} and was stopped; its \
                             log: {}",
                            self.log.display()
                        ),
                    });
                }
            }
        }
    }

    /// Kills it if it still runs.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for LazyPages {
    fn drop(&mut self) {
        self.stop();
    }
}
