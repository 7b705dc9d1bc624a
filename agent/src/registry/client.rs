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
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use reqwest::header::{
    HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
    LOCATION, RANGE, WWW_AUTHENTICATE,
};
use reqwest::{Method, Response, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::reference::Reference;
use crate::Error;

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
    /// A bearer token sent to the registry as it is (CRI's `registry_token`).
    RegistryToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::Basic { .. } => "Credential::Basic(<redacted>)",
            Credential::IdentityToken(_) => "Credential::IdentityToken(<redacted>)",
            Credential::RegistryToken(_) => "Credential::RegistryToken(<redacted>)",
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
    /// Limit for a response's headers to arrive, and for each wait on its body: a
    /// stalled transfer fails after this long, a slow but moving one does not (a 5 GB
    /// blob has no sensible total limit).
    pub timeout: Duration,
    /// Retries after a 5xx, a 429 or a connection error.
    pub retries: u32,
    /// Blobs up to this size are uploaded in one request, larger ones in chunks of it.
    pub chunk_size: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            plain_http: Vec::new(),
            credentials: HashMap::new(),
            timeout: Duration::from_secs(60),
            retries: 4,
            chunk_size: 16 << 20,
        }
    }
}

/// A manifest as the registry sent it, verified.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub media_type: String,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    pub bytes: Vec<u8>,
}

/// An `Authorization` header value (`Bearer …` or `Basic …`) and when to stop using it.
#[derive(Clone)]
struct Token {
    value: String,
    expires: Instant,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("expires", &self.expires)
            .finish()
    }
}

/// A distribution API client shared by every pull on the node.
#[derive(Debug)]
pub struct RegistryClient {
    http: reqwest::Client,
    opts: ClientOptions,
    /// Credentials that pulls brought for one repository (the kubelet's pull secrets,
    /// through the CRI proxy), by (registry, repository): used for that repository's
    /// reads before the node's own, never for a forwarded request. Memory only.
    pull_credentials: Mutex<HashMap<(String, String), Credential>>,
    /// `Authorization` values by who obtained them, so requests after the first do not
    /// each start with a 401.
    tokens: Mutex<HashMap<TokenKey, Token>>,
    /// (registry, repository) pairs whose registry asked for credentials and got some
    /// (the node's or a pull's): their images are private, and the agent serves their
    /// chunks to peers only against a proof of access (`peer::access`).
    credentialed: Mutex<std::collections::HashSet<(String, String)>>,
}

/// What a cached `Authorization` value was obtained for: a registry, a scope, and
/// whether with a pull's credentials (a token one pull's credentials earned is never
/// used for a request that must go with the node's own or a mirror client's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TokenKey {
    registry: String,
    scope: String,
    pulled: bool,
}

/// Which credentials answer a request's challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// The node's own (`ClientOptions::credentials`).
    Node,
    /// A pull's, kept for the request's repository.
    Pulled,
}

/// The parts of a `WWW-Authenticate` challenge a client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: HashMap<String, String>,
}

/// Parses `Bearer realm="…",service="…",scope="…"` (or `Basic realm="…"`).
pub fn parse_challenge(header: &str) -> Option<Challenge> {
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

/// A reqwest error with its causes ("error decoding response body: connection reset by
/// peer"): reqwest's own message alone hides what happened. URLs are left out (they
/// are in the error's context already, and a presigned storage URL carries a secret).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" for url ({url})"), "");
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
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
            pull_credentials: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            credentialed: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// Whether the registry asked this client for credentials for `r`'s repository and
    /// was given some, since the client was made: then the repository is private to
    /// whoever holds them. (A registry that lets anyone pull never asks, or hands out
    /// an anonymous token; with credentials configured it gets them anyway, so an image
    /// it would give anyone may count as private too: the safe side.)
    pub fn used_credentials(&self, r: &Reference) -> bool {
        self.credentialed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(r.registry.clone(), r.repository.clone()))
    }

    /// Keeps `credential` for reads of `r`'s repository (a CRI pull's), replacing the
    /// one kept before, which is returned; tokens obtained for that repository are
    /// forgotten, so the next request authenticates with the new one.
    pub fn keep_pull_credential(
        &self,
        r: &Reference,
        credential: Option<Credential>,
    ) -> Option<Credential> {
        let key = (r.registry.clone(), r.repository.clone());
        let previous = {
            let mut kept = self
                .pull_credentials
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match credential {
                Some(c) => kept.insert(key, c),
                None => kept.remove(&key),
            }
        };
        let named = format!("repository:{}:", r.repository);
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| !(k.pulled && k.registry == r.registry && k.scope.contains(&named)));
        previous
    }

    /// The pulls' credentials kept, by (registry, repository): for the opt-in file
    /// that keeps them across a restart.
    pub fn pull_credentials(&self) -> Vec<((String, String), Credential)> {
        self.pull_credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect()
    }

    /// Whose credentials answer a request for `r`: a pull's kept for its repository,
    /// else the node's; a forwarded request only ever gets the node's.
    fn identity(&self, r: &Reference, forwarded: bool) -> Identity {
        let pulled = !forwarded
            && self
                .pull_credentials
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&(r.registry.clone(), r.repository.clone()));
        if pulled {
            Identity::Pulled
        } else {
            Identity::Node
        }
    }

    fn credential(&self, r: &Reference, identity: Identity) -> Option<Credential> {
        match identity {
            Identity::Node => self.opts.credentials.get(&r.registry).cloned(),
            Identity::Pulled => self
                .pull_credentials
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(r.registry.clone(), r.repository.clone()))
                .cloned(),
        }
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

    fn error(&self, r: &Reference, what: &str) -> impl Fn(String) -> Error {
        let (registry, repository, what) =
            (r.registry.clone(), r.repository.clone(), what.to_string());
        move |reason| Error::Transport {
            registry: registry.clone(),
            repository: repository.clone(),
            what: what.clone(),
            reason,
        }
    }

    /// The error for a response with a status that ends the operation, with what the
    /// registry said about it (the codes and messages of its error body).
    async fn failed(r: &Reference, what: &str, resp: Response) -> Error {
        let status = resp.status();
        let said = registry_says(resp).await;
        Self::status_error(r, what, status, said)
    }

    fn status_error(r: &Reference, what: &str, status: StatusCode, said: String) -> Error {
        let hint = match status.as_u16() {
            401 | 403 => {
                " (check the credentials for this registry, e.g. in ~/.docker/config.json)"
            }
            404 => " (the repository, tag or digest does not exist)",
            429 => " (rate limited; retries exhausted)",
            500..=599 => " (registry error; retries exhausted)",
            _ => "",
        };
        Error::Status {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_string(),
            status: status.as_u16(),
            said,
            hint,
        }
    }

    /// The `Authorization` value last obtained for this key, unless expired.
    fn cached_auth(&self, key: &TokenKey) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens
            .get(key)
            .filter(|t| t.expires > Instant::now())
            .map(|t| t.value.clone())
    }

    fn remember(&self, key: &TokenKey, value: &str, life: Duration) {
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                key.clone(),
                Token {
                    value: value.to_string(),
                    expires: Instant::now() + life,
                },
            );
    }

    fn token_key(r: &Reference, scope: &str, identity: Identity) -> TokenKey {
        TokenKey {
            registry: r.registry.clone(),
            scope: scope.to_string(),
            pulled: identity == Identity::Pulled,
        }
    }

    /// Answers a challenge with `identity`'s credentials: a bearer token from the
    /// realm, or basic credentials.
    async fn authenticate(
        &self,
        r: &Reference,
        challenge: &Challenge,
        scope: &str,
        identity: Identity,
    ) -> Result<String, Error> {
        let cred = self.credential(r, identity);
        let cred = cred.as_ref();
        if cred.is_some() {
            self.credentialed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((r.registry.clone(), r.repository.clone()));
        }
        let key = Self::token_key(r, scope, identity);
        let err = self.error(r, "authenticate");
        if let Some(Credential::RegistryToken(token)) = cred {
            // Sent as it is, whatever the challenge; it lasts as long as the pull's.
            let value = format!("Bearer {token}");
            self.remember(&key, &value, Duration::from_secs(3600));
            return Ok(value);
        }
        if challenge.scheme == "basic" {
            return match cred {
                Some(Credential::Basic { username, password }) => {
                    let value =
                        format!("Basic {}", BASE64.encode(format!("{username}:{password}")));
                    // Basic credentials do not expire; the hour only bounds the cache.
                    self.remember(&key, &value, Duration::from_secs(3600));
                    Ok(value)
                }
                _ => Err(err(
                    "the registry asks for basic credentials and none are configured \
                     (pass them with --creds/--src-creds/--dest-creds, or `docker login`)"
                        .into(),
                )),
            };
        }
        let realm = challenge
            .params
            .get("realm")
            .ok_or_else(|| err("bearer challenge without a realm".into()))?;
        let mut req = self.http.get(realm);
        // One `scope` parameter per scope, as docker sends them.
        let mut query: Vec<(&str, &str)> = scope.split(' ').map(|s| ("scope", s)).collect();
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
            Some(Credential::RegistryToken(_)) | None => req,
        };
        if !matches!(cred, Some(Credential::IdentityToken(_))) {
            req = req.query(&query);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| err(format!("token request failed: {}", describe(&e))))?;
        if !resp.status().is_success() {
            return Err(Self::status_error(
                r,
                "token request",
                resp.status(),
                String::new(),
            ));
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
            .map_err(|e| err(format!("bad token response: {}", describe(&e))))?;
        let value = body
            .token
            .or(body.access_token)
            .ok_or_else(|| err("token response has no token".into()))?;
        // Spec default is 60 s. Renew early so a request rarely carries a stale token:
        // 10 s early for ordinary lifetimes, a quarter early for very short ones.
        let secs = body.expires_in.unwrap_or(60).max(1);
        let life = if secs > 40 {
            Duration::from_secs(secs - 10)
        } else {
            Duration::from_millis(secs * 750)
        };
        let value = format!("Bearer {value}");
        self.remember(&key, &value, life);
        Ok(value)
    }

    /// Sends a request with authentication and retries; returns the final response
    /// whatever its status (callers judge it).
    async fn send(&self, r: &Reference, req: Request<'_>) -> Result<Response, Error> {
        let err = self.error(r, req.what);
        let node_credentials = self.opts.credentials.contains_key(&r.registry);
        let identity = self.identity(r, req.forwarded.is_some());
        let key = Self::token_key(r, &req.scope, identity);
        let mut auth: Option<String> = match &req.forwarded {
            Some(Some(client)) => Some(client.clone()),
            // A forwarded request without credentials may use the node's own, if any.
            Some(None) if !node_credentials => None,
            _ => self.cached_auth(&key),
        };
        let mut authenticated_once = false;
        let mut attempt = 0u32;
        loop {
            let mut builder = self
                .http
                .request(req.method.clone(), req.url.as_str())
                .headers(req.headers.clone());
            if let Some(body) = &req.body {
                // `Bytes` clones share the buffer, so a retry resends without copying.
                builder = builder.body(body.clone());
            }
            if let Some(a) = &auth {
                let mut v = HeaderValue::from_str(a)
                    .map_err(|_| err("credential is not a valid header value".into()))?;
                v.set_sensitive(true);
                builder = builder.header(AUTHORIZATION, v);
            }
            let sent = match tokio::time::timeout(self.opts.timeout, builder.send()).await {
                Ok(result) => result.map_err(Failure::Http),
                Err(_) => Err(Failure::HeadersTimedOut),
            };
            // A forwarded request's 401 goes back to its client (who answers the
            // challenge itself), unless the node's own credentials may answer it.
            let answer_401 = match &req.forwarded {
                None => true,
                Some(client) => client.is_none() && node_credentials,
            };
            match sent {
                Ok(resp)
                    if resp.status() == StatusCode::UNAUTHORIZED
                        && !authenticated_once
                        && answer_401 =>
                {
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
                        .remove(&key);
                    auth = Some(
                        self.authenticate(r, &challenge, &req.scope, identity)
                            .await?,
                    );
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
                    tracing::debug!(status = %resp.status(), attempt, what = req.what, "retrying");
                    tokio::time::sleep(backoff(attempt, retry_after)).await;
                    attempt += 1;
                }
                Ok(resp) => return Ok(resp),
                Err(e) if e.retriable() && attempt < self.opts.retries => {
                    tracing::debug!(error = %e, attempt, what = req.what, "retrying");
                    tokio::time::sleep(backoff(attempt, None)).await;
                    attempt += 1;
                }
                Err(e) => return Err(err(format!("request failed: {e}"))),
            }
        }
    }

    /// Sends a read request (`tail` after `/v2/<repository>/`) on behalf of a client
    /// that brings its own `Authorization` (the registry mirror), with this client's
    /// retries. The client's credentials are used as they are and a 401 comes back for
    /// the client to answer; only a client that sent none gets the node's credentials
    /// (when the node has some for this registry). The response is returned whatever its
    /// status.
    pub async fn forward(
        &self,
        r: &Reference,
        method: Method,
        tail: &str,
        headers: HeaderMap,
        client_auth: Option<String>,
    ) -> Result<Response, Error> {
        let what = format!("{method} {tail}");
        let url = self.url(r, tail);
        let mut req = Request::pull(r, method, url, &what).headers(headers);
        req.forwarded = Some(client_auth);
        self.send(r, req).await
    }

    /// Fetches the manifest (or index) a reference names, checking it against the
    /// reference's digest when pinned and against the registry's `Docker-Content-Digest`.
    pub async fn manifest(&self, r: &Reference) -> Result<Manifest, Error> {
        let mut attempt = 0;
        loop {
            match self.manifest_once(r).await {
                Err(Error::Transport { reason, .. })
                    if reason.starts_with(BODY_CUT) && attempt < self.opts.retries =>
                {
                    tracing::debug!(reason, "manifest body cut off; asking again");
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt, None)).await;
                }
                result => return result,
            }
        }
    }

    async fn manifest_once(&self, r: &Reference) -> Result<Manifest, Error> {
        let what = format!("manifest {}", r.object());
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(MANIFEST_MEDIA_TYPES));
        let url = self.url(r, &format!("manifests/{}", r.object()));
        let resp = self
            .send(
                r,
                Request::pull(r, Method::GET, url, &what).headers(headers),
            )
            .await?;
        if !resp.status().is_success() {
            return Err(Self::failed(r, &what, resp).await);
        }
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
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
                return Err(Error::Digest {
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

    /// The OCI 1.1 referrers API's index of the manifests whose `subject` is `subject`
    /// (`GET /v2/<name>/referrers/<digest>`), or `None` when the registry has no such
    /// API (404, as distribution 2.8 answers): then referrers are found through the
    /// referrers tag schema instead ([`super::referrers`]).
    pub async fn referrers(&self, r: &Reference, subject: &str) -> Result<Option<Manifest>, Error> {
        let what = format!("referrers of {subject}");
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.oci.image.index.v1+json"),
        );
        let url = self.url(r, &format!("referrers/{subject}"));
        let resp = self
            .send(
                r,
                Request::pull(r, Method::GET, url, &what).headers(headers),
            )
            .await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(Self::failed(r, &what, resp).await);
        }
        let bytes = read_bounded(resp, MAX_MANIFEST)
            .await
            .map_err(self.error(r, &what))?;
        Ok(Some(Manifest {
            media_type: "application/vnd.oci.image.index.v1+json".into(),
            digest: sha256_hex(&bytes),
            bytes,
        }))
    }

    /// Streams a whole blob into `out`, verifying its sha256; returns its size. A body
    /// cut off mid-way (a reset, a proxy timeout) is resumed with a Range request from
    /// where it stopped. On a mismatch the caller must discard what was written.
    pub async fn blob(
        &self,
        r: &Reference,
        digest: &str,
        out: &mut (impl AsyncWrite + Unpin),
    ) -> Result<u64, Error> {
        let what = format!("blob {digest}");
        let err = self.error(r, &what);
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        let mut resumes = 0u32;
        'request: loop {
            let mut headers = HeaderMap::new();
            if len > 0 {
                let range = HeaderValue::from_str(&format!("bytes={len}-"))
                    .map_err(|_| err("bad range".into()))?;
                headers.insert(RANGE, range);
            }
            let url = self.url(r, &format!("blobs/{digest}"));
            let mut resp = self
                .send(
                    r,
                    Request::pull(r, Method::GET, url, &what).headers(headers),
                )
                .await?;
            // Bytes of this response to skip: all we have when a resume got a whole body.
            let mut skip = match resp.status() {
                StatusCode::PARTIAL_CONTENT if len > 0 => 0,
                s if s.is_success() => len,
                _ => return Err(Self::failed(r, &what, resp).await),
            };
            loop {
                let chunk = match resp.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break 'request,
                    Err(e) if resumes < self.opts.retries => {
                        tracing::debug!(error = %describe(&e), at = len, what, "body cut off; resuming");
                        resumes += 1;
                        tokio::time::sleep(backoff(resumes, None)).await;
                        continue 'request;
                    }
                    Err(e) => return Err(err(format!("read body: {}", describe(&e)))),
                };
                let drop = skip.min(chunk.len() as u64) as usize;
                skip -= drop as u64;
                let chunk = &chunk[drop..];
                hasher.update(chunk);
                len += chunk.len() as u64;
                out.write_all(chunk)
                    .await
                    .map_err(|e| err(format!("write: {e}")))?;
            }
        }
        out.flush().await.map_err(|e| err(format!("write: {e}")))?;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            return Err(Error::Digest {
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
    /// Range and sends the whole blob (200) is handled by skipping to the range; a body
    /// cut off is asked for again. The caller verifies the bytes (they are chunks with
    /// digests in the bootstrap).
    pub async fn blob_range(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
    ) -> Result<Vec<u8>, Error> {
        self.blob_range_as(r, digest, range, None, &mut |_| {})
            .await
    }

    /// [`blob_range`](Self::blob_range), showing `arrived` the bytes received so far
    /// (from the range's start) each time more arrive, so a caller can use the front of
    /// a long range before its end is here. After a cut-off body is asked for again,
    /// `arrived` sees the range from its start again.
    pub async fn blob_range_streamed(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
        arrived: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<Vec<u8>, Error> {
        self.blob_range_as(r, digest, range, None, arrived).await
    }

    /// [`blob_range`](Self::blob_range) on behalf of a client with its own
    /// `Authorization` (see [`forward`](Self::forward)).
    pub async fn blob_range_forwarded(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
        client_auth: Option<String>,
    ) -> Result<Vec<u8>, Error> {
        self.blob_range_as(r, digest, range, Some(client_auth), &mut |_| {})
            .await
    }

    async fn blob_range_as(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
        forwarded: Option<Option<String>>,
        arrived: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<Vec<u8>, Error> {
        let what = format!("blob {digest} bytes {}..{}", range.start, range.end);
        let mut attempt = 0;
        loop {
            match self
                .blob_range_once(r, digest, range.clone(), &what, forwarded.clone(), arrived)
                .await
            {
                Err(Error::Transport { reason, .. })
                    if reason.starts_with(BODY_CUT) && attempt < self.opts.retries =>
                {
                    tracing::debug!(reason, what, "body cut off; asking again");
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt, None)).await;
                }
                result => return result,
            }
        }
    }

    async fn blob_range_once(
        &self,
        r: &Reference,
        digest: &str,
        range: Range<u64>,
        what: &str,
        forwarded: Option<Option<String>>,
        arrived: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<Vec<u8>, Error> {
        let proto = |reason: String| Error::Protocol {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_string(),
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
        let mut req = Request::pull(r, Method::GET, url, what).headers(headers);
        req.forwarded = forwarded;
        let mut resp = self.send(r, req).await?;
        let err = self.error(r, what);
        let body_err = |e: reqwest::Error| err(format!("{BODY_CUT}: {}", describe(&e)));
        let mut out = Vec::with_capacity(want);
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => {
                while let Some(chunk) = resp.chunk().await.map_err(body_err)? {
                    if out.len() + chunk.len() > want {
                        return Err(proto(format!(
                            "server sent more than the {want} bytes asked for"
                        )));
                    }
                    out.extend_from_slice(&chunk);
                    arrived(&out);
                }
            }
            StatusCode::OK => {
                // Whole body: skip to the range, keep `want` bytes, stop reading.
                let mut pos = 0u64;
                while let Some(chunk) = resp.chunk().await.map_err(body_err)? {
                    let (start, end) = (pos, pos + chunk.len() as u64);
                    pos = end;
                    if end <= range.start {
                        continue;
                    }
                    let from = range.start.saturating_sub(start) as usize;
                    let to = (range.end.min(end) - start) as usize;
                    out.extend_from_slice(&chunk[from..to]);
                    arrived(&out);
                    if out.len() == want {
                        break;
                    }
                }
            }
            _ => return Err(Self::failed(r, what, resp).await),
        }
        if out.len() != want {
            return Err(proto(format!("got {} bytes, asked for {want}", out.len())));
        }
        Ok(out)
    }

    /// The size of a blob, or `None` if the registry does not have it.
    pub async fn blob_size(&self, r: &Reference, digest: &str) -> Result<Option<u64>, Error> {
        self.head_blob(r, digest, Request::pull_scope(r)).await
    }

    async fn head_blob(
        &self,
        r: &Reference,
        digest: &str,
        scope: String,
    ) -> Result<Option<u64>, Error> {
        let what = format!("blob {digest} (HEAD)");
        let url = self.url(r, &format!("blobs/{digest}"));
        let req = Request::pull(r, Method::HEAD, url, &what).scope(scope);
        let resp = self.send(r, req).await?;
        match resp.status() {
            StatusCode::NOT_FOUND => Ok(None),
            // The header, not `content_length()`: a HEAD response's body is empty.
            s if s.is_success() => Ok(resp
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())),
            // A HEAD answer has no body to quote.
            s => Err(Self::status_error(r, &what, s, String::new())),
        }
    }

    /// Makes blob `digest` of repository `from` (same registry) part of `r`'s
    /// repository without sending its bytes: `true` if `r` has it afterwards. A
    /// registry that cannot mount opens an upload session instead; it is cancelled.
    pub async fn mount_blob(&self, r: &Reference, digest: &str, from: &str) -> Result<bool, Error> {
        let blob = BlobTarget {
            r,
            digest,
            scope: Request::push_scope(r, Some(from)),
            what: format!("mount blob {digest} from {from}"),
        };
        if self
            .head_blob(r, digest, blob.scope.clone())
            .await?
            .is_some()
        {
            return Ok(true);
        }
        match self.start_upload(&blob, Some(from)).await? {
            UploadStart::Mounted => Ok(true),
            UploadStart::Session(location) => {
                // Give the session back (best effort; the registry expires it anyway).
                let req = Request::pull(r, Method::DELETE, location.to_string(), &blob.what)
                    .scope(blob.scope.clone());
                let _ = self.send(r, req).await;
                Ok(false)
            }
        }
    }

    /// Pushes the blob in file `path` (`digest`, `size` bytes) to `r`'s repository:
    /// nothing if the repository already has it, a cross-repository mount from
    /// `mount_from` (a repository on the same registry) if that one has it, else an
    /// upload — in one request up to `ClientOptions::chunk_size`, in chunks above. A
    /// failed upload starts over (a registry may keep a half-received chunk), so a
    /// flaky connection costs time, never a corrupt blob: the registry checks the
    /// digest before it commits.
    pub async fn push_blob(
        &self,
        r: &Reference,
        digest: &str,
        size: u64,
        path: &Path,
        mount_from: Option<&str>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<PushOutcome, Error> {
        let blob = BlobTarget {
            r,
            digest,
            scope: Request::push_scope(r, mount_from),
            what: format!("push blob {digest}"),
        };
        if self
            .head_blob(r, digest, blob.scope.clone())
            .await?
            .is_some()
        {
            return Ok(PushOutcome::Existed);
        }
        let mut attempt = 0;
        loop {
            let result = match self.start_upload(&blob, mount_from).await {
                Ok(UploadStart::Mounted) => return Ok(PushOutcome::Mounted),
                Ok(UploadStart::Session(location)) => {
                    self.upload(&blob, location, size, path, progress).await
                }
                Err(e) => Err(e),
            };
            match result {
                Err(e) if attempt < self.opts.retries && upload_retriable(&e) => {
                    tracing::debug!(error = %e, attempt, "upload failed; starting over");
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt, None)).await;
                }
                Ok(()) => return Ok(PushOutcome::Uploaded { bytes: size }),
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens an upload session, or mounts the blob from `mount_from` if the registry can.
    async fn start_upload(
        &self,
        blob: &BlobTarget<'_>,
        mount_from: Option<&str>,
    ) -> Result<UploadStart, Error> {
        let (r, what) = (blob.r, blob.what.as_str());
        let mut start = reqwest::Url::parse(&self.url(r, "blobs/uploads/"))
            .map_err(|e| self.error(r, what)(format!("bad URL: {e}")))?;
        if let Some(from) = mount_from.filter(|from| *from != r.repository) {
            start
                .query_pairs_mut()
                .append_pair("mount", blob.digest)
                .append_pair("from", from);
        }
        let req = Request::pull(r, Method::POST, start.to_string(), what)
            .scope(blob.scope.clone())
            .body(Bytes::new());
        let resp = self.send(r, req).await?;
        match resp.status() {
            StatusCode::CREATED if mount_from.is_some() => Ok(UploadStart::Mounted),
            StatusCode::ACCEPTED => Ok(UploadStart::Session(self.location(r, &resp, what)?)),
            _ => Err(Self::failed(r, what, resp).await),
        }
    }

    /// Sends the file's bytes into an upload session and commits it under the digest.
    async fn upload(
        &self,
        blob: &BlobTarget<'_>,
        mut location: reqwest::Url,
        size: u64,
        path: &Path,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), Error> {
        let (r, what) = (blob.r, blob.what.as_str());
        let err = self.error(r, what);
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| err(format!("open {}: {e}", path.display())))?;
        let read_err = |e: std::io::Error| err(format!("read {}: {e}", path.display()));
        let mut sent = 0u64;
        let final_body = if size <= self.opts.chunk_size {
            // Monolithic: the whole blob in the closing PUT.
            let mut data = Vec::with_capacity(size as usize);
            file.read_to_end(&mut data).await.map_err(read_err)?;
            Bytes::from(data)
        } else {
            while sent < size {
                let n = self.opts.chunk_size.min(size - sent);
                let mut data = vec![0u8; n as usize];
                file.read_exact(&mut data).await.map_err(read_err)?;
                let mut headers = HeaderMap::new();
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                let range = format!("{sent}-{}", sent + n - 1);
                headers.insert(
                    CONTENT_RANGE,
                    HeaderValue::from_str(&range).map_err(|_| err("bad range".into()))?,
                );
                let req = Request::pull(r, Method::PATCH, location.to_string(), what)
                    .scope(blob.scope.clone())
                    .headers(headers)
                    .body(Bytes::from(data));
                let resp = self.send(r, req).await?;
                if resp.status() != StatusCode::ACCEPTED {
                    return Err(Self::failed(r, what, resp).await);
                }
                location = self.location(r, &resp, what)?;
                sent += n;
                progress(n);
            }
            Bytes::new()
        };
        let final_len = final_body.len() as u64;
        location
            .query_pairs_mut()
            .append_pair("digest", blob.digest);
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let req = Request::pull(r, Method::PUT, location.to_string(), what)
            .scope(blob.scope.clone())
            .headers(headers)
            .body(final_body);
        let resp = self.send(r, req).await?;
        if resp.status() != StatusCode::CREATED {
            return Err(Self::failed(r, what, resp).await);
        }
        progress(final_len);
        Ok(())
    }

    /// The upload URL a registry answered with (`Location` may be relative).
    fn location(&self, r: &Reference, resp: &Response, what: &str) -> Result<reqwest::Url, Error> {
        let proto = |reason: &str| Error::Protocol {
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            what: what.to_string(),
            reason: reason.to_string(),
        };
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| proto("upload response without a Location header"))?;
        resp.url()
            .join(location)
            .map_err(|_| proto("upload response with an unusable Location header"))
    }

    /// Pushes a manifest (or index) under `r`'s tag, or its digest if untagged; returns
    /// its digest. Callers push a manifest only after every blob it names.
    pub async fn push_manifest(
        &self,
        r: &Reference,
        media_type: &str,
        bytes: Vec<u8>,
    ) -> Result<String, Error> {
        let digest = sha256_hex(&bytes);
        let object = r.tag.clone().unwrap_or_else(|| digest.clone());
        let what = format!("push manifest {object}");
        let err = self.error(r, &what);
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(media_type).map_err(|_| err("bad media type".into()))?,
        );
        let url = self.url(r, &format!("manifests/{object}"));
        let req = Request::pull(r, Method::PUT, url, &what)
            .scope(Request::push_scope(r, None))
            .headers(headers)
            .body(Bytes::from(bytes));
        let resp = self.send(r, req).await?;
        if resp.status() != StatusCode::CREATED {
            return Err(Self::failed(r, &what, resp).await);
        }
        Ok(digest)
    }
}

/// How a blob push went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// The repository already had it.
    Existed,
    /// Linked from another repository of the registry; no bytes sent.
    Mounted,
    Uploaded {
        bytes: u64,
    },
}

/// The blob an upload or mount is about, with the token scope and the name errors use.
struct BlobTarget<'a> {
    r: &'a Reference,
    digest: &'a str,
    scope: String,
    what: String,
}

/// How a registry answered the start of an upload.
enum UploadStart {
    /// It linked the blob from the other repository: nothing to send.
    Mounted,
    /// An upload session, at this URL.
    Session(reqwest::Url),
}

/// Whether starting an upload over may help: connection trouble and server errors,
/// and the registry having lost or refused the upload session (404, 416).
fn upload_retriable(e: &Error) -> bool {
    match e {
        Error::Transport { .. } => true,
        Error::Status { status, .. } => matches!(status, 404 | 416 | 429 | 500..=599),
        _ => false,
    }
}

/// Why a request got no response.
enum Failure {
    Http(reqwest::Error),
    HeadersTimedOut,
}

impl Failure {
    fn retriable(&self) -> bool {
        match self {
            Failure::Http(e) => e.is_connect() || e.is_timeout() || e.is_request() || e.is_body(),
            Failure::HeadersTimedOut => true,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Http(e) => f.write_str(&describe(e)),
            Failure::HeadersTimedOut => f.write_str("no response within the timeout"),
        }
    }
}

/// Marks a transport error as a body cut off mid-way, which a new request can repair.
const BODY_CUT: &str = "body cut off";

/// Delay before retry `attempt`: exponential from 100 ms with jitter, or what the
/// server asked for, at most 30 s.
fn backoff(attempt: u32, retry_after: Option<Duration>) -> Duration {
    let base = Duration::from_millis(100 * (1 << attempt.min(6)));
    // Jitter from the clock's nanoseconds: enough to spread a swarm's retries.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = Duration::from_nanos(u64::from(nanos % 100_000_000));
    retry_after
        .unwrap_or(base + jitter)
        .min(Duration::from_secs(30))
}

/// One request as `send` makes it, with what it is for (errors name it) and the
/// token scope it needs.
#[derive(Debug)]
struct Request<'a> {
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Option<Bytes>,
    what: &'a str,
    /// Space-separated token scopes (`repository:NAME:ACTIONS`).
    scope: String,
    /// Sent on behalf of a client (the mirror): `Some` with the client's own
    /// `Authorization` value, if it sent one.
    forwarded: Option<Option<String>>,
}

impl<'a> Request<'a> {
    fn pull(r: &Reference, method: Method, url: String, what: &'a str) -> Self {
        Request {
            method,
            url,
            headers: HeaderMap::new(),
            body: None,
            what,
            scope: Self::pull_scope(r),
            forwarded: None,
        }
    }

    fn pull_scope(r: &Reference) -> String {
        format!("repository:{}:pull", r.repository)
    }

    /// Push access to `r`, plus pull access to the repository a blob is mounted from.
    fn push_scope(r: &Reference, mount_from: Option<&str>) -> String {
        let mut scope = format!("repository:{}:pull,push", r.repository);
        if let Some(from) = mount_from.filter(|from| *from != r.repository) {
            scope.push_str(&format!(" repository:{from}:pull"));
        }
        scope
    }

    fn headers(mut self, headers: HeaderMap) -> Self {
        self.headers = headers;
        self
    }

    fn body(mut self, body: Bytes) -> Self {
        self.body = Some(body);
        self
    }

    fn scope(mut self, scope: String) -> Self {
        self.scope = scope;
        self
    }
}

/// Reads a body of at most `max` bytes.
async fn read_bounded(mut resp: Response, max: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("{BODY_CUT}: {}", describe(&e)))?
    {
        if out.len() + chunk.len() > max {
            return Err(format!("body larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Error bodies read at most (they are a few hundred bytes).
const ERROR_BODY_LIMIT: usize = 8 << 10;
/// Characters of the registry's words kept in an error.
const SAID_LIMIT: usize = 300;

/// What the registry's error body says, as ` CODE: message; …` (the OCI distribution
/// spec's `{"errors": [{"code", "message"}]}`); empty if it is not that shape. Only
/// those two fields are kept: `detail` may quote the request back.
async fn registry_says(mut resp: Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        match tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    error_codes(&body)
}

fn error_codes(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Body {
        errors: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let Ok(parsed) = serde_json::from_slice::<Body>(body) else {
        return String::new();
    };
    let said: Vec<String> = parsed
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.code, e.message))
        .collect();
    if said.is_empty() {
        return String::new();
    }
    let mut text = format!(" {}", said.join("; "));
    if let Some((cut, _)) = text.char_indices().nth(SAID_LIMIT) {
        text.truncate(cut);
        text.push('…');
    }
    // One line, whatever the registry put in it.
    text.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_error_body_is_quoted_by_code_and_message_only() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"v9"}},{"code":"NAME_UNKNOWN","message":"repository name not known\nto registry"}]}"#;
        assert_eq!(
            error_codes(body),
            " MANIFEST_UNKNOWN: manifest unknown; NAME_UNKNOWN: repository name not knownto registry"
        );
        assert_eq!(error_codes(b"<html>404 page not found</html>"), "");
        assert_eq!(error_codes(br#"{"errors":[]}"#), "");
        let long = format!(
            r#"{{"errors":[{{"code":"X","message":"{}"}}]}}"#,
            "m".repeat(1000)
        );
        assert_eq!(error_codes(long.as_bytes()).chars().count(), SAID_LIMIT + 1);
    }

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
