//! Talking to OCI registries: image references, registry credentials and settings, a
//! client for the distribution API (manifests, blobs, Range reads, pushes, auth,
//! retries), and Tessera images as OCI images (media types, the bootstrap layer, blobs
//! read by Range).

pub mod client;
pub mod credentials;
pub mod image;
pub mod reference;
