//! An image config as a registry sends it: its `rootfs.diff_ids` read for `tessera pull`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::image_config(data));
