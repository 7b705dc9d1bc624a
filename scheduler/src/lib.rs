//! The scheduler: which peers hold what, and origin single-flight for the swarm.
//!
//! - [`swarm`]: the in-memory state (hosts, leases, holdings, transfer history, the
//!   blocklist) and the decisions; no I/O, time passed in.
//! - [`service`]: the gRPC `Scheduler` service over it (tonic), checking every message
//!   into domain types first.
//! - [`admin`]: the admin API (HTTP/JSON, `docs/scheduler-admin-api.yaml`): hosts,
//!   blobs, stats, blocking hosts, preheat jobs; health, readiness and Prometheus
//!   metrics.
//! - [`preheat`]: preheat jobs: hosts chosen, handed the job in heartbeat answers,
//!   their progress gathered from heartbeats.
//! - [`store`]: what outlives a restart (the blocklist, preheat jobs), in sled.

pub mod admin;
mod error;
pub mod preheat;
pub mod service;
pub mod store;
pub mod swarm;

pub use error::Error;
