//! Arbitrary bytes as a layer tarball: a whole build, then the image read back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rafs_format::fuzzing::layer(data));
