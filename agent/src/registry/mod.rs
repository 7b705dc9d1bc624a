//! Talking to OCI registries: image references and a client for the read side of the
//! distribution API (manifests, blobs, Range reads, auth, retries); pushes arrive with
//! `tessera convert`.

pub mod client;
pub mod reference;
