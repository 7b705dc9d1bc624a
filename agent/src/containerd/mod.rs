//! containerd, from the node's side: its configuration ([`hosts`]: `tessera
//! containerd-config`) and a client of its own gRPC API ([`client`]: content, images,
//! leases and snapshots for `tessera pull`; containers and tasks for checkpointing and
//! restoring containers, [`tasks`], with the spec a booted one gets, [`spec`]).

pub mod client;
pub mod hosts;
pub mod spec;
pub mod tasks;

pub use client::{Containerd, Prepared};
pub use hosts::*;
