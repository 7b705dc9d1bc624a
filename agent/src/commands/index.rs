//! `tessera index IMAGE`: the command line around [`tessera_agent::index`] — flags,
//! credentials, a progress line per phase and the summary.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tessera_agent::convert::ConvertProgress;
use tessera_agent::index::{index as run_index, IndexOptions};
use tessera_agent::registry::client::Credential;
use tessera_agent::registry::credentials::parse_user_password;
use tessera_agent::registry::reference::Reference;

use super::convert::progress_display;
use super::image::{print_summary, FormatArgs};
use super::registry::{runtime, PlatformArgs, RegistryArgs};

#[derive(Debug, Args)]
pub struct IndexArgs {
    /// Image to index (`host/repo:tag`, `@sha256:…`); its layers must be gzip. The
    /// index is pushed to the same repository, as a referrer of the image's manifest.
    image: Reference,
    /// Chunking and digests: keep them as `tessera convert`'s so an index and a
    /// converted image share their chunks.
    #[command(flatten)]
    format: FormatArgs,
    #[command(flatten)]
    platforms: PlatformArgs,
    /// Credentials for the registry, `USER:PASSWORD` (else the credentials file).
    #[arg(long, env = "TESSERA_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Scratch directory for layers and the index [default: the system's temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn index(args: IndexArgs) -> Result<()> {
    let client = args.registry.client(&[&args.image], args.creds.as_ref())?;
    let work = match &args.work_dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let opts = IndexOptions {
        build: args.format.options()?,
        platform: args.platforms.platform(),
        all_platforms: args.platforms.all(),
        work_dir: work.path().to_path_buf(),
    };
    let progress = Arc::new(ConvertProgress::default());
    let display = progress_display(progress.clone());
    let summary = runtime()?
        .block_on(run_index(client, &args.image, &opts, &progress))
        .with_context(|| format!("index {}", args.image))?;
    drop(display);
    print_summary(&summary, args.json)
}
