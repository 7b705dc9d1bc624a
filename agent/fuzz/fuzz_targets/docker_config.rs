//! A docker `config.json`: parsed, credentials looked up (helpers are not run).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::docker_config(data));
