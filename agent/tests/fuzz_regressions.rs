//! Replays the agent's fuzz inputs on stable Rust: every file under
//! `fuzz/regressions/<target>/` (inputs that once crashed, when there are any) and
//! `fuzz/seeds/<target>/`, through the same `tessera_agent::fuzzing` functions the
//! fuzzer runs. A panic here is a regression; `fuzz/README.md` says how to fuzz.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for kind in ["regressions", "seeds"] {
        let Ok(dir) = std::fs::read_dir(fuzz.join(kind).join(target)) else {
            continue;
        };
        for e in dir {
            let path = e.unwrap().path();
            if path.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn replay(target: &str, run: fn(&[u8])) {
    let inputs = inputs(target);
    assert!(!inputs.is_empty(), "no checked-in inputs for {target}");
    for path in inputs {
        let data = std::fs::read(&path).unwrap();
        eprintln!("{target}: {}", path.display());
        run(&data);
        // Every prefix too: truncation is the commonest corruption.
        for cut in (0..data.len()).step_by(7) {
            run(&data[..cut]);
        }
    }
}

#[test]
fn challenges() {
    replay("challenge", tessera_agent::fuzzing::challenge);
}

#[test]
fn manifests() {
    replay("manifest", tessera_agent::fuzzing::manifest);
}

#[test]
fn image_configs() {
    replay("image_config", tessera_agent::fuzzing::image_config);
}

#[test]
fn docker_configs() {
    replay("docker_config", tessera_agent::fuzzing::docker_config);
}

#[test]
fn wire_messages() {
    replay("wire_message", tessera_agent::fuzzing::wire_message);
}

#[test]
fn criu_pagemaps() {
    replay("criu_pagemap", tessera_agent::fuzzing::criu_pagemap);
}
