//! One module per group of subcommands.

pub mod convert;
pub mod image;
pub mod registry;
