//! Arbitrary bytes as a layer tarball: a build that succeeds must write a valid image.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rafs_format::fuzzing::layer_roundtrip(data));
