//! A token issuer for a registry configured with `auth: token:`, implementing the
//! docker token protocol as distribution 2.8 and its clients speak it:
//!
//! - `GET /token?service=S&scope=repository:NAME:ACTIONS&scope=…` with basic
//!   credentials answers `{"token", "access_token", "expires_in", "issued_at"}`
//!   (<https://distribution.github.io/distribution/spec/auth/token/>);
//! - `POST /token` with a form, `grant_type=password` (`username`, `password`) or
//!   `grant_type=refresh_token` (`refresh_token` = the configured identity token),
//!   answers `{"access_token", "expires_in", "issued_at", "scope"}` (the OAuth2
//!   variant, `spec/auth/oauth.md`). No refresh token is ever handed out: tests
//!   configure the identity token they use.
//!
//! Wrong or missing credentials get 401 in both forms (OAuth2 says 400
//! `invalid_grant`; docker's own servers and clients treat it as 401). Every requested
//! action is granted once the credentials are right.
//!
//! Tokens are ES256 JWTs. The header carries the signing certificate as `x5c`, and that
//! self-signed certificate is the registry's `rootcertbundle`: distribution 2.8
//! (`registry/auth/token/token.go`, `VerifySigningKey`) accepts `x5c` chained to the
//! bundle or a `kid` naming a bundle key in libtrust's key-id format. `x5c` needs no
//! libtrust fingerprint code and is also what distribution 3 accepts.

use std::io;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use serde_json::json;

use super::http::{self, Request, Server};

/// The registry's `service`, the tokens' audience.
pub const SERVICE: &str = "tessera-test-registry";
/// The tokens' issuer, which the registry must trust.
pub const ISSUER: &str = "tessera-test-token-server";

/// distribution 2.8 accepts a token until 60 s after its `exp` (`token.Leeway`, for
/// clock skew). Tokens are issued with `exp` that much earlier, so that a token
/// configured to live 2 s is refused by the registry after 2 s, not 62.
const REGISTRY_LEEWAY_SECS: u64 = 60;

/// Who may get tokens, and for how long they are good.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    pub username: String,
    pub password: String,
    /// The refresh token accepted by `grant_type=refresh_token` (docker's
    /// `identitytoken`); `None` refuses that grant.
    pub identity_token: Option<String>,
    /// How long the registry accepts a token after it is issued (whole seconds), and the
    /// `expires_in` told to clients. Changeable later with
    /// [`TokenServer::set_lifetime`].
    pub lifetime: Duration,
}

impl TokenConfig {
    /// `username`/`password`, no identity token, tokens good for 5 minutes.
    pub fn new(username: &str, password: &str) -> TokenConfig {
        TokenConfig {
            username: username.to_string(),
            password: password.to_string(),
            identity_token: None,
            lifetime: Duration::from_secs(300),
        }
    }
}

/// A running token issuer on `127.0.0.1`; stops when dropped.
#[derive(Debug)]
pub struct TokenServer {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    issuer: Arc<Issuer>,
    _server: Server,
}

impl TokenServer {
    /// Generates a signing key and certificate and starts serving.
    pub fn start(config: TokenConfig) -> TokenServer {
        let issuer = Arc::new(Issuer::new(config));
        let server = {
            let issuer = Arc::clone(&issuer);
            Server::start("token-server", move |stream| issuer.serve(stream))
        };
        TokenServer {
            addr: server.addr.clone(),
            issuer,
            _server: server,
        }
    }

    /// The token endpoint, the registry's `realm`.
    pub fn realm(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// The signing certificate in PEM, the registry's `rootcertbundle`.
    pub fn root_cert_pem(&self) -> String {
        let b64 = STANDARD.encode(&self.issuer.cert_der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|l| std::str::from_utf8(l).expect("base64 is ASCII"))
            .collect();
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            lines.join("\n")
        )
    }

    /// Changes the lifetime of tokens issued from now on (e.g. long for a push, then
    /// short for the reads under test).
    pub fn set_lifetime(&self, lifetime: Duration) {
        lock(&self.issuer.config).lifetime = lifetime;
    }

    /// How many tokens have been issued, over both endpoints.
    pub fn tokens_issued(&self) -> usize {
        lock(&self.issuer.issued).len()
    }

    /// Every token issued so far, to check that none leaks into an error message.
    pub fn tokens(&self) -> Vec<String> {
        lock(&self.issuer.issued).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state shared by the connection threads.
#[derive(Debug)]
struct Issuer {
    config: Mutex<TokenConfig>,
    /// Signs tokens: ES256 wants the fixed-size `r || s` signature.
    key: EcdsaKeyPair,
    /// DER of the self-signed certificate of `key`.
    cert_der: Vec<u8>,
    rng: SystemRandom,
    /// Tokens in issue order; the index makes each `jti` unique.
    issued: Mutex<Vec<String>>,
}

/// What a request is granted as: the subject, and the scopes asked for.
struct Grant {
    subject: String,
    scopes: Vec<String>,
}

impl Issuer {
    fn new(config: TokenConfig) -> Issuer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate a P-256 key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("load the P-256 key");
        let cert_der = self_signed_certificate(pkcs8.as_ref(), &rng);
        Issuer {
            config: Mutex::new(config),
            key,
            cert_der,
            rng,
            issued: Mutex::new(Vec::new()),
        }
    }

    fn serve(&self, mut stream: TcpStream) -> io::Result<()> {
        let Some(req) = Request::read(&mut http::reader(&stream)?)? else {
            return Ok(());
        };
        let (status, body) = match (req.method.as_str(), req.path()) {
            ("GET", "/token") => self.docker_token(&req),
            ("POST", "/token") => self.oauth_token(&req),
            _ => (404, json!({"error": "not found"})),
        };
        let mut headers = vec![("Content-Type", "application/json")];
        if status == 401 {
            headers.push((
                "WWW-Authenticate",
                r#"Basic realm="tessera-test-token-server""#,
            ));
        }
        http::write_response(&mut stream, status, &headers, body.to_string().as_bytes())
    }

    /// `GET /token`: basic credentials, scopes as repeated `scope` parameters.
    fn docker_token(&self, req: &Request) -> (u16, serde_json::Value) {
        let params = req.query();
        if let Some(refused) = check_service(&params) {
            return refused;
        }
        let Some((user, password)) = req.header("authorization").and_then(basic_credentials) else {
            return unauthorized("credentials required");
        };
        let config = lock(&self.config).clone();
        if user != config.username || password != config.password {
            return unauthorized("incorrect username or password");
        }
        let grant = Grant {
            subject: user,
            scopes: scopes(&params),
        };
        let (token, expires_in, issued_at) = self.issue(&grant, config.lifetime);
        (
            200,
            json!({
                "token": token,
                "access_token": token,
                "expires_in": expires_in,
                "issued_at": issued_at,
            }),
        )
    }

    /// `POST /token`: the OAuth2 password and refresh-token grants.
    fn oauth_token(&self, req: &Request) -> (u16, serde_json::Value) {
        let params: Vec<(String, String)> =
            form_urlencoded::parse(&req.body).into_owned().collect();
        if let Some(refused) = check_service(&params) {
            return refused;
        }
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let config = lock(&self.config).clone();
        let subject = match param("grant_type") {
            Some("password")
                if param("username") == Some(config.username.as_str())
                    && param("password") == Some(config.password.as_str()) =>
            {
                config.username.clone()
            }
            Some("refresh_token")
                if param("refresh_token").is_some()
                    && param("refresh_token") == config.identity_token.as_deref() =>
            {
                config.username.clone()
            }
            Some("password" | "refresh_token") => return unauthorized("invalid grant"),
            other => {
                return (
                    400,
                    json!({"error": "unsupported_grant_type", "grant_type": other}),
                )
            }
        };
        let grant = Grant {
            subject,
            scopes: scopes(&params),
        };
        let (token, expires_in, issued_at) = self.issue(&grant, config.lifetime);
        (
            200,
            json!({
                "access_token": token,
                "expires_in": expires_in,
                "issued_at": issued_at,
                "scope": grant.scopes.join(" "),
            }),
        )
    }

    /// Signs a token for `grant`; returns it with `expires_in` and `issued_at`.
    fn issue(&self, grant: &Grant, lifetime: Duration) -> (String, u64, String) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let lifetime = lifetime.as_secs();
        let header = json!({
            "typ": "JWT",
            "alg": "ES256",
            "x5c": [STANDARD.encode(&self.cert_der)],
        });
        let mut issued = lock(&self.issued);
        let claims = json!({
            "iss": ISSUER,
            "sub": grant.subject,
            "aud": SERVICE,
            // May lie before `iat`: see REGISTRY_LEEWAY_SECS.
            "exp": (now + lifetime) as i64 - REGISTRY_LEEWAY_SECS as i64,
            "nbf": now,
            "iat": now,
            "jti": format!("tessera-test-{}", issued.len()),
            "access": grant.scopes.iter().filter_map(|s| access(s)).collect::<Vec<_>>(),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("sign a token");
        let token = format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        );
        issued.push(token.clone());
        (token, lifetime, rfc3339(now))
    }
}

/// A 400 if the client names a service other than ours (its challenge parsing is off).
fn check_service(params: &[(String, String)]) -> Option<(u16, serde_json::Value)> {
    let service = params.iter().find(|(k, _)| k == "service")?;
    (service.1 != SERVICE).then(|| {
        (
            400,
            json!({"error": "unknown service", "service": service.1}),
        )
    })
}

fn unauthorized(why: &str) -> (u16, serde_json::Value) {
    (401, json!({"error": "unauthorized", "details": why}))
}

/// `Basic base64(user:password)` → (user, password).
fn basic_credentials(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Every scope asked for: `scope` may repeat and each may hold several, space-separated.
fn scopes(params: &[(String, String)]) -> Vec<String> {
    params
        .iter()
        .filter(|(k, _)| k == "scope")
        .flat_map(|(_, v)| v.split_whitespace().map(String::from))
        .collect()
}

/// `repository:a/b:pull,push` → `{"type", "name", "actions"}`. The name is what lies
/// between the first and the last colon (a type may carry a class, as in
/// `repository(plugin)`, but never a colon).
fn access(scope: &str) -> Option<serde_json::Value> {
    let (kind, rest) = scope.split_once(':')?;
    let (name, actions) = rest.rsplit_once(':')?;
    let actions: Vec<&str> = actions.split(',').filter(|a| !a.is_empty()).collect();
    Some(json!({"type": kind, "name": name, "actions": actions}))
}

/// `2024-05-06T07:08:09Z` for seconds since the epoch (the token spec's `issued_at`;
/// containers/image refuses a token response whose `issued_at` does not parse).
fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------
// The signing certificate
// ---------------------------------------------------------------------------

/// `AlgorithmIdentifier` for ecdsa-with-SHA256 (1.2.840.10045.4.3.2), parameters absent.
const ECDSA_WITH_SHA256: &[u8] = &[
    0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02,
];
/// OID id-ecPublicKey (1.2.840.10045.2.1).
const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// OID prime256v1 (1.2.840.10045.3.1.7).
const PRIME256V1: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// OID commonName (2.5.4.3).
const COMMON_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];

/// A minimal self-signed X.509 v3 certificate (RFC 5280 §4.1) for the key in `pkcs8`:
/// the same name as issuer and subject, valid 2000–2049, no extensions. That is all Go's
/// `x509.Verify` needs to accept it as its own root, and ring cannot write certificates,
/// so a few lines of DER are cheaper than a certificate crate.
fn self_signed_certificate(pkcs8: &[u8], rng: &SystemRandom) -> Vec<u8> {
    // The same key, signing with the DER-encoded signatures certificates carry.
    let signer = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8, rng)
        .expect("load the P-256 key");
    let name = der(
        0x30,
        &der(
            0x31,
            &der(0x30, &[COMMON_NAME, &der(0x0c, ISSUER.as_bytes())].concat()),
        ),
    );
    let validity = der(
        0x30,
        &[der(0x17, b"000101000000Z"), der(0x17, b"491231235959Z")].concat(),
    );
    let public_key = [&[0u8][..], signer.public_key().as_ref()].concat();
    let spki = der(
        0x30,
        &[
            der(0x30, &[EC_PUBLIC_KEY, PRIME256V1].concat()),
            der(0x03, &public_key),
        ]
        .concat(),
    );
    let version_3 = der(0xa0, &der(0x02, &[2]));
    let serial = der(0x02, &[1]);
    let tbs = der(
        0x30,
        &[
            &version_3[..],
            &serial,
            ECDSA_WITH_SHA256,
            &name,
            &validity,
            &name,
            &spki,
        ]
        .concat(),
    );
    let signature = signer.sign(rng, &tbs).expect("sign the certificate");
    let signature_bits = [&[0u8][..], signature.as_ref()].concat();
    der(
        0x30,
        &[&tbs[..], ECDSA_WITH_SHA256, &der(0x03, &signature_bits)].concat(),
    )
}

/// One DER tag-length-value.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}
