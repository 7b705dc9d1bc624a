//! Tessera's wire protocols: agent ↔ scheduler and agent ↔ agent.
//!
//! Empty until the peer-to-peer issue defines the `.proto` files; the crate exists so
//! the workspace already has the shape the architecture describes.
