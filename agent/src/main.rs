//! `tessera`: the node agent and its command-line tools.
//!
//! Today the binary carries the image tools (`build`, `inspect`, `check`, `unpack`);
//! the daemon (`tessera agent`), lazy mounts and the registry client arrive with later
//! issues, each as a module along the data path (`fs` → `fetch` → `cache`, `registry`,
//! `peer`, `mirror`, `api`).

mod commands;

use clap::{Parser, Subcommand};

/// Command-line interface of `tessera`.
#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "Lazily loaded, peer-to-peer container images"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build an image dir (bootstrap + blobs) from a directory, layer tarballs or an OCI layout.
    Build(commands::image::BuildArgs),
    /// Show an image's summary and its tree with metadata.
    Inspect(commands::image::InspectArgs),
    /// Read and verify every chunk and blob of an image.
    Check(commands::image::CheckArgs),
    /// Rebuild an image's tree in a directory or a tar file.
    Unpack(commands::image::UnpackArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => commands::image::build(args),
        Command::Inspect(args) => commands::image::inspect(args),
        Command::Check(args) => commands::image::check(args),
        Command::Unpack(args) => commands::image::unpack(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
