//! Entry points for the cargo-fuzz targets in `agent/fuzz/`, over the parsers of bytes
//! that come from registries, users or the network: `WWW-Authenticate` challenges,
//! manifests and indexes, image configs, docker `config.json`, the P2P wire messages, and
//! CRIU page maps from checkpoints. `tests/fuzz_regressions.rs` replays the checked-in
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

/// An image config as a registry sends it (`tessera pull` reads its
/// `rootfs.diff_ids`), for an image of one to three layers.
pub fn image_config(data: &[u8]) {
    let Ok(r) = Reference::parse("registry.example/fuzz/image:t") else {
        return;
    };
    for layers in 1..=3 {
        let layer = serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", "0".repeat(64)),
            "size": 1,
        });
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{}", "1".repeat(64)),
                "size": data.len(),
            },
            "layers": vec![layer; layers],
        });
        let Ok(manifest) = serde_json::from_value(manifest) else {
            return;
        };
        let img = PlatformImage {
            reference: r.clone(),
            manifest,
            raw: Manifest {
                media_type: String::new(),
                digest: String::new(),
                bytes: Vec::new(),
            },
            platform: None,
        };
        if let Ok(ids) = image::diff_ids(&img, data) {
            assert_eq!(ids.len(), layers, "one diff ID per layer");
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

/// One P2P wire message as a scheduler, an agent or a peer might receive it: the first
/// byte picks the message type, the rest is its protobuf encoding; it is decoded and
/// checked into its domain type as the receiver does.
pub fn wire_message(data: &[u8]) {
    use prost::Message;
    use tessera_proto::{domain, pb};
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 7 {
        0 => {
            if let Ok(m) = pb::FindPeersResponse::decode(bytes) {
                let _ = domain::PeerChoice::try_from(m);
            }
        }
        1 => {
            if let Ok(m) = pb::ChunkData::decode(bytes) {
                let _ = domain::ChunkData::try_from(m);
            }
        }
        2 => {
            if let Ok(Some(h)) = pb::RegisterRequest::decode(bytes).map(|m| m.host) {
                let _ = domain::Host::try_from(h);
            }
        }
        3 => {
            if let Ok(m) = pb::AnnounceRequest::decode(bytes) {
                let _ = domain::Announce::try_from(m);
            }
        }
        4 => {
            if let Ok(m) = pb::FindPeersRequest::decode(bytes) {
                let _ = domain::FindPeers::try_from(m);
            }
        }
        5 => {
            if let Ok(m) = pb::ReportRequest::decode(bytes) {
                for t in m.transfers {
                    let _ = domain::Transfer::try_from(t);
                }
            }
        }
        _ => {
            if let Ok(m) = pb::FetchChunksRequest::decode(bytes) {
                let _ = domain::FetchChunks::try_from(m);
            }
        }
    }
}

/// A CRIU page map from a checkpoint (untrusted: a registry's), and a lazy-pages log:
/// parsed, every faulted address looked up in it.
pub fn criu_pagemap(data: &[u8]) {
    use crate::checkpoint::pagemap::{faults, Pagemap};
    if let Ok(map) = Pagemap::parse("pagemap-1.img", data) {
        for e in &map.entries {
            let _ = map.offset_of(e.vaddr.saturating_add(e.pages.saturating_mul(4096)));
        }
        for (_, addr) in faults(&String::from_utf8_lossy(data)) {
            let _ = map.offset_of(addr);
        }
    }
}
