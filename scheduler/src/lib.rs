//! The scheduler: which peers hold what, and origin single-flight for the swarm.
//!
//! - [`swarm`]: the in-memory state (hosts, leases, holdings, transfer history) and
//!   the decisions; no I/O, time passed in.
//! - [`service`]: the gRPC `Scheduler` service over it (tonic), checking every message
//!   into domain types first.

pub mod service;
pub mod swarm;
