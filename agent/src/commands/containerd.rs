//! `tessera containerd-config`: containerd's hosts files pointing at the agent's mirror,
//! and containerd's config file using the agent's snapshotter.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use tessera_agent::containerd::{self, Change, FileChange, HostsConfig};

use super::image::print_summary;

#[derive(Debug, Args)]
pub struct ContainerdConfigArgs {
    /// A registry to pull through the mirror (`docker.io`, `registry.example.com:5000`);
    /// repeat for several.
    #[arg(long = "registry", value_name = "HOST")]
    registries: Vec<String>,
    /// Every other registry too (`_default/hosts.toml`).
    #[arg(long)]
    all: bool,
    /// The agent's mirror endpoint.
    #[arg(long, default_value = "http://127.0.0.1:7082", value_name = "URL")]
    mirror: String,
    /// containerd's hosts directory.
    #[arg(long, default_value = "/etc/containerd/certs.d", value_name = "DIR")]
    certs_dir: PathBuf,
    /// Also configure containerd to use the agent's snapshotter at this socket (the
    /// agent's `--snapshotter-socket`): edits containerd's config file (backed up
    /// first); restart containerd once after.
    #[arg(long, value_name = "PATH")]
    snapshotter_socket: Option<PathBuf>,
    /// With `--snapshotter-socket`, the runtime handler added beside it: containerd's
    /// default runtime on containerd's own snapshotter, for pods that must start while
    /// the agent is down (the agent's own: the chart's RuntimeClass names it).
    #[arg(long, default_value = containerd::NATIVE_RUNTIME, value_name = "NAME")]
    native_runtime: String,
    /// With `--snapshotter-socket`, the agent's snapshotter root on the node (its
    /// `--snapshotter-root`), exported to containerd, which reports the image
    /// filesystem to the kubelet from it.
    #[arg(
        long,
        default_value = "/var/lib/tessera/snapshotter",
        value_name = "DIR"
    )]
    snapshotter_root: PathBuf,
    /// containerd's config file (read to say whether `config_path` is set; written
    /// only with `--snapshotter-socket`).
    #[arg(
        long,
        default_value = "/etc/containerd/config.toml",
        value_name = "FILE"
    )]
    containerd_config: PathBuf,
    /// A registry whose upstream speaks plain HTTP.
    #[arg(long = "insecure", value_name = "HOST")]
    insecure: Vec<String>,
    /// Restore the files this command replaced and remove the ones it created.
    #[arg(long)]
    undo: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Summary {
    files: Vec<FileChange>,
    /// Whether containerd's config names the hosts directory (`None`: unreadable).
    config_path_set: Option<bool>,
    /// Hosts files were configured (else only the snapshotter).
    hosts: bool,
    /// The config file's section that holds `config_path` (by its version).
    registry_section: &'static str,
    certs_dir: PathBuf,
    containerd_config: PathBuf,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for file in &self.files {
            if file.registry == "snapshotter" {
                let what = match file.change {
                    Change::Unchanged => "already uses the Tessera snapshotter",
                    Change::Written => "now uses the Tessera snapshotter: restart containerd once",
                    Change::BackedUpAndWritten => {
                        "now uses the Tessera snapshotter (the previous file kept as config.toml.tessera-backup): restart containerd once"
                    }
                    Change::Restored | Change::Removed => "restored: restart containerd once",
                    Change::Untouched => "not configured by this command, left alone",
                };
                writeln!(f, "{} {what}", file.path.display())?;
                continue;
            }
            let what = match file.change {
                Change::Written => "written",
                Change::Unchanged => "unchanged",
                Change::BackedUpAndWritten => {
                    "written (the previous file kept as hosts.toml.tessera-backup)"
                }
                Change::Restored => "restored from its backup",
                Change::Removed => "removed",
                Change::Untouched => "not ours, left alone",
            };
            writeln!(f, "{:<24} {} {what}", file.registry, file.path.display())?;
        }
        if !self.hosts {
            return Ok(());
        }
        match self.config_path_set {
            Some(true) => writeln!(
                f,
                "containerd's config_path names {}: pulls use the mirror now (no restart needed)",
                self.certs_dir.display()
            ),
            Some(false) => writeln!(
                f,
                "containerd's config_path does not name {dir}: add `config_path = \"{dir}\"` to {} in {} and restart containerd once (later hosts.toml changes need no restart; `ctr --hosts-dir {dir}` works without it)",
                self.registry_section,
                self.containerd_config.display(),
                dir = self.certs_dir.display()
            ),
            None => writeln!(
                f,
                "could not read {}: make sure containerd's config_path names {} (`ctr --hosts-dir` works without it)",
                self.containerd_config.display(),
                self.certs_dir.display()
            ),
        }
    }
}

pub fn containerd_config(args: ContainerdConfigArgs) -> Result<()> {
    let config = HostsConfig {
        certs_dir: args.certs_dir.clone(),
        mirror: args.mirror,
        registries: args.registries,
        all: args.all,
        insecure: args.insecure,
    };
    // Hosts files when any registry is named (and, without a snapshotter, to say
    // that one must be).
    let hosts = !config.registries.is_empty() || config.all || args.snapshotter_socket.is_none();
    let mut files = match (hosts, args.undo) {
        (false, _) => Vec::new(),
        (true, true) => containerd::undo(&config)?,
        (true, false) => containerd::apply(&config)?,
    };
    if let Some(socket) = &args.snapshotter_socket {
        files.push(if args.undo {
            containerd::undo_snapshotter(&args.containerd_config)?
        } else {
            containerd::apply_snapshotter(
                &args.containerd_config,
                &containerd::SnapshotterConfig {
                    socket,
                    root: &args.snapshotter_root,
                    native_runtime: &args.native_runtime,
                },
            )?
        });
    }
    let registry_section = containerd::config_version(&args.containerd_config)
        .unwrap_or(containerd::ConfigVersion::V2)
        .registry_section();
    let summary = Summary {
        hosts,
        registry_section,
        files,
        config_path_set: containerd::config_path_set(&args.containerd_config, &args.certs_dir),
        certs_dir: args.certs_dir,
        containerd_config: args.containerd_config,
    };
    print_summary(&summary, args.json)
}
