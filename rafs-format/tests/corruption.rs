//! A corrupt, truncated or hostile bootstrap or blob gets a typed error naming what is
//! wrong — never a panic, never a wrong answer.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::path::Path;

use rafs_format::builder::{BuildOptions, Builder};
use rafs_format::chunk::Chunking;
use rafs_format::image;
use rafs_format::reader::{Bootstrap, Verify};
use rafs_format::Error;

/// Builds a small image with every kind of record: dirs, files over several chunks,
/// a hardlink, a symlink, xattrs and a prefetch list.
fn small_image(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("etc/deep")).unwrap();
    std::fs::write(src.join("etc/hosts"), b"127.0.0.1 localhost\n".repeat(50)).unwrap();
    let big: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("etc/deep/big"), &big).unwrap();
    std::fs::hard_link(src.join("etc/hosts"), src.join("hosts.link")).unwrap();
    std::os::unix::fs::symlink("etc/hosts", src.join("sym")).unwrap();
    xattr::set(src.join("etc"), "user.test", b"value").unwrap();
    let list = vec!["/etc/deep/big".to_string()];
    let out = dir.join("img");
    let opts = BuildOptions {
        chunking: Chunking::Fixed { size: 4096 },
        prefetch: list,
        ..BuildOptions::default()
    };
    let mut b = Builder::new(&out, opts).unwrap();
    b.add_dir(&src).unwrap();
    b.finish().unwrap();
    out
}

/// Opens and walks everything, as `check` does before reading chunks.
fn open_and_validate(bytes: Vec<u8>, verify: Verify) -> Result<(), Error> {
    let b = Bootstrap::from_bytes(bytes, verify)?;
    b.validate_all()
}

#[test]
fn every_truncation_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    let bytes = std::fs::read(img.join("bootstrap")).unwrap();
    assert!(open_and_validate(bytes.clone(), Verify::Checksum).is_ok());
    for len in 0..bytes.len() {
        for verify in [Verify::Checksum, Verify::Trusted] {
            let err = open_and_validate(bytes[..len].to_vec(), verify)
                .expect_err(&format!("truncated to {len} bytes must fail"));
            let msg = err.to_string();
            assert!(
                msg.contains("truncated")
                    || msg.contains("bootstrap_size")
                    || msg.contains("magic"),
                "truncation to {len}: unhelpful error {msg}"
            );
        }
    }
}

#[test]
fn every_flipped_byte_is_caught_by_the_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    let bytes = std::fs::read(img.join("bootstrap")).unwrap();
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x5a;
        let err =
            open_and_validate(bad, Verify::Checksum).expect_err(&format!("flip at {i} must fail"));
        if !(8..12).contains(&i) && !(48..56).contains(&i) && i >= 8 {
            assert!(
                matches!(err, Error::ChecksumMismatch { .. }),
                "flip at {i}: expected a checksum mismatch, got {err}"
            );
        }
    }
}

/// Without the checksum (the bootstrap was "verified" by digest elsewhere), structural
/// validation must still hold: thousands of random mutations never panic, and those
/// that break structure are typed errors.
#[test]
fn random_mutations_without_checksum_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    let bytes = std::fs::read(img.join("bootstrap")).unwrap();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut errors = 0;
    for _ in 0..20_000 {
        let mut bad = bytes.clone();
        for _ in 0..1 + rand() % 4 {
            let i = (rand() % bad.len() as u64) as usize;
            bad[i] = match rand() % 3 {
                0 => rand() as u8,
                1 => 0xff,
                _ => 0,
            };
        }
        if open_and_validate(bad, Verify::Trusted).is_err() {
            errors += 1;
        }
    }
    assert!(
        errors > 1000,
        "only {errors} of 20000 mutations were detected"
    );
}

#[test]
fn random_bytes_are_not_a_bootstrap() {
    for len in [0usize, 10, 255, 256, 4096] {
        let junk: Vec<u8> = (0..len).map(|i| (i * 31 % 256) as u8).collect();
        let err = Bootstrap::from_bytes(junk, Verify::Checksum).unwrap_err();
        assert!(
            matches!(err, Error::BadMagic { .. } | Error::Truncated { .. }),
            "{err}"
        );
    }
}

/// A bad field is named with its structure, offset and value.
#[test]
fn a_bad_field_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    let mut bytes = std::fs::read(img.join("bootstrap")).unwrap();
    // Inode table offset is at superblock bytes 72..80; corrupt inode 2's mode.
    let inodes = u64::from_le_bytes(bytes[72..80].try_into().unwrap()) as usize;
    let at = inodes + 64;
    bytes[at..at + 4].copy_from_slice(&0o170777u32.to_le_bytes());
    let err = open_and_validate(bytes, Verify::Trusted).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("inode[2].mode"), "{msg}");
    assert!(msg.contains(&format!("offset {at}")), "{msg}");
    assert!(msg.contains("170777"), "{msg}");
}

#[test]
fn a_flipped_blob_byte_names_the_chunk_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    image::check(&img).unwrap();
    let b = Bootstrap::open(&img.join("bootstrap")).unwrap();
    let blob = b.blob(0).unwrap();
    let blob_path = img.join("blobs").join(blob.hex());
    let pristine = std::fs::read(&blob_path).unwrap();
    // Flip a byte inside each chunk in turn: check names that chunk every time.
    for c in 0..b.chunk_count() {
        let chunk = b.chunk(c).unwrap();
        let mut bad = pristine.clone();
        bad[(chunk.compressed_offset + u64::from(chunk.compressed_size) / 2) as usize] ^= 1;
        std::fs::write(&blob_path, &bad).unwrap();
        let err = image::check(&img).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&format!("chunk {c} ")), "{msg}");
        assert!(
            msg.contains(&format!("at offset {}", chunk.compressed_offset)),
            "{msg}"
        );
        assert!(msg.contains("file /"), "{msg}");
    }
    std::fs::write(&blob_path, &pristine).unwrap();
    image::check(&img).unwrap();
    // A missing or short blob is named too.
    std::fs::write(&blob_path, &pristine[..pristine.len() - 1]).unwrap();
    let msg = image::check(&img).unwrap_err().to_string();
    assert!(msg.contains(&blob.hex()) || msg.contains("blob"), "{msg}");
}

/// Two files claiming the same piece range would make whole-image validation quadratic
/// (found by fuzzing); ranges must follow each other.
#[test]
fn overlapping_ranges_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = small_image(dir.path());
    let bytes = std::fs::read(img.join("bootstrap")).unwrap();
    let b = Bootstrap::from_bytes(bytes.clone(), Verify::Checksum).unwrap();
    let inodes = u64::from_le_bytes(bytes[72..80].try_into().unwrap()) as usize;
    // Find two regular files and point the second at the first one's pieces.
    let files: Vec<u32> = (1..=b.inode_count())
        .filter(|&i| b.inode(i).unwrap().kind == rafs_format::reader::FileKind::Regular)
        .collect();
    let (first, second) = (files[0] as usize, files[1] as usize);
    let rec = |ino: usize| inodes + (ino - 1) * 64;
    let mut bad = bytes.clone();
    let src = rec(first);
    let dst = rec(second);
    // size, data_start and data_count of the first file copied onto the second.
    let size: [u8; 8] = bytes[src + 16..src + 24].try_into().unwrap();
    let range: [u8; 8] = bytes[src + 48..src + 56].try_into().unwrap();
    bad[dst + 16..dst + 24].copy_from_slice(&size);
    bad[dst + 48..dst + 56].copy_from_slice(&range);
    let err = open_and_validate(bad, Verify::Trusted)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must not overlap"), "{err}");
}
