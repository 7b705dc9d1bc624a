//! A real CNCF distribution registry (Debian `docker-registry`) on 127.0.0.1 with its
//! own storage in a temp dir, started per test and killed when dropped; open, behind
//! basic auth, or behind bearer tokens from a [`TokenServer`] of its own.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::NetHost;
use super::oci::{require_tool, run};
use super::token_server::{self, TokenConfig, TokenServer};

/// How the registry authenticates clients.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Anyone may pull and push.
    None,
    /// `auth: htpasswd:` with one user; the registry answers `Basic` challenges.
    Basic { username: String, password: String },
    /// `auth: token:` trusting a [`TokenServer`] started with this configuration; the
    /// registry answers `Bearer` challenges naming it.
    Token(TokenConfig),
}

#[derive(Debug)]
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The registry's stdout; its own log goes to `registry.err` beside it.
    pub log: PathBuf,
    /// User and password that pushes use, and that tests pass on to the client.
    creds: Option<(String, String)>,
    /// The issuer of [`Auth::Token`]; it lives as long as the registry.
    token_server: Option<TokenServer>,
    /// Config, storage, logs; removed after the registry is killed (fields drop after
    /// `Drop::drop` has run).
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry without authentication and waits until it listens.
    pub fn start() -> Registry {
        Registry::start_with(Auth::None)
    }

    /// Starts a registry authenticating as `auth` says and waits until it listens.
    pub fn start_with(auth: Auth) -> Registry {
        // A free port: bind port 0, note it, release it for the registry.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port")
            .port();
        Registry::launch(auth, format!("127.0.0.1:{port}"), None)
    }

    /// Starts an open registry on `host:5000` inside a cluster host's network
    /// namespace (reachable from the test process through the cluster's bridge).
    pub fn start_in(host: &NetHost) -> Registry {
        Registry::start_in_with(host, Auth::None)
    }

    /// [`start_in`](Self::start_in), authenticating as `auth` says.
    pub fn start_in_with(host: &NetHost, auth: Auth) -> Registry {
        Registry::launch(auth, format!("{}:5000", host.ip), Some(host))
    }

    fn launch(auth: Auth, addr: String, host: Option<&NetHost>) -> Registry {
        require_tool("docker-registry");
        let dir = tempfile::tempdir().expect("temp dir");
        let (auth_config, creds, token_server) = match auth {
            Auth::None => (String::new(), None, None),
            Auth::Basic { username, password } => {
                let htpasswd = dir.path().join("htpasswd");
                // Cost 4, bcrypt's minimum: the registry checks the password on every
                // request, and it accepts nothing but bcrypt.
                let hash = bcrypt::hash(&password, 4).expect("bcrypt");
                std::fs::write(&htpasswd, format!("{username}:{hash}\n")).expect("htpasswd");
                let config = format!(
                    "auth:\n  htpasswd:\n    realm: tessera-test\n    path: {}\n",
                    htpasswd.display()
                );
                (config, Some((username, password)), None)
            }
            Auth::Token(token_config) => {
                let creds = (token_config.username.clone(), token_config.password.clone());
                let server = TokenServer::start(token_config);
                let bundle = dir.path().join("token-root.pem");
                std::fs::write(&bundle, server.root_cert_pem()).expect("write root cert");
                let config = format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                    server.realm(),
                    token_server::SERVICE,
                    token_server::ISSUER,
                    bundle.display()
                );
                (config, Some(creds), Some(server))
            }
        };
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{auth_config}",
                dir.path().join("storage").display()
            ),
        )
        .expect("write registry config");
        let log = dir.path().join("registry.log");
        let mut command = match host {
            Some(h) => h.command("docker-registry"),
            None => Command::new("docker-registry"),
        };
        let child = command
            .args(["serve", config.to_str().expect("utf-8")])
            .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("registry.err")).expect("log"),
            ))
            .spawn()
            .expect("start docker-registry");
        let mut registry = Registry {
            child,
            addr,
            log,
            creds,
            token_server,
            dir,
        };
        registry.wait_ready();
        registry
    }

    /// Stops the registry (as an outage would): requests to it are refused from now on.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Body bytes the registry's access log says it sent for blob GETs answered with
    /// `status` (206: the Range requests chunks are fetched with).
    pub fn blob_bytes_sent(&self, status: u16) -> u64 {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                // `... "GET /v2/NAME/blobs/sha256:HEX HTTP/1.1" 206 BYTES "REFERER" "AGENT"`
                let (request, rest) = line.split_once("\" ")?;
                let request = request.rsplit_once('"')?.1;
                if !request.starts_with("GET ") || !request.contains("/blobs/") {
                    return None;
                }
                let mut fields = rest.split(' ');
                let code: u16 = fields.next()?.parse().ok()?;
                let bytes: u64 = fields.next()?.parse().ok()?;
                (code == status).then_some(bytes)
            })
            .sum()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(&self.addr).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "docker-registry exited ({status}) before listening:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "docker-registry did not listen on {} within 20 s:\n{}",
            self.addr,
            self.stderr()
        );
    }

    /// The registry's storage (`docker/registry/v2/…`): tests corrupt blobs here.
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the registry stores blob `digest` (`sha256:…`): tests corrupt it here.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The registry's own log so far (it logs to stderr).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.err")).unwrap_or_default()
    }

    /// The user and password of [`Auth::Basic`] or [`Auth::Token`].
    pub fn creds(&self) -> Option<(String, String)> {
        self.creds.clone()
    }

    /// The token issuer of an [`Auth::Token`] registry.
    pub fn token_server(&self) -> Option<&TokenServer> {
        self.token_server.as_ref()
    }

    /// Pushes `layout:tag` to `repo:tag` on this registry with skopeo, with the
    /// registry's credentials if it has any.
    pub fn push_layout(&self, layout: &Path, tag: &str, repo: &str) {
        self.push_layout_via(&self.addr, layout, tag, repo);
    }

    /// [`Registry::push_layout`] through `host` (`host:port`, e.g. a
    /// [`super::fault_proxy::FaultProxy`] in front of this registry).
    pub fn push_layout_via(&self, host: &str, layout: &Path, tag: &str, repo: &str) {
        require_tool("skopeo");
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--insecure-policy", "--dest-tls-verify=false"]);
        if let Some((username, password)) = &self.creds {
            cmd.arg(format!("--dest-creds={username}:{password}"));
        }
        run(cmd.args([
            &format!("oci:{}:{tag}", layout.display()),
            &format!("docker://{host}/{repo}:{tag}"),
        ]));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A registry client with default options (plain HTTP to 127.0.0.1 is allowed).
pub fn client() -> tessera_agent::registry::client::RegistryClient {
    tessera_agent::registry::client::RegistryClient::new(Default::default())
        .expect("a registry client")
}

/// Runs `f` to completion on a runtime of its own.
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}
