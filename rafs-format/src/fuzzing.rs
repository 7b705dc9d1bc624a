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
        let _ = b.validate_all();
    }
    if let Some(size) = data.get(BOOTSTRAP_SIZE) {
        let len = (data.len() as u64).to_le_bytes();
        if size != len {
            let mut fixed = data.to_vec();
            fixed[BOOTSTRAP_SIZE].copy_from_slice(&len);
            if let Ok(b) = Bootstrap::from_bytes(fixed, Verify::Trusted) {
                exercise(&b);
                let _ = b.validate_all();
            }
        }
    }
}

/// Calls every reader accessor on an opened bootstrap, ignoring the results (callers
/// follow with `validate_all`).
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
/// succeeds, reads the image back with the checksum verified, validates and `check`s it.
///
/// A plain tar is also split into layers and built again: tars concatenated after an
/// end-of-archive marker are applied as the next layers (up to [`MAX_LAYERS`]), so
/// whiteouts and opaque markers meet lower layers; and every header's checksum is
/// recomputed, since a mutated header almost always fails its checksum and would stop
/// the fuzzer at the first check.
pub fn layer(data: &[u8]) {
    let _ = build_and_check(&[data]);
    if let Some((fixed, layers)) = split_tar(data) {
        let layers: Vec<&[u8]> = layers.into_iter().map(|r| &fixed[r]).collect();
        let _ = build_and_check(&layers);
    }
}

/// Like [`layer`], but panics if a build that succeeded wrote an image that the reader or
/// `check` rejects: the builder must refuse what the format cannot hold, not write it.
pub fn layer_roundtrip(data: &[u8]) {
    let fail = |why: String| -> ! {
        panic!("the builder accepted these layers but wrote an invalid image: {why}")
    };
    if let Err(Some(why)) = build_and_check(&[data]) {
        fail(why);
    }
    if let Some((fixed, layers)) = split_tar(data) {
        let layers: Vec<&[u8]> = layers.into_iter().map(|r| &fixed[r]).collect();
        if let Err(Some(why)) = build_and_check(&layers) {
            fail(why);
        }
    }
}

/// Layers applied at most, so a long run of tiny tars stays one cheap execution.
const MAX_LAYERS: usize = 4;

/// For a plain tar: the bytes with every header checksum recomputed, and the ranges of
/// the layers in them. `None` if that changes nothing (one layer, checksums right) or
/// `data` is compressed. Headers are found by walking sizes as a tar reader does,
/// approximately (PAX `size` records are not applied).
fn split_tar(data: &[u8]) -> Option<(Vec<u8>, Vec<std::ops::Range<usize>>)> {
    use crate::builder::tar::{parse_number, BLOCK};
    if data.starts_with(&[0x1f, 0x8b]) || data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return None;
    }
    let mut out = data.to_vec();
    let mut changed = false;
    let mut layers = Vec::new();
    let (mut start, mut pos, mut in_trailer) = (0, 0, false);
    while let Some(h) = out.get_mut(pos..pos + BLOCK) {
        if h.iter().all(|&b| b == 0) {
            in_trailer = true;
            pos += BLOCK;
            continue;
        }
        if in_trailer {
            // A header after the end-of-archive blocks starts the next layer.
            if layers.len() + 1 == MAX_LAYERS {
                break;
            }
            layers.push(start..pos);
            start = pos;
            in_trailer = false;
        }
        pos += BLOCK;
        let Ok(header) = <&[u8; BLOCK]>::try_from(&*h) else {
            break;
        };
        let (sum, _) = crate::builder::tar::header_checksums(header);
        if parse_number(&h[148..156], "checksum").ok() != Some(sum) {
            h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
            changed = true;
        }
        let size = parse_number(&h[124..136], "size").unwrap_or(0);
        let Some(next) = usize::try_from(size.div_ceil(BLOCK as u64))
            .ok()
            .and_then(|b| b.checked_mul(BLOCK))
            .and_then(|n| n.checked_add(pos))
            .filter(|&next| next < out.len())
        else {
            break;
        };
        pos = next;
    }
    layers.push(start..out.len());
    (changed || layers.len() > 1).then_some((out, layers))
}

/// `Err(None)`: the build failed (fine); `Err(Some(why))`: the build succeeded and the
/// image it wrote is invalid.
fn build_and_check(layers: &[&[u8]]) -> Result<(), Option<String>> {
    let dir = tempfile::tempdir().map_err(|_| None)?;
    let out = dir.path().join("image");
    build(layers, &out).map_err(|_| None)?;
    let b = Bootstrap::open(&out.join("bootstrap")).map_err(|e| Some(e.to_string()))?;
    exercise(&b);
    b.validate_all().map_err(|e| Some(e.to_string()))?;
    crate::image::check(&out).map_err(|e| Some(e.to_string()))?;
    Ok(())
}

fn build(layers: &[&[u8]], out: &Path) -> crate::Result<()> {
    let opts = BuildOptions {
        // Small chunks and a fast level keep one execution short.
        chunking: Chunking::Fixed { size: 4096 },
        compression_level: 1,
        ..BuildOptions::default()
    };
    let mut builder = Builder::new(out, opts)?;
    for layer in layers {
        builder.add_layer(*layer)?;
    }
    builder.finish()?;
    Ok(())
}

/// Output inflated per input: DEFLATE expands up to 1032×, so a small input could
/// otherwise keep the fuzzer busy for long.
const GZIP_MAX_OUT: u64 = 64 << 20;

/// Arbitrary bytes as a gzip layer: inflated from the start while recording
/// checkpoints (every 4 KiB of output), then resumed at each of the first checkpoints,
/// where the resumed output must equal the rest of the first pass's. Then the bytes as a
/// resume from a made-up checkpoint: the first byte's low 3 bits are the bit offset
/// and the next up to 255 bytes (the second byte says how many) the window.
pub fn gzip(data: &[u8]) {
    use crate::gzip::{Checkpoint, GzipReader};
    use std::io::Read;

    let mut whole = Vec::new();
    let mut reader = GzipReader::indexing(data, 4096);
    let complete = reader
        .by_ref()
        .take(GZIP_MAX_OUT)
        .read_to_end(&mut whole)
        .is_ok()
        && (whole.len() as u64) < GZIP_MAX_OUT;
    for cp in reader.take_checkpoints().iter().take(4) {
        let Some(from) = data.get((cp.in_bits / 8) as usize..) else {
            panic!("checkpoint {cp:?} is past the input's {} bytes", data.len());
        };
        let mut resumed = GzipReader::resume(from, cp).expect("a recorded checkpoint resumes");
        let mut rest = Vec::new();
        let resumed_ok = resumed
            .by_ref()
            .take(GZIP_MAX_OUT)
            .read_to_end(&mut rest)
            .is_ok()
            && (rest.len() as u64) < GZIP_MAX_OUT;
        let start = cp.out as usize;
        if complete && resumed_ok && start <= whole.len() {
            assert!(
                rest == whole[start..],
                "resuming at {cp:?} gave other bytes than the first pass"
            );
        }
    }

    if let [first, len, rest @ ..] = data {
        let window_len = (*len as usize).min(rest.len());
        let (window, stream) = rest.split_at(window_len);
        let cp = Checkpoint {
            in_bits: (*first & 7) as u64,
            out: window_len as u64,
            window: window.to_vec(),
        };
        if let Ok(resumed) = GzipReader::resume(stream, &cp) {
            let _ = std::io::copy(&mut resumed.take(GZIP_MAX_OUT), &mut std::io::sink());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = ::tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = ::tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        b.into_inner().expect("finish tar")
    }

    #[test]
    fn concatenated_tars_are_split_into_layers() {
        let lower = tar_of(&[("a/f", b"lower"), ("a/g", b"kept")]);
        let upper = tar_of(&[("a/.wh.f", b"")]);
        let both = [&lower[..], &upper[..]].concat();
        let (fixed, layers) = split_tar(&both).expect("two layers");
        assert!(fixed == both, "valid checksums are kept");
        assert_eq!(layers, vec![0..lower.len(), lower.len()..both.len()]);
        assert_eq!(split_tar(&lower), None);
        let layers: Vec<&[u8]> = layers.into_iter().map(|r| &fixed[r]).collect();
        assert_eq!(build_and_check(&layers), Ok(()));
    }

    #[test]
    fn broken_header_checksums_are_fixed() {
        let mut t = tar_of(&[("f", b"data")]);
        t[0] = b'g';
        let (fixed, layers) = split_tar(&t).expect("checksum fixed");
        assert_eq!(layers, vec![0..t.len()]);
        assert_eq!(build_and_check(&[&t[..]]), Err(None));
        assert_eq!(build_and_check(&[&fixed[..]]), Ok(()));
    }
}
