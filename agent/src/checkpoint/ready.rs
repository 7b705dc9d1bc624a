//! Readiness probes for `tessera checkpoint --boot` (a release's checkpoint made in CI:
//! boot the image, wait until the app is ready, checkpoint it, push): as Kubernetes'
//! probes, an HTTP GET that answers 2xx or 3xx, a TCP connect that succeeds, or a
//! command that exits 0, tried until one succeeds or the timeout passes.

use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between attempts.
const INTERVAL: Duration = Duration::from_millis(200);

/// When an app is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `http://HOST:PORT/PATH` answers a GET with 2xx or 3xx.
    Http(String),
    /// `tcp://HOST:PORT` accepts a connection.
    Tcp(String),
    /// `exec:COMMAND` (run by `sh -c` on the node) exits 0.
    Exec(String),
}

impl FromStr for Probe {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Probe, String> {
        if s.starts_with("http://") || s.starts_with("https://") {
            reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a URL: {e}"))?;
            Ok(Probe::Http(s.to_string()))
        } else if let Some(address) = s.strip_prefix("tcp://") {
            match address.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Probe::Tcp(address.to_string()))
                }
                _ => Err(format!("{s:?}: a TCP probe is tcp://HOST:PORT")),
            }
        } else if let Some(command) = s.strip_prefix("exec:") {
            if command.trim().is_empty() {
                return Err("exec: needs a command".into());
            }
            Ok(Probe::Exec(command.to_string()))
        } else {
            Err(format!(
                "{s:?}: a probe is http://HOST:PORT/PATH, tcp://HOST:PORT or exec:COMMAND"
            ))
        }
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Http(url) => write!(f, "{url}"),
            Probe::Tcp(address) => write!(f, "tcp://{address}"),
            Probe::Exec(command) => write!(f, "exec:{command}"),
        }
    }
}

/// When an app is ready: for `tessera checkpoint --boot`, to be checkpointed; for
/// `tessera run --record-working-set`, done with its first requests.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub probe: Probe,
    /// How long the app may take to become ready.
    pub timeout: Duration,
    /// Waited after the probe first succeeded: the app's own warm-up (caches it
    /// fills after answering) then lands in the checkpoint, or in the working set.
    pub settle: Duration,
}

impl Probe {
    /// One attempt: `Ok(())` when ready, else what the probe saw.
    async fn attempt(&self, http: &reqwest::Client) -> std::result::Result<(), String> {
        match self {
            Probe::Http(url) => {
                let answer = http.get(url).send().await.map_err(|e| e.to_string())?;
                let status = answer.status();
                if status.is_success() || status.is_redirection() {
                    Ok(())
                } else {
                    Err(format!("answered {status}"))
                }
            }
            Probe::Tcp(address) => {
                tokio::time::timeout(ATTEMPT_TIMEOUT, tokio::net::TcpStream::connect(address))
                    .await
                    .map_err(|_| "connect timed out".to_string())?
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Probe::Exec(command) => {
                let status = tokio::process::Command::new("sh")
                    .args(["-c", command])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .status();
                match tokio::time::timeout(ATTEMPT_TIMEOUT.max(Duration::from_secs(10)), status)
                    .await
                {
                    Ok(Ok(s)) if s.success() => Ok(()),
                    Ok(Ok(s)) => Err(format!("exited with {s}")),
                    Ok(Err(e)) => Err(format!("could not run: {e}")),
                    Err(_) => Err("did not finish".into()),
                }
            }
        }
    }

    /// Tries until ready (the time it took) or `timeout` passed (an error with the
    /// probe's last answer), checking `alive` between attempts: an app that died is
    /// not waited for.
    pub async fn wait(
        &self,
        timeout: Duration,
        mut alive: impl AsyncFnMut() -> std::result::Result<(), String>,
    ) -> Result<Duration> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|e| not_ready(self, format!("an HTTP client: {e}")))?;
        let started = Instant::now();
        loop {
            let last = match self.attempt(&http).await {
                Ok(()) => return Ok(started.elapsed()),
                Err(e) => e,
            };
            alive().await.map_err(|why| not_ready(self, why))?;
            if started.elapsed() >= timeout {
                return Err(not_ready(
                    self,
                    format!("not ready after {timeout:?}; the last attempt: {last}"),
                ));
            }
            tokio::time::sleep(INTERVAL).await;
        }
    }
}

fn not_ready(probe: &Probe, reason: String) -> Error {
    Error::NotReady {
        probe: probe.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_parsed_from_their_scheme() {
        assert_eq!(
            "http://127.0.0.1:8080/healthz".parse(),
            Ok(Probe::Http("http://127.0.0.1:8080/healthz".into()))
        );
        assert_eq!(
            "tcp://10.0.0.1:5432".parse(),
            Ok(Probe::Tcp("10.0.0.1:5432".into()))
        );
        assert_eq!(
            "exec:test -f /tmp/ready".parse(),
            Ok(Probe::Exec("test -f /tmp/ready".into()))
        );
        for bad in ["tcp://nohost", "tcp://:80", "exec: ", "ftp://x", "8080"] {
            assert!(bad.parse::<Probe>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_probe_waits_for_readiness_and_gives_up_on_a_dead_app() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let probe = Probe::Tcp(listener.local_addr().unwrap().to_string());
        let took = probe
            .wait(Duration::from_secs(5), async || Ok(()))
            .await
            .unwrap();
        assert!(took < Duration::from_secs(5));
        drop(listener);
        let dead = probe
            .wait(Duration::from_secs(60), async || {
                Err("the container exited".into())
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&dead, Error::NotReady { reason, .. } if reason.contains("exited")),
            "{dead:?}"
        );
        let exec = Probe::Exec("exit 3".into());
        let e = exec
            .wait(Duration::from_millis(300), async || Ok(()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("exited with"), "{e}");
    }
}
