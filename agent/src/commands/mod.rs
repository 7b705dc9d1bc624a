//! One module per group of subcommands.

pub mod agent;
pub mod containerd;
pub mod convert;
pub mod image;
pub mod registry;
