//! `tessera convert SRC DST`: the command line around [`tessera_agent::convert`] —
//! flags, credentials for each side, a progress line per phase and the summary.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tessera_agent::convert::{convert as run_convert, ConvertOptions, ConvertProgress};
use tessera_agent::registry::client::Credential;
use tessera_agent::registry::reference::Reference;

use super::image::{print_summary, FormatArgs, ProgressDisplay};
use tessera_agent::registry::credentials::parse_user_password;

use super::registry::{runtime, PlatformArgs, RegistryArgs};

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Image to convert (`host/repo:tag`, `@sha256:…`; Docker Hub short names work).
    source: Reference,
    /// Where to push the Tessera image (a tag).
    target: Reference,
    #[command(flatten)]
    format: FormatArgs,
    #[command(flatten)]
    platforms: PlatformArgs,
    /// An image converted earlier (e.g. the previous version): chunks it has are not
    /// pushed again. Fastest in the same registry as the target (blobs are mounted).
    #[arg(long, value_name = "REF")]
    chunk_dict: Option<Reference>,
    /// Credentials for the source registry, `USER:PASSWORD` (else the credentials file).
    #[arg(long, env = "TESSERA_SRC_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    src_creds: Option<Credential>,
    /// Credentials for the target registry, `USER:PASSWORD` (else the credentials file).
    #[arg(long, env = "TESSERA_DEST_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    dest_creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Scratch directory for layers and the built image [default: the system's temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    // Each side gets its own client, so each side's credentials stay with its registry.
    let src_client = args
        .registry
        .client(&[&args.source], args.src_creds.as_ref())?;
    let mut dst_refs = vec![&args.target];
    dst_refs.extend(args.chunk_dict.as_ref());
    let dst_client = args.registry.client(&dst_refs, args.dest_creds.as_ref())?;
    let work = match &args.work_dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let opts = ConvertOptions {
        build: args.format.options()?,
        platform: args.platforms.platform(),
        all_platforms: args.platforms.all(),
        chunk_dict: args.chunk_dict.clone(),
        work_dir: work.path().to_path_buf(),
    };
    let progress = Arc::new(ConvertProgress::default());
    let display = progress_display(progress.clone());
    let rt = runtime()?;
    let summary = rt
        .block_on(run_convert(
            src_client,
            dst_client,
            &args.source,
            &args.target,
            &opts,
            &progress,
        ))
        .with_context(|| format!("convert {} to {}", args.source, args.target))?;
    drop(display);
    print_summary(&summary, args.json)
}

/// One line for the current phase: bytes done of the total and the phase's rate.
pub(super) fn progress_display(progress: Arc<ConvertProgress>) -> ProgressDisplay {
    ProgressDisplay::start(move |_| {
        let phase = progress
            .phase
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (done, total) = progress.done(&phase);
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let rate =
            mib(done.saturating_sub(phase.base)) / phase.started.elapsed().as_secs_f64().max(0.001);
        match total {
            Some(t) => format!(
                "{}: {:.1} / {:.1} MiB, {rate:.1} MiB/s",
                phase.name,
                mib(done),
                mib(t)
            ),
            None => format!("{}: {:.1} MiB read, {rate:.1} MiB/s", phase.name, mib(done)),
        }
    })
}
