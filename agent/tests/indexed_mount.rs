//! Plain images started lazily through an index (issue 22, format.md §17): a real
//! `tessera agent`, real FUSE mounts, a real `docker-registry` behind the fault proxy
//! (which measures origin egress), images pushed by skopeo and indexed by `tessera
//! index`, never converted.
//!
//! Needs fuse3, docker-registry, umoci, skopeo, GNU tar and setfattr (`make test-deps`);
//! runs as root.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use support::agent::{is_mounted, AgentProcess};
use support::fault_proxy::FaultProxy;
use support::fstree::{assert_trees_equal, CompareOptions};
use support::oci::{self, build_files_image, pseudo_random};
use support::registry::Registry;
use support::registry::{block_on, client};
use support::s;
use tessera_agent::registry::image::{BOOTSTRAP_MEDIA_TYPE, INDEX_ARTIFACT_TYPE};
use tessera_agent::registry::reference::Reference;
use tessera_agent::registry::referrers::{self, Artifact, Descriptor};

fn home(t: &Path) -> PathBuf {
    let home = t.join("home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

fn mountpoint(t: &Path, name: &str) -> PathBuf {
    let p = t.join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// The digest of `reference`'s manifest.
fn manifest_digest(reference: &str) -> String {
    block_on(client().manifest(&Reference::parse(reference).unwrap()))
        .unwrap()
        .digest
}

/// Text that gzip compresses about 3x, so a layer of it has DEFLATE blocks (and
/// checkpoints) throughout.
fn text(len: usize, seed: u32) -> Vec<u8> {
    (0..40_000u32)
        .flat_map(|i| {
            let word = ["alpha", "beta", "gamma", "delta"][(i + seed) as usize % 4];
            format!("{i:08} {seed} {}\n", word.repeat(1 + (i % 5) as usize)).into_bytes()
        })
        .cycle()
        .take(len)
        .collect()
}

/// A one-layer image of two 12 MiB text files around a small one, at `repo:tag` of
/// `registry`; returns its files.
fn push_files_image(
    t: &Path,
    registry: &Registry,
    repo: &str,
    tag: &str,
    seed: u32,
) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("big/a".to_string(), text(12 << 20, seed)),
        (
            "small.txt".to_string(),
            b"the one file this test reads\n".to_vec(),
        ),
        ("big/b".to_string(), text(12 << 20, seed + 1)),
    ];
    let layout = t.join(format!("layout-{seed}"));
    build_files_image(
        &layout,
        "amd64",
        &[files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect()],
    );
    // `build_files_image` tags its layouts `oci::TAG`; the repository gets `tag`.
    let pushed = std::process::Command::new("skopeo")
        .args(["copy", "--insecure-policy", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{}", layout.display(), oci::TAG))
        .arg(format!("docker://{}/{repo}:{tag}", registry.addr))
        .output()
        .unwrap();
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    files
}

/// What the tests of one indexed files image share: `src/files` (from
/// [`push_files_image`]) indexed, behind a counting proxy.
struct Indexed {
    t: tempfile::TempDir,
    home: PathBuf,
    registry: Registry,
    proxy: FaultProxy,
    files: Vec<(String, Vec<u8>)>,
    /// The image in the registry itself, and through the proxy.
    src: String,
    reference: String,
    /// `tessera index --json`'s summary.
    summary: serde_json::Value,
}

fn indexed_files_image() -> Indexed {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);
    let files = push_files_image(t.path(), &registry, "src/files", oci::TAG, 0);
    let src = format!("{}/src/files:{}", registry.addr, oci::TAG);
    let summary = support::index(&home, &src, &[]);
    let reference = format!("{}/src/files:{}", proxy.addr, oci::TAG);
    Indexed {
        t,
        home,
        registry,
        proxy,
        files,
        src,
        reference,
        summary,
    }
}

fn read_all(mnt: &Path, files: &[(String, Vec<u8>)]) {
    for (path, data) in files {
        let got = std::fs::read(mnt.join(path)).unwrap();
        assert!(got == *data, "{path} reads back different bytes");
    }
}

/// The multi-layer image (whiteouts, an opaque directory, hardlinks, xattrs, long
/// names) pushed by skopeo and indexed, never converted: the agent mounts it and the
/// mount equals `umoci unpack` of the image. Before the index exists, the mount is
/// refused with what to run.
#[test]
fn an_indexed_plain_image_mounts_like_umoci_unpack() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let image = oci::build_layered_image(t.path());
    let registry = Registry::start();
    let proxy = FaultProxy::start(&registry.addr);
    registry.push_layout(&image.layout, &image.tag, "src/app");
    let src = format!("{}/src/app:{}", registry.addr, image.tag);
    let reference = format!("{}/src/app:{}", proxy.addr, image.tag);
    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let mnt = mountpoint(t.path(), "mnt");

    let refused = agent.run(&["mount", &reference, s(&mnt)]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("no index") && stderr.contains("tessera index"),
        "{stderr}"
    );
    assert!(!is_mounted(&mnt));

    support::index(&home, &src, &[]);
    agent.ok(&["mount", &reference, s(&mnt)]);
    let expected = oci::umoci_unpack_rootfs(&image.layout, &image.tag, &t.path().join("ref"));
    assert_trees_equal(
        &expected,
        &mnt,
        &CompareOptions {
            compare_root_metadata: false,
            ..CompareOptions::default()
        },
    );
    let status = agent.status();
    let pull = &status["mounts"][0]["pull"];
    assert!(pull["origin_bytes"].as_u64().unwrap() > 0, "{status}");
    assert_eq!(pull["verification_failures"], 0, "{status}");
    agent.ok(&["umount", s(&mnt)]);
    assert!(!is_mounted(&mnt));
}

/// Reading one small file of an indexed image fetches a small part of its layer (the
/// span from the checkpoint before it, and that checkpoint's window); reading every
/// file gives every byte. The chunks are cached by digest: the same layers converted
/// by `tessera convert` then mount and read without the origin.
#[test]
fn an_indexed_mount_reads_a_small_file_from_a_small_part_of_the_layer() {
    let Indexed {
        t,
        home,
        registry,
        proxy,
        files,
        src,
        reference,
        summary,
    } = indexed_files_image();
    let layer_bytes = summary["images"][0]["layer_bytes"].as_u64().unwrap();
    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let mnt = mountpoint(t.path(), "mnt");
    agent.ok(&["mount", &reference, s(&mnt)]);

    let before = proxy.blob_bytes();
    assert_eq!(
        std::fs::read(mnt.join("small.txt")).unwrap(),
        files[1].1,
        "small.txt"
    );
    let small = proxy.blob_bytes() - before;
    eprintln!("small.txt: {small} bytes of a {layer_bytes} byte layer from the origin");
    assert!(
        small > 0 && small * 4 < layer_bytes,
        "reading small.txt took {small} bytes of a {layer_bytes} byte layer"
    );

    read_all(&mnt, &files);
    let status = agent.status();
    let pull = &status["mounts"][0]["pull"];
    assert_eq!(pull["verification_failures"], 0, "{status}");
    // Spans of one checkpoint overlap and a run takes them together, so what goes
    // twice is at most the stretch between a run's checkpoint and the end of the run
    // before it (about a third of this layer's: checkpoints 2 MiB of output apart,
    // reads' runs 256 KiB of the layer long), plus the windows.
    let wire = proxy.blob_bytes() - before;
    eprintln!("every file: {wire} bytes of a {layer_bytes} byte layer from the origin");
    assert!(
        wire * 2 < layer_bytes * 3,
        "reading the image took {wire} bytes of a {layer_bytes} byte layer"
    );
    agent.ok(&["umount", s(&mnt)]);

    // The same layers converted: their chunks have the same digests, already cached.
    let converted = format!("{}/tessera/files:v1", registry.addr);
    support::convert(&home, &src, &converted, &[]);
    let via_proxy = format!("{}/tessera/files:v1", proxy.addr);
    agent.ok(&["mount", &via_proxy, s(&mnt)]);
    let before = proxy.blob_bytes();
    read_all(&mnt, &files);
    let status = agent.status();
    let pull = &status["mounts"][0]["pull"];
    assert_eq!(pull["origin_bytes"], 0, "{status}");
    assert_eq!(
        proxy.blob_bytes(),
        before,
        "the converted image's reads went out"
    );
    agent.ok(&["umount", s(&mnt)]);
}

/// A byte flipped in a stored layer: the range it spoils reads as EIO, counted as a
/// verification failure, and nothing bad is cached; files before it in the layer read
/// as ever; once the layer is repaired the same read succeeds through the same mount.
#[test]
fn a_flipped_byte_in_a_layer_gives_eio_for_its_range_only() {
    let Indexed {
        t,
        registry,
        proxy: _proxy,
        files,
        src,
        reference,
        ..
    } = indexed_files_image();
    let manifest: serde_json::Value = serde_json::from_slice(
        &block_on(client().manifest(&Reference::parse(&src).unwrap()))
            .unwrap()
            .bytes,
    )
    .unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let stored = registry.blob_path(layer);
    let original = std::fs::read(&stored).unwrap();
    // Near the end of the layer: inside big/b, which is last in the tar.
    let mut bad = original.clone();
    let at = original.len() - original.len() / 10;
    bad[at] ^= 0x55;
    std::fs::write(&stored, &bad).unwrap();

    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let mnt = mountpoint(t.path(), "mnt");
    agent.ok(&["mount", &reference, s(&mnt)]);
    read_all(&mnt, &files[..2]);

    let f = std::fs::File::open(mnt.join("big/b")).unwrap();
    let size = files[2].1.len() as u64;
    let mut spoiled = None;
    let mut buf = vec![0u8; 1 << 20];
    for offset in (0..size).step_by(1 << 20) {
        let want = (size - offset).min(1 << 20) as usize;
        match f.read_exact_at(&mut buf[..want], offset) {
            Ok(()) => assert!(
                buf[..want] == files[2].1[offset as usize..offset as usize + want],
                "big/b differs at {offset}"
            ),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(5), "expected EIO, got {e}");
                spoiled.get_or_insert(offset);
            }
        }
    }
    let spoiled = spoiled.expect("no read of big/b failed");
    eprintln!("big/b spoiled from {spoiled} of {size}");
    assert!(spoiled > 0, "the flip spoiled big/b from its start");
    let status = agent.status();
    assert!(
        status["mounts"][0]["pull"]["verification_failures"]
            .as_u64()
            .unwrap()
            > 0,
        "{status}"
    );

    std::fs::write(&stored, &original).unwrap();
    drop(f);
    assert!(std::fs::read(mnt.join("big/b")).unwrap() == files[2].1);
    agent.ok(&["umount", s(&mnt)]);
}

/// An index pushed for another image is refused, whether it names that image as its
/// subject or names this one over another image's layers; so is an index whose
/// bootstrap is damaged or not a bootstrap at all. Each refusal says what to do.
#[test]
fn an_index_for_another_image_or_a_damaged_one_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let home = home(t.path());
    let registry = Registry::start();
    push_files_image(t.path(), &registry, "src/files", "a", 0);
    push_files_image(t.path(), &registry, "src/files", "b", 7);
    let (a, b) = (
        format!("{}/src/files:a", registry.addr),
        format!("{}/src/files:b", registry.addr),
    );
    support::index(&home, &b, &[]);
    let (digest_a, digest_b) = (manifest_digest(&a), manifest_digest(&b));
    let repo = Reference::parse(&format!("{}/src/files", registry.addr)).unwrap();
    let found = block_on(referrers::list(
        &client(),
        &repo,
        &digest_b,
        Some(INDEX_ARTIFACT_TYPE),
    ))
    .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let agent = AgentProcess::start(&t.path().join("agent"), &["--prefetch", "none"]);
    let mnt = mountpoint(t.path(), "mnt");
    let refusal = |image: &str| {
        let out = agent.run(&["mount", image, s(&mnt)]);
        assert!(!out.status.success(), "mounting {image} succeeded");
        assert!(!is_mounted(&mnt));
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("{image}: {stderr}");
        stderr
    };

    // A's referrers tag (distribution 2.8 has no referrers API) set to `manifests`.
    let tagged = Reference {
        tag: Some(referrers::fallback_tag(&digest_a)),
        ..repo.clone()
    };
    let set_referrers_of_a = |manifests: serde_json::Value| {
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": referrers::INDEX_TYPE,
            "manifests": manifests,
        });
        let bytes = serde_json::to_vec(&index).unwrap();
        block_on(client().push_manifest(&tagged, referrers::INDEX_TYPE, bytes)).unwrap();
    };

    // B's index listed as a referrer of A: its subject is B.
    set_referrers_of_a(serde_json::json!([{
        "mediaType": referrers::MANIFEST_TYPE,
        "digest": found[0].digest,
        "size": found[0].size,
        "artifactType": INDEX_ARTIFACT_TYPE,
    }]));
    let stderr = refusal(&a);
    assert!(
        stderr.contains(&format!("its subject is {digest_b}")) && stderr.contains("tessera index"),
        "{stderr}"
    );

    // B's index pushed again with A as its subject: its blobs are B's layers.
    let artifact_ref = Reference {
        digest: Some(found[0].digest.clone()),
        ..repo.clone()
    };
    let artifact: serde_json::Value =
        serde_json::from_slice(&block_on(client().manifest(&artifact_ref)).unwrap().bytes).unwrap();
    let layers: Vec<Descriptor> = artifact["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| Descriptor {
            media_type: l["mediaType"].as_str().unwrap().to_string(),
            digest: l["digest"].as_str().unwrap().to_string(),
            size: l["size"].as_u64().unwrap(),
            artifact_type: None,
            annotations: Default::default(),
        })
        .collect();
    let push_for_a = |layers: &[Descriptor]| {
        // A fresh referrers tag: only this artifact.
        set_referrers_of_a(serde_json::json!([]));
        let manifest_a = block_on(client().manifest(&Reference::parse(&a).unwrap())).unwrap();
        let subject = Descriptor {
            media_type: manifest_a.media_type.clone(),
            digest: manifest_a.digest.clone(),
            size: manifest_a.bytes.len() as u64,
            artifact_type: None,
            annotations: Default::default(),
        };
        block_on(referrers::push(
            &client(),
            &repo,
            &Artifact {
                subject: &subject,
                artifact_type: INDEX_ARTIFACT_TYPE,
                layers,
                annotations: Default::default(),
            },
        ))
        .unwrap();
    };
    push_for_a(&layers);
    let stderr = refusal(&a);
    assert!(
        stderr.contains("is not a layer of this image") && stderr.contains("tessera index"),
        "{stderr}"
    );

    // An index whose bootstrap is cut short, then one of random bytes.
    let bootstrap = layers
        .iter()
        .find(|l| l.media_type == BOOTSTRAP_MEDIA_TYPE)
        .unwrap();
    let mut zst = Vec::new();
    block_on(client().blob(&repo, &bootstrap.digest, &mut zst)).unwrap();
    let whole = zstd::decode_all(&zst[..]).unwrap();
    for (what, bytes) in [
        ("cut short", whole[..whole.len() / 2].to_vec()),
        ("random", pseudo_random(64 << 10, 3)),
    ] {
        let zst = zstd::encode_all(&bytes[..], 3).unwrap();
        let path = t.path().join("bad.zst");
        std::fs::write(&path, &zst).unwrap();
        let digest = format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&zst))
        );
        block_on(client().push_blob(&repo, &digest, zst.len() as u64, &path, None, &|_| {}))
            .unwrap();
        let layers: Vec<Descriptor> = layers
            .iter()
            .map(|l| {
                if l.media_type == BOOTSTRAP_MEDIA_TYPE {
                    Descriptor {
                        digest: digest.clone(),
                        size: zst.len() as u64,
                        ..l.clone()
                    }
                } else {
                    l.clone()
                }
            })
            .collect();
        push_for_a(&layers);
        let stderr = refusal(&a);
        assert!(stderr.contains("bootstrap"), "{what}: {stderr}");
    }
    assert!(!agent.log().contains("panicked at"));
}
