//! `tessera checkpoint` and `tessera restore`: the command line around
//! [`tessera_agent::checkpoint`] — flags, credentials, the progress line and the
//! summaries.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use rafs_format::builder::BuildOptions;
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use tessera_agent::checkpoint::{self, CheckpointOptions, Criu, RestoreOptions};
use tessera_agent::config::DEFAULT_SOCKET;
use tessera_agent::convert::ConvertProgress;
use tessera_agent::registry::client::Credential;
use tessera_agent::registry::credentials::parse_user_password;
use tessera_agent::registry::reference::{Platform, Reference};

use super::convert::progress_display;
use super::image::print_summary;
use super::parse_size;
use super::registry::{runtime, RegistryArgs};

/// The CRIU binary and what it is given, shared by both commands.
#[derive(Debug, Args)]
pub struct CriuArgs {
    /// The `criu` binary (CRIU 4.2.1 works on recent kernels: `make criu-deps` builds
    /// it into target/tools/criu/criu).
    #[arg(
        long,
        env = "TESSERA_CRIU",
        default_value = "criu",
        value_name = "PATH"
    )]
    criu: PathBuf,
    /// A flag passed on to `criu dump` / `criu restore` (repeatable), e.g. `--ext-unix-sk`.
    #[arg(long = "criu-arg", value_name = "ARG", allow_hyphen_values = true)]
    criu_args: Vec<String>,
}

impl CriuArgs {
    fn criu(&self) -> Criu {
        Criu {
            path: self.criu.clone(),
            extra_args: self.criu_args.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The root process of the tree to checkpoint.
    #[arg(long)]
    pid: u32,
    /// Keep the process running after the dump (by default CRIU stops it).
    #[arg(long)]
    leave_running: bool,
    /// Where to push the checkpoint (a tag).
    target: Reference,
    #[command(flatten)]
    criu: CriuArgs,
    /// Content-defined chunking's average chunk size (min a quarter, max four times);
    /// accepts K/M suffixes.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    chunk_size: u32,
    /// zstd level of the chunks.
    #[arg(long, default_value_t = 3)]
    compression_level: i32,
    /// Credentials for the target registry, `USER:PASSWORD` (else the credentials file).
    #[arg(long, env = "TESSERA_DEST_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    dest_creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Scratch directory for the dump and the built image [default: the system's temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn checkpoint(args: CheckpointArgs) -> Result<()> {
    let client = args
        .registry
        .client(&[&args.target], args.dest_creds.as_ref())?;
    let work = scratch(&args.work_dir)?;
    let avg = args.chunk_size;
    let opts = CheckpointOptions {
        pid: args.pid,
        leave_running: args.leave_running,
        criu: args.criu.criu(),
        build: BuildOptions {
            // Content-defined: successive checkpoints of an app share chunks even
            // where pages moved.
            chunking: Chunking::Cdc {
                min: avg / 4,
                avg,
                max: avg.saturating_mul(4).min(16 << 20),
            },
            compression: Compression::Zstd,
            compression_level: args.compression_level,
            digest: DigestAlgo::Sha256,
            chunk_dict: None,
            prefetch: Vec::new(),
            progress: None,
        },
        work_dir: work.path().to_path_buf(),
    };
    let progress = Arc::new(ConvertProgress::default());
    let display = progress_display(progress.clone());
    let summary = runtime()?
        .block_on(checkpoint::checkpoint(
            client,
            &args.target,
            &opts,
            &progress,
        ))
        .with_context(|| format!("checkpoint pid {} to {}", args.pid, args.target))?;
    drop(display);
    print_summary(&summary, args.json)
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The checkpoint image (made by `tessera checkpoint`).
    image: Reference,
    #[command(flatten)]
    criu: CriuArgs,
    /// The agent's socket: the agent mounts the checkpoint lazily.
    #[arg(long, env = "TESSERA_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// Registry credentials to read the checkpoint's manifest, `USER:PASSWORD` (else the
    /// credentials file); the agent uses its own for the mount.
    #[arg(long, env = "TESSERA_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Scratch directory for the mountpoint and CRIU's log [default: the system's temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn restore(args: RestoreArgs) -> Result<()> {
    let client = args.registry.client(&[&args.image], args.creds.as_ref())?;
    let work = scratch(&args.work_dir)?;
    let work_dir = std::path::absolute(work.path()).context("resolve the scratch directory")?;
    let opts = RestoreOptions {
        criu: args.criu.criu(),
        // The agent is told absolute paths: it runs elsewhere.
        socket: std::path::absolute(&args.socket).unwrap_or(args.socket.clone()),
        platform: Platform::host(),
        work_dir,
    };
    let summary = runtime()?
        .block_on(checkpoint::restore(&client, &args.image, &opts))
        .with_context(|| format!("restore {}", args.image))?;
    print_summary(&summary, args.json)
}

fn scratch(dir: &Option<PathBuf>) -> Result<tempfile::TempDir> {
    match dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")
}
