//! The read side of the OCI distribution API: manifests, whole blobs and byte ranges of
//! blobs, with the authentication dance registries expect and retries for the failures
//! they produce. Everything downloaded by digest is verified against that digest.
//!
//! Written on reqwest rather than taken from `oci-client` because the agent needs what
//! that crate does not expose: Range reads that cope with servers answering 200,
//! streaming verification into any sink, and re-authentication in the middle of a pull
//! (the stalled-pull failure Nydus users report when a token expires).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, RANGE, WWW_AUTHENTICATE};
use reqwest::{Method, Response, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::reference::Reference;

/// Media types a manifest request accepts: OCI and Docker, single and multi-platform.
pub const MANIFEST_MEDIA_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// Largest manifest accepted (they are small JSON documents; this bounds a hostile one).
const MAX_MANIFEST: usize = 4 << 20;

/// Credentials for one registry. Never logged, never in errors, never sent elsewhere.
#[derive(Clone)]
pub enum Credential {
    Basic {
        username: String,
        password: String,
    },
    /// An OAuth2 refresh token (`identitytoken` in docker's config.json).
    IdentityToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::Basic { .. } => "Credential::Basic(<redacted>)",
            Credential::IdentityToken(_) => "Credential::IdentityToken(<redacted>)",
        })
    }
}

/// How the client behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Registries (`host[:port]`) spoken to over plain HTTP. `localhost` and 127.0.0.0/8
    /// always are, as Docker does.
    pub plain_http: Vec<String>,
    /// Credentials by registry host.
    pub credentials: HashMap<String, Credential>,
    /// Limit for one request, headers and body.
    pub timeout: Duration,
    /// Retries after a 5xx, a 429 or a connection error.
    pub retries: u32,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            plain_http: Vec::new(),
            credentials: HashMap::new(),
            timeout: Duration::from_secs(60),
            retries: 4,
        }
    }
}

/// What went wrong talking to a registry; every variant names the registry and
/// repository, none carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{registry}/{repository}: {what}: HTTP {status}{hint}")]
    Status {
        registry: String,
        repository: String,
        what: String,
        status: u16,
        hint: &'static str,
    },
    #[error("{registry}/{repository}: {what}: {reason}")]
    Transport {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
    #[error("{registry}/{repository}: {what}: digest mismatch: expected {expected}, got {actual}")]
    Digest {
        registry: String,
        repository: String,
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{registry}/{repository}: {what}: {reason}")]
    Protocol {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },
}

/// A manifest as the registry sent it, verified.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub media_type: String,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    pub bytes: Vec<u8>,
}

/// A bearer token and when to stop using it.
#[derive(Debug, Clone)]
struct Token {
    value: String,
    expires: Instant,
}

/// A distribution API client shared by every pull on the node.
#[derive(Debug)]
pub struct RegistryClient {
    http: reqwest::Client,
    opts: ClientOptions,
    /// Bearer tokens by (registry, scope).
    tokens: Mutex<HashMap<(String, String), Token>>,
}

/// The parts of a `WWW-Authenticate` challenge a client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub scheme: String,
    pub params: HashMap<String, String>,
}

/// Parses `Bearer realm="…",service="…",scope="…"` (or `Basic realm="…"`).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        params.insert(key.trim().to_ascii_lowercase(), value.to_string());
        rest = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

fn sha256_hex(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

impl RegistryClient {
    pub fn new(opts: ClientOptions) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(opts.timeout)
            .user_agent(concat!("tessera/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(RegistryClient {
            http,
            opts,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    /// Whether to speak plain HTTP to this registry.
    fn plain_http(&self, registry: &str) -> bool {
        let host = match registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => registry,
        };
        host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
            || self.opts.plain_http.iter().any(|r| r == registry)
    }

    fn url(&self, r: &Reference, tail: &str) -> String {
        let scheme = if self.plain_http(&r.registry) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{}/v2/{}/{tail}", r.api_host(), r.repository)
    }

    fn error(&self, r: &Reference, what: &str) -> impl Fn(String) -> RegistryError {
        let (registry, repository, what) =
            (r.registry.clone(), r.repository.clone(), what.to_string());
        move |reason| RegistryError::Transport {
            registry: registry.clone(),
            repository: repository.clone(),
            what: what.clone(),
            reason,
        }
    }

    fn status_error(r: &Reference, what: &str, status: StatusCode) -> RegistryError {
        let hint = match status.as_u16() {
            401 | 403 => {
                " (check the credentials for this registry, e.g. in ~/.docker/config.json)"
            }
            404 => " (the repository, tag or digest does not exist)",
            429 => " (rate limited; retries exhausted)",
            500..=599 => " (registry error; retries exhausted)",
            _ => "",
        };
        RegistryError::Status {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_string(),
            status: status.as_u16(),
            hint,
        }
    }

    fn cached_token(&self, registry: &str, scope: &str) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens
            .get(&(registry.to_string(), scope.to_string()))
            .filter(|t| t.expires > Instant::now())
            .map(|t| t.value.clone())
    }

    /// Answers a challenge: a bearer token from the realm, or basic credentials.
    async fn authenticate(
        &self,
        r: &Reference,
        challenge: &Challenge,
        scope: &str,
    ) -> Result<String, RegistryError> {
        let cred = self.opts.credentials.get(&r.registry);
        let err = self.error(r, "authenticate");
        if challenge.scheme == "basic" {
            return match cred {
                Some(Credential::Basic { username, password }) => {
                    use base64_encode as b64;
                    Ok(format!("Basic {}", b64(&format!("{username}:{password}"))))
                }
                _ => Err(err(
                    "the registry asks for basic credentials and none are configured".into(),
                )),
            };
        }
        let realm = challenge
            .params
            .get("realm")
            .ok_or_else(|| err("bearer challenge without a realm".into()))?;
        let mut req = self.http.get(realm);
        let mut query: Vec<(&str, &str)> = vec![("scope", scope)];
        if let Some(service) = challenge.params.get("service") {
            query.push(("service", service));
        }
        req = match cred {
            Some(Credential::Basic { username, password }) => {
                req.basic_auth(username, Some(password))
            }
            Some(Credential::IdentityToken(token)) => {
                // OAuth2 refresh-token grant, as docker does with identity tokens.
                let service = challenge.params.get("service").cloned().unwrap_or_default();
                self.http.post(realm).form(&[
                    ("grant_type", "refresh_token"),
                    ("refresh_token", token.as_str()),
                    ("service", service.as_str()),
                    ("scope", scope),
                    ("client_id", "tessera"),
                ])
            }
            None => req,
        };
        if !matches!(cred, Some(Credential::IdentityToken(_))) {
            req = req.query(&query);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| err(format!("token request failed: {}", e.without_url())))?;
        if !resp.status().is_success() {
            return Err(Self::status_error(r, "token request", resp.status()));
        }
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            token: Option<String>,
            access_token: Option<String>,
            expires_in: Option<u64>,
        }
        let body: TokenResponse = resp
            .json()
            .await
            .map_err(|e| err(format!("bad token response: {}", e.without_url())))?;
        let value = body
            .token
            .or(body.access_token)
            .ok_or_else(|| err("token response has no token".into()))?;
        // Spec default is 60 s; renew 10 s early so a request never carries a stale one.
        let life = Duration::from_secs(body.expires_in.unwrap_or(60).max(20) - 10);
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (r.registry.clone(), scope.to_string()),
                Token {
                    value: value.clone(),
                    expires: Instant::now() + life,
                },
            );
        Ok(format!("Bearer {value}"))
    }

    /// Sends a request with authentication and retries; returns the final response
    /// whatever its status (callers judge it).
    async fn send(
        &self,
        r: &Reference,
        method: Method,
        url: &str,
        headers: HeaderMap,
        what: &str,
    ) -> Result<Response, RegistryError> {
        let scope = format!("repository:{}:pull", r.repository);
        let err = self.error(r, what);
        let mut auth: Option<String> = self
            .cached_token(&r.registry, &scope)
            .map(|t| format!("Bearer {t}"));
        let mut authenticated_once = false;
        let mut attempt = 0u32;
        loop {
            let mut req = self
                .http
                .request(method.clone(), url)
                .headers(headers.clone());
            if let Some(a) = &auth {
                let mut v = HeaderValue::from_str(a)
                    .map_err(|_| err("credential is not a valid header value".into()))?;
                v.set_sensitive(true);
                req = req.header(AUTHORIZATION, v);
            }
            let backoff = |attempt: u32, retry_after: Option<Duration>| {
                let base = Duration::from_millis(100 * (1 << attempt.min(6)));
                // Jitter from the clock's nanoseconds: enough to spread a swarm's retries.
                let jitter = Duration::from_nanos(u64::from(
                    Instant::now().elapsed().subsec_nanos() % 100_000_000,
                ));
                retry_after
                    .unwrap_or(base + jitter)
                    .min(Duration::from_secs(30))
            };
            match req.send().await {
                Ok(resp) if resp.status() == StatusCode::UNAUTHORIZED && !authenticated_once => {
                    let challenge = resp
                        .headers()
                        .get(WWW_AUTHENTICATE)
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_challenge)
                        .ok_or_else(|| {
                            err("HTTP 401 without a usable WWW-Authenticate challenge".into())
                        })?;
                    // A 401 with a token in hand means it expired: forget it and ask again.
                    self.tokens
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&(r.registry.clone(), scope.clone()));
                    auth = Some(self.authenticate(r, &challenge, &scope).await?);
                    authenticated_once = true;
                }
                Ok(resp)
                    if (resp.status().is_server_error()
                        || resp.status() == StatusCode::TOO_MANY_REQUESTS)
                        && attempt < self.opts.retries =>
                {
                    let retry_after = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    tokio::time::sleep(backoff(attempt, retry_after)).await;
                    attempt += 1;
                }
                Ok(resp) => return Ok(resp),
                Err(e)
                    if (e.is_connect() || e.is_timeout() || e.is_request())
                        && attempt < self.opts.retries =>
                {
                    tokio::time::sleep(backoff(attempt, None)).await;
                    attempt += 1;
                }
                Err(e) => return Err(err(format!("request failed: {}", e.without_url()))),
            }
        }
    }

    /// Fetches the manifest (or index) a reference names, checking it against the
    /// reference's digest when pinned and against the registry's `Docker-Content-Digest`.
    pub async fn manifest(&self, r: &Reference) -> Result<Manifest, RegistryError> {
        let what = format!("manifest {}", r.object());
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(MANIFEST_MEDIA_TYPES));
        let url = self.url(r, &format!("manifests/{}", r.object()));
        let resp = self.send(r, Method::GET, &url, headers, &what).await?;
        if !resp.status().is_success() {
            return Err(Self::status_error(r, &what, resp.status()));
        }
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let media_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let bytes = read_bounded(resp, MAX_MANIFEST)
            .await
            .map_err(self.error(r, &what))?;
        let digest = sha256_hex(&bytes);
        let expected = r
            .digest
            .clone()
            .or(header_digest.filter(|d| d.starts_with("sha256:")));
        if let Some(expected) = expected {
            if expected != digest {
                return Err(RegistryError::Digest {
                    registry: r.registry.clone(),
                    repository: r.repository.clone(),
                    what,
                    expected,
                    actual: digest,
                });
            }
        }
        Ok(Manifest {
            media_type,
            digest,
            bytes,
        })
    }

    /// Streams a whole blob into `out`, verifying its sha256; returns its size. On a
    /// mismatch the caller must discard what was written.
    pub async fn blob(
        &self,
        r: &Reference,
        digest: &str,
        out: &mut (impl AsyncWrite + Unpin),
    ) -> Result<u64, RegistryError> {
        let what = format!("blob {digest}");
        let url = self.url(r, &format!("blobs/{digest}"));
        let mut resp = self
            .send(r, Method::GET, &url, HeaderMap::new(), &what)
            .await?;
        if !resp.status().is_success() {
            return Err(Self::status_error(r, &what, resp.status()));
        }
        let err = self.error(r, &what);
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| err(format!("read body: {}", e.without_url())))?
        {
            hasher.update(&chunk);
            len += chunk.len() as u64;
            out.write_all(&chunk)
                .await
                .map_err(|e| err(format!("write: {e}")))?;
        }
        out.flush().await.map_err(|e| err(format!("write: {e}")))?;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            return Err(RegistryError::Digest {
                registry: r.registry.clone(),
                repository: r.repository.clone(),
                what,
                expected: digest.to_string(),
                actual,
            });
        }
        Ok(len)
    }

    /// Reads bytes `range` of a blob with an HTTP Range request. A server that ignores
    /// Range and sends the whole blob (200) is handled by skipping to the range. The
    /// caller verifies the bytes (they are chunks with digests in the bootstrap).
    pub async fn blob_range(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
    ) -> Result<Vec<u8>, RegistryError> {
        let what = format!("blob {digest} bytes {}..{}", range.start, range.end);
        let proto = |reason: String| RegistryError::Protocol {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.clone(),
            reason,
        };
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let want = usize::try_from(range.end - range.start)
            .map_err(|_| proto("range too large".into()))?;
        let mut headers = HeaderMap::new();
        let value = format!("bytes={}-{}", range.start, range.end - 1);
        headers.insert(
            RANGE,
            HeaderValue::from_str(&value).map_err(|_| proto("bad range".into()))?,
        );
        let url = self.url(r, &format!("blobs/{digest}"));
        let mut resp = self.send(r, Method::GET, &url, headers, &what).await?;
        let err = self.error(r, &what);
        let mut out = Vec::with_capacity(want);
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => {
                while let Some(chunk) = resp
                    .chunk()
                    .await
                    .map_err(|e| err(format!("read body: {}", e.without_url())))?
                {
                    if out.len() + chunk.len() > want {
                        return Err(proto(format!(
                            "server sent more than the {want} bytes asked for"
                        )));
                    }
                    out.extend_from_slice(&chunk);
                }
            }
            StatusCode::OK => {
                // Whole body: skip to the range, keep `want` bytes, stop reading.
                let mut pos = 0u64;
                while let Some(chunk) = resp
                    .chunk()
                    .await
                    .map_err(|e| err(format!("read body: {}", e.without_url())))?
                {
                    let (start, end) = (pos, pos + chunk.len() as u64);
                    pos = end;
                    if end <= range.start {
                        continue;
                    }
                    let from = range.start.saturating_sub(start) as usize;
                    let to = (range.end.min(end) - start) as usize;
                    out.extend_from_slice(&chunk[from..to]);
                    if out.len() == want {
                        break;
                    }
                }
            }
            s => return Err(Self::status_error(r, &what, s)),
        }
        if out.len() != want {
            return Err(proto(format!("got {} bytes, asked for {want}", out.len())));
        }
        Ok(out)
    }

    /// The size of a blob, or `None` if the registry does not have it.
    pub async fn blob_size(
        &self,
        r: &Reference,
        digest: &str,
    ) -> Result<Option<u64>, RegistryError> {
        let what = format!("blob {digest} (HEAD)");
        let url = self.url(r, &format!("blobs/{digest}"));
        let resp = self
            .send(r, Method::HEAD, &url, HeaderMap::new(), &what)
            .await?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            // The header, not `content_length()`: a HEAD response's body is empty.
            s if s.is_success() => Ok(resp
                .headers()
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())),
            s => Err(Self::status_error(r, &what, s)),
        }
    }
}

/// Reads a body of at most `max` bytes.
async fn read_bounded(mut resp: Response, max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("read body: {}", e.without_url()))?
    {
        if out.len() + chunk.len() > max {
            return Err(format!("body larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Standard base64 (for basic credentials), kept here to avoid a dependency for 15 lines.
fn base64_encode(s: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let c = parse_challenge(r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#).unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example.com/token");
        assert_eq!(c.params["service"], "registry.example.com");
        assert_eq!(c.params["scope"], "repository:a/b:pull");
        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(c.scheme, "basic");
        let c = parse_challenge("Bearer realm=https://x/token, service=x").unwrap();
        assert_eq!(c.params["service"], "x");
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64_encode(plain), encoded);
        }
    }

    #[test]
    fn loopback_registries_use_plain_http() {
        let c = RegistryClient::new(ClientOptions {
            plain_http: vec!["insecure.example:5000".into()],
            ..ClientOptions::default()
        })
        .unwrap();
        for (reg, plain) in [
            ("127.0.0.1:5000", true),
            ("127.1.2.3", true),
            ("localhost:5000", true),
            ("[::1]:5000", true),
            ("insecure.example:5000", true),
            ("registry.example.com", false),
            ("10.0.0.1:5000", false),
        ] {
            assert_eq!(c.plain_http(reg), plain, "{reg}");
        }
    }

    #[test]
    fn credentials_do_not_print() {
        let c = Credential::Basic {
            username: "user".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
