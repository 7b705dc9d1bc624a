//! Entry points for the cargo-fuzz targets in `agent/fuzz/`, over the parsers of bytes
//! that come from registries or users: `WWW-Authenticate` challenges, manifests and
//! indexes, docker `config.json`. `tests/fuzz_regressions.rs` replays the checked-in
//! inputs through the same functions on stable Rust. None may panic.

use std::path::Path;

use crate::registry::client::{parse_challenge, Manifest};
use crate::registry::credentials::DockerConfig;
use crate::registry::image::{self, Document, PlatformImage};
use crate::registry::reference::Reference;

/// A `WWW-Authenticate` header value.
pub fn challenge(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_challenge(text);
    }
}

/// A manifest or index as a registry might send it, typed or not.
pub fn manifest(data: &[u8]) {
    let Ok(r) = Reference::parse("registry.example/fuzz/image:t") else {
        return;
    };
    for media_type in ["", "application/vnd.oci.image.index.v1+json"] {
        let m = Manifest {
            media_type: media_type.to_string(),
            digest: String::new(),
            bytes: data.to_vec(),
        };
        match image::parse_document(&r, &m) {
            Ok(Document::Image(manifest)) => {
                let img = PlatformImage {
                    reference: r.clone(),
                    manifest: *manifest,
                    raw: m,
                    platform: None,
                };
                let _ = image::bootstrap_layer(&img);
            }
            Ok(Document::Index(index)) => {
                for d in index.manifests() {
                    let _ = image::platform_of(d);
                }
            }
            Err(_) => {}
        }
    }
}

/// A docker `config.json` (credential helpers are not run).
pub fn docker_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = DockerConfig::parse(text, Path::new("fuzz.json")) {
        for registry in ["docker.io", "registry.example", "127.0.0.1:5000"] {
            let _ = config.stored_credential(registry);
        }
    }
}
