//! The node agent's library: everything `tessera` does that its binary and its
//! integration tests call. Modules follow the data path:
//!
//! - [`registry`]: image references, the OCI distribution API client, registry
//!   credentials, and Tessera images as OCI artifacts (media types, remote blobs).
//! - [`convert`]: `tessera convert`, from a registry image to a Tessera image.
//! - [`daemon`]: `tessera agent` — mounts ([`fs`]), the chunk path ([`fetch`]: cache →
//!   peers → origin), the verified chunk [`cache`], peer-to-peer ([`peer`]), the local
//!   [`api`] and the [`config`].
//! - [`containerd`]: containerd's hosts files pointing at the agent's mirror.
//! - [`layer_store`]: the additional layer store Podman and CRI-O look Tessera images
//!   up in (`--store-root`).
//! - [`pull`]: `tessera pull`, a Tessera image into containerd for its snapshotter,
//!   without the CRI plugin.
//! - [`checkpoint`]: `tessera checkpoint` and `tessera restore`, a process tree dumped
//!   by CRIU as a Tessera image, and restored from the agent's lazy mount of it.
//!
//! Errors: one [`Error`] enum for the crate; the binary wraps it in `anyhow`.

pub mod api;
pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod containerd;
pub mod convert;
pub mod cri;
pub mod daemon;
mod error;
pub mod fetch;
pub mod fs;
pub mod fuzzing;
pub mod index;
pub mod layer_store;
pub mod mirror;
pub mod peer;
pub mod pull;
pub mod registry;
pub mod snapshotter;

pub use error::{ChunkFailure, Error, RejectedCheckpoint, Result};
