//! `tessera-scheduler`: tells agents which peers hold which chunks and keeps the
//! origin registry from being hit once per node.
//!
//! Only the command-line shell exists so far; the service arrives with the P2P issue.

use clap::Parser;

/// Command-line interface of the scheduler.
#[derive(Debug, Parser)]
#[command(name = "tessera-scheduler", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    anyhow::bail!("the scheduler service is not built yet; see the P2P issue")
}
