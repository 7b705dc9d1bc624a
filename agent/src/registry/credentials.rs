//! Where registry credentials and per-registry settings come from: docker's
//! `config.json` (the file `docker login`, `skopeo login` and CI systems write) and the
//! `[registry]` section of Tessera's own config. Credentials are read here, handed to
//! the client, and go nowhere else.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::Deserialize;

use super::client::Credential;
use super::reference::DOCKER_HUB;
use crate::{Error, Result};

/// Registry settings shared by `tessera convert` and the agent (`[registry]` in
/// `agent.toml`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// Registries (`host[:port]`) spoken to over plain HTTP. Loopback registries
    /// always are.
    pub insecure: Vec<String>,
    /// A docker `config.json` to take credentials from (default: `$DOCKER_CONFIG/config.json`,
    /// else `~/.docker/config.json`).
    pub auth_file: Option<PathBuf>,
}

/// A config file with a `[registry]` section (the agent's `agent.toml`); other sections
/// belong to the agent and are ignored here.
pub fn load_registry_config(path: &Path) -> Result<RegistryConfig> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        registry: RegistryConfig,
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("read config", path, e))?;
    let file: File = toml::from_str(&text).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(file.registry)
}

/// docker's default credentials file, if there is a home to find it in.
pub fn default_auth_file() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The parts of docker's `config.json` that hold credentials.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
    /// A credential helper for every registry (`docker-credential-<name>`).
    #[serde(default)]
    creds_store: Option<String>,
    /// Credential helpers by registry.
    #[serde(default)]
    cred_helpers: HashMap<String, String>,
    #[serde(skip)]
    path: PathBuf,
}

impl std::fmt::Debug for DockerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Registries only: the entries are secrets.
        f.debug_struct("DockerConfig")
            .field("path", &self.path)
            .field("registries", &self.auths.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    /// base64 of `username:password`.
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    /// An OAuth2 refresh token, used instead of a password.
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The registry host a `config.json` key names: keys may be bare hosts or URLs
/// (`https://index.docker.io/v1/`), and Docker Hub goes by several names.
fn registry_of_key(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DOCKER_HUB,
        h => h,
    }
    .to_string()
}

impl DockerConfig {
    /// Reads a `config.json`; a missing file is an empty config (no credentials).
    pub fn load(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(Error::io("read credentials file", path, e)),
        };
        Self::parse(&text, path)
    }

    /// Parses a `config.json`'s text; `path` names it in errors.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Self> {
        // Only where, not serde's message: for a value of the wrong type it quotes the
        // value, which may be a password.
        let mut config: DockerConfig = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            reason: format!(
                "not a docker config: {:?} error at line {} column {}",
                e.classify(),
                e.line(),
                e.column()
            ),
        })?;
        config.path = path.to_path_buf();
        Ok(config)
    }

    /// The credential for `registry` (`host[:port]`, `docker.io` for Docker Hub):
    /// a credential helper if one is configured for it, else its `auths` entry.
    pub fn credential(&self, registry: &str) -> Result<Option<Credential>> {
        let bad = |reason: String| Error::Config {
            path: self.path.clone(),
            reason: format!("credentials for {registry}: {reason}"),
        };
        let helper = self
            .cred_helpers
            .iter()
            .find(|(k, _)| registry_of_key(k) == registry)
            .map(|(_, h)| h)
            .or(self.creds_store.as_ref());
        if let Some(helper) = helper {
            if let Some(c) = run_helper(helper, registry).map_err(bad)? {
                return Ok(Some(c));
            }
        }
        self.stored_credential(registry)
    }

    /// Every credential stored in `auths`, by registry (for the agent, which does not
    /// know in advance which registries it will pull from). Credential helpers are
    /// asked per registry by `credential` and are not included.
    pub fn all_credentials(&self) -> Result<HashMap<String, Credential>> {
        let mut out = HashMap::new();
        for key in self.auths.keys() {
            let registry = registry_of_key(key);
            if let Some(c) = self.stored_credential(&registry)? {
                out.insert(registry, c);
            }
        }
        Ok(out)
    }

    /// The credential stored in the `auths` entry for `registry`.
    pub fn stored_credential(&self, registry: &str) -> Result<Option<Credential>> {
        let bad = |reason: String| Error::Config {
            path: self.path.clone(),
            reason: format!("credentials for {registry}: {reason}"),
        };
        let Some(entry) = self
            .auths
            .iter()
            .find(|(k, _)| registry_of_key(k) == registry)
            .map(|(_, e)| e)
        else {
            return Ok(None);
        };
        if let Some(token) = entry.identitytoken.as_ref().filter(|t| !t.is_empty()) {
            return Ok(Some(Credential::IdentityToken(token.clone())));
        }
        if let Some(auth) = entry.auth.as_ref().filter(|a| !a.is_empty()) {
            let decoded = BASE64
                .decode(auth.trim())
                .map_err(|_| bad("`auth` is not base64".into()))?;
            let decoded =
                String::from_utf8(decoded).map_err(|_| bad("`auth` is not UTF-8".into()))?;
            let (username, password) = decoded
                .split_once(':')
                .ok_or_else(|| bad("`auth` is not base64 of username:password".into()))?;
            return Ok(Some(Credential::Basic {
                username: username.to_string(),
                password: password.to_string(),
            }));
        }
        match (&entry.username, &entry.password) {
            (Some(u), Some(p)) => Ok(Some(Credential::Basic {
                username: u.clone(),
                password: p.clone(),
            })),
            _ => Ok(None),
        }
    }
}

/// Asks `docker-credential-<helper>` for a registry's credential, as docker does: the
/// server URL on stdin, `{"Username", "Secret"}` on stdout; `<token>` as the username
/// means the secret is an identity token. A helper that knows no credential for the
/// registry fails with "credentials not found"; that is `None`, not an error.
fn run_helper(helper: &str, registry: &str) -> Result<Option<Credential>, String> {
    // A helper is a name, never a path: `docker-credential-../x` must not run `x`.
    if helper.is_empty()
        || !helper
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        || helper.contains("..")
    {
        return Err(format!(
            "credential helper name {helper:?} is not a plain name"
        ));
    }
    let program = format!("docker-credential-{helper}");
    let server = if registry == DOCKER_HUB {
        "https://index.docker.io/v1/"
    } else {
        registry
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("run credential helper {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(server.as_bytes())
            .map_err(|e| format!("write to {program}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("run {program}: {e}"))?;
    if !out.status.success() {
        return if String::from_utf8_lossy(&out.stdout).contains("credentials not found") {
            Ok(None)
        } else {
            Err(format!("{program} get failed ({})", out.status))
        };
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct HelperAnswer {
        username: String,
        secret: String,
    }
    let answer: HelperAnswer = serde_json::from_slice(&out.stdout)
        .map_err(|_| format!("{program} answered something other than its JSON"))?;
    Ok(Some(if answer.username == "<token>" {
        Credential::IdentityToken(answer.secret)
    } else {
        Credential::Basic {
            username: answer.username,
            password: answer.secret,
        }
    }))
}

/// `user:password` from a flag or environment variable (`--src-creds`, `TESSERA_SRC_CREDS`).
pub fn parse_user_password(s: &str) -> Result<Credential, String> {
    match s.split_once(':') {
        Some((u, p)) if !u.is_empty() => Ok(Credential::Basic {
            username: u.to_string(),
            password: p.to_string(),
        }),
        // Never echo the value: it holds a password.
        _ => Err("credentials must be USERNAME:PASSWORD".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> DockerConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, json).unwrap();
        DockerConfig::load(&path).unwrap()
    }

    fn basic(c: Option<Credential>) -> (String, String) {
        match c {
            Some(Credential::Basic { username, password }) => (username, password),
            other => panic!("expected basic credentials, got {other:?}"),
        }
    }

    #[test]
    fn auths_entries_in_every_spelling() {
        let c = config(
            r#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "aHViOmh1YnB3"},
                "registry.example.com:5000": {"username": "u", "password": "p:w"},
                "https://ghcr.example/v2/": {"auth": "Z2g6Z2hwdzp3aXRoOmNvbG9ucw=="},
                "tokens.example": {"auth": "", "identitytoken": "refresh-me"}
            }}"#,
        );
        assert_eq!(
            basic(c.credential("docker.io").unwrap()),
            ("hub".into(), "hubpw".into())
        );
        assert_eq!(
            basic(c.credential("registry.example.com:5000").unwrap()),
            ("u".into(), "p:w".into())
        );
        assert_eq!(
            basic(c.credential("ghcr.example").unwrap()),
            ("gh".into(), "ghpw:with:colons".into())
        );
        assert!(matches!(
            c.credential("tokens.example").unwrap(),
            Some(Credential::IdentityToken(t)) if t == "refresh-me"
        ));
        assert!(c.credential("elsewhere.example").unwrap().is_none());
    }

    #[test]
    fn bad_files_say_where_and_not_what() {
        let c = config(r#"{"auths": {"r.example": {"auth": "!!not base64 secret!!"}}}"#);
        let e = c.credential("r.example").unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("r.example"), "{e}");
        assert!(!e.contains("secret"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths": {"r": {"auth": "hunter2"#).unwrap();
        let e = DockerConfig::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("not a docker config") && !e.contains("hunter2"),
            "{e}"
        );

        std::fs::write(&path, r#"{"auths": {"r": "hunter2"}}"#).unwrap();
        let e = DockerConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("hunter2"), "{e}");

        let missing = DockerConfig::load(&dir.path().join("absent.json")).unwrap();
        assert!(missing.credential("r").unwrap().is_none());
    }

    #[test]
    fn registry_section_of_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "[registry]\ninsecure = [\"10.0.0.5:5000\"]\nauth_file = \"/etc/x.json\"\n[other]\nx = 1\n",
        )
        .unwrap();
        let c = load_registry_config(&path).unwrap();
        assert_eq!(c.insecure, ["10.0.0.5:5000"]);
        assert_eq!(c.auth_file.as_deref(), Some(Path::new("/etc/x.json")));
        std::fs::write(&path, "[registry]\ninsecur = []\n").unwrap();
        let e = load_registry_config(&path).unwrap_err().to_string();
        assert!(e.contains("insecur"), "{e}");
    }

    #[test]
    fn helpers_are_names_not_paths() {
        let c = config(r#"{"credsStore": "../../bin/true"}"#);
        let e = c.credential("r.example").unwrap_err().to_string();
        assert!(e.contains("not a plain name"), "{e}");
    }

    #[test]
    fn flag_credentials() {
        assert_eq!(
            basic(Some(parse_user_password("a:b:c").unwrap())),
            ("a".into(), "b:c".into())
        );
        let e = parse_user_password("nocolon-secret").unwrap_err();
        assert!(!e.contains("secret"));
    }
}
