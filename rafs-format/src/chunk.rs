//! Chunk codecs shared by the builder and every reader: digests and compression.
//!
//! A chunk is digested over its *uncompressed* bytes, so the same data has the same
//! digest whatever compression a build chose, and a reader can verify a chunk from any
//! source (cache, peer, origin) after decompressing it.

use std::io::Read;

use serde::{Deserialize, Serialize};

/// Largest uncompressed chunk the format allows (16 MiB). Readers refuse larger chunks so
/// a hostile bootstrap cannot make them allocate without bound.
pub const MAX_CHUNK_SIZE: u32 = 16 << 20;
/// Smallest fixed chunk size a build may ask for (4 KiB).
pub const MIN_CHUNK_SIZE: u32 = 4 << 10;

/// How files are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Chunking {
    /// Every chunk but a file's last is `size` bytes (a power of two, 4 KiB..=16 MiB).
    Fixed { size: u32 },
    /// FastCDC content-defined chunking: boundaries follow the content, so an insertion
    /// moves only the chunks around it.
    Cdc { min: u32, avg: u32, max: u32 },
}

impl Default for Chunking {
    fn default() -> Self {
        Chunking::Fixed { size: 1 << 20 }
    }
}

impl std::fmt::Display for Chunking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kib = |n: u32| format!("{}K", n / 1024);
        match *self {
            Chunking::Fixed { size } => write!(f, "fixed {}", kib(size)),
            Chunking::Cdc { min, avg, max } => {
                write!(f, "cdc min {} avg {} max {}", kib(min), kib(avg), kib(max))
            }
        }
    }
}

impl Chunking {
    /// Why these parameters are not allowed, if they are not.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Chunking::Fixed { size } => {
                if !size.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&size) {
                    return Err(format!(
                        "chunk size {size} must be a power of two from 4 KiB to 16 MiB"
                    ));
                }
            }
            Chunking::Cdc { min, avg, max } => {
                use fastcdc::v2020::{
                    AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN,
                };
                if !(min < avg && avg < max) {
                    return Err(format!(
                        "CDC sizes must satisfy min < avg < max (got {min}/{avg}/{max})"
                    ));
                }
                // FastCDC's own limits (it asserts them), and ours: no chunk under 1 KiB.
                let min_ok = (MINIMUM_MIN.max(MIN_CHUNK_SIZE / 4)..=MINIMUM_MAX).contains(&min);
                let avg_ok = (AVERAGE_MIN..=AVERAGE_MAX).contains(&avg);
                let max_ok = (MAXIMUM_MIN..=MAXIMUM_MAX.min(MAX_CHUNK_SIZE)).contains(&max);
                if !(min_ok && avg_ok && max_ok) {
                    return Err(format!(
                        "CDC sizes min {min} / avg {avg} / max {max} out of range: \
                         min 1 KiB..=1 MiB, avg 256 B..=4 MiB, max 1 KiB..=16 MiB"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Algorithm of chunk digests (one per image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DigestAlgo {
    Sha256,
    Blake3,
}

impl DigestAlgo {
    /// The byte stored in the superblock (docs/format.md, `digest_algo`).
    pub fn to_byte(self) -> u8 {
        match self {
            DigestAlgo::Sha256 => 1,
            DigestAlgo::Blake3 => 2,
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(DigestAlgo::Sha256),
            2 => Some(DigestAlgo::Blake3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DigestAlgo::Sha256 => "sha256",
            DigestAlgo::Blake3 => "blake3",
        }
    }

    pub fn digest(self, data: &[u8]) -> [u8; 32] {
        match self {
            DigestAlgo::Sha256 => {
                use sha2::Digest;
                sha2::Sha256::digest(data).into()
            }
            DigestAlgo::Blake3 => blake3::hash(data).into(),
        }
    }

    /// `algo:hex` as printed to people.
    pub fn format(self, digest: &[u8; 32]) -> String {
        format!("{}:{}", self.name(), hex::encode(digest))
    }
}

impl std::str::FromStr for DigestAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(DigestAlgo::Sha256),
            "blake3" => Ok(DigestAlgo::Blake3),
            _ => Err(format!("unknown digest {s:?}: expected sha256 or blake3")),
        }
    }
}

/// How one chunk is stored in its blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Zstd,
    Gzip,
    /// A span of an unconverted gzip layer (format.md §17.3): inflated from a checkpoint
    /// by `reader::read_chunk`, never written by the builder's compressor.
    GzipSpan,
}

impl Compression {
    pub fn to_byte(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 1,
            Compression::Gzip => 2,
            Compression::GzipSpan => 3,
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Compression::None),
            1 => Some(Compression::Zstd),
            2 => Some(Compression::Gzip),
            3 => Some(Compression::GzipSpan),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
            Compression::GzipSpan => "gzip-span",
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "zstd" => Ok(Compression::Zstd),
            "gzip" => Ok(Compression::Gzip),
            _ => Err(format!(
                "unknown compression {s:?}: expected zstd, gzip or none"
            )),
        }
    }
}

/// Compresses one chunk. Returns the stored bytes and the compression actually used:
/// a chunk that does not shrink is stored raw, so readers never pay to inflate it.
pub fn compress(data: &[u8], compression: Compression, level: i32) -> (Vec<u8>, Compression) {
    let packed = match compression {
        // Spans are made by indexing a layer, not by compressing a chunk.
        Compression::None | Compression::GzipSpan => None,
        // In-memory compression of a buffer cannot fail short of allocation failure;
        // treat any error as "did not shrink" rather than failing the build.
        Compression::Zstd => zstd_compress(data, level),
        Compression::Gzip => {
            use std::io::Write;
            let level = flate2::Compression::new(level.clamp(0, 9) as u32);
            let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 2), level);
            enc.write_all(data).ok().and_then(|_| enc.finish().ok())
        }
    };
    match packed {
        Some(p) if p.len() < data.len() => (p, compression),
        _ => (data.to_vec(), Compression::None),
    }
}

/// zstd with one compression context per thread and level: creating a context costs
/// more than compressing a small chunk.
fn zstd_compress(data: &[u8], level: i32) -> Option<Vec<u8>> {
    use std::cell::RefCell;
    thread_local! {
        static CONTEXT: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
            const { RefCell::new(None) };
    }
    CONTEXT.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        slot.as_mut()?.1.compress(data).ok()
    })
}

/// Decompresses one chunk into exactly `uncompressed_size` bytes; anything else is an
/// error string naming what went wrong. Never allocates more than `uncompressed_size`.
pub fn decompress(
    stored: &[u8],
    compression: Compression,
    uncompressed_size: u32,
) -> Result<Vec<u8>, String> {
    let expected = uncompressed_size as usize;
    let out = match compression {
        Compression::None => stored.to_vec(),
        Compression::Zstd => zstd::bulk::decompress(stored, expected)
            .map_err(|e| format!("zstd decompression failed: {e}"))?,
        Compression::Gzip => {
            let mut out = Vec::with_capacity(expected);
            flate2::read::GzDecoder::new(stored)
                .take(expected as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip decompression failed: {e}"))?;
            out
        }
        Compression::GzipSpan => {
            return Err("a span of a gzip layer is inflated from its checkpoint \
                 (rafs_format::gzip::inflate_ranges), not on its own"
                .into())
        }
    };
    if out.len() != expected {
        return Err(format!(
            "decompressed to {} bytes, expected {expected}",
            out.len()
        ));
    }
    Ok(out)
}

/// Decompresses a stored chunk and checks it against its digest: the one gate every
/// chunk passes before anyone uses it.
pub fn decode_and_verify(
    stored: &[u8],
    compression: Compression,
    uncompressed_size: u32,
    algo: DigestAlgo,
    digest: &[u8; 32],
) -> Result<Vec<u8>, String> {
    let data = decompress(stored, compression, uncompressed_size)?;
    verify_digest(&data, algo, digest)?;
    Ok(data)
}

/// Checks decoded chunk bytes against their digest (what [`decode_and_verify`] does
/// after decoding, for bytes decoded elsewhere: spans of a gzip layer).
pub fn verify_digest(data: &[u8], algo: DigestAlgo, digest: &[u8; 32]) -> Result<(), String> {
    let actual = algo.digest(data);
    if &actual != digest {
        return Err(format!(
            "digest mismatch: data hashes to {}",
            algo.format(&actual)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_round_trips_and_falls_back_to_raw() {
        let text = b"hello hello hello hello hello hello hello".repeat(100);
        for c in [Compression::Zstd, Compression::Gzip, Compression::None] {
            let (stored, used) = compress(&text, c, 3);
            assert_eq!(used, c);
            let back = decompress(&stored, used, text.len() as u32).unwrap();
            assert_eq!(back, text);
        }
        // Incompressible data is stored raw.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let (stored, used) = compress(&noise, Compression::Zstd, 3);
        assert_eq!(used, Compression::None);
        assert_eq!(stored, noise);
    }

    #[test]
    fn decompress_refuses_wrong_sizes() {
        let text = vec![7u8; 10000];
        let (stored, used) = compress(&text, Compression::Zstd, 3);
        assert!(decompress(&stored, used, 9999).is_err());
        assert!(decompress(&stored, used, 10001).is_err());
        let (stored, used) = compress(&text, Compression::Gzip, 6);
        assert!(decompress(&stored, used, 9999).is_err());
        assert!(decompress(&stored[..stored.len() - 3], used, 10000).is_err());
    }

    #[test]
    fn chunking_limits_are_enforced_before_fastcdc_asserts_them() {
        assert!(Chunking::default().validate().is_ok());
        assert!(Chunking::Cdc {
            min: 64 << 10,
            avg: 256 << 10,
            max: 1 << 20
        }
        .validate()
        .is_ok());
        for bad in [
            Chunking::Fixed { size: 3000 },
            Chunking::Fixed { size: 32 << 20 },
            Chunking::Cdc {
                min: 2 << 20,
                avg: 4 << 20,
                max: 8 << 20,
            },
            Chunking::Cdc {
                min: 2 << 20,
                avg: 8 << 20,
                max: 16 << 20,
            },
            Chunking::Cdc {
                min: 100,
                avg: 200,
                max: 300,
            },
            Chunking::Cdc {
                min: 4096,
                avg: 2048,
                max: 8192,
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn verify_catches_a_wrong_digest() {
        let data = b"some chunk".to_vec();
        for algo in [DigestAlgo::Sha256, DigestAlgo::Blake3] {
            let d = algo.digest(&data);
            assert!(decode_and_verify(&data, Compression::None, 10, algo, &d).is_ok());
            let mut bad = d;
            bad[0] ^= 1;
            assert!(decode_and_verify(&data, Compression::None, 10, algo, &bad).is_err());
        }
    }
}
