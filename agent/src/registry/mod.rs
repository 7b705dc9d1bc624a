//! Talking to OCI registries: image references, registry credentials and settings, a
//! client for the distribution API (manifests, blobs, Range reads, pushes, auth,
//! retries), and Tessera images as OCI images (media types, the bootstrap layer, blobs
//! read by Range), and OCI 1.1 referrers (artifacts pushed about an image, found by its
//! manifest digest).

pub mod client;
pub mod credentials;
pub mod image;
pub mod reference;
pub mod referrers;
