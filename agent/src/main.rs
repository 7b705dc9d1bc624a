//! `tessera`: the node agent and its command-line tools.
//!
//! The binary carries the image tools (`build`, `inspect`, `check`, `unpack`, the last
//! three also on registry images), `convert`, `index`, `checkpoint` and `restore`, the daemon (`tessera agent`) and its
//! clients (`mount`, `umount`, `status`), `pull` and `containerd-config`; the work is done by
//! the library (`tessera_agent`), one module per part of the data path.

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
    /// Convert a registry image into a Tessera image and push it to a registry.
    Convert(Box<commands::convert::ConvertArgs>),
    /// Index a plain gzip image so it starts lazily without conversion; the index is
    /// pushed beside it (an OCI referrer of its manifest).
    Index(Box<commands::index::IndexArgs>),
    /// Checkpoint a running container (containerd, runc) or process tree (CRIU) and
    /// push it as a Tessera image.
    Checkpoint(Box<commands::checkpoint::CheckpointArgs>),
    /// Restore a checkpoint (`tessera checkpoint`) from a lazy mount the agent makes.
    Restore(Box<commands::checkpoint::RestoreArgs>),
    /// Run a container in containerd from an image: restored from the image's newest
    /// checkpoint this node can restore, booted when there is none or the restore fails.
    Run(Box<commands::checkpoint::RunArgs>),
    /// Run the node agent: lazy mounts, the chunk cache, the local API.
    Agent(Box<commands::agent::AgentArgs>),
    /// Run the agent for Podman's, Buildah's and CRI-O's additional layer store at
    /// `--root` (the same as `tessera agent --store-root PATH`; every agent flag
    /// applies).
    Store(Box<commands::agent::StoreArgs>),
    /// Mount an image through the agent (data is fetched as it is read).
    Mount(commands::agent::MountArgs),
    /// Unmount an image mounted through the agent.
    Umount(commands::agent::UmountArgs),
    /// Show the agent's mounts, cache and traffic.
    Status(commands::agent::StatusArgs),
    /// Work on the agent's chunk cache.
    #[command(subcommand)]
    Cache(commands::agent::CacheCommand),
    /// Pull a Tessera image (converted or indexed) into containerd for the Tessera
    /// snapshotter, without CRI: `ctr run --snapshotter tessera` then starts it lazily.
    Pull(Box<commands::pull::PullArgs>),
    /// Configure containerd for the agent: its registry hosts pointed at the agent's
    /// mirror (hosts.toml files), and with `--snapshotter-socket` its config file for
    /// the agent's snapshotter (the proxy plugin, and CRI's snapshotter); `--undo`
    /// reverts both.
    ContainerdConfig(commands::containerd::ContainerdConfigArgs),
    /// Work on the containerd snapshotter's state on this node.
    #[command(subcommand)]
    Snapshotter(commands::agent::SnapshotterCommand),
    /// Hold the snapshotter's FUSE connections while the agent restarts (the agent
    /// starts it; it exits when it holds nothing).
    #[command(hide = true)]
    FuseKeeper(commands::agent::FuseKeeperArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a daemon's log goes to a file or
        // the journal, where escape codes are noise to read and to search.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => commands::image::build(args),
        Command::Inspect(args) => commands::image::inspect(args),
        Command::Check(args) => commands::image::check(args),
        Command::Unpack(args) => commands::image::unpack(args),
        Command::Convert(args) => commands::convert::convert(*args),
        Command::Index(args) => commands::index::index(*args),
        Command::Checkpoint(args) => commands::checkpoint::checkpoint(*args),
        Command::Restore(args) => commands::checkpoint::restore(*args),
        Command::Run(args) => commands::checkpoint::run(*args),
        Command::Agent(args) => commands::agent::agent(*args),
        Command::Store(args) => commands::agent::store(*args),
        Command::Mount(args) => commands::agent::mount(args),
        Command::Umount(args) => commands::agent::umount(args),
        Command::Status(args) => commands::agent::status(args),
        Command::Cache(command) => commands::agent::cache(command),
        Command::Pull(args) => commands::pull::pull(*args),
        Command::ContainerdConfig(args) => commands::containerd::containerd_config(args),
        Command::Snapshotter(command) => commands::agent::snapshotter(command),
        Command::FuseKeeper(args) => commands::agent::fuse_keeper(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        // `restore --for` with nothing to restore is an answer ("boot it"), not a
        // failure: scripts tell the two apart by the exit code.
        let code = match err.downcast_ref::<tessera_agent::Error>() {
            Some(tessera_agent::Error::NoUsableCheckpoint { .. }) => {
                tessera_agent::checkpoint::NO_USABLE_CHECKPOINT_EXIT_CODE
            }
            _ => 1,
        };
        std::process::exit(code);
    }
}
