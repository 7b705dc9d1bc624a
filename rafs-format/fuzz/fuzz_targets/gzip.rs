//! Arbitrary bytes as a gzip layer: inflated with checkpoints, then resumed at them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rafs_format::fuzzing::gzip(data));
