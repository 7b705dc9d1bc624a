//! Test data shared by the integration tests: file contents that compress like real
//! files, tar headers with fixed metadata, gzip.

#![allow(dead_code)] // Each test file uses its own subset.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::io::Write;

/// Bytes that compress like real files: text, noise and runs, from a seed.
pub fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        match next() % 4 {
            0 => out.extend(
                (0..1500).flat_map(|i| format!("row {} of {seed}\n", i * 7 % 13).into_bytes()),
            ),
            1 => out.extend((0..30_000).map(|_| next() as u8)),
            2 => out.extend(std::iter::repeat_n(0u8, (next() % 3000) as usize)),
            _ => out.extend(std::iter::repeat_n(b'x', (next() % 5000) as usize)),
        }
    }
    out.truncate(len);
    out
}

/// A tar header with fixed times and owners, so builds of it are reproducible.
pub fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_mtime(1_700_000_000);
    h.set_uid(1000);
    h.set_gid(100);
    h.set_size(size);
    h
}

/// `tar` compressed with gzip at level 6.
pub fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    e.write_all(tar).unwrap();
    e.finish().unwrap()
}
