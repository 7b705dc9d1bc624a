//! `tessera checkpoint` and `tessera restore`: the command line around
//! [`tessera_agent::checkpoint`] — flags, credentials, the progress line and the
//! summaries.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use rafs_format::builder::BuildOptions;
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use tessera_agent::checkpoint::{self, CheckpointOptions, Criu, DictChoice, RestoreOptions};
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
    /// Where to push the checkpoint (a tag). With --for it must be in the app image's
    /// repository, and may be left out: the checkpoint is then pushed there untagged.
    #[arg(required_unless_present = "app")]
    target: Option<Reference>,
    /// The app image the process runs: the checkpoint is pushed as an OCI referrer of
    /// its manifest (this node's platform), where `tessera restore --for` finds it.
    #[arg(long = "for", value_name = "APP_IMAGE")]
    app: Option<Reference>,
    /// An earlier checkpoint whose chunks are referenced instead of uploaded again
    /// [default with --for: the app image's newest checkpoint, if any].
    #[arg(long, value_name = "REF")]
    chunk_dict: Option<Reference>,
    /// Store every chunk, even with --for (no chunk dictionary).
    #[arg(long, conflicts_with = "chunk_dict")]
    no_chunk_dict: bool,
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
    let refs: Vec<&Reference> = [&args.target, &args.app, &args.chunk_dict]
        .into_iter()
        .flatten()
        .collect();
    let client = args.registry.client(&refs, args.dest_creds.as_ref())?;
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
        app: args.app.clone(),
        chunk_dict: match (&args.chunk_dict, args.no_chunk_dict) {
            (Some(r), _) => DictChoice::Image(r.clone()),
            (None, true) => DictChoice::None,
            (None, false) => DictChoice::NewestCheckpoint,
        },
    };
    let progress = Arc::new(ConvertProgress::default());
    let display = progress_display(progress.clone());
    let destination = match (&args.target, &args.app) {
        (Some(t), _) => t.to_string(),
        (None, Some(app)) => format!("the repository of {app}"),
        (None, None) => "nowhere".into(),
    };
    let summary = runtime()?
        .block_on(checkpoint::checkpoint(
            client,
            args.target.as_ref(),
            &opts,
            &progress,
        ))
        .with_context(|| format!("checkpoint pid {} to {destination}", args.pid))?;
    drop(display);
    print_summary(&summary, args.json)
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The checkpoint image (made by `tessera checkpoint`).
    #[arg(required_unless_present = "app", conflicts_with = "app")]
    image: Option<Reference>,
    /// Restore the newest checkpoint of this app image that this node can restore
    /// (made with `tessera checkpoint --for`). Exits with code 3 when there is none:
    /// boot the image then.
    #[arg(long = "for", value_name = "APP_IMAGE")]
    app: Option<Reference>,
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
    let refs: Vec<&Reference> = [&args.image, &args.app].into_iter().flatten().collect();
    let client = args.registry.client(&refs, args.creds.as_ref())?;
    let work = scratch(&args.work_dir)?;
    let work_dir = std::path::absolute(work.path()).context("resolve the scratch directory")?;
    let opts = RestoreOptions {
        criu: args.criu.criu(),
        // The agent is told absolute paths: it runs elsewhere.
        socket: std::path::absolute(&args.socket).unwrap_or(args.socket.clone()),
        platform: Platform::host(),
        work_dir,
    };
    let rt = runtime()?;
    let summary = match (&args.image, &args.app) {
        (Some(image), _) => rt
            .block_on(checkpoint::restore(&client, image, &opts))
            .with_context(|| format!("restore {image}"))?,
        (None, Some(app)) => rt
            .block_on(checkpoint::restore_for(&client, app, &opts))
            .with_context(|| format!("restore a checkpoint of {app}"))?,
        (None, None) => anyhow::bail!("give a checkpoint REF or --for APP_IMAGE"),
    };
    print_summary(&summary, args.json)
}

fn scratch(dir: &Option<PathBuf>) -> Result<tempfile::TempDir> {
    match dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")
}
