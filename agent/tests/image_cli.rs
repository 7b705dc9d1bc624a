//! The image tools end to end through the real `tessera` binary: build → check →
//! unpack round trips over every file type, OCI layouts made by umoci and skopeo,
//! deduplication, chunk dictionaries, CDC, reproducibility and corruption.
//!
//! Runs as root (it creates devices and chowns files); the OCI tests need umoci,
//! skopeo, GNU tar and setfattr (`make test-deps`).

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::path::Path;

use rafs_format::reader::Bootstrap;
use support::fstree::{assert_trees_equal, compare_trees, generate_tree, CompareOptions, TreeSpec};
use support::{build, oci, s, tessera, tessera_ok};

fn unpack(img: &Path, to: &Path) {
    tessera_ok(&["unpack", s(img), "--to", s(to)]);
}

/// Every file type, hardlinks, xattrs, sparse and empty files, unicode and 255-byte
/// names, deep paths and large files survive build → unpack exactly, under every
/// chunking, compression and digest option.
#[test]
fn round_trip_every_file_type_under_every_option() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    generate_tree(&src, &TreeSpec::default()).unwrap();
    let variants: &[(&str, &[&str])] = &[
        ("default", &[]),
        (
            "cdc-gzip-blake3",
            &[
                "--chunking",
                "cdc",
                "--chunk-size",
                "64K",
                "--compression",
                "gzip",
                "--digest",
                "blake3",
            ],
        ),
        (
            "fixed4k-none",
            &["--chunk-size", "4K", "--compression", "none"],
        ),
        (
            "fixed16m-zstd1",
            &["--chunk-size", "16M", "--compression-level", "1"],
        ),
    ];
    for (name, args) in variants {
        let img = t.path().join(format!("img-{name}"));
        let mut full = vec!["--dir", s(&src)];
        full.extend_from_slice(args);
        let summary = build(&img, &full);
        assert!(
            summary["regular_files"].as_u64().unwrap() > 100,
            "{summary}"
        );
        tessera_ok(&["check", s(&img)]);
        let out = t.path().join(format!("out-{name}"));
        unpack(&img, &out);
        assert_trees_equal(&src, &out, &CompareOptions::default());
    }
}

/// The same inputs give byte-identical bootstrap and blobs.
#[test]
fn builds_are_reproducible() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    generate_tree(
        &src,
        &TreeSpec {
            files: 60,
            large_file_bytes: 3 << 20,
            ..TreeSpec::default()
        },
    )
    .unwrap();
    let a = build(
        &t.path().join("a"),
        &["--dir", s(&src), "--chunking", "cdc", "--chunk-size", "64K"],
    );
    let b = build(
        &t.path().join("b"),
        &["--dir", s(&src), "--chunking", "cdc", "--chunk-size", "64K"],
    );
    assert_eq!(a["bootstrap_digest"], b["bootstrap_digest"]);
    assert_eq!(a["blobs"], b["blobs"]);
    let read = |p: &Path| std::fs::read(p).unwrap();
    assert_eq!(
        read(&t.path().join("a/bootstrap")),
        read(&t.path().join("b/bootstrap"))
    );
    let blob = a["new_blob"]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:");
    assert_eq!(
        read(&t.path().join("a/blobs").join(blob)),
        read(&t.path().join("b/blobs").join(blob))
    );
}

/// `unpack --tar` writes a layer that builds back into the same tree (sockets aside:
/// tar cannot hold them).
#[test]
fn tar_output_builds_back_to_the_same_tree() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    generate_tree(
        &src,
        &TreeSpec {
            files: 80,
            large_file_bytes: 2 << 20,
            ..TreeSpec::default()
        },
    )
    .unwrap();
    let img = t.path().join("img");
    build(&img, &["--dir", s(&src)]);
    let tar = t.path().join("image.tar");
    tessera_ok(&["unpack", s(&img), "--tar", s(&tar)]);
    let img2 = t.path().join("img2");
    build(&img2, &["--layer", s(&tar)]);
    let out = t.path().join("out");
    unpack(&img2, &out);
    let diffs = compare_trees(&src, &out, &CompareOptions::default());
    assert_eq!(
        diffs,
        vec!["special/socket: only in expected".to_string()],
        "{diffs:#?}"
    );
    // GNU tar reads our tar too.
    let gnu = t.path().join("gnu");
    std::fs::create_dir(&gnu).unwrap();
    oci::run(std::process::Command::new("tar").args([
        "--xattrs",
        "--xattrs-include=*",
        "--numeric-owner",
        "-xpf",
        s(&tar),
        "-C",
        s(&gnu),
    ]));
    assert!(gnu.join("hard/original").is_file());
}

/// An image with several layers, deletions and an opaque directory, made by umoci and
/// exported by skopeo (gzip and zstd layers), unpacks to what `umoci unpack` gives.
#[test]
fn oci_layout_matches_umoci_unpack() {
    for tool in ["umoci", "skopeo", "tar", "setfattr"] {
        oci::require_tool(tool);
    }
    let t = tempfile::tempdir().unwrap();
    let image = oci::build_layered_image(t.path());
    let reference = oci::umoci_unpack_rootfs(&image.layout, &image.tag, &t.path().join("ref"));
    let mut sources = vec![("exported", image.exported.clone())];
    if let Some(z) = &image.exported_zstd {
        sources.push(("zstd", z.clone()));
    }
    for (name, layout) in sources {
        let img = t.path().join(format!("img-{name}"));
        let summary = build(
            &img,
            &["--oci-layout", &format!("{}:{}", s(&layout), image.tag)],
        );
        assert!(summary["regular_files"].as_u64().unwrap() > 10, "{summary}");
        tessera_ok(&["check", s(&img)]);
        let out = t.path().join(format!("out-{name}"));
        unpack(&img, &out);
        assert_trees_equal(&reference, &out, &CompareOptions::default());
        // The comparison is only as good as the fixture: make sure the interesting
        // cases are really in it.
        assert!(
            !out.join("opaque/lower.txt").exists(),
            "opaque dir kept a lower file"
        );
        assert!(out.join("opaque/new.txt").is_file());
        assert!(
            !out.join("doomed").is_dir(),
            "whiteout of a directory ignored"
        );
        assert!(out.join("data/will-be-dir").is_dir());
        assert!(out.join(oci::LONG_FILE).is_file());
        assert!(out.join(oci::DEEP_FILE).is_file());
    }
}

/// A layout whose layer does not match its digest is refused, naming the layer.
#[test]
fn oci_layout_with_a_corrupt_layer_is_refused() {
    for tool in ["umoci", "skopeo", "tar", "setfattr"] {
        oci::require_tool(tool);
    }
    let t = tempfile::tempdir().unwrap();
    let image = oci::build_layered_image(t.path());
    // Damage the largest blob of the layout (a layer).
    let blobs = image.layout.join("blobs/sha256");
    let largest = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&largest).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&largest, &bytes).unwrap();
    let out = tessera()
        .args([
            "build",
            "--out",
            s(&t.path().join("img")),
            "--oci-layout",
            &format!("{}:v1", s(&image.layout)),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let hex = largest.file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains(hex) || err.contains("gzip") || err.contains("corrupt"),
        "{err}"
    );
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn new_blob_size(summary: &serde_json::Value) -> u64 {
    summary["new_blob"]["size"].as_u64().unwrap_or(0)
}

/// Identical files and repeated chunks are stored once.
#[test]
fn identical_files_are_stored_once() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    let data = random_bytes(1, 3 << 20);
    for p in ["one", "a/two", "a/b/three", "a/b/four"] {
        std::fs::write(src.join(p), &data).unwrap();
    }
    let summary = build(&t.path().join("img"), &["--dir", s(&src)]);
    assert_eq!(summary["chunks"], 12, "{summary}");
    assert_eq!(summary["unique_chunks"], 3, "{summary}");
    // Random data does not compress: the blob holds the 3 MiB once.
    assert_eq!(new_blob_size(&summary), 3 << 20, "{summary}");
}

/// Rebuilt with `--chunk-dict` of its previous version, an image writes only its new
/// chunks: exactly the blob a build of the new file alone writes.
#[test]
fn chunk_dict_writes_only_new_chunks() {
    let t = tempfile::tempdir().unwrap();
    let v1 = t.path().join("v1");
    std::fs::create_dir_all(v1.join("lib")).unwrap();
    for i in 0..6u64 {
        std::fs::write(v1.join(format!("lib/f{i}")), random_bytes(10 + i, 2 << 20)).unwrap();
    }
    let v2 = t.path().join("v2");
    oci::run(std::process::Command::new("cp").args(["-a", s(&v1), s(&v2)]));
    let new_file = random_bytes(99, 1_500_000);
    std::fs::write(v2.join("lib/new"), &new_file).unwrap();
    let only_new = t.path().join("only-new");
    std::fs::create_dir(&only_new).unwrap();
    std::fs::write(only_new.join("new"), &new_file).unwrap();

    let img1 = t.path().join("img1");
    let s1 = build(&img1, &["--dir", s(&v1)]);
    let s2 = build(
        &t.path().join("img2"),
        &["--dir", s(&v2), "--chunk-dict", s(&img1)],
    );
    let s3 = build(&t.path().join("img3"), &["--dir", s(&only_new)]);
    let full = build(&t.path().join("img2-full"), &["--dir", s(&v2)]);

    assert_eq!(s2["dict_chunks"], s1["unique_chunks"], "{s2}");
    assert_eq!(new_blob_size(&s2), new_blob_size(&s3), "{s2}");
    assert_eq!(
        new_blob_size(&full),
        new_blob_size(&s1) + new_blob_size(&s3)
    );
    assert_eq!(s2["blobs"].as_array().unwrap().len(), 2);
    // The new image dir is complete on its own.
    tessera_ok(&["check", s(&t.path().join("img2"))]);
    let out = t.path().join("out2");
    unpack(&t.path().join("img2"), &out);
    assert_trees_equal(&v2, &out, &CompareOptions::default());
}

/// CDC's edge: bytes inserted near the start of a file change only the chunks around
/// them, while fixed chunking changes every later chunk.
#[test]
fn cdc_survives_an_insertion_fixed_chunking_does_not() {
    let t = tempfile::tempdir().unwrap();
    let original = random_bytes(7, 8 << 20);
    let mut edited = original[..5000].to_vec();
    edited.extend_from_slice(b"a hundred bytes inserted near the start of the file.......................................!!");
    edited.extend_from_slice(&original[5000..]);
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(a.join("f"), &original).unwrap();
    std::fs::write(b.join("f"), &edited).unwrap();
    let shared = |chunking: &str| -> (u64, u64) {
        let dict = t.path().join(format!("dict-{chunking}"));
        build(
            &dict,
            &[
                "--dir",
                s(&a),
                "--chunking",
                chunking,
                "--chunk-size",
                "64K",
            ],
        );
        let summary = build(
            &t.path().join(format!("new-{chunking}")),
            &[
                "--dir",
                s(&b),
                "--chunking",
                chunking,
                "--chunk-size",
                "64K",
                "--chunk-dict",
                s(&dict),
            ],
        );
        (
            summary["dict_chunks"].as_u64().unwrap(),
            summary["unique_chunks"].as_u64().unwrap(),
        )
    };
    let (cdc_shared, cdc_total) = shared("cdc");
    let (fixed_shared, fixed_total) = shared("fixed");
    assert!(cdc_total > 50 && fixed_total > 100);
    assert!(
        cdc_shared * 10 >= cdc_total * 9,
        "CDC shares only {cdc_shared} of {cdc_total} chunks"
    );
    assert!(
        fixed_shared <= 1,
        "fixed chunking shares {fixed_shared} of {fixed_total} chunks"
    );
}

/// The prefetch list is recorded, and its files' chunks come first in the blob.
#[test]
fn prefetch_list_is_recorded_and_placed_first() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("usr/bin")).unwrap();
    std::fs::write(src.join("a-first-by-name"), random_bytes(3, 300_000)).unwrap();
    std::fs::write(src.join("usr/bin/app"), random_bytes(4, 300_000)).unwrap();
    let list = t.path().join("prefetch.txt");
    std::fs::write(&list, "# start-up files\n/usr/bin/app\n/not/there\n").unwrap();
    let summary = build(
        &t.path().join("img"),
        &["--dir", s(&src), "--prefetch-list", s(&list)],
    );
    assert_eq!(
        summary["prefetch_missing"],
        serde_json::json!(["/not/there"])
    );
    let listing: serde_json::Value = serde_json::from_slice(
        &tessera_ok(&["inspect", "--json", s(&t.path().join("img"))]).stdout,
    )
    .unwrap();
    assert_eq!(
        listing["stats"]["prefetch"],
        serde_json::json!(["/usr/bin/app"])
    );
    let b = Bootstrap::open(&t.path().join("img/bootstrap")).unwrap();
    let app = b.resolve(b"usr/bin/app").unwrap().unwrap();
    let first = b.file_chunks(&app).unwrap()[0].chunk.unwrap();
    assert_eq!(b.chunk(first).unwrap().compressed_offset, 0);
}

/// Damage is reported by the CLI with what to look at, and a non-zero exit.
#[test]
fn cli_reports_corruption() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("file"), random_bytes(5, 100_000)).unwrap();
    let img = t.path().join("img");
    let summary = build(&img, &["--dir", s(&src)]);
    let blob = summary["new_blob"]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let blob_path = img.join("blobs").join(&blob);
    let mut bytes = std::fs::read(&blob_path).unwrap();
    bytes[50_000] ^= 0x01;
    std::fs::write(&blob_path, &bytes).unwrap();
    let out = tessera().args(["check", s(&img)]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("file /file"), "{err}");
    assert!(err.contains("chunk 0 "), "{err}");
    assert!(
        err.contains(&format!("blob sha256:{blob} at offset 0")),
        "{err}"
    );
    assert!(err.contains("digest mismatch"), "{err}");
    // A truncated bootstrap is named as such by every command.
    let boot = img.join("bootstrap");
    let b = std::fs::read(&boot).unwrap();
    std::fs::write(&boot, &b[..b.len() / 2]).unwrap();
    for cmd in [
        &["inspect"][..],
        &["check"],
        &["unpack", "--to", s(&t.path().join("x"))],
    ] {
        let mut args = cmd.to_vec();
        args.insert(1, s(&img));
        let out = tessera().args(&args).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("bootstrap_size") || err.contains("truncated"),
            "{cmd:?}: {err}"
        );
    }
}
