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
use support::podman::Podman;
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

/// The size of registry blob `digest` (zstd) decompressed, with `zstd`.
fn zstd_size(registry: &Registry, digest: &str) -> u64 {
    oci::require_tool("zstd");
    let out = std::process::Command::new("zstd")
        .args(["-dc", "--"])
        .arg(registry.blob_path(digest))
        .output()
        .unwrap();
    assert!(out.status.success(), "zstd -dc of {digest}");
    out.stdout.len() as u64
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

/// A registry with `src/app:v1` (plain: busybox as `/bin/sh` and `/bin/cat`, then
/// `data/hello` and 3 MiB of `data/big`) and `tessera/app:v1`, its conversion.
struct Images {
    registry: Registry,
    /// The plain image and the converted one.
    src: String,
    dst: String,
    big: Vec<u8>,
}

fn images(t: &Path) -> Images {
    oci::require_tool("busybox");
    let registry = Registry::start();
    let layout = t.join("layout");
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let big = oci::pseudo_random(3 << 20, 11);
    build_files_image_with(
        &layout,
        "amd64",
        &[
            // busybox runs the applet its name says.
            vec![("bin/sh", busybox.clone()), ("bin/cat", busybox)],
            vec![
                ("data/hello", b"hello from the image\n".to_vec()),
                ("data/big", big.clone()),
            ],
        ],
        &["bin/sh", "bin/cat"],
        serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "src/app");
    let (src, dst) = (
        format!("{}/src/app:v1", registry.addr),
        format!("{}/tessera/app:v1", registry.addr),
    );
    convert(t, &src, &dst, &[]);
    Images {
        registry,
        src,
        dst,
        big,
    }
}

#[test]
fn serves_a_converted_image_and_says_not_here_for_the_rest() {
    oci::require_tool("curl");
    let t = tempfile::Builder::new()
        .prefix("tals")
        .tempdir_in("/tmp")
        .unwrap();
    let Images {
        registry,
        src,
        dst,
        big,
    } = images(t.path());
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
        let (compression, diff_size) = match media_type {
            // The bootstrap's size uncompressed, which its diff ID hashes.
            BOOTSTRAP_MEDIA_TYPE => (4, zstd_size(&registry, digest)),
            // Blobs are stored as they are.
            _ => (0, size),
        };
        assert_eq!(
            info,
            serde_json::json!({
                "compressed-diff-digest": digest,
                "compressed-size": size,
                "diff-digest": diff_id,
                "diff-size": diff_size,
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

    // After a crash the next agent clears the store and the tree it left, and serves
    // both again.
    let bootstrap = layers
        .iter()
        .find(|l| l["mediaType"] == BOOTSTRAP_MEDIA_TYPE)
        .and_then(|l| l["digest"].as_str())
        .unwrap();
    // A tree unmounted behind the store's back (`tessera umount`) is never shown as
    // its empty mount point: the `diff` fails (EIO) while it is mounted again.
    let hello = image.join(bootstrap).join("diff/data/hello");
    let tree = std::fs::read_link(image.join(bootstrap).join("diff")).unwrap();
    agent.ok(&["umount", s(&tree)]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read(&hello) {
            Ok(bytes) => break assert_eq!(bytes, b"hello from the image\n"),
            Err(e) => assert_ne!(e.kind(), ErrorKind::NotFound, "an empty tree: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tree was not mounted again:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mounted = agent.log().matches("mounted an image's tree").count();
    assert_eq!(mounted, 2, "the tree was mounted again:\n{}", agent.log());

    agent.kill9();
    agent.restart();
    assert_eq!(
        std::fs::read(image.join(bootstrap).join("diff/data/hello")).unwrap(),
        b"hello from the image\n",
        "after a crash and a restart"
    );
    let log = agent.log();
    assert!(
        log.matches("cleared a stale Tessera mount").count() >= 2,
        "the store and the tree the crashed agent left are cleared:\n{log}"
    );

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

/// The access log's blob GETs Podman made (its user agent is containers/image's), as
/// the digests asked for.
fn podman_blob_gets(registry: &Registry) -> Vec<String> {
    blob_gets(registry, true)
}

/// The blobs GET from the registry by Podman (its `containers/` user agent) or, with
/// `podman` false, by everyone else (the agent's chunk fetches), as its log records them.
fn blob_gets(registry: &Registry, podman: bool) -> Vec<String> {
    std::fs::read_to_string(&registry.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("containers/") == podman && l.contains("\"GET "))
        .filter_map(|l| l.split("/blobs/").nth(1))
        .filter_map(|rest| rest.split(' ').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn podman_runs_a_converted_image_from_the_store_without_pulling_its_layers() {
    let t = tempfile::Builder::new()
        .prefix("talsp")
        .tempdir_in("/tmp")
        .unwrap();
    let Images {
        registry,
        src,
        dst,
        big,
    } = images(t.path());
    let root = t.path().join("store");
    let mut agent = AgentProcess::start(
        &t.path().join("agent"),
        &["--no-p2p", "--prefetch", "none", "--store-root", s(&root)],
    );
    // Dropped before the agent: no container is left on the image's lazy mount.
    let podman = Podman::new(&t.path().join("podman"), Some(&root));

    podman.ok(&["pull", "--tls-verify=false", &dst]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&get(&registry.addr, "tessera/app", "manifests/v1")).unwrap();
    let config = manifest["config"]["digest"].as_str().unwrap();
    let gets = podman_blob_gets(&registry);
    assert_eq!(
        gets,
        [config],
        "Podman fetched the config and no layer; the agent's log:\n{}",
        agent.log()
    );

    let hello = podman.ok(&["run", "--rm", &dst, "/bin/cat", "/data/hello"]);
    assert_eq!(hello, b"hello from the image\n");
    let read = podman.ok(&["run", "--rm", &dst, "/bin/cat", "/data/big"]);
    assert!(read == big, "the container reads data/big's exact bytes");
    assert_eq!(
        podman_blob_gets(&registry),
        [config],
        "running fetched no layer through Podman"
    );

    // A restarted agent serves the image Podman pulled before: the store mounts its
    // tree again when the container's overlay looks its `diff` up.
    agent.restart();
    let hello = podman.ok(&["run", "--rm", &dst, "/bin/cat", "/data/hello"]);
    assert_eq!(hello, b"hello from the image\n", "after a restart");
    assert_eq!(
        podman_blob_gets(&registry),
        [config],
        "nothing pulled again"
    );

    // Removed and pulled again: the layers come from the store again, and the tree from
    // the agent's cache, so neither Podman nor the agent fetches a layer or chunk twice.
    let read_by_agent = blob_gets(&registry, false).len();
    assert!(
        read_by_agent > 0,
        "the first runs read the tree through the agent"
    );
    podman.ok(&["rmi", &dst]);
    podman.ok(&["pull", "--tls-verify=false", &dst]);
    let read = podman.ok(&["run", "--rm", &dst, "/bin/cat", "/data/big"]);
    assert!(read == big, "after rmi and a second pull");
    assert_eq!(
        podman_blob_gets(&registry),
        [config, config],
        "the second pull fetched the config again and no layer"
    );
    assert_eq!(
        blob_gets(&registry, false).len(),
        read_by_agent,
        "the agent read the tree from its cache: nothing fetched twice"
    );

    // The plain image is not in the store: Podman pulls its layers as usual.
    podman.ok(&["pull", "--tls-verify=false", &src]);
    assert!(
        podman_blob_gets(&registry).len() > 2,
        "the plain image's layers came from the registry"
    );
    let hello = podman.ok(&["run", "--rm", &src, "/bin/cat", "/data/hello"]);
    assert_eq!(hello, b"hello from the image\n");
    drop(podman);
    drop(agent);
}

/// `podman ARGS` in `podman`'s setup, its stdout's lines sorted (byte order: a
/// listing, whatever order the directories come in).
fn listing(podman: &Podman, args: &[&str]) -> Vec<String> {
    let out = podman.ok(args);
    let mut lines: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

#[test]
fn podman_runs_an_indexed_plain_image_from_each_layers_own_tree() {
    oci::require_tool("busybox");
    let t = tempfile::Builder::new()
        .prefix("talsi")
        .tempdir_in("/tmp")
        .unwrap();
    let registry = Registry::start();
    let busybox = std::fs::read(oci::which("busybox").unwrap()).unwrap();
    let big = oci::pseudo_random(3 << 20, 12);
    let base = vec![
        ("bin/sh", busybox.clone()),
        ("bin/cat", busybox.clone()),
        ("bin/ls", busybox),
        ("data/gone", b"deleted by the top layer\n".to_vec()),
        ("data/dir/old", b"hidden by an opaque dir\n".to_vec()),
    ];
    let middle = vec![
        ("data/hello", b"hello from the middle layer\n".to_vec()),
        ("data/big", big.clone()),
    ];
    // The top layer deletes a file and makes a directory opaque: Podman stacks each
    // layer's `diff` as an overlay lower directory, so these must be overlay
    // whiteouts in the top layer's tree.
    let top = vec![
        ("data/.wh.gone", Vec::new()),
        ("data/dir/.wh..wh..opq", Vec::new()),
        ("data/dir/new", b"the top layer's\n".to_vec()),
    ];
    let process = serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]});
    let executables = ["bin/sh", "bin/cat", "bin/ls"];
    let layout = t.path().join("layout");
    build_files_image_with(
        &layout,
        "amd64",
        &[base.clone(), middle.clone(), top],
        &executables,
        process.clone(),
    );
    registry.push_layout(&layout, oci::TAG, "src/idx");
    let src = format!("{}/src/idx:v1", registry.addr);
    support::index(t.path(), &src, &[]);
    // Another plain image on the same two first layers, never indexed: Podman pulls
    // its own top layer and builds it on the two it already has from the store.
    let other_layout = t.path().join("other");
    build_files_image_with(
        &other_layout,
        "amd64",
        &[
            base,
            middle,
            vec![("data/other", b"another image's top\n".to_vec())],
        ],
        &executables,
        process,
    );
    registry.push_layout(&other_layout, oci::TAG, "src/other");
    let other = format!("{}/src/other:v1", registry.addr);

    // Served by `tessera store`, the agent run for the store alone.
    let root = t.path().join("store");
    let agent = AgentProcess::start_store(
        &t.path().join("agent"),
        &root,
        &["--no-p2p", "--prefetch", "none"],
    );
    let podman = Podman::new(&t.path().join("podman"), Some(&root));

    podman.ok(&["pull", "--tls-verify=false", &src]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&get(&registry.addr, "src/idx", "manifests/v1")).unwrap();
    let config = manifest["config"]["digest"].as_str().unwrap();
    assert_eq!(
        podman_blob_gets(&registry),
        [config],
        "Podman fetched the config and no layer; the agent's log:\n{}",
        agent.log()
    );
    // Each layer's diff is that layer's own tree, with the top layer's whiteout and
    // opaque directory in overlayfs's form.
    let image = root.join(entry(&src));
    let layers = manifest["layers"].as_array().unwrap();
    let top_diff = image
        .join(layers[2]["digest"].as_str().unwrap())
        .join("diff");
    let whiteout = std::fs::symlink_metadata(top_diff.join("data/gone")).unwrap();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(
        whiteout.file_type().is_char_device() && whiteout.rdev() == 0,
        "the top layer's whiteout is a character device 0/0"
    );
    let middle_diff = image
        .join(layers[1]["digest"].as_str().unwrap())
        .join("diff");
    let mut names: Vec<String> = std::fs::read_dir(middle_diff.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["big", "hello"], "the middle layer's own files only");

    assert_eq!(
        listing(
            &podman,
            &["run", "--rm", &src, "/bin/ls", "/data", "/data/dir"]
        ),
        ["", "/data/dir:", "/data:", "big", "dir", "hello", "new"],
        "the container sees the layers stacked: the whiteout and the opaque dir apply"
    );
    let read = podman.ok(&["run", "--rm", &src, "/bin/cat", "/data/big"]);
    assert!(read == big, "the container reads data/big's exact bytes");
    assert_eq!(
        podman_blob_gets(&registry),
        [config],
        "running fetched no layer through Podman"
    );

    // The other image reuses the two layers from the store and pulls only its top.
    podman.ok(&["pull", "--tls-verify=false", &other]);
    let other_manifest: serde_json::Value =
        serde_json::from_slice(&get(&registry.addr, "src/other", "manifests/v1")).unwrap();
    let other_top = other_manifest["layers"][2]["digest"].as_str().unwrap();
    let other_config = other_manifest["config"]["digest"].as_str().unwrap();
    assert_eq!(
        podman_blob_gets(&registry),
        [config, other_config, other_top],
        "the other image's first two layers came from the store"
    );
    assert_eq!(
        listing(
            &podman,
            &["run", "--rm", &other, "/bin/ls", "/data", "/data/dir"]
        ),
        [
            "",
            "/data/dir:",
            "/data:",
            "big",
            "dir",
            "gone",
            "hello",
            "old",
            "other"
        ],
        "built on the store's layers, the other image sees exactly its own layers"
    );
    drop(podman);
    let log = agent.log();
    assert!(!log.contains("panicked"), "{log}");
}
