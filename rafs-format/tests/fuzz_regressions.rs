//! Replays the fuzz targets' checked-in inputs on stable Rust: every file under
//! `fuzz/regressions/<target>/` (inputs that once crashed) and `fuzz/seeds/<target>/` (a
//! few small seeds), through the same `rafs_format::fuzzing` functions the fuzzer runs.
//! A panic here is a regression; `fuzz/README.md` says how to fuzz for new ones.

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
            let path = e.expect("list fuzz inputs").path();
            if path.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn replay(target: &str, run: fn(&[u8]), at_least: usize) {
    let inputs = inputs(target);
    assert!(
        inputs.len() >= at_least,
        "expected at least {at_least} checked-in inputs for {target}, found {inputs:?}"
    );
    for path in inputs {
        let data = std::fs::read(&path).expect("read fuzz input");
        eprintln!("{target}: {}", path.display());
        run(&data);
    }
}

#[test]
fn bootstrap_inputs_do_not_panic() {
    replay("bootstrap", rafs_format::fuzzing::bootstrap, 1);
}

#[test]
fn layer_inputs_do_not_panic() {
    replay("layer", rafs_format::fuzzing::layer, 1);
}

/// Layers the builder accepts must read back as valid images.
#[test]
fn layer_inputs_build_valid_images() {
    replay("layer", rafs_format::fuzzing::layer_roundtrip, 1);
    replay("layer_roundtrip", rafs_format::fuzzing::layer_roundtrip, 0);
}

#[test]
fn gzip_inputs_do_not_panic() {
    replay("gzip", rafs_format::fuzzing::gzip, 2);
}
