//! `tessera agent` (the daemon) and its clients: `mount`, `umount`, `status`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use tessera_agent::api::{self, ReadPlan, Request};
use tessera_agent::config::{parse_size, AgentConfig, Prefetch, DEFAULT_SOCKET};
use tessera_agent::daemon::{
    self, CacheUsage, Listeners, MountStatus, PruneReport, Status, VerifyReport,
};
use tokio::net::TcpListener;

use super::image::{print_out, print_summary};
use super::registry::runtime;

/// The daemon's flags: each overrides the same key of the config file.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Config file (TOML); every key has a default, so none is needed.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The local API's unix socket.
    #[arg(long, env = "TESSERA_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    #[arg(long, env = "TESSERA_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Bytes the chunk cache may hold (`10G`, `512M`).
    #[arg(long, env = "TESSERA_CACHE_CAPACITY", value_parser = parse_size, value_name = "SIZE")]
    cache_capacity: Option<u64>,
    /// Evict unpinned chunks when the cache's filesystem is fuller than this percent
    /// (100: off).
    #[arg(long, env = "TESSERA_CACHE_DISK_HIGH_PERCENT", value_name = "PERCENT")]
    cache_disk_high_percent: Option<u8>,
    /// …until it is below this percent.
    #[arg(long, env = "TESSERA_CACHE_DISK_LOW_PERCENT", value_name = "PERCENT")]
    cache_disk_low_percent: Option<u8>,
    /// Serve Prometheus metrics on `host:port` (`/metrics`).
    #[arg(long, env = "TESSERA_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Also serve the local API on TCP `host:port` (needs --api-token-file).
    #[arg(long, env = "TESSERA_API_LISTEN", value_name = "ADDR")]
    api_listen: Option<String>,
    #[arg(long, env = "TESSERA_API_TOKEN_FILE", value_name = "FILE")]
    api_token_file: Option<PathBuf>,
    /// Serve the TCP API over TLS with this certificate (PEM; needs --api-tls-key).
    #[arg(
        long,
        env = "TESSERA_API_TLS_CERT",
        value_name = "FILE",
        requires = "api_tls_key"
    )]
    api_tls_cert: Option<PathBuf>,
    #[arg(
        long,
        env = "TESSERA_API_TLS_KEY",
        value_name = "FILE",
        requires = "api_tls_cert"
    )]
    api_tls_key: Option<PathBuf>,
    /// Background fetching after a mount.
    #[arg(long, env = "TESSERA_PREFETCH", value_enum)]
    prefetch: Option<Prefetch>,
    /// On SIGTERM or SIGINT, let reads in flight go on this long (seconds, default
    /// 10) before failing what is left with EIO, unmounting and exiting.
    #[arg(long, env = "TESSERA_SHUTDOWN_GRACE", value_name = "SECS")]
    shutdown_grace: Option<u64>,
    /// Let the kernel read files whose data is all cached straight from the cache's
    /// disk (FUSE passthrough, Linux 6.9+; default true).
    #[arg(long, env = "TESSERA_PASSTHROUGH", value_name = "BOOL")]
    passthrough: Option<bool>,
    /// Join the swarm of this scheduler (`http://host:port`): fetch from peers before
    /// the origin and serve peers.
    #[arg(long, env = "TESSERA_SCHEDULER", value_name = "URL")]
    scheduler: Option<String>,
    /// Where the peer service listens (default 0.0.0.0:7081).
    #[arg(long, env = "TESSERA_PEER_LISTEN", value_name = "ADDR")]
    peer_listen: Option<String>,
    /// The ip:port other nodes reach the peer service at.
    #[arg(long, env = "TESSERA_ADVERTISE", value_name = "ADDR")]
    advertise: Option<String>,
    /// This node's id in the swarm (default: hostname@advertised address).
    #[arg(long, env = "TESSERA_HOST_ID", value_name = "ID")]
    host_id: Option<String>,
    /// Topology: peers in the same zone, then rack, are preferred.
    #[arg(long, env = "TESSERA_ZONE", value_name = "NAME")]
    zone: Option<String>,
    #[arg(long, env = "TESSERA_RACK", value_name = "NAME")]
    rack: Option<String>,
    /// A file with the bearer token the scheduler and peers require.
    #[arg(long, env = "TESSERA_P2P_TOKEN_FILE", value_name = "FILE")]
    p2p_token_file: Option<PathBuf>,
    /// TLS: the CA (PEM) that signed the scheduler's and peers' certificates.
    #[arg(long, env = "TESSERA_P2P_TLS_CA", value_name = "FILE")]
    p2p_tls_ca: Option<PathBuf>,
    /// TLS for the peer service (this agent's certificate and key, PEM); peers are
    /// then dialled with TLS too.
    #[arg(long, env = "TESSERA_P2P_TLS_CERT", value_name = "FILE")]
    p2p_tls_cert: Option<PathBuf>,
    #[arg(long, env = "TESSERA_P2P_TLS_KEY", value_name = "FILE")]
    p2p_tls_key: Option<PathBuf>,
    /// The name peers' certificates carry (default: their IP).
    #[arg(long, env = "TESSERA_P2P_TLS_SERVER_NAME", value_name = "NAME")]
    p2p_tls_server_name: Option<String>,
    /// Uploads served to peers at once.
    #[arg(long, env = "TESSERA_MAX_UPLOADS", value_name = "N")]
    max_uploads: Option<u32>,
    /// Upload bandwidth to peers in bytes per second (`100M`; 0: unlimited).
    #[arg(long, env = "TESSERA_UPLOAD_RATE", value_parser = parse_size, value_name = "SIZE")]
    upload_rate: Option<u64>,
    /// Serve the registry mirror containerd pulls through on `host:port`
    /// (e.g. 127.0.0.1:7082; see `tessera containerd-config`).
    #[arg(long, env = "TESSERA_MIRROR_LISTEN", value_name = "ADDR")]
    mirror_listen: Option<String>,
    /// The mirror's upstream for requests that do not name one (default docker.io).
    #[arg(long, env = "TESSERA_MIRROR_DEFAULT_REGISTRY", value_name = "HOST")]
    mirror_default_registry: Option<String>,
    /// While the registry cannot be reached, let the mirror answer from what it said
    /// within this many seconds (a tag's last known digest, manifests, access to
    /// blobs), so nodes start from the swarm; 0 (the default): off.
    #[arg(long, env = "TESSERA_MIRROR_LAST_KNOWN_SECS", value_name = "SECS")]
    mirror_last_known_secs: Option<u64>,
    /// Serve containerd's snapshots API on this unix socket (a proxy snapshotter;
    /// `tessera containerd-config --snapshotter-socket PATH` configures containerd
    /// for it).
    #[arg(long, env = "TESSERA_SNAPSHOTTER_SOCKET", value_name = "PATH")]
    snapshotter_socket: Option<PathBuf>,
    /// The snapshotter's state: metadata, layers, containers' writable layers.
    #[arg(long, env = "TESSERA_SNAPSHOTTER_ROOT", value_name = "DIR")]
    snapshotter_root: Option<PathBuf>,
    /// Serve Podman's and CRI-O's additional layer store at this directory (a FUSE
    /// mount; `additionallayerstores = ["PATH:ref"]` in containers' `storage.conf`).
    #[arg(long, env = "TESSERA_STORE_ROOT", value_name = "PATH")]
    store_root: Option<PathBuf>,
    /// Serve CRI's image service on this unix socket, in front of containerd's: point
    /// the kubelet's `--image-service-endpoint` at it, and the credentials of its pulls
    /// (pods' `imagePullSecrets`) reach the agent's lazy mounts (kept in memory only).
    #[arg(long, env = "TESSERA_CRI_LISTEN", value_name = "PATH")]
    cri_listen: Option<PathBuf>,
    /// containerd's socket, where the CRI proxy passes every call on to (default
    /// /run/containerd/containerd.sock).
    #[arg(long, env = "TESSERA_CRI_CONTAINERD", value_name = "PATH")]
    cri_containerd: Option<PathBuf>,
    /// Keep the CRI pulls' credentials across restarts in this root-only file
    /// (opt-in; off by default: they live in memory only).
    #[arg(long, env = "TESSERA_CRI_CREDENTIALS_FILE", value_name = "FILE")]
    cri_credentials_file: Option<PathBuf>,
    /// Turn peer-to-peer off: every chunk from cache or origin (for comparisons).
    #[arg(long, env = "TESSERA_NO_P2P")]
    no_p2p: bool,
    /// Check the configuration (the file, `TESSERA_*` variables and flags together) and
    /// the registry credentials file, print the result as TOML, and exit: 0 if the agent
    /// would start with it.
    #[arg(long)]
    check_config: bool,
    /// Test-only fault switch: serve corrupted chunks to peers.
    #[arg(long, hide = true, env = "TESSERA_FAULT_CORRUPT_UPLOADS")]
    fault_corrupt_uploads: bool,
}

impl AgentArgs {
    fn config(&self) -> Result<AgentConfig> {
        let mut c = match &self.config {
            Some(path) => AgentConfig::load(path)?,
            None => AgentConfig::default(),
        };
        if let Some(v) = &self.socket {
            c.socket = v.clone();
        }
        if let Some(v) = &self.cache_dir {
            c.cache_dir = v.clone();
        }
        if let Some(v) = self.cache_capacity {
            c.cache_capacity = v;
        }
        if let Some(v) = self.cache_disk_high_percent {
            c.cache_disk_high_percent = v;
        }
        if let Some(v) = self.cache_disk_low_percent {
            c.cache_disk_low_percent = v;
        }
        if let Some(v) = self.shutdown_grace {
            c.shutdown_grace_secs = v;
        }
        if let Some(v) = self.passthrough {
            c.passthrough = v;
        }
        if let Some(v) = &self.metrics_listen {
            c.metrics_listen = Some(v.clone());
        }
        if let Some(v) = &self.api_listen {
            c.api_listen = Some(v.clone());
        }
        if let Some(v) = &self.api_token_file {
            c.api_token_file = Some(v.clone());
        }
        if let Some(v) = &self.api_tls_cert {
            c.api_tls_cert = Some(v.clone());
        }
        if let Some(v) = &self.api_tls_key {
            c.api_tls_key = Some(v.clone());
        }
        if let Some(v) = self.prefetch {
            c.prefetch = v;
        }
        if let Some(v) = &self.mirror_listen {
            c.mirror.listen = Some(v.clone());
        }
        if let Some(v) = self.mirror_last_known_secs {
            c.mirror.last_known_secs = v;
        }
        if let Some(v) = &self.mirror_default_registry {
            c.mirror.default_registry = v.clone();
        }
        if let Some(v) = &self.snapshotter_socket {
            c.snapshotter.socket = Some(v.clone());
        }
        if let Some(v) = &self.snapshotter_root {
            c.snapshotter.root = v.clone();
        }
        if let Some(v) = &self.store_root {
            c.store_root = Some(v.clone());
        }
        if let Some(v) = &self.cri_listen {
            c.cri.listen = Some(v.clone());
        }
        if let Some(v) = &self.cri_containerd {
            c.cri.containerd = v.clone();
        }
        if let Some(v) = &self.cri_credentials_file {
            c.cri.credentials_file = Some(v.clone());
        }
        let p = &mut c.p2p;
        for (key, flag) in [
            (&mut p.scheduler, &self.scheduler),
            (&mut p.advertise, &self.advertise),
            (&mut p.host_id, &self.host_id),
            (&mut p.zone, &self.zone),
            (&mut p.rack, &self.rack),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        if let Some(v) = &self.peer_listen {
            p.peer_listen = v.clone();
        }
        for (key, flag) in [
            (&mut p.token_file, &self.p2p_token_file),
            (&mut p.tls_ca, &self.p2p_tls_ca),
            (&mut p.tls_cert, &self.p2p_tls_cert),
            (&mut p.tls_key, &self.p2p_tls_key),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        if self.p2p_tls_server_name.is_some() {
            p.tls_server_name.clone_from(&self.p2p_tls_server_name);
        }
        if let Some(v) = self.max_uploads {
            p.max_uploads = v;
        }
        if let Some(v) = self.upload_rate {
            p.upload_bytes_per_sec = v;
        }
        if self.no_p2p {
            p.enabled = false;
        }
        if self.fault_corrupt_uploads {
            p.fault_corrupt_uploads = true;
        }
        if let Err(problems) = c.validate() {
            bail!("invalid configuration:\n  {}", problems.join("\n  "));
        }
        Ok(c)
    }
}

/// `tessera store --root PATH`: the agent run for the additional layer store, as
/// stargz-store and SOCI's store are run for theirs. Every agent flag applies.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Where to serve the store (absolute): `additionallayerstores = ["PATH:ref"]` in
    /// containers' `storage.conf` names the same path.
    #[arg(long, value_name = "PATH")]
    root: PathBuf,
    #[command(flatten)]
    agent: AgentArgs,
}

pub fn store(args: StoreArgs) -> Result<()> {
    let mut agent = args.agent;
    agent.store_root = Some(args.root);
    self::agent(agent)
}

pub fn agent(args: AgentArgs) -> Result<()> {
    let config = args.config()?;
    if args.check_config {
        daemon::node_client(&config).context("read registry credentials")?;
        print_out(format_args!(
            "{}",
            toml::to_string(&config).context("print the configuration")?
        ))?;
        eprintln!("tessera agent: the configuration is valid");
        return Ok(());
    }
    // Every connection and every cached chunk file is a descriptor: use all the
    // system allows this process.
    match tessera_proto::listen::raise_fd_limit() {
        Ok(limit) => tracing::info!(open_files = limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
    let runtime = runtime()?;
    let result = runtime.block_on(async move {
        let listeners = bind(&config).await?;
        Ok(daemon::run(config, listeners, shutdown_signal()).await?)
    });
    // Reads have been failed and mounts detached by now; blocking work still running
    // (a disk write, a hash) is not waited for past this.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// Binds the TCP listeners `config` names (the unix sockets are bound by the daemon,
/// once it is ready to answer on them).
async fn bind(config: &AgentConfig) -> Result<Listeners> {
    async fn listen(addr: &Option<String>, what: &str) -> Result<Option<TcpListener>> {
        match addr {
            None => Ok(None),
            Some(addr) => TcpListener::bind(addr)
                .await
                .map(Some)
                .with_context(|| format!("{what}listen on {addr}")),
        }
    }
    let peer = config.p2p.active().then(|| config.p2p.peer_listen.clone());
    Ok(Listeners {
        api: listen(&config.api_listen, "").await?,
        metrics: listen(&config.metrics_listen, "").await?,
        mirror: listen(&config.mirror.listen, "mirror: ").await?,
        peer: listen(&peer, "p2p: ").await?,
    })
}

/// Completes at the first SIGTERM or SIGINT; from then on a second one ends the
/// process at once, without waiting for the shutdown's grace period.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("tessera agent: a second signal: exiting now, without unmounting");
        std::process::exit(1);
    });
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The agent's socket.
    #[arg(long, env = "TESSERA_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn call(client: &ClientArgs, request: Request) -> Result<serde_json::Value> {
    Ok(runtime()?.block_on(api::call(&client.socket, request))?)
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Image reference (a Tessera image, e.g. made by `tessera convert`).
    image: String,
    /// An existing empty directory.
    mountpoint: PathBuf,
    /// Append the path of each file read (first read only) to FILE: a prefetch list
    /// for `tessera convert --prefetch-list`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<String>,
    #[arg(long, value_enum)]
    prefetch: Option<Prefetch>,
    #[command(flatten)]
    client: ClientArgs,
}

pub fn mount(args: MountArgs) -> Result<()> {
    // The agent runs elsewhere: give it absolute paths.
    let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let result = call(
        &args.client,
        Request::Mount {
            image: args.image.clone(),
            mountpoint: abs(&args.mountpoint),
            platform: args.platform.clone(),
            plan: ReadPlan {
                record: args.record.as_ref().map(abs),
                prefetch: args.prefetch,
                ..ReadPlan::default()
            },
        },
    )
    .with_context(|| format!("mount {}", args.image))?;
    show_mount(&args.client, result)
}

fn show_mount(client: &ClientArgs, result: serde_json::Value) -> Result<()> {
    let status: MountStatus = serde_json::from_value(result)?;
    if client.json {
        return print_summary(&status, true);
    }
    // A mount's summary is one line without its own newline (it is also a log line).
    print_out(format_args!("{status}\n"))
}

#[derive(Debug, Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
    #[command(flatten)]
    client: ClientArgs,
}

pub fn umount(args: UmountArgs) -> Result<()> {
    let mountpoint = std::path::absolute(&args.mountpoint).unwrap_or(args.mountpoint.clone());
    let result = call(&args.client, Request::Umount { mountpoint })
        .with_context(|| format!("unmount {}", args.mountpoint.display()))?;
    show_mount(&args.client, result)
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    client: ClientArgs,
}

pub fn status(args: StatusArgs) -> Result<()> {
    let result = call(&args.client, Request::Status).context("ask the agent for its status")?;
    let status: Status = serde_json::from_value(result)?;
    print_summary(&status, args.client.json)
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Read every cached chunk and check it against its digest now, dropping those
    /// that fail (they are fetched again when next read). The agent also does this in
    /// the background, slowly (`[scrub]`).
    Verify(CacheVerifyArgs),
    /// What the cache holds: bytes, chunks, capacity, the bytes mounted images pin
    /// (never evicted while mounted) and each mount's, and the cache filesystem's
    /// usage against its watermarks.
    Usage(CacheVerifyArgs),
    /// Evict every cached chunk no mounted image pins (they are fetched again when
    /// next read), or with `--keep` only down to that many bytes.
    Prune(CachePruneArgs),
}

#[derive(Debug, Args)]
pub struct CacheVerifyArgs {
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct CachePruneArgs {
    /// Keep this many bytes of chunks (`2G`, `512M`), the most recently used.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    keep: Option<u64>,
    #[command(flatten)]
    client: ClientArgs,
}

pub fn cache(command: CacheCommand) -> Result<()> {
    match command {
        CacheCommand::Verify(args) => {
            let status: Status = serde_json::from_value(
                call(&args.client, Request::Status).context("ask the agent for its status")?,
            )?;
            if !args.client.json {
                eprintln!(
                    "verifying {} cached chunks ({:.1} MiB)…",
                    status.cache.entries,
                    status.cache.bytes as f64 / 1048576.0
                );
            }
            let result = call(&args.client, Request::CacheVerify)
                .context("ask the agent to verify its cache")?;
            let report: VerifyReport = serde_json::from_value(result)?;
            if args.client.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "verified {} chunks ({:.1} MiB) in {:.1} s: {} failed and were dropped",
                    report.chunks,
                    report.bytes as f64 / 1048576.0,
                    report.millis as f64 / 1000.0,
                    report.dropped
                );
            }
            Ok(())
        }
        CacheCommand::Usage(args) => {
            let result = call(&args.client, Request::CacheUsage)
                .context("ask the agent for its cache usage")?;
            let usage: CacheUsage = serde_json::from_value(result)?;
            print_summary(&usage, args.client.json)
        }
        CacheCommand::Prune(args) => {
            let result = call(&args.client, Request::CachePrune { keep: args.keep })
                .context("ask the agent to prune its cache")?;
            let report: PruneReport = serde_json::from_value(result)?;
            if args.client.json {
                return print_summary(&report, true);
            }
            print_out(format_args!("{report}\n"))
        }
    }
}

#[derive(Debug, Args)]
pub struct FuseKeeperArgs {
    /// The unix socket agents reach it on (the agent's is
    /// `<snapshotter root>/fuse-keeper.sock`).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Never exit, even holding nothing (run as a container of its own); exit on
    /// SIGTERM (its pod is being deleted).
    #[arg(long)]
    stay: bool,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotterCommand {
    /// After the agent stopped: detach the image mounts it left for its next start
    /// (lazily; a plain `umount` of such a mount can hang), let the FUSE keeper exit,
    /// and with `--remove` delete the snapshotter's root. Leaves nothing mounted or
    /// running. Refuses while an agent serves the socket, and `--remove` while a
    /// container runs on one of its layers.
    Clean(SnapshotterCleanArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotterCleanArgs {
    /// The snapshotter's root (the agent's `--snapshotter-root`).
    #[arg(
        long,
        default_value = "/var/lib/tessera/snapshotter",
        value_name = "DIR"
    )]
    root: PathBuf,
    /// The snapshotter's socket (the agent's `--snapshotter-socket`): nothing may
    /// answer on it.
    #[arg(
        long,
        default_value = "/run/tessera/snapshotter.sock",
        value_name = "PATH"
    )]
    socket: PathBuf,
    /// Also delete the root: containerd's snapshots on it are gone (remove the images
    /// from containerd too, or reinstall the snapshotter before the next pull).
    #[arg(long)]
    remove: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, serde::Serialize)]
struct CleanSummary {
    root: PathBuf,
    #[serde(flatten)]
    cleaned: tessera_agent::snapshotter::clean::Cleaned,
}

impl std::fmt::Display for CleanSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.cleaned;
        writeln!(
            f,
            "snapshotter {}: {} image mounts detached",
            self.root.display(),
            c.unmounted.len()
        )?;
        if c.keeper_stopped {
            writeln!(f, "the FUSE keeper exited")?;
        }
        if c.keeper_stays {
            writeln!(
                f,
                "the FUSE keeper runs on (--stay: a container of its own) and holds nothing"
            )?;
        }
        if !c.in_use.is_empty() {
            writeln!(
                f,
                "{} mounts of running containers left under it",
                c.in_use.len()
            )?;
        }
        if c.removed {
            writeln!(f, "removed {}", self.root.display())?;
        }
        Ok(())
    }
}

pub fn snapshotter(command: SnapshotterCommand) -> Result<()> {
    match command {
        SnapshotterCommand::Clean(args) => {
            let cleaned =
                tessera_agent::snapshotter::clean::clean(&args.root, &args.socket, args.remove)?;
            print_summary(
                &CleanSummary {
                    root: args.root,
                    cleaned,
                },
                args.json,
            )
        }
    }
}

pub fn fuse_keeper(args: FuseKeeperArgs) -> Result<()> {
    if args.stay {
        exit_on_sigterm()?;
    }
    tessera_agent::fs::handover::run_keeper(&args.socket, args.stay)
        .with_context(|| format!("FUSE keeper on {}", args.socket.display()))
}

/// A keeper that stays (a container of its own in the agent's pod) is told SIGTERM
/// only when its pod is being deleted: an uninstall, a rollout, a drain. No agent of
/// this pod can take its connections over any more, so it exits at once. As PID 1 of
/// its container it would otherwise ignore the signal, and every deletion of an
/// agent's pod would wait out the pod's whole grace period before the SIGKILL.
fn exit_on_sigterm() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("start the FUSE keeper's signal thread")?;
    let mut term = runtime
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        })
        .context("watch SIGTERM")?;
    std::thread::spawn(move || {
        runtime.block_on(term.recv());
        tracing::info!("FUSE keeper: SIGTERM, its pod is going; letting go of every connection");
        std::process::exit(0);
    });
    Ok(())
}
