//! Entry points for the fuzz targets in `rafs-format/fuzz/` and for
//! `tests/fuzz_regressions.rs`, which replays their findings on stable Rust.
//!
//! Each function takes arbitrary bytes and must never panic, abort or allocate without
//! bound: errors are the expected answer to hostile input. They live in the crate (rather
//! than in the fuzz crate) so the regression test calls exactly what the fuzzer ran.

use std::path::Path;

use crate::builder::{BuildOptions, Builder};
use crate::chunk::Chunking;
use crate::layout::ROOT_INO;
use crate::reader::{Bootstrap, Inode, Verify};

/// Inodes visited per input, so a bootstrap of 2^32 inodes cannot stall the fuzzer.
const MAX_INODES: u32 = 100_000;
/// Directory entries, file pieces and xattrs visited per inode.
const MAX_PER_INODE: u32 = 1_000;
/// Records read in total by the per-inode accessors; `validate_all` is not limited.
const BUDGET: u64 = 1_000_000;
/// Byte range of `SuperblockV1::bootstrap_size`.
const BOOTSTRAP_SIZE: std::ops::Range<usize> = 48..56;

/// Opens `data` as a bootstrap (skipping the checksum so mutations reach the structure
/// checks) and, if it opens, calls every accessor over every index, then `validate_all`.
///
/// Mutations that insert or remove bytes break `bootstrap_size`; the bytes are also tried
/// with that field set to their length, so such mutations still reach the tables.
pub fn bootstrap(data: &[u8]) {
    if let Ok(b) = Bootstrap::from_bytes(data.to_vec(), Verify::Trusted) {
        exercise(&b);
    }
    if let Some(size) = data.get(BOOTSTRAP_SIZE) {
        let len = (data.len() as u64).to_le_bytes();
        if size != len {
            let mut fixed = data.to_vec();
            fixed[BOOTSTRAP_SIZE].copy_from_slice(&len);
            if let Ok(b) = Bootstrap::from_bytes(fixed, Verify::Trusted) {
                exercise(&b);
            }
        }
    }
}

/// Calls every reader accessor on an opened bootstrap, ignoring the results.
fn exercise(b: &Bootstrap) {
    let _ = (b.as_bytes().len(), b.digest_algo(), b.chunking());
    let mut budget = BUDGET;
    // Out-of-range numbers must be errors too, hence 0 and count + 1.
    let last = b.inode_count().min(MAX_INODES).saturating_add(1);
    for ino in 0..=last {
        if budget == 0 {
            break;
        }
        budget -= 1;
        if let Ok(inode) = b.inode(ino) {
            exercise_inode(b, &inode, &mut budget);
        }
    }
    for i in 0..b.chunk_count().min(MAX_INODES).saturating_add(1) {
        let _ = b.chunk(i);
    }
    for i in 0..b.blob_count().min(MAX_INODES).saturating_add(1) {
        let _ = b.blob(i);
    }
    let _ = (b.chunk(u32::MAX), b.blob(u32::MAX), b.blobs());
    if let Ok(prefetch) = b.prefetch() {
        for p in prefetch.iter().take(MAX_PER_INODE as usize) {
            let _ = b.resolve(p.path);
        }
    }
    for path in [
        &b""[..],
        b"/",
        b".",
        b"/./",
        b"a",
        b"/a/b/c",
        b"bin/sh",
        b"//x//",
    ] {
        let _ = b.resolve(path);
    }
    let _ = b.validate_all();
}

fn exercise_inode(b: &Bootstrap, inode: &Inode, budget: &mut u64) {
    let _ = inode.mode();
    let n = b.dir_len(inode).min(MAX_PER_INODE);
    for e in b.dir_entries(inode).take(n as usize) {
        *budget = budget.saturating_sub(1);
        let Ok(e) = e else { continue };
        let _ = b.lookup(inode, e.name);
        let mut missing = e.name.to_vec();
        missing.push(0xff);
        let _ = b.lookup(inode, &missing);
        if inode.ino == ROOT_INO {
            let _ = b.resolve(e.name);
        }
    }
    for i in [0, 1, n / 2, n.saturating_sub(1), n, u32::MAX] {
        let _ = b.dir_entry(inode, i);
    }
    let _ = b.lookup(inode, b"");
    let _ = b.lookup(inode, b"\xff\xff\xff\xff");
    if *budget > u64::from(MAX_PER_INODE) {
        // Pieces and xattrs are bounded by their tables' sizes, checked in `inode`.
        if let Ok(pieces) = b.file_chunks(inode) {
            *budget = budget.saturating_sub(pieces.len() as u64);
            for p in pieces.iter().take(MAX_PER_INODE as usize) {
                if let Some(Ok(info)) = p.chunk.map(|c| b.chunk(c)) {
                    let _ = b
                        .blob(info.blob_index)
                        .map(|blob| (blob.hex(), blob.oci_digest()));
                }
            }
        }
        if let Ok(x) = b.xattrs(inode) {
            *budget = budget.saturating_sub(x.len() as u64);
        }
    }
    let _ = b.symlink_target(inode);
}

/// Builds an image from `data` as a layer tarball (plain, gzip or zstd); if the build
/// succeeds, reads the image back with the checksum verified and validates it.
pub fn layer(data: &[u8]) {
    let _ = build_and_check(data);
}

/// Like [`layer`], but panics if a build that succeeded wrote an image that the reader or
/// `check` rejects: the builder must refuse what the format cannot hold, not write it.
pub fn layer_roundtrip(data: &[u8]) {
    if let Err(Some(why)) = build_and_check(data) {
        panic!("the builder accepted this layer but wrote an invalid image: {why}");
    }
}

/// `Err(None)`: the build failed (fine); `Err(Some(why))`: the build succeeded and the
/// image it wrote is invalid.
fn build_and_check(data: &[u8]) -> Result<(), Option<String>> {
    let dir = tempfile::tempdir().map_err(|_| None)?;
    let out = dir.path().join("image");
    build(data, &out).map_err(|_| None)?;
    let b = Bootstrap::open(&out.join("bootstrap")).map_err(|e| Some(e.to_string()))?;
    exercise(&b);
    b.validate_all().map_err(|e| Some(e.to_string()))?;
    crate::image::check(&out).map_err(|e| Some(e.to_string()))?;
    Ok(())
}

fn build(data: &[u8], out: &Path) -> crate::Result<()> {
    let opts = BuildOptions {
        // Small chunks and a fast level keep one execution short.
        chunking: Chunking::Fixed { size: 4096 },
        compression_level: 1,
        ..BuildOptions::default()
    };
    let mut builder = Builder::new(out, opts)?;
    builder.add_layer(data)?;
    builder.finish()?;
    Ok(())
}
