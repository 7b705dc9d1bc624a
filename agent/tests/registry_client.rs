//! The distribution client against a real registry (Debian `docker-registry`) holding an
//! image pushed by skopeo: manifests by tag and digest, verified whole blobs, Range
//! reads, HEAD, pushes, and clear errors for what is missing or wrong.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use sha2::{Digest, Sha256};
use support::oci;
use support::registry::Registry;
use tessera_agent::registry::client::{ClientOptions, PushOutcome, RegistryClient};
use tessera_agent::registry::reference::Reference;
use tessera_agent::Error;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn reads_manifests_and_blobs_from_a_real_registry() {
    let t = tempfile::tempdir().unwrap();
    let image = oci::build_layered_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&image.layout, &image.tag, "test/app");
    let client = RegistryClient::new(ClientOptions::default()).unwrap();
    runtime().block_on(async {
        let by_tag =
            Reference::parse(&format!("{}/test/app:{}", registry.addr, image.tag)).unwrap();
        let m = client.manifest(&by_tag).await.unwrap();
        assert_eq!(m.media_type, "application/vnd.oci.image.manifest.v1+json");
        let manifest: serde_json::Value = serde_json::from_slice(&m.bytes).unwrap();
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), oci::LAYER_COUNT);

        // By digest: the same bytes, verified against the pinned digest.
        let by_digest =
            Reference::parse(&format!("{}/test/app@{}", registry.addr, m.digest)).unwrap();
        assert_eq!(client.manifest(&by_digest).await.unwrap().bytes, m.bytes);

        // Whole blob, verified, equal to the layout's file.
        let layer = &layers[0];
        let digest = layer["digest"].as_str().unwrap();
        let size = layer["size"].as_u64().unwrap();
        let mut body = Vec::new();
        assert_eq!(client.blob(&by_tag, digest, &mut body).await.unwrap(), size);
        let on_disk = std::fs::read(image.layout.join("blobs/sha256").join(&digest[7..])).unwrap();
        assert_eq!(body, on_disk);

        // Ranges: the start, the middle, the end.
        for range in [0..10, size / 3..size / 2, size - 7..size] {
            let part = client
                .blob_range(&by_tag, digest, range.clone())
                .await
                .unwrap();
            assert_eq!(
                part,
                on_disk[range.start as usize..range.end as usize],
                "{range:?}"
            );
        }
        assert_eq!(client.blob_size(&by_tag, digest).await.unwrap(), Some(size));
        let missing = format!("sha256:{}", "0".repeat(64));
        assert_eq!(client.blob_size(&by_tag, &missing).await.unwrap(), None);

        // Missing things say what and where.
        let nope = Reference::parse(&format!("{}/test/nope:v1", registry.addr)).unwrap();
        let e = client.manifest(&nope).await.unwrap_err();
        assert!(matches!(e, Error::Status { status: 404, .. }), "{e}");
        assert!(
            e.to_string().contains("test/nope") && e.to_string().contains("does not exist"),
            "{e}"
        );
        // With the registry's own words for it.
        assert!(e.to_string().contains("MANIFEST_UNKNOWN"), "{e}");

        // A digest that does not match what the registry serves is refused: ask for one
        // blob's bytes under another blob's digest name by pinning a wrong manifest digest.
        let wrong = Reference::parse(&format!("{}/test/app@{}", registry.addr, digest)).unwrap();
        let e = client.manifest(&wrong).await.unwrap_err();
        assert!(
            matches!(e, Error::Status { .. } | Error::Digest { .. }),
            "{e}"
        );
    });
}

#[test]
fn a_dead_registry_is_reported_after_retries() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = RegistryClient::new(ClientOptions {
        retries: 2,
        ..ClientOptions::default()
    })
    .unwrap();
    let r = Reference::parse(&format!("127.0.0.1:{port}/x/y:z")).unwrap();
    let e = runtime().block_on(client.manifest(&r)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("127.0.0.1:{port}/x/y")) && msg.contains("request failed"),
        "{msg}"
    );
}

/// One scripted response: status, extra headers (`{addr}` is replaced by the server's
/// address), body.
type Scripted = (u16, Vec<(&'static str, String)>, Vec<u8>);

/// A server that answers every request with the next scripted response (status, extra
/// headers, body) and closes the connection: for what real registries do not do on
/// demand — lie about digests, ignore Range, fail and recover.
fn scripted_server(script: Vec<Scripted>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let addr_for_thread = addr.clone();
    let handle = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for (status, headers, body) in script {
            let (mut stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            requests.push(head);
            let mut resp = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                let v = v.replace("{addr}", &addr_for_thread);
                resp.push_str(&format!("{k}: {v}\r\n"));
            }
            resp.push_str("\r\n");
            stream.write_all(resp.as_bytes()).unwrap();
            stream.write_all(&body).unwrap();
        }
        requests
    });
    (addr, handle)
}

#[test]
fn lying_servers_are_caught_and_flaky_ones_retried() {
    let client = RegistryClient::new(ClientOptions::default()).unwrap();
    let rt = runtime();
    // A manifest whose bytes do not match the digest the server claims.
    let (addr, server) = scripted_server(vec![(
        200,
        vec![(
            "Docker-Content-Digest",
            format!("sha256:{}", "1".repeat(64)),
        )],
        b"{}".to_vec(),
    )]);
    let r = Reference::parse(&format!("{addr}/a/b:t")).unwrap();
    let e = rt.block_on(client.manifest(&r)).unwrap_err();
    assert!(matches!(e, Error::Digest { .. }), "{e}");
    server.join().unwrap();

    // A blob whose bytes do not hash to its digest.
    let (addr, server) = scripted_server(vec![(200, vec![], b"not the blob".to_vec())]);
    let r = Reference::parse(&format!("{addr}/a/b:t")).unwrap();
    let mut sink = Vec::new();
    let e = rt
        .block_on(client.blob(&r, &format!("sha256:{}", "2".repeat(64)), &mut sink))
        .unwrap_err();
    assert!(matches!(e, Error::Digest { .. }), "{e}");
    server.join().unwrap();

    // 503 with Retry-After, then a server that ignores Range and sends the whole blob.
    let whole: Vec<u8> = (0..=255u8).collect();
    let (addr, server) = scripted_server(vec![
        (503, vec![("Retry-After", "0".into())], Vec::new()),
        (200, vec![], whole.clone()),
    ]);
    let r = Reference::parse(&format!("{addr}/a/b:t")).unwrap();
    let part = rt
        .block_on(client.blob_range(&r, &format!("sha256:{}", "3".repeat(64)), 100..110))
        .unwrap();
    assert_eq!(part, whole[100..110]);
    let requests = server.join().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1]
            .to_ascii_lowercase()
            .contains("range: bytes=100-109"),
        "{}",
        requests[1]
    );

    // Bearer auth: a 401 challenge, the token endpoint (anonymous, naming service and
    // scope), then the request again with the token.
    let (addr, server) = scripted_server(vec![
        (
            401,
            vec![(
                "WWW-Authenticate",
                r#"Bearer realm="http://{addr}/token",service="test""#.into(),
            )],
            Vec::new(),
        ),
        (
            200,
            vec![("Content-Type", "application/json".into())],
            br#"{"token":"t0k3n","expires_in":300}"#.to_vec(),
        ),
        (200, vec![], b"{}".to_vec()),
    ]);
    let r = Reference::parse(&format!("{addr}/a/b:t")).unwrap();
    rt.block_on(client.manifest(&r)).unwrap();
    let requests = server.join().unwrap();
    assert!(requests[1].starts_with("GET /token?"), "{}", requests[1]);
    assert!(
        requests[1].contains("scope=repository%3Aa%2Fb%3Apull")
            && requests[1].contains("service=test"),
        "{}",
        requests[1]
    );
    assert!(
        requests[2]
            .to_ascii_lowercase()
            .contains("authorization: bearer t0k3n"),
        "{}",
        requests[2]
    );
}

/// Pushes: chunked above the chunk size, in one request below it, skipped when the
/// repository has the blob, mounted across repositories; a manifest pushed last reads
/// back byte for byte.
#[test]
fn pushes_chunked_monolithic_existing_and_mounted_blobs() {
    let t = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let client = RegistryClient::new(ClientOptions {
        chunk_size: 1 << 20,
        ..ClientOptions::default()
    })
    .unwrap();
    let repo = Reference::parse(&format!("{}/push/one:v1", registry.addr)).unwrap();
    let other = Reference::parse(&format!("{}/push/two:v1", registry.addr)).unwrap();
    let big = oci::pseudo_random((3 << 20) + 12345, 7);
    let small = b"{\"small\": true}".to_vec();
    let digest = |b: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(b)));
    let (big_digest, small_digest) = (digest(&big), digest(&small));
    std::fs::write(t.path().join("big"), &big).unwrap();
    std::fs::write(t.path().join("small"), &small).unwrap();
    let sent = std::sync::atomic::AtomicU64::new(0);
    let progress = |n: u64| {
        sent.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    };
    runtime().block_on(async {
        let size = big.len() as u64;
        let outcome = client
            .push_blob(&repo, &big_digest, size, &t.path().join("big"), None, &progress)
            .await
            .unwrap();
        assert_eq!(outcome, PushOutcome::Uploaded { bytes: size });
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), size);
        let mut back = Vec::new();
        client.blob(&repo, &big_digest, &mut back).await.unwrap();
        assert!(back == big, "chunked upload changed the blob");

        let outcome = client
            .push_blob(&repo, &big_digest, size, &t.path().join("big"), None, &progress)
            .await
            .unwrap();
        assert_eq!(outcome, PushOutcome::Existed);

        let small_size = small.len() as u64;
        let outcome = client
            .push_blob(&repo, &small_digest, small_size, &t.path().join("small"), None, &progress)
            .await
            .unwrap();
        assert_eq!(outcome, PushOutcome::Uploaded { bytes: small_size });

        assert_eq!(client.blob_size(&other, &big_digest).await.unwrap(), None);
        assert!(client.mount_blob(&other, &big_digest, "push/one").await.unwrap());
        assert_eq!(client.blob_size(&other, &big_digest).await.unwrap(), Some(size));
        // A blob the source repository does not have cannot be mounted.
        let absent = format!("sha256:{}", "1".repeat(64));
        assert!(!client.mount_blob(&other, &absent, "push/one").await.unwrap());

        // A wrong digest is refused by the registry, not stored.
        let e = client
            .push_blob(&repo, &absent, small_size, &t.path().join("small"), None, &progress)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Status { status: 400, .. }), "{e}");

        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": small_digest, "size": small_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": big_digest, "size": size}],
        })
        .to_string()
        .into_bytes();
        let pushed = client
            .push_manifest(&repo, "application/vnd.oci.image.manifest.v1+json", manifest.clone())
            .await
            .unwrap();
        let fetched = client.manifest(&repo).await.unwrap();
        assert_eq!((fetched.digest, fetched.bytes), (pushed, manifest));
    });
}

/// Registries often answer blob GETs with a redirect to a storage backend (S3, a CDN):
/// followed, with the Range header kept, for whole blobs and for ranges.
#[test]
fn blob_reads_follow_redirects_to_storage() {
    let client = RegistryClient::new(ClientOptions::default()).unwrap();
    let rt = runtime();
    let whole: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&whole)));
    let redirect = (
        307,
        vec![(
            "Location",
            "http://{addr}/storage/blob?signature=x".to_string(),
        )],
        Vec::new(),
    );
    let (addr, server) = scripted_server(vec![
        redirect.clone(),
        (
            206,
            vec![("Content-Range", "bytes 10-19/1000".into())],
            whole[10..20].to_vec(),
        ),
        redirect,
        (200, vec![], whole.clone()),
    ]);
    let r = Reference::parse(&format!("{addr}/a/b:t")).unwrap();
    let part = rt.block_on(client.blob_range(&r, &digest, 10..20)).unwrap();
    assert_eq!(part, whole[10..20]);
    let mut body = Vec::new();
    rt.block_on(client.blob(&r, &digest, &mut body)).unwrap();
    assert!(body == whole);
    let requests = server.join().unwrap();
    assert!(
        requests[1].starts_with("GET /storage/blob?signature=x"),
        "{}",
        requests[1]
    );
    assert!(
        requests[1]
            .to_ascii_lowercase()
            .contains("range: bytes=10-19"),
        "{}",
        requests[1]
    );
}

/// OCI 1.1 referrers on distribution 2.8, which has no referrers API: an artifact
/// pushed about an image is found again by the image's manifest digest through the
/// referrers tag schema, filtered by artifact type, never listed twice, and the image
/// itself is left as it was.
#[test]
fn referrers_are_pushed_beside_an_image_and_found_by_its_digest() {
    use std::collections::BTreeMap;
    use tessera_agent::registry::referrers::{self, Artifact, Descriptor};

    let t = tempfile::tempdir().unwrap();
    let image = oci::build_layered_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&image.layout, &image.tag, "test/app");
    let client = RegistryClient::new(ClientOptions::default()).unwrap();
    runtime().block_on(async {
        let by_tag =
            Reference::parse(&format!("{}/test/app:{}", registry.addr, image.tag)).unwrap();
        let before = client.manifest(&by_tag).await.unwrap();
        let subject = Descriptor {
            media_type: before.media_type.clone(),
            digest: before.digest.clone(),
            size: before.bytes.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        };
        // The registry has no referrers API: the client says so rather than failing.
        assert!(client
            .referrers(&by_tag, &subject.digest)
            .await
            .unwrap()
            .is_none());
        assert!(referrers::list(&client, &by_tag, &subject.digest, None)
            .await
            .unwrap()
            .is_empty());

        let payload = b"an index of the image".to_vec();
        let payload_digest = format!("sha256:{}", hex::encode(Sha256::digest(&payload)));
        std::fs::write(t.path().join("payload"), &payload).unwrap();
        client
            .push_blob(
                &by_tag,
                &payload_digest,
                payload.len() as u64,
                &t.path().join("payload"),
                None,
                &|_| {},
            )
            .await
            .unwrap();
        let layer = Descriptor {
            media_type: "application/vnd.tessera.test.v1".into(),
            digest: payload_digest,
            size: payload.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        };
        let artifact = |kind: &'static str| Artifact {
            subject: &subject,
            artifact_type: kind,
            layers: std::slice::from_ref(&layer),
            annotations: BTreeMap::from([("org.example.kind".to_string(), kind.to_string())]),
        };
        let first = referrers::push(&client, &by_tag, &artifact("application/vnd.tessera.a"))
            .await
            .unwrap();
        let second = referrers::push(&client, &by_tag, &artifact("application/vnd.tessera.b"))
            .await
            .unwrap();
        // Pushing the same artifact again lists it once.
        let again = referrers::push(&client, &by_tag, &artifact("application/vnd.tessera.a"))
            .await
            .unwrap();
        assert_eq!(again, first);

        let all = referrers::list(&client, &by_tag, &subject.digest, None)
            .await
            .unwrap();
        assert_eq!(all, vec![first.clone(), second.clone()]);
        let only_a = referrers::list(
            &client,
            &by_tag,
            &subject.digest,
            Some("application/vnd.tessera.a"),
        )
        .await
        .unwrap();
        assert_eq!(only_a, vec![first.clone()]);

        // The artifact names the image as its subject; the image is unchanged.
        let pushed = client
            .manifest(
                &Reference::parse(&format!("{}/test/app@{}", registry.addr, first.digest)).unwrap(),
            )
            .await
            .unwrap();
        let pushed: serde_json::Value = serde_json::from_slice(&pushed.bytes).unwrap();
        assert_eq!(pushed["subject"]["digest"], subject.digest.as_str());
        assert_eq!(pushed["artifactType"], "application/vnd.tessera.a");
        assert_eq!(pushed["layers"][0]["digest"], layer.digest.as_str());
        assert_eq!(
            client.manifest(&by_tag).await.unwrap().digest,
            before.digest
        );

        // Another image has no referrers.
        let other = format!("sha256:{}", "0".repeat(64));
        assert!(referrers::list(&client, &by_tag, &other, None)
            .await
            .unwrap()
            .is_empty());
    });
}
