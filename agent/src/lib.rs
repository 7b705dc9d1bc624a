//! The node agent's library: everything `tessera` does that other code (its binary, its
//! integration tests, later the daemon) calls. Modules follow the data path; today:
//!
//! - [`registry`]: image references, the OCI distribution API client, registry
//!   credentials, and Tessera images as OCI artifacts (media types, remote blobs).
//! - [`convert`]: `tessera convert`, from a registry image to a Tessera image.
//!
//! Errors: one [`Error`] enum for the crate; the binary wraps it in `anyhow`.

pub mod api;
pub mod cache;
pub mod config;
pub mod convert;
pub mod daemon;
mod error;
pub mod fetch;
pub mod fs;
pub mod fuzzing;
pub mod peer;
pub mod registry;

pub use error::{Error, Result};
