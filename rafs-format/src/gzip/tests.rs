//! The decoder against flate2's encoder: whole streams, resumed streams, marks, and
//! damaged input.

use std::io::{self, Read, Write};

use flate2::write::GzEncoder;
use flate2::{Compression, GzBuilder};
use proptest::prelude::*;

use super::*;

fn gzip(data: &[u8], level: u32) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::new(level));
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Text-like, repetitive (long and overlapping matches) and random (stored blocks)
/// stretches, so every block type and code path is met.
fn mixed(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let words: Vec<Vec<u8>> = (0..300)
        .map(|_| {
            (0..2 + next() % 9)
                .map(|_| b'a' + (next() % 26) as u8)
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        match next() % 4 {
            0 => (0..4000).for_each(|_| {
                out.extend_from_slice(&words[(next() % 300) as usize]);
                out.push(b' ');
            }),
            1 => out.extend((0..50_000).map(|_| next() as u8)),
            2 => out.extend(std::iter::repeat_n(b'z', (next() % 70_000) as usize)),
            _ => out.extend((0..30_000).map(|i| (i % 7) as u8)),
        }
    }
    out.truncate(len);
    out
}

fn inflate(gz: &[u8]) -> Result<Vec<u8>, io::Error> {
    let mut out = Vec::new();
    GzipReader::new(gz).read_to_end(&mut out)?;
    Ok(out)
}

fn error_text(e: io::Error) -> String {
    e.into_inner().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn inflates_what_flate2_compresses_at_every_level() {
    let data = mixed(3 << 20, 7);
    for level in [0, 1, 6, 9] {
        assert!(
            inflate(&gzip(&data, level)).unwrap() == data,
            "level {level}"
        );
    }
    assert_eq!(inflate(&gzip(b"", 6)).unwrap(), b"");
    assert_eq!(inflate(&gzip(b"a", 6)).unwrap(), b"a");
}

#[test]
fn reads_every_member_and_every_header_field() {
    let mut gz = gzip(b"first member ", 6);
    let mut named = GzBuilder::new()
        .filename("layer.tar")
        .comment("a comment")
        .extra(vec![1, 2, 3, 4])
        .write(Vec::new(), Compression::default());
    named.write_all(b"second member").unwrap();
    gz.extend(named.finish().unwrap());
    // A header CRC (FHCRC) is skipped: gzip writes it rarely and its check adds nothing
    // the member's CRC-32 does not.
    let mut third = gzip(b", third", 1);
    third[3] |= 0x02;
    third.splice(10..10, [0xab, 0xcd]);
    gz.extend(third);
    gz.extend([0, 0, 0]);
    assert_eq!(inflate(&gz).unwrap(), b"first member second member, third");
}

#[test]
fn refuses_bad_checksums_lengths_and_trailing_bytes() {
    let data = mixed(200_000, 3);
    let good = gzip(&data, 6);
    let n = good.len();

    let mut bad_crc = good.clone();
    bad_crc[n - 8] ^= 1;
    assert!(error_text(inflate(&bad_crc).unwrap_err()).contains("CRC-32"));

    let mut bad_len = good.clone();
    bad_len[n - 1] ^= 1;
    assert!(error_text(inflate(&bad_len).unwrap_err()).contains("trailer says"));

    let mut trailing = good.clone();
    trailing.push(7);
    assert!(error_text(inflate(&trailing).unwrap_err()).contains("after the last gzip member"));

    let not_gzip = b"PK\x03\x04 a zip file".to_vec();
    assert!(error_text(inflate(&not_gzip).unwrap_err()).contains("not gzip"));
}

#[test]
fn a_truncated_stream_is_an_error_never_a_short_success() {
    let data = mixed(300_000, 5);
    let gz = gzip(&data, 6);
    for cut in [
        0,
        1,
        9,
        10,
        11,
        100,
        gz.len() / 2,
        gz.len() - 9,
        gz.len() - 1,
    ] {
        let err = inflate(&gz[..cut]).expect_err("a truncated stream was accepted");
        assert!(error_text(err).contains("truncated"), "cut at {cut}");
    }
}

/// A checkpoint's window is the output before it, with the bytes nothing after it
/// refers to set to zero.
fn assert_sparse_window(cp: &Checkpoint, data: &[u8]) {
    let before = &data[cp.out as usize - cp.window.len()..cp.out as usize];
    let differs = cp
        .window
        .iter()
        .zip(before)
        .position(|(w, d)| w != d && *w != 0);
    assert_eq!(differs, None, "{cp:?}: the window differs from the output");
}

#[test]
fn every_checkpoint_resumes_to_the_same_output() {
    let data = mixed(4 << 20, 11);
    for level in [1, 6, 9] {
        let gz = gzip(&data, level);
        let mut reader = GzipReader::indexing(&gz[..], 256 * 1024);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).unwrap();
        assert!(out == data && reader.finished());
        let checkpoints = reader.take_checkpoints();
        // zlib-rs's level 1 (zlib-ng's quick strategy) writes blocks of megabytes, so
        // its checkpoints are as far apart; the other levels end a block every few
        // tens of KiB.
        let least = if level == 1 { 1 } else { 8 };
        assert!(
            checkpoints.len() >= least,
            "level {level}: {} checkpoints",
            checkpoints.len()
        );
        for pair in checkpoints.windows(2) {
            assert!(pair[1].out >= pair[0].out + 256 * 1024);
        }
        // Noise is stored as literals: much of a window nothing refers to is zeroed.
        let zeroed = checkpoints.iter().any(|cp| {
            let before = &data[cp.out as usize - WINDOW..cp.out as usize];
            cp.window
                .iter()
                .zip(before)
                .any(|(w, d)| *w == 0 && *d != 0)
        });
        assert!(
            zeroed || level == 1,
            "level {level}: no window byte left out"
        );
        for cp in &checkpoints {
            assert_eq!(cp.window.len(), WINDOW);
            assert_sparse_window(cp, &data);
            let from = (cp.in_bits / 8) as usize;
            let mut resumed = GzipReader::resume(&gz[from..], cp).unwrap();
            let mut rest = Vec::new();
            resumed.read_to_end(&mut rest).unwrap();
            assert!(rest == data[cp.out as usize..], "level {level}, {cp:?}");
        }
    }
}

/// What a lazy read does: fetch from a checkpoint's byte to the end of the mark past the
/// range it needs, and inflate only that.
#[test]
fn the_bytes_up_to_a_mark_inflate_to_the_output_up_to_it() {
    let data = mixed(2 << 20, 13);
    let gz = gzip(&data, 6);
    let mut reader = GzipReader::indexing(&gz[..], 128 * 1024);
    io::copy(&mut reader, &mut io::sink()).unwrap();
    let checkpoints = reader.take_checkpoints();
    let marks = reader.take_marks();
    assert!(marks.len() >= 30, "{} marks", marks.len());
    for pair in marks.windows(2) {
        assert!(pair[1].out > pair[0].out && pair[1].in_bits > pair[0].in_bits);
    }
    for cp in &checkpoints {
        for mark in marks.iter().filter(|m| m.out > cp.out).take(3) {
            let from = (cp.in_bits / 8) as usize;
            let to = mark.in_bits.div_ceil(8) as usize;
            let mut resumed = GzipReader::resume(&gz[from..to], cp).unwrap();
            let mut got = vec![0u8; (mark.out - cp.out) as usize];
            resumed.read_exact(&mut got).unwrap();
            assert!(
                got == data[cp.out as usize..mark.out as usize],
                "{cp:?} {mark:?}"
            );
        }
    }
}

#[test]
fn a_checkpoint_near_the_start_has_a_short_window() {
    let data = mixed(600_000, 17);
    // A sync flush ends a block after 10,000 bytes.
    let mut e = GzEncoder::new(Vec::new(), Compression::new(9));
    e.write_all(&data[..10_000]).unwrap();
    e.flush().unwrap();
    e.write_all(&data[10_000..]).unwrap();
    let gz = e.finish().unwrap();
    let mut reader = GzipReader::indexing(&gz[..], 1);
    io::copy(&mut reader, &mut io::sink()).unwrap();
    let first = reader.take_checkpoints().remove(0);
    assert_eq!(first.out, 10_000);
    assert_eq!(first.window.len(), 10_000);
    assert_sparse_window(&first, &data);
    let mut rest = Vec::new();
    GzipReader::resume(&gz[(first.in_bits / 8) as usize..], &first)
        .unwrap()
        .read_to_end(&mut rest)
        .unwrap();
    assert!(rest == data[first.out as usize..]);
}

#[test]
fn a_window_that_does_not_fit_its_offset_is_refused() {
    let cp = Checkpoint {
        in_bits: 80,
        out: 10,
        window: vec![0; 11],
    };
    assert!(GzipReader::resume(&[][..], &cp).is_err());
    let cp = Checkpoint {
        in_bits: 80,
        out: 1 << 20,
        window: vec![0; WINDOW + 1],
    };
    assert!(GzipReader::resume(&[][..], &cp).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trips_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..20_000), level in 0u32..10) {
        prop_assert_eq!(inflate(&gzip(&data, level)).unwrap(), data);
    }

    /// Damaged streams give an error or some output, never a panic; a damaged stream
    /// that still inflates passed its CRC-32.
    #[test]
    fn damaged_streams_never_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let data = mixed(100_000, 23);
        let mut gz = gzip(&data, 6);
        for (at, xor) in flips {
            let i = at.index(gz.len());
            gz[i] ^= xor.max(1);
        }
        if let Ok(out) = inflate(&gz) {
            prop_assert_eq!(out, data);
        }
    }
}

#[test]
fn a_span_inflates_to_its_range_from_a_fraction_of_the_stream() {
    let data = mixed(3 << 20, 29);
    let gz = gzip(&data, 6);
    let mut reader = GzipReader::indexing(&gz[..], 512 * 1024);
    io::copy(&mut reader, &mut io::sink()).unwrap();
    let (checkpoints, marks) = (reader.take_checkpoints(), reader.take_marks());
    let len = data.len() as u64;
    let mut fetched = 0;
    let ranges = [
        0..1,
        0..4096,
        100_000..300_000,
        len / 2..len / 2 + 4096,
        len - 10..len,
    ];
    for range in ranges
        .iter()
        .cloned()
        .chain((1..40).map(|i| i * 70_001..i * 70_001 + 9_000))
    {
        let s = span(&checkpoints, &marks, range.clone(), gz.len() as u64);
        let bytes = &gz[s.compressed.start as usize..s.compressed.end as usize];
        let cp = s.checkpoint.map(|i| &checkpoints[i]);
        let got = inflate_span(bytes, cp, s.skip, (range.end - range.start) as usize).unwrap();
        assert!(
            got == data[range.start as usize..range.end as usize],
            "{range:?}: {s:?}"
        );
        fetched += bytes.len();
    }
    // 44 small ranges spread over the stream fetch far less than 44 whole streams: each
    // is at most a checkpoint's spacing plus a block and a mark.
    let per_range = fetched / 44;
    assert!(
        per_range < gz.len() / 3,
        "{per_range} bytes per range of a {} byte stream",
        gz.len()
    );

    // A span cut short is an error, not short output.
    let s = span(
        &checkpoints,
        &marks,
        len / 2..len / 2 + 4096,
        gz.len() as u64,
    );
    let cut = &gz[s.compressed.start as usize..s.compressed.start as usize + 10];
    let cp = s.checkpoint.map(|i| &checkpoints[i]);
    assert!(inflate_span(cut, cp, s.skip, 4096).is_err());
}

#[test]
fn ranges_of_one_checkpoint_inflate_in_one_pass_and_fail_from_the_damage_on() {
    let data = mixed(2 << 20, 31);
    let gz = gzip(&data, 6);
    let mut reader = GzipReader::indexing(&gz[..], 512 * 1024);
    io::copy(&mut reader, &mut io::sink()).unwrap();
    let (checkpoints, marks) = (reader.take_checkpoints(), reader.take_marks());
    let cp = &checkpoints[0];
    let start = cp.out as usize;
    let ranges = [(0u64, 10usize), (10, 4096), (50_000, 1), (100_000, 65_536)];
    let s = span(
        &checkpoints,
        &marks,
        cp.out..cp.out + 165_536,
        gz.len() as u64,
    );
    assert_eq!(s.checkpoint, Some(0));
    let bytes = &gz[s.compressed.start as usize..s.compressed.end as usize];
    let mut got = Vec::new();
    inflate_ranges(bytes, Some(cp), &ranges, |i, b| got.push((i, b))).unwrap();
    assert_eq!(got.len(), ranges.len());
    for ((i, b), (skip, len)) in got.iter().zip(ranges) {
        let from = start + skip as usize;
        assert!(b[..] == data[from..from + len], "range {i}");
    }

    // Ranges out of order are refused, naming the first one that is.
    let err = inflate_ranges(bytes, Some(cp), &[(100, 10), (50, 10)], |_, _| {}).unwrap_err();
    assert_eq!(err.0, 1, "{err:?}");

    // A span cut short delivers what it holds and names the first range it cannot.
    let cut = &bytes[..bytes.len() / 3];
    let mut delivered = Vec::new();
    let err = inflate_ranges(cut, Some(cp), &ranges, |i, _| delivered.push(i)).unwrap_err();
    assert_eq!(delivered, (0..err.0).collect::<Vec<_>>());
    assert!(err.0 >= 1 && err.0 < ranges.len(), "{err:?}");
}

/// The whole mechanism of a lazy read of an unconverted layer: one indexing pass
/// through the tar reader notes where each file's data starts in the tar stream; each
/// file is then read back from its span alone.
#[test]
fn every_file_of_a_tar_gz_reads_back_from_its_span() {
    use crate::builder::tar::{EntryType, TarReader};

    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut builder = tar::Builder::new(Vec::new());
    for i in 0..60u64 {
        let size = match i % 5 {
            0 => 0,
            1 => 100 + i as usize,
            2 => 70_000,
            3 => 1 << 20,
            _ => 3 << 20,
        };
        let data = mixed(size, 100 + i);
        let path = format!("dir{}/file{i}", i % 4);
        let mut header = tar::Header::new_gnu();
        header.set_size(size as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, &path, &data[..]).unwrap();
        files.push((path, data));
    }
    let gz = gzip(&builder.into_inner().unwrap(), 6);

    let mut reader = GzipReader::indexing(&gz[..], 1 << 20);
    let mut offsets = Vec::new();
    {
        let mut tar = TarReader::new(&mut reader);
        while let Some(entry) = tar.next_entry().unwrap() {
            assert_eq!(entry.kind, EntryType::Regular);
            offsets.push((tar.offset(), entry.size));
        }
    }
    io::copy(&mut reader, &mut io::sink()).unwrap();
    assert!(reader.finished());
    let (checkpoints, marks) = (reader.take_checkpoints(), reader.take_marks());
    assert_eq!(offsets.len(), files.len());

    for ((path, data), (offset, size)) in files.iter().zip(offsets) {
        assert_eq!(size, data.len() as u64, "{path}");
        let s = span(&checkpoints, &marks, offset..offset + size, gz.len() as u64);
        let bytes = &gz[s.compressed.start as usize..s.compressed.end as usize];
        let cp = s.checkpoint.map(|i| &checkpoints[i]);
        let got = inflate_span(bytes, cp, s.skip, size as usize).unwrap();
        assert!(&got == data, "{path}: {s:?}");
        if size < 100_000 {
            // A small file costs about a checkpoint's spacing of the layer, not all of it.
            assert!(
                bytes.len() < gz.len() / 8,
                "{path}: {} of {} bytes",
                bytes.len(),
                gz.len()
            );
        }
    }
}
