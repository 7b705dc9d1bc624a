//! Peer-to-peer between agents.
//!
//! - [`server`]: the serving side, streaming chunks from this node's verified cache to
//!   other agents, bounded in uploads and bandwidth, behind the cluster's bearer token.
//! - [`network`]: membership in the swarm (register, heartbeat, announce what was
//!   verified, report transfers, ask who holds a range) and the connections to other
//!   agents. The fetcher (`crate::fetch`) uses it between the cache and the origin.
//! - [`preheat`]: preheat jobs from heartbeat answers, queued for the daemon (which
//!   owns the queue and runs them), and their progress back in heartbeats.
//! - [`ring`]: consistent hashing of blobs over scheduler replicas.
//! - [`access`]: private images and checkpoints among peers: the access keys of the
//!   restricted images this node mounted, the proofs its requests carry, and the check
//!   the server makes before it streams their chunks.

pub mod access;
pub mod network;
pub mod preheat;
pub mod ring;
pub mod server;

pub use access::PeerAccess;
pub use network::Network;
pub use server::{PeerServer, UploadLimits};
