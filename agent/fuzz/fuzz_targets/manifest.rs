//! A manifest or index as a registry sends it: parsed, its bootstrap layer or platforms looked up.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::manifest(data));
