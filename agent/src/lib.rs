//! The node agent's library: everything `tessera` does that other code (its binary, its
//! integration tests, later the daemon) calls. Modules follow the data path; today:
//!
//! - [`registry`]: image references and the OCI distribution API client.
//!
//! Errors: modules whose callers branch on the failure have their own typed error
//! (`registry::client::RegistryError`); the binary wraps everything in `anyhow`.

pub mod registry;
