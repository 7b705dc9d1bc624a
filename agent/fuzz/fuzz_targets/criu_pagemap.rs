//! A CRIU page map from a checkpoint: parsed, addresses looked up in it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::criu_pagemap(data));
