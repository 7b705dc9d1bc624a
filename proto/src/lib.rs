//! Tessera's wire protocols: agent ↔ scheduler and agent ↔ agent
//! (`proto/tessera/v1/tessera.proto`, compiled at build time by protox + tonic-build).
//!
//! [`pb`] holds the generated messages and services. [`domain`] holds the checked types
//! the scheduler and agents work with: each is made from its message with `TryFrom` on
//! the receiving side, and a bad message is an [`Invalid`] naming the field, which
//! becomes `invalid_argument` at the gRPC boundary.

pub mod auth;
pub mod domain;
pub mod tls;

/// Generated from `tessera.proto`.
#[allow(clippy::all, missing_debug_implementations, unused_qualifications)]
pub mod pb {
    tonic::include_proto!("tessera.v1");
}

pub use domain::Invalid;
