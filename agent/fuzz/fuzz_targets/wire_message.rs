//! A P2P wire message (type byte + protobuf): decoded and checked into domain types.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tessera_agent::fuzzing::wire_message(data));
