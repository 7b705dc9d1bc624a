//! Arbitrary bytes as a bootstrap: every reader accessor, then `validate_all`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rafs_format::fuzzing::bootstrap(data));
