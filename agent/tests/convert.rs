//! `tessera convert` end to end against a real CNCF distribution registry: images
//! pushed by skopeo are converted, read back with `check --ref` and `unpack --ref`, and
//! compared with `umoci unpack` of the source; chunk dictionaries, multi-platform
//! indexes, authenticated registries and injected faults.
//!
//! Needs docker-registry, umoci, skopeo, GNU tar and setfattr (`make test-deps`).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::Path;
use std::process::Output;

use support::fault_proxy::{Fault, FaultProxy, Rule};
use support::fstree::{assert_trees_equal, CompareOptions};
use support::oci::{self, build_files_image, pseudo_random};
use support::registry::{block_on, client, Auth, Registry};
use support::token_server::TokenConfig;
use support::{s, tessera};
use tessera_agent::registry::reference::Reference;

/// Runs `tessera ARGS` isolated from this machine's credentials and config files.
fn run_tessera(home: &Path, args: &[&str]) -> Output {
    tessera()
        .args(args)
        .env("DOCKER_CONFIG", home)
        .env("TESSERA_CONFIG", home.join("agent.toml"))
        .env_remove("TESSERA_SRC_CREDS")
        .env_remove("TESSERA_DEST_CREDS")
        .env_remove("TESSERA_CREDS")
        .output()
        .expect("run tessera")
}

fn ok(home: &Path, args: &[&str]) -> Output {
    let out = run_tessera(home, args);
    assert!(
        out.status.success(),
        "tessera {args:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `tessera convert --json SRC DST ARGS`, parsed.
fn convert(home: &Path, src: &str, dst: &str, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["convert", "--json", src, dst];
    full.extend_from_slice(args);
    serde_json::from_slice(&ok(home, &full).stdout).expect("convert --json prints JSON")
}

/// A home with an empty agent.toml, so no machine-wide setting leaks into a test.
fn home(t: &Path) -> std::path::PathBuf {
    let home = t.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("agent.toml"), "").unwrap();
    home
}

/// A manifest (or index) from the registry, parsed, with its digest.
fn get_manifest(reference: &str) -> (serde_json::Value, String) {
    let r = Reference::parse(reference).unwrap();
    let m = block_on(client().manifest(&r)).unwrap();
    (serde_json::from_slice(&m.bytes).unwrap(), m.digest)
}

/// A JSON blob (an image config) from the registry.
fn json_blob(reference: &str, digest: &str) -> serde_json::Value {
    let r = Reference::parse(reference).unwrap();
    let mut bytes = Vec::new();
    block_on(client().blob(&r, digest, &mut bytes)).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The multi-layer image (deletions, opaque dirs, long names, xattrs, hardlinks)
/// pushed by skopeo converts into an image whose `check --ref` passes and whose
/// `unpack --ref` equals `umoci unpack` of the source; the pushed manifest carries
/// the media types, annotations and config the format spec promises.
#[test]
fn converted_image_unpacks_like_umoci() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let image = oci::build_layered_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&image.layout, &image.tag, "src/app");
    let src = format!("{}/src/app:{}", registry.addr, image.tag);
    let dst = format!("{}/tessera/app:v1", registry.addr);

    let summary = convert(&home, &src, &dst, &[]);
    assert!(summary["pushed_bytes"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["images"].as_array().unwrap().len(), 1);

    let report = ok(&home, &["check", "--json", "--ref", &dst]);
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert!(report["chunks_verified"].as_u64().unwrap() > 0, "{report}");
    assert!(report["blobs_verified"].as_u64().unwrap() >= 1, "{report}");

    let out = t.path().join("out");
    ok(&home, &["unpack", "--ref", &dst, "--to", s(&out)]);
    let reference = oci::umoci_unpack_rootfs(&image.layout, &image.tag, &t.path().join("ref"));
    assert_trees_equal(&reference, &out, &CompareOptions::default());

    let listing = ok(&home, &["inspect", "--ref", &dst]);
    assert!(String::from_utf8_lossy(&listing.stdout).contains(oci::LONG_FILE));

    // The manifest: blobs then the bootstrap, typed and annotated; the source's config
    // kept with diff_ids naming the new layers.
    let (manifest, _) = get_manifest(&dst);
    let layers = manifest["layers"].as_array().unwrap();
    let bootstrap = layers.last().unwrap();
    assert_eq!(
        bootstrap["mediaType"],
        "application/vnd.oci.image.layer.tessera.bootstrap.v1+zstd"
    );
    assert_eq!(
        bootstrap["annotations"]["io.tessera.rafs.bootstrap"],
        "true"
    );
    let (source_manifest, source_digest) = get_manifest(&src);
    assert_eq!(
        bootstrap["annotations"]["io.tessera.source.digest"],
        source_digest.as_str()
    );
    assert_eq!(
        manifest["annotations"]["io.tessera.source.ref"],
        src.as_str()
    );
    for blob in &layers[..layers.len() - 1] {
        assert_eq!(
            blob["mediaType"],
            "application/vnd.oci.image.layer.tessera.blob.v1"
        );
    }
    let config = json_blob(&dst, manifest["config"]["digest"].as_str().unwrap());
    let source_config = json_blob(&src, source_manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["config"], source_config["config"]);
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().unwrap().len(),
        layers.len()
    );
}

/// The next version of an image converted with `--chunk-dict` (the previous version's
/// conversion) pushes only the chunks it does not share: its new file, the bootstrap
/// and the config — asserted in bytes — and still checks and unpacks whole.
#[test]
fn chunk_dict_pushes_only_new_chunks() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let registry = Registry::start();
    let base = pseudo_random(6 << 20, 1);
    let update = pseudo_random(1 << 20, 2);
    let v1 = t.path().join("v1");
    build_files_image(&v1, "amd64", &[vec![("opt/base.bin", base.clone())]]);
    let v2 = t.path().join("v2");
    build_files_image(
        &v2,
        "amd64",
        &[
            vec![("opt/base.bin", base.clone())],
            vec![("opt/update.bin", update.clone())],
        ],
    );
    registry.push_layout(&v1, oci::TAG, "src/app-v1");
    registry.push_layout(&v2, oci::TAG, "src/app-v2");
    let a = registry.addr.clone();
    let tess_v1 = format!("{a}/tessera/app:v1");
    let tess_v2 = format!("{a}/tessera/app:v2");
    let first = convert(&home, &format!("{a}/src/app-v1:v1"), &tess_v1, &[]);
    let second = convert(
        &home,
        &format!("{a}/src/app-v2:v1"),
        &tess_v2,
        &["--chunk-dict", &tess_v1],
    );
    let image = &second["images"][0];
    let build = &image["build"];
    // Every chunk of base.bin comes from the dictionary; update.bin's are new.
    assert_eq!(build["dict_chunks"].as_u64().unwrap(), 6, "{second}");
    let new_blob = build["new_blob"]["size"].as_u64().unwrap();
    // Random data does not compress: the new blob is update.bin and nothing else.
    assert!(
        new_blob >= update.len() as u64 && new_blob < update.len() as u64 + 4096,
        "new blob is {new_blob} bytes for a {}-byte update",
        update.len()
    );
    let (manifest, _) = get_manifest(&tess_v2);
    let bootstrap_layer = manifest["layers"].as_array().unwrap().last().unwrap()["size"]
        .as_u64()
        .unwrap();
    let config = manifest["config"]["size"].as_u64().unwrap();
    let pushed = second["pushed_bytes"].as_u64().unwrap();
    assert_eq!(
        pushed,
        new_blob + bootstrap_layer + config,
        "pushed more than the new chunks, the bootstrap and the config: {second}"
    );
    // The old blob was already in the repository: reused, not sent.
    let old_blob = first["images"][0]["build"]["new_blob"]["size"]
        .as_u64()
        .unwrap();
    assert_eq!(
        second["reused_bytes"].as_u64().unwrap(),
        old_blob,
        "{second}"
    );
    assert!(
        pushed < second["source_bytes"].as_u64().unwrap() / 4,
        "{second}"
    );

    ok(&home, &["check", "--ref", &tess_v2]);
    let out = t.path().join("out");
    ok(&home, &["unpack", "--ref", &tess_v2, "--to", s(&out)]);
    assert_eq!(std::fs::read(out.join("opt/base.bin")).unwrap(), base);
    assert_eq!(std::fs::read(out.join("opt/update.bin")).unwrap(), update);

    // A dictionary in another repository of the same registry: its blob is mounted.
    let third = convert(
        &home,
        &format!("{a}/src/app-v2:v1"),
        &format!("{a}/other/app:v2"),
        &["--chunk-dict", &tess_v1],
    );
    assert_eq!(third["reused_bytes"].as_u64().unwrap(), old_blob, "{third}");
    ok(&home, &["check", "--ref", &format!("{a}/other/app:v2")]);
}

/// A multi-platform source: `--all-platforms` converts each image and pushes an index
/// naming them with their platforms; without it, `--platform` picks one.
#[test]
fn all_platforms_push_an_index() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let registry = Registry::start();
    let a = registry.addr.clone();
    let mut entries = Vec::new();
    for (arch, seed) in [("amd64", 1), ("arm64", 2)] {
        let layout = t.path().join(arch);
        let digest = build_files_image(
            &layout,
            arch,
            &[vec![("bin/app", pseudo_random(100_000, seed))]],
        );
        registry.push_layout(&layout, oci::TAG, "src/multi");
        let size = std::fs::metadata(layout.join("blobs/sha256").join(&digest[7..]))
            .unwrap()
            .len();
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
            "platform": {"os": "linux", "architecture": arch},
        }));
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    })
    .to_string();
    let src = format!("{a}/src/multi:multi");
    block_on(client().push_manifest(
        &Reference::parse(&src).unwrap(),
        "application/vnd.oci.image.index.v1+json",
        index.into_bytes(),
    ))
    .unwrap();
    let dst = format!("{a}/tessera/multi:v1");
    let summary = convert(&home, &src, &dst, &["--all-platforms"]);
    assert_eq!(
        summary["media_type"],
        "application/vnd.oci.image.index.v1+json"
    );
    let (index, _) = get_manifest(&dst);
    let platforms: Vec<&str> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["amd64", "arm64"]);
    for (arch, seed) in [("amd64", 1), ("arm64", 2)] {
        let out = t.path().join(format!("out-{arch}"));
        let platform = format!("linux/{arch}");
        ok(&home, &["check", "--ref", &dst, "--platform", &platform]);
        ok(
            &home,
            &[
                "unpack",
                "--ref",
                &dst,
                "--platform",
                &platform,
                "--to",
                s(&out),
            ],
        );
        assert_eq!(
            std::fs::read(out.join("bin/app")).unwrap(),
            pseudo_random(100_000, seed)
        );
    }

    // One platform only: a plain manifest under the tag.
    let one = convert(
        &home,
        &src,
        &format!("{a}/tessera/multi:arm"),
        &["--platform", "linux/arm64"],
    );
    assert_eq!(
        one["media_type"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(one["images"][0]["platform"], "linux/arm64");
    let e = run_tessera(
        &home,
        &[
            "convert",
            &src,
            &format!("{a}/tessera/multi:x"),
            "--platform",
            "linux/s390x",
        ],
    );
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(
        !e.status.success() && stderr.contains("linux/s390x") && stderr.contains("linux/arm64"),
        "{stderr}"
    );
}

const USER: &str = "tessera";
/// Distinctive, so that finding it in output cannot be a coincidence.
const PASSWORD: &str = "pw-Cv7nQ4-never-print-me";
const IDENTITY_TOKEN: &str = "refresh-Hx2pT8-never-print-me";

/// A three-layer image of files (one file replaced by a later layer) in an OCI layout.
fn three_layer_image(t: &Path) -> std::path::PathBuf {
    let layout = t.join("layout");
    build_files_image(
        &layout,
        "amd64",
        &[
            vec![
                ("usr/lib/big.so", pseudo_random(3 << 20, 11)),
                ("etc/conf", b"v1\n".to_vec()),
            ],
            vec![("usr/share/doc/readme", b"read me\n".repeat(5000))],
            vec![
                ("etc/conf", b"v2\n".to_vec()),
                ("bin/app", pseudo_random(1 << 20, 12)),
            ],
        ],
    );
    layout
}

/// Converts within `registry` (SRC pushed there by skopeo) and checks the result like
/// the plain-registry test: `check --ref`, and `unpack --ref` equal to `umoci unpack`.
fn convert_and_verify(
    t: &Path,
    home: &Path,
    host: &str,
    extra: &[&str],
    layout: &Path,
) -> serde_json::Value {
    let src = format!("{host}/src/app:{}", oci::TAG);
    let dst = format!("{host}/tessera/app:v1");
    let summary = convert(home, &src, &dst, extra);
    let creds: Vec<&str> = extra
        .windows(2)
        .find(|w| w[0] == "--dest-creds")
        .map(|w| vec!["--creds", w[1]])
        .unwrap_or_default();
    let mut check = vec!["check", "--ref", &dst];
    check.extend(&creds);
    ok(home, &check);
    let out = t.join("out");
    let mut unpack = vec!["unpack", "--ref", &dst, "--to", s(&out)];
    unpack.extend(&creds);
    ok(home, &unpack);
    let reference = oci::umoci_unpack_rootfs(layout, oci::TAG, &t.join("ref"));
    assert_trees_equal(&reference, &out, &CompareOptions::default());
    summary
}

/// Nothing secret in a command's output.
fn assert_quiet(out: &Output) {
    for stream in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(stream);
        for secret in [PASSWORD, IDENTITY_TOKEN] {
            assert!(!text.contains(secret), "output leaks a secret: {text}");
        }
    }
}

/// htpasswd basic auth: credentials from docker's config.json (base64 `auth`) for one
/// side and from `--dest-creds` for the other; none gives a 401 that says what to do.
#[test]
fn converts_on_a_basic_auth_registry() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let layout = three_layer_image(t.path());
    let registry = Registry::start_with(Auth::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    });
    registry.push_layout(&layout, oci::TAG, "src/app");
    let host = registry.addr.clone();

    let denied = run_tessera(
        &home,
        &[
            "convert",
            &format!("{host}/src/app:v1"),
            &format!("{host}/tessera/app:v1"),
        ],
    );
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success() && stderr.contains("credentials") && stderr.contains("src/app"),
        "{stderr}"
    );

    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        home.join("config.json"),
        serde_json::json!({"auths": {host.clone(): {"auth": auth}}}).to_string(),
    )
    .unwrap();
    let summary = convert_and_verify(t.path(), &home, &host, &[], &layout);
    assert!(
        summary["pushed_bytes"].as_u64().unwrap() > 4 << 20,
        "{summary}"
    );

    // Flags instead of the file (and a wrong file entry they override).
    std::fs::write(
        home.join("config.json"),
        serde_json::json!({"auths": {host.clone(): {"username": USER, "password": "wrong"}}})
            .to_string(),
    )
    .unwrap();
    let creds = format!("{USER}:{PASSWORD}");
    let out = ok(
        &home,
        &[
            "convert",
            &format!("{host}/src/app:v1"),
            &format!("{host}/tessera/app:v2"),
            "--src-creds",
            &creds,
            "--dest-creds",
            &creds,
        ],
    );
    assert_quiet(&out);
}

/// Token auth (our issuer, the real registry): an identity token from config.json for
/// the refresh-token grant, and tokens that expire every 2 s while a conversion slowed
/// down by a trickling layer takes longer — renewed, never fatal.
#[test]
fn converts_on_a_token_auth_registry_with_expiring_tokens() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let layout = three_layer_image(t.path());
    let registry = Registry::start_with(Auth::Token(TokenConfig {
        identity_token: Some(IDENTITY_TOKEN.into()),
        ..TokenConfig::new(USER, PASSWORD)
    }));
    registry.push_layout(&layout, oci::TAG, "src/app");
    let tokens = registry.token_server().unwrap();
    tokens.set_lifetime(std::time::Duration::from_secs(2));
    let before = tokens.tokens_issued();

    // The proxy trickles the 3 MiB layer so the pull alone outlives a token.
    let big_layer = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap())
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .file_name();
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::SlowBody {
            bytes_per_sec: 1 << 20,
        })
        .method("GET")
        .path(big_layer.to_str().unwrap()),
    );
    std::fs::write(
        home.join("config.json"),
        serde_json::json!({"auths": {proxy.addr.clone(): {"identitytoken": IDENTITY_TOKEN}}})
            .to_string(),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let summary = convert_and_verify(t.path(), &home, &proxy.addr, &[], &layout);
    assert!(started.elapsed() > std::time::Duration::from_secs(3));
    assert!(
        summary["pushed_bytes"].as_u64().unwrap() > 4 << 20,
        "{summary}"
    );
    // One token per scope would be 2 (pull src, push dst); expiry forced renewals.
    let issued = tokens.tokens_issued() - before;
    assert!(issued > 3, "only {issued} tokens issued");
}

/// Through a proxy that fails the way networks do — 500s on uploads, a 429 on a
/// manifest, a layer reset mid-body, chunked uploads cut into many PATCHes — the
/// conversion recovers. Failures that do not stop end in a clear error, and the tag is
/// not created: the manifest is pushed last.
#[test]
fn conversion_recovers_from_faults_and_never_half_writes_the_target() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let layout = three_layer_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&layout, oci::TAG, "src/app");
    let proxy = FaultProxy::start(&registry.addr);
    proxy.inject(
        Rule::new(Fault::TooManyRequests {
            retry_after_secs: 1,
        })
        .path("/manifests/"),
    );
    proxy.inject(
        Rule::new(Fault::ResetMidBody)
            .method("GET")
            .path("/blobs/sha256:"),
    );
    proxy.inject(Rule::new(Fault::Status(500)).method("PATCH").times(2));
    proxy.inject(
        Rule::new(Fault::Status(503))
            .method("PUT")
            .path("/blobs/uploads/"),
    );
    proxy.inject(
        Rule::new(Fault::Status(502))
            .method("PUT")
            .path("/manifests/"),
    );
    let summary = convert_and_verify(
        t.path(),
        &home,
        &proxy.addr,
        &["--upload-chunk-size", "256K"],
        &layout,
    );
    assert!(
        summary["pushed_bytes"].as_u64().unwrap() > 4 << 20,
        "{summary}"
    );
    let log = proxy.log();
    for expected in [429, 500, 502, 503] {
        assert!(
            log.iter().any(|l| l.status == expected),
            "no {expected} injected: {log:#?}"
        );
    }
    assert!(log.iter().filter(|l| l.method == "PATCH").count() > 10);

    // A registry that never accepts the manifest: a clear error, and no tag.
    proxy.inject(
        Rule::new(Fault::Status(500))
            .method("PUT")
            .path("/manifests/")
            .times(100),
    );
    let dst = format!("{}/tessera/app:broken", proxy.addr);
    let failed = run_tessera(
        &home,
        &[
            "convert",
            "--retries",
            "1",
            &format!("{}/src/app:v1", proxy.addr),
            &dst,
        ],
    );
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        !failed.status.success()
            && stderr.contains("tessera/app")
            && stderr.contains("HTTP 500")
            && stderr.contains("manifest"),
        "{stderr}"
    );
    let direct = format!("{}/tessera/app:broken", registry.addr);
    let e = block_on(client().manifest(&Reference::parse(&direct).unwrap())).unwrap_err();
    assert!(
        matches!(e, tessera_agent::Error::Status { status: 404, .. }),
        "{e}"
    );

    // Blob uploads that always fail: the same, before any manifest is tried.
    proxy.inject(
        Rule::new(Fault::Status(500))
            .method("POST")
            .path("/blobs/uploads/")
            .times(100),
    );
    let failed = run_tessera(
        &home,
        &[
            "convert",
            "--retries",
            "1",
            &format!("{}/src/app:v1", proxy.addr),
            &format!("{}/tessera/other:v1", proxy.addr),
        ],
    );
    assert!(!failed.status.success());
    let e = block_on(
        client()
            .manifest(&Reference::parse(&format!("{}/tessera/other:v1", registry.addr)).unwrap()),
    )
    .unwrap_err();
    assert!(
        matches!(e, tessera_agent::Error::Status { status: 404, .. }),
        "{e}"
    );
}

/// The build reads each layer while it downloads, and stops at the tar's end, before a
/// gzip stream's trailer: a layer whose bytes fail their digest only there must still
/// fail the conversion, naming the layer, with nothing pushed under the tag.
#[test]
fn a_layer_failing_its_digest_fails_the_conversion_even_past_the_tar_end() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let layout = three_layer_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&layout, oci::TAG, "src/app");
    let src = format!("{}/src/app:{}", registry.addr, oci::TAG);
    let (manifest, _) = get_manifest(&src);
    let layer = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    // The last byte of a gzip member is the top byte of ISIZE: no tar reader needs it.
    let stored = registry.blob_path(&layer);
    let mut bytes = std::fs::read(&stored).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&stored, &bytes).unwrap();

    let dst = format!("{}/tessera/app:v1", registry.addr);
    let failed = run_tessera(&home, &["convert", "--retries", "0", &src, &dst]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        !failed.status.success() && stderr.contains(&layer),
        "the conversion must fail naming {layer}: {stderr}"
    );
    let e = block_on(client().manifest(&Reference::parse(&dst).unwrap())).unwrap_err();
    assert!(
        matches!(e, tessera_agent::Error::Status { status: 404, .. }),
        "{e}"
    );
}

/// A source pushed as a Docker schema 2 manifest (`skopeo --format v2s2`, gzip layers
/// with Docker media types) converts like an OCI one.
#[test]
fn docker_schema2_sources_convert() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let layout = three_layer_image(t.path());
    let registry = Registry::start();
    let src = format!("{}/src/docker:v1", registry.addr);
    oci::run(
        std::process::Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--format",
                "v2s2",
                "--dest-tls-verify=false",
            ])
            .arg(format!("oci:{}:{}", layout.display(), oci::TAG))
            .arg(format!("docker://{src}")),
    );
    let (source, _) = get_manifest(&src);
    assert_eq!(
        source["mediaType"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    let dst = format!("{}/tessera/docker:v1", registry.addr);
    convert(&home, &src, &dst, &[]);
    let out = t.path().join("out");
    ok(&home, &["unpack", "--ref", &dst, "--to", s(&out)]);
    let reference = oci::umoci_unpack_rootfs(&layout, oci::TAG, &t.path().join("ref"));
    assert_trees_equal(&reference, &out, &CompareOptions::default());
}

/// The index `tessera index` pushed for manifest `digest` of `r`'s repository, found
/// through its referrers: the artifact's digest, its manifest, and the bootstrap.
fn pushed_index(
    r: &Reference,
    digest: &str,
) -> (String, serde_json::Value, rafs_format::reader::Bootstrap) {
    use rafs_format::reader::{Bootstrap, Verify};
    use tessera_agent::index::INDEX_ARTIFACT_TYPE;
    use tessera_agent::registry::image::BOOTSTRAP_MEDIA_TYPE;
    use tessera_agent::registry::referrers;

    let found = block_on(referrers::list(
        &client(),
        r,
        digest,
        Some(INDEX_ARTIFACT_TYPE),
    ))
    .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let artifact_ref = Reference {
        tag: None,
        digest: Some(found[0].digest.clone()),
        ..r.clone()
    };
    let artifact: serde_json::Value =
        serde_json::from_slice(&block_on(client().manifest(&artifact_ref)).unwrap().bytes).unwrap();
    let bootstrap = artifact["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["mediaType"] == BOOTSTRAP_MEDIA_TYPE)
        .unwrap();
    let mut zst = Vec::new();
    block_on(client().blob(r, bootstrap["digest"].as_str().unwrap(), &mut zst)).unwrap();
    let b = Bootstrap::from_bytes(zstd::decode_all(&zst[..]).unwrap(), Verify::Checksum).unwrap();
    b.validate_all().unwrap();
    (found[0].digest.clone(), artifact, b)
}

/// `tessera index`: a plain image pushed by skopeo gets an index beside it (an OCI
/// referrer of its manifest, found again by the manifest's digest), the image itself
/// untouched; the index read through the registry equals `umoci unpack` of the image;
/// a zstd image is refused with what to do instead.
#[test]
fn an_indexed_plain_image_reads_like_umoci_and_stays_as_it_was() {
    use tessera_agent::registry::image::RemoteBlobs;

    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let image = oci::build_layered_image(t.path());
    let registry = Registry::start();
    registry.push_layout(&image.layout, &image.tag, "src/app");
    let src = format!("{}/src/app:{}", registry.addr, image.tag);
    let (_, before) = get_manifest(&src);

    // The start-up's files, recorded so that their spans are fetched first.
    let prefetch = t.path().join("prefetch.txt");
    std::fs::write(&prefetch, "/data/a.txt\n").unwrap();
    let out = ok(
        &home,
        &["index", "--json", &src, "--prefetch-list", s(&prefetch)],
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let indexed = &summary["images"][0];
    assert_eq!(indexed["manifest_digest"], before.as_str(), "{summary}");
    let (_, after) = get_manifest(&src);
    assert_eq!(after, before, "indexing changed the image");

    let r = Reference::parse(&src).unwrap();
    let (artifact_digest, artifact, b) = pushed_index(&r, &before);
    assert_eq!(artifact_digest, indexed["index_digest"].as_str().unwrap());
    // The artifact names the manifest as its subject; its bootstrap layer is the index.
    assert_eq!(artifact["subject"]["digest"], before.as_str());
    let listed: Vec<_> = b
        .prefetch()
        .unwrap()
        .iter()
        .map(|p| p.path.to_vec())
        .collect();
    assert_eq!(listed, vec![b"/data/a.txt".to_vec()]);

    // Read through the registry: the layers themselves, in the image's repository.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let repo = Reference {
        tag: None,
        digest: None,
        ..r.clone()
    };
    let blobs = RemoteBlobs::new(std::sync::Arc::new(client()), repo, rt.handle().clone());
    let unpacked = t.path().join("unpacked");
    rafs_format::image::unpack_image_to_dir(&b, &blobs, &unpacked).unwrap();
    let reference = oci::umoci_unpack_rootfs(&image.layout, &image.tag, &t.path().join("ref"));
    assert_trees_equal(&reference, &unpacked, &CompareOptions::default());

    if let Some(zstd_layout) = &image.exported_zstd {
        registry.push_layout(zstd_layout, &image.tag, "src/zstd");
        let zsrc = format!("{}/src/zstd:{}", registry.addr, image.tag);
        let refused = run_tessera(&home, &["index", &zsrc]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success());
        assert!(
            stderr.contains("only gzip layers can be indexed")
                && stderr.contains("tessera convert"),
            "{stderr}"
        );
    }
}

/// Reading one small file of an indexed image asks for a small part of its layer: the
/// span from the checkpoint before the file, not the layer.
#[test]
fn a_small_file_of_an_indexed_image_reads_a_small_part_of_its_layer() {
    use rafs_format::reader::{read_chunk, BlobInfo, BlobSource};
    use std::sync::atomic::{AtomicU64, Ordering};
    use tessera_agent::registry::image::RemoteBlobs;

    /// Counts the bytes asked of the layers (not the index's own blob).
    struct Counting<'a>(&'a RemoteBlobs, AtomicU64, u64);
    impl BlobSource for Counting<'_> {
        fn read_at(&self, blob: &BlobInfo, offset: u64, len: u32) -> rafs_format::Result<Vec<u8>> {
            if blob.size == self.2 {
                self.1.fetch_add(u64::from(len), Ordering::Relaxed);
            }
            self.0.read_at(blob, offset, len)
        }
        fn verify_blob(&self, blob: &BlobInfo) -> rafs_format::Result<()> {
            self.0.verify_blob(blob)
        }
    }

    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let registry = Registry::start();
    // Text that compresses about 3x, so the layer has DEFLATE blocks throughout.
    let text: Vec<u8> = (0..40_000u32)
        .flat_map(|i| {
            format!(
                "{i:08} {}\n",
                ["alpha", "beta", "gamma", "delta"][i as usize % 4].repeat(1 + (i % 5) as usize)
            )
            .into_bytes()
        })
        .cycle()
        .take(24 << 20)
        .collect();
    let small = b"the one file this test reads\n".to_vec();
    let layout = t.path().join("layout");
    build_files_image(
        &layout,
        "amd64",
        &[vec![
            ("big/a", text.clone()),
            ("small.txt", small.clone()),
            ("big/b", text),
        ]],
    );
    registry.push_layout(&layout, oci::TAG, "src/files");
    let src = format!("{}/src/files:{}", registry.addr, oci::TAG);
    ok(&home, &["index", &src, "--platform", "linux/amd64"]);

    let r = Reference::parse(&src).unwrap();
    let (manifest, digest) = get_manifest(&src);
    let layer_size = manifest["layers"][0]["size"].as_u64().unwrap();
    let (_, _, b) = pushed_index(&r, &digest);
    assert!(
        b.checkpoint_count() >= 10,
        "{} checkpoints",
        b.checkpoint_count()
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let repo = Reference {
        tag: None,
        digest: None,
        ..r.clone()
    };
    let remote = RemoteBlobs::new(std::sync::Arc::new(client()), repo, rt.handle().clone());
    let counting = Counting(&remote, AtomicU64::new(0), layer_size);
    let inode = b.resolve(b"small.txt").unwrap().unwrap();
    let mut got = Vec::new();
    for piece in b.file_chunks(&inode).unwrap() {
        let chunk = b.chunk(piece.chunk.unwrap()).unwrap();
        got.extend(read_chunk(&counting, &b, &chunk).unwrap());
    }
    assert_eq!(got, small);
    let asked = counting.1.load(Ordering::Relaxed);
    assert!(
        asked > 0 && asked * 4 < layer_size,
        "asked {asked} bytes of a {layer_size} byte layer"
    );
}
