//! The distribution client against real registries that authenticate (htpasswd basic
//! auth, bearer tokens from our own issuer) and through a proxy that injects the
//! failures of real networks: 5xx, 429, connections reset mid-body, slow bodies, tokens
//! rejected as expired. Secrets must never show up in an error.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::fault_proxy::{Fault, FaultProxy, Rule};
use support::oci::{self, BlobImage};
use support::registry::{Auth, Registry};
use support::token_server::TokenConfig;
use tessera_agent::registry::client::{ClientOptions, Credential, RegistryClient};
use tessera_agent::registry::reference::Reference;
use tessera_agent::Error;

const USER: &str = "tessera";
/// Distinctive, so that finding it in a message cannot be a coincidence.
const PASSWORD: &str = "pw-Zq8vX2-never-print-me";
const IDENTITY_TOKEN: &str = "refresh-Lk3mW9-never-print-me";
const REPO: &str = "test/app";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A registry authenticating as `auth`, holding a one-layer image whose layer is about
/// `layer_bytes` long, pushed by skopeo to [`REPO`]. The temp dir holds the layout.
fn registry_with_image(auth: Auth, layer_bytes: usize) -> (tempfile::TempDir, Registry, BlobImage) {
    let work = tempfile::tempdir().unwrap();
    let image = oci::build_blob_image(work.path(), layer_bytes);
    let registry = Registry::start_with(auth);
    registry.push_layout(&image.layout, &image.tag, REPO);
    (work, registry, image)
}

fn basic_auth() -> Auth {
    Auth::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    }
}

fn token_auth() -> Auth {
    Auth::Token(TokenConfig {
        identity_token: Some(IDENTITY_TOKEN.into()),
        ..TokenConfig::new(USER, PASSWORD)
    })
}

fn basic(password: &str) -> Credential {
    Credential::Basic {
        username: USER.into(),
        password: password.into(),
    }
}

/// A client that knows `credential` (if any) for `host`.
fn client(host: &str, credential: Option<Credential>) -> RegistryClient {
    RegistryClient::new(ClientOptions {
        credentials: credential
            .map(|c| HashMap::from([(host.to_string(), c)]))
            .unwrap_or_default(),
        ..ClientOptions::default()
    })
    .unwrap()
}

fn image_ref(host: &str, image: &BlobImage) -> Reference {
    Reference::parse(&format!("{host}/{REPO}:{}", image.tag)).unwrap()
}

/// Reads the manifest and the whole layer, checking both against the pushed image.
async fn pull(client: &RegistryClient, r: &Reference, image: &BlobImage) {
    let manifest = client.manifest(r).await.unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    assert_eq!(manifest["layers"][0]["digest"], image.layer_digest.as_str());
    let mut body = Vec::new();
    let len = client
        .blob(r, &image.layer_digest, &mut body)
        .await
        .unwrap();
    assert_eq!(len, image.layer.len() as u64);
    assert!(
        body == image.layer,
        "layer bytes differ from the pushed layer"
    );
}

/// Panics if the error, as shown to people or in debug logs, contains any secret.
fn assert_no_secret(e: &Error, secrets: &[String]) {
    for text in [e.to_string(), format!("{e:?}")] {
        for secret in secrets {
            assert!(!text.contains(secret.as_str()), "{text:?} leaks a secret");
        }
    }
}

fn assert_status(e: &Error, expected: u16) {
    assert!(
        matches!(e, Error::Status { status, .. } if *status == expected),
        "expected HTTP {expected}, got: {e}"
    );
}

#[test]
fn basic_auth_registry_serves_the_right_password_only() {
    let (_work, registry, image) = registry_with_image(basic_auth(), 64 << 10);
    assert_eq!(registry.creds(), Some((USER.into(), PASSWORD.into())));
    let r = image_ref(&registry.addr, &image);
    let rt = runtime();

    rt.block_on(pull(
        &client(&registry.addr, Some(basic(PASSWORD))),
        &r,
        &image,
    ));

    let wrong = "wrong-Hx7-password";
    let e = rt
        .block_on(client(&registry.addr, Some(basic(wrong))).manifest(&r))
        .unwrap_err();
    assert_status(&e, 401);
    assert!(e.to_string().contains("credentials"), "{e}");
    assert_no_secret(&e, &[wrong.into(), PASSWORD.into()]);

    // No credentials at all: refused without sending any.
    let e = rt
        .block_on(client(&registry.addr, None).manifest(&r))
        .unwrap_err();
    assert!(e.to_string().contains("credentials"), "{e}");
}

#[test]
fn token_auth_registry_serves_bearer_tokens_for_passwords_and_identity_tokens() {
    let (_work, registry, image) = registry_with_image(token_auth(), 64 << 10);
    let tokens = registry.token_server().unwrap();
    let r = image_ref(&registry.addr, &image);
    let rt = runtime();

    // Password: `GET /token` with basic credentials.
    let issued = tokens.tokens_issued();
    let by_password = client(&registry.addr, Some(basic(PASSWORD)));
    rt.block_on(pull(&by_password, &r, &image));
    assert!(tokens.tokens_issued() > issued, "no token was asked for");

    // Identity token: the OAuth2 refresh-token grant.
    let issued = tokens.tokens_issued();
    let by_identity = client(
        &registry.addr,
        Some(Credential::IdentityToken(IDENTITY_TOKEN.into())),
    );
    rt.block_on(pull(&by_identity, &r, &image));
    assert!(tokens.tokens_issued() > issued, "no token was asked for");

    // Refusals name the status; no secret is in them.
    let wrong = "wrong-Hx7-password";
    let e = rt
        .block_on(client(&registry.addr, Some(basic(wrong))).manifest(&r))
        .unwrap_err();
    assert_status(&e, 401);
    let wrong_identity = Credential::IdentityToken("refresh-wrong-Qp4".into());
    let e2 = rt
        .block_on(client(&registry.addr, Some(wrong_identity)).manifest(&r))
        .unwrap_err();
    assert_status(&e2, 401);
    // An error after a token was obtained (the tag does not exist).
    let missing = Reference::parse(&format!("{}/{REPO}:no-such-tag", registry.addr)).unwrap();
    let e3 = rt.block_on(by_password.manifest(&missing)).unwrap_err();
    assert_status(&e3, 404);
    let mut secrets = tokens.tokens();
    secrets.extend([wrong, "refresh-wrong-Qp4", PASSWORD, IDENTITY_TOKEN].map(String::from));
    for e in [e, e2, e3] {
        assert_no_secret(&e, &secrets);
    }
}

#[test]
fn tokens_expiring_during_a_pull_are_renewed() {
    let (_work, registry, image) = registry_with_image(token_auth(), 256 << 10);
    let tokens = registry.token_server().unwrap();
    // The push is done with long-lived tokens; from now on the registry accepts each
    // token for 2 s only (whatever the client believes about `expires_in`).
    tokens.set_lifetime(Duration::from_secs(2));
    let issued = tokens.tokens_issued();
    let r = image_ref(&registry.addr, &image);
    let client = client(&registry.addr, Some(basic(PASSWORD)));
    let start = Instant::now();
    runtime().block_on(async {
        client.manifest(&r).await.unwrap();
        let len = image.layer.len() as u64;
        for i in 0..8u64 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let range = i * len / 8..(i + 1) * len / 8;
            let part = client
                .blob_range(&r, &image.layer_digest, range.clone())
                .await
                .unwrap_or_else(|e| panic!("read {range:?} at {:?}: {e}", start.elapsed()));
            assert!(
                part == image.layer[range.start as usize..range.end as usize],
                "bytes {range:?} differ"
            );
        }
    });
    assert!(start.elapsed() > Duration::from_secs(3));
    let renewed = tokens.tokens_issued() - issued;
    assert!(
        renewed > 1,
        "{renewed} token(s) over 4 s of 2-second tokens"
    );
}

#[test]
fn server_errors_are_retried() {
    let (_work, registry, image) = registry_with_image(Auth::None, 64 << 10);
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::Status(500))
            .method("GET")
            .path("/manifests/")
            .times(2),
    );
    let r = image_ref(&proxy.addr, &image);
    runtime().block_on(pull(&client(&proxy.addr, None), &r, &image));
    let manifest_statuses: Vec<u16> = proxy
        .log()
        .iter()
        .filter(|l| l.target.contains("/manifests/"))
        .map(|l| l.status)
        .collect();
    assert_eq!(manifest_statuses, [500, 500, 200]);
}

#[test]
fn rate_limits_are_waited_out_as_retry_after_says() {
    let (_work, registry, image) = registry_with_image(Auth::None, 64 << 10);
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::TooManyRequests {
            retry_after_secs: 1,
        })
        .path("/blobs/"),
    );
    let r = image_ref(&proxy.addr, &image);
    let start = Instant::now();
    runtime().block_on(pull(&client(&proxy.addr, None), &r, &image));
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "Retry-After ignored"
    );
    let blob_statuses: Vec<u16> = proxy
        .log()
        .iter()
        .filter(|l| l.target.contains("/blobs/"))
        .map(|l| l.status)
        .collect();
    assert_eq!(blob_statuses, [429, 200]);
}

#[test]
fn a_blob_cut_off_by_a_connection_reset_is_resumed() {
    let (_work, registry, image) = registry_with_image(Auth::None, 1 << 20);
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::ResetMidBody)
            .method("GET")
            .path(&image.layer_digest),
    );
    let r = image_ref(&proxy.addr, &image);
    runtime().block_on(pull(&client(&proxy.addr, None), &r, &image));
    let log = proxy.log();
    let blob_gets: Vec<_> = log
        .iter()
        .filter(|l| l.method == "GET" && l.target.contains(&image.layer_digest))
        .collect();
    // Resumed from where the reset cut it, not downloaded again.
    assert_eq!(blob_gets.len(), 2, "{log:#?}");
    let resumed_from = blob_gets[1].range.as_deref().unwrap_or("none");
    assert!(
        resumed_from.starts_with("bytes=") && !resumed_from.starts_with("bytes=0-"),
        "resumed with Range {resumed_from}"
    );
}

/// A manifest cut off mid-body is asked for again (it is small: no Range resume), and
/// a reset that never stops ends in an error that says the connection was reset.
#[test]
fn a_manifest_cut_off_is_fetched_again_and_a_dead_link_says_why() {
    let (_work, registry, image) = registry_with_image(Auth::None, 4096);
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::ResetMidBody)
            .method("GET")
            .path("/manifests/"),
    );
    let r = image_ref(&proxy.addr, &image);
    runtime().block_on(pull(&client(&proxy.addr, None), &r, &image));
    let gets = proxy
        .log()
        .iter()
        .filter(|l| l.method == "GET" && l.target.contains("/manifests/"))
        .count();
    assert_eq!(gets, 2);

    proxy.inject(
        Rule::new(Fault::ResetMidBody)
            .method("GET")
            .path(&image.layer_digest)
            .times(100),
    );
    let client = RegistryClient::new(ClientOptions {
        retries: 2,
        ..ClientOptions::default()
    })
    .unwrap();
    let e = runtime()
        .block_on(client.blob(&r, &image.layer_digest, &mut Vec::new()))
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::Transport { .. })
            && text.contains(REPO)
            && text.contains(&image.layer_digest)
            && text.to_lowercase().contains("reset"),
        "{text}"
    );
}

#[test]
fn uploads_pass_through_the_proxy() {
    let work = tempfile::tempdir().unwrap();
    let image = oci::build_blob_image(work.path(), 64 << 10);
    let registry = Registry::start_with(basic_auth());
    let proxy = FaultProxy::start(&registry.addr);
    // skopeo uploads with POST, a chunked PATCH and PUT, and follows the `Location`s
    // the registry builds from `Host`: they must name the proxy.
    registry.push_layout_via(&proxy.addr, &image.layout, &image.tag, REPO);
    let log = proxy.log();
    for method in ["POST", "PATCH", "PUT"] {
        assert!(
            log.iter().any(|l| l.method == method && l.status < 300),
            "no successful {method}: {log:#?}"
        );
    }
    let r = image_ref(&proxy.addr, &image);
    runtime().block_on(pull(
        &client(&proxy.addr, Some(basic(PASSWORD))),
        &r,
        &image,
    ));
}

#[test]
fn a_slow_body_arrives_whole() {
    let (_work, registry, image) = registry_with_image(Auth::None, 32 << 10);
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::SlowBody {
            bytes_per_sec: 32 << 10,
        })
        .path(&image.layer_digest),
    );
    let r = image_ref(&proxy.addr, &image);
    let start = Instant::now();
    runtime().block_on(pull(&client(&proxy.addr, None), &r, &image));
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "the body was not slowed"
    );
}

#[test]
fn a_token_rejected_mid_pull_is_renewed_once() {
    let (_work, registry, image) = registry_with_image(token_auth(), 64 << 10);
    let tokens = registry.token_server().unwrap();
    let proxy = FaultProxy::start(&registry.addr);
    // Credentials go with the address the client talks to: the proxy's.
    let client = client(&proxy.addr, Some(basic(PASSWORD)));
    let r = image_ref(&proxy.addr, &image);
    let rt = runtime();
    rt.block_on(client.manifest(&r)).unwrap();
    let issued = tokens.tokens_issued();

    // The blob request carries a token the registry (says it) no longer accepts.
    proxy.inject(Rule::new(Fault::Unauthorized).path("/blobs/"));
    rt.block_on(pull(&client, &r, &image));
    assert_eq!(tokens.tokens_issued() - issued, 1, "one renewal");
    assert!(
        proxy
            .log()
            .iter()
            .any(|l| l.fault == Some(Fault::Unauthorized) && l.status == 401),
        "{:#?}",
        proxy.log()
    );

    // Refused again right after renewing: give up with the status, leaking nothing.
    proxy.inject(Rule::new(Fault::Unauthorized).path("/manifests/").times(2));
    let e = rt.block_on(client.manifest(&r)).unwrap_err();
    assert_status(&e, 401);
    let mut secrets = tokens.tokens();
    secrets.push(PASSWORD.into());
    assert_no_secret(&e, &secrets);
}
