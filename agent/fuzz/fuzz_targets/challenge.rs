//! A `WWW-Authenticate` header value: `parse_challenge`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::challenge(data));
