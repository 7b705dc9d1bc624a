//! `tessera pull IMAGE`: the command line around [`tessera_agent::pull`] — containerd's
//! address and namespace, the node's registry credentials, a progress line per layer
//! (stderr) and the summary.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tessera_agent::containerd::SNAPSHOTTER;
use tessera_agent::pull::{pull as run_pull, LayerOutcome, LayerStep, PullOptions};
use tessera_agent::registry::client::Credential;
use tessera_agent::registry::credentials::parse_user_password;
use tessera_agent::registry::reference::{Platform, Reference};

use super::image::print_summary;
use super::registry::{runtime, RegistryArgs};

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Image to pull (`host/repo:tag`, `@sha256:…`): a Tessera image (`tessera
    /// convert`) or a plain image with an index (`tessera index`). It is named so in
    /// containerd, normalised (`alpine` → `docker.io/library/alpine:latest`).
    image: Reference,
    /// containerd's socket.
    #[arg(
        long,
        env = "CONTAINERD_ADDRESS",
        value_name = "SOCKET",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: PathBuf,
    /// containerd namespace to pull into (`ctr`'s default; the kubelet's is `k8s.io`).
    #[arg(long, env = "CONTAINERD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// The Tessera snapshotter's name in containerd's config (the proxy plugin
    /// `tessera containerd-config --snapshotter-socket` adds).
    #[arg(long, default_value = SNAPSHOTTER)]
    snapshotter: String,
    /// Platform to take from a multi-platform image [default: this machine's].
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<Platform>,
    /// Credentials for the registry, `USER:PASSWORD` (else the credentials file).
    /// The snapshotter reads the image with the agent's own credentials.
    #[arg(long, env = "TESSERA_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn pull(args: PullArgs) -> Result<()> {
    let client = args.registry.client(&[&args.image], args.creds.as_ref())?;
    let opts = PullOptions {
        address: args.address.clone(),
        namespace: args.namespace.clone(),
        snapshotter: args.snapshotter.clone(),
        platform: args.platform.clone().unwrap_or_else(Platform::host),
    };
    let mut progress = print_layer;
    let summary = runtime()?
        .block_on(run_pull(&client, &args.image, &opts, &mut progress))
        .with_context(|| format!("pull {}", args.image))?;
    print_summary(&summary, args.json)
}

/// A layer's progress line (stderr).
fn print_layer(step: &LayerStep<'_>) {
    let outcome = match step.outcome {
        LayerOutcome::Lazy => "lazy, nothing downloaded",
        LayerOutcome::Present => "already present",
    };
    eprintln!(
        "layer {}/{} {}: {outcome}",
        step.number, step.count, step.digest
    );
}
