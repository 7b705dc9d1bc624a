//! The additional layer store (`tessera agent --store-root`), as containers/storage
//! sees it through the filesystem: a real registry, an image converted with `tessera
//! convert`, the agent daemon serving the store, and `std::fs` doing what Podman 4.3
//! does (docs/research/podman-additional-layer-store.md).
//!
//! Needs fuse3, docker-registry, tar, gzip and curl (`make test-deps`); runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use sha2::Digest;
use support::agent::{is_mounted, AgentProcess};
use support::oci::{self, build_files_image_with};
use support::registry::Registry;
use support::{convert, s};

const BOOTSTRAP_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.tessera.bootstrap.v1+zstd";
const BLOB_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.tessera.blob.v1";

/// The store's entry name of an image reference: Go's padded standard base64.
fn entry(reference: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(reference)
}

/// `GET http://{addr}/v2/{repo}/{what}` (a manifest or a blob) with curl.
fn get(addr: &str, repo: &str, what: &str) -> Vec<u8> {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ])
        .arg(format!("http://{addr}/v2/{repo}/{what}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {repo}/{what} failed");
    out.stdout
}

fn not_found(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{}: {e}", path.display()),
        Ok(_) => panic!(
            "{} exists; the store should say \"not here\"",
            path.display()
        ),
    }
}

#[test]
fn serves_a_converted_image_and_says_not_here_for_the_rest() {
    oci::require_tool("curl");
    let t = tempfile::Builder::new()
        .prefix("tals")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let layout = t.path().join("layout");
    let big = oci::pseudo_random(3 << 20, 11);
    build_files_image_with(
        &layout,
        "amd64",
        &[
            vec![("data/hello", b"hello from the image\n".to_vec())],
            vec![("data/big", big.clone())],
        ],
        &[],
        serde_json::json!({"Cmd": ["/bin/sh"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    let (src, dst) = (
        format!("{}/src/app:v1", registry.addr),
        format!("{}/tessera/app:v1", registry.addr),
    );
    convert(t.path(), &src, &dst, &[]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&get(&registry.addr, "tessera/app", "manifests/v1")).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let config: serde_json::Value = serde_json::from_slice(&get(
        &registry.addr,
        "tessera/app",
        &format!("blobs/{config_digest}"),
    ))
    .unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    let layers = manifest["layers"].as_array().unwrap();

    let root = t.path().join("store");
    let mut agent = AgentProcess::start(
        &t.path().join("agent"),
        &["--no-p2p", "--prefetch", "none", "--store-root", s(&root)],
    );
    assert!(
        is_mounted(&root),
        "the store is mounted once the agent is ready"
    );

    let image = root.join(entry(&dst));
    assert!(
        std::fs::metadata(&image).unwrap().is_dir(),
        "the converted image's directory"
    );
    let mut blob_layers = 0;
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        let digest = layer["digest"].as_str().unwrap();
        let size = layer["size"].as_u64().unwrap();
        let media_type = layer["mediaType"].as_str().unwrap();
        let dir = image.join(digest);

        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("info")).unwrap()).unwrap();
        let compression = if media_type == BOOTSTRAP_MEDIA_TYPE {
            4
        } else {
            0
        };
        assert_eq!(
            info,
            serde_json::json!({
                "compressed-diff-digest": digest,
                "compressed-size": size,
                "diff-digest": diff_id,
                "diff-size": -1,
                "compression": compression,
            }),
            "info of layer {digest}"
        );
        assert_eq!(std::fs::metadata(dir.join("blob")).unwrap().len(), size);

        let diff = dir.join("diff");
        match media_type {
            BOOTSTRAP_MEDIA_TYPE => {
                let link = std::fs::symlink_metadata(&diff).unwrap();
                assert!(
                    link.file_type().is_symlink(),
                    "the bootstrap layer's diff is a symlink"
                );
                assert_eq!(
                    std::fs::read(diff.join("data/hello")).unwrap(),
                    b"hello from the image\n"
                );
                assert!(std::fs::read(diff.join("data/big")).unwrap() == big);
                // `blob` reads the layer's bytes from the registry.
                let blob = std::fs::read(dir.join("blob")).unwrap();
                let sum = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&blob)));
                assert_eq!(sum, digest, "the bootstrap layer's blob reads its bytes");
            }
            BLOB_MEDIA_TYPE => {
                blob_layers += 1;
                assert!(std::fs::metadata(&diff).unwrap().is_dir());
                assert_eq!(
                    std::fs::read_dir(&diff).unwrap().count(),
                    0,
                    "a blob layer's diff is empty"
                );
            }
            other => panic!("a converted image has no {other} layer"),
        }

        // containers/storage's `use` notification and release answer ENOENT.
        let created = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("use"));
        assert_eq!(created.unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(
            std::fs::remove_dir(&dir).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert!(dir.join("info").exists(), "the layer is still there");
    }
    assert!(blob_layers > 0, "the converted image has blob layers");

    // "Not here": a layer the manifest does not have, the plain image, a name that is
    // not base64, nor a reference, an image the registry does not have.
    let absent = format!("sha256:{}", "0".repeat(64));
    not_found(&image.join(absent).join("diff"));
    not_found(&root.join(entry(&src)));
    not_found(&root.join(entry(&src)).join("anything"));
    not_found(&root.join("not base64!"));
    not_found(&root.join(entry("Not A Reference")));
    not_found(&root.join(entry(&format!("{}/nothing/here:v1", registry.addr))));

    // SIGTERM: the store is unmounted with the agent's other mounts.
    let status = agent.signal_and_wait("TERM", Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "agent exit: {status:?}\n{}",
        agent.log()
    );
    assert!(!is_mounted(&root), "the store is unmounted at shutdown");
    let log = agent.log();
    assert!(!log.contains("panicked"), "{log}");
}
