//! `tessera checkpoint`, `tessera restore` and `tessera run`: the command line around
//! [`tessera_agent::checkpoint`] — flags, credentials, the progress line and the
//! summaries.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use rafs_format::builder::BuildOptions;
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use tessera_agent::checkpoint::ready::{Probe, Readiness};
use tessera_agent::checkpoint::release;
use tessera_agent::checkpoint::run::{RestoreChoice, RunOptions, WorkingSetChoice};
use tessera_agent::checkpoint::{
    self, CheckpointOptions, ContainerdAt, Criu, DictChoice, RestoreOptions, Source,
};
use tessera_agent::config::{Prefetch, DEFAULT_SOCKET};
use tessera_agent::containerd::SNAPSHOTTER;
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
    /// it into target/tools/criu/criu). For containers, runc 1.1 (containerd 1.6) is
    /// told this path; runc 1.2 and later (containerd 2.x) run the `criu` on
    /// containerd's `PATH` whatever this says.
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

/// Where containerd is.
#[derive(Debug, Args)]
pub struct ContainerdArgs {
    /// containerd's socket.
    #[arg(
        long,
        env = "CONTAINERD_ADDRESS",
        value_name = "SOCKET",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: PathBuf,
    /// containerd namespace (`ctr`'s default; the kubelet's is `k8s.io`).
    #[arg(long, env = "CONTAINERD_NAMESPACE", default_value = "default")]
    namespace: String,
}

impl ContainerdArgs {
    fn at(&self) -> ContainerdAt {
        ContainerdAt {
            address: self.address.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The root process of the tree to checkpoint (CRIU dumps it directly).
    #[arg(long, required_unless_present_any = ["container", "boot"], conflicts_with_all = ["container", "boot"])]
    pid: Option<u32>,
    /// The containerd container to checkpoint (runc dumps its task through
    /// containerd); --for defaults to its image.
    #[arg(long, value_name = "ID", conflicts_with = "boot")]
    container: Option<String>,
    /// A release's checkpoint, as CI makes it: boot this app image in a container
    /// of its own (on the Tessera snapshotter), wait until --ready succeeds,
    /// checkpoint it as its referrer, remove the container.
    #[arg(
        long,
        value_name = "APP_IMAGE",
        requires = "ready",
        conflicts_with = "app"
    )]
    boot: Option<Reference>,
    /// With --boot: when the app is ready. `http://HOST:PORT/PATH` (a GET answered
    /// 2xx or 3xx), `tcp://HOST:PORT` (a connection accepted) or `exec:COMMAND` (run
    /// by `sh -c` on this node, exits 0). The container shares the node's network.
    #[arg(long, value_name = "PROBE")]
    ready: Option<Probe>,
    /// With --boot: how long the app may take to become ready.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    ready_timeout: u64,
    /// With --boot: how long to wait after the app became ready, before the
    /// checkpoint (its own warm-up then lands in the checkpoint).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    settle: u64,
    /// With --boot: then restore the checkpoint once with lazy pages and push its
    /// working set beside it (what the restore and the app's first request, --ready's
    /// probe, needed of it: later restores fetch that first).
    #[arg(long, requires = "boot")]
    record_working_set: bool,
    /// With --record-working-set: the agent's socket (it mounts the checkpoint lazily).
    #[arg(long, env = "TESSERA_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// With --boot: the container's state directory (its output log).
    #[arg(long, default_value = "/var/lib/tessera/run", value_name = "DIR")]
    state_dir: PathBuf,
    /// With --boot: the Tessera snapshotter's name in containerd's config.
    #[arg(long, default_value = SNAPSHOTTER)]
    snapshotter: String,
    #[command(flatten)]
    containerd: ContainerdArgs,
    /// Keep the process running after the dump (by default CRIU stops it).
    #[arg(long)]
    leave_running: bool,
    /// Where to push the checkpoint (a tag). With --for (or --container) it must be in
    /// the app image's repository, and may be left out: the checkpoint is then pushed
    /// there untagged.
    #[arg(required_unless_present_any = ["app", "container", "boot"])]
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
    let refs: Vec<&Reference> = [&args.target, &args.app, &args.chunk_dict, &args.boot]
        .into_iter()
        .flatten()
        .collect();
    let client = args.registry.client(&refs, args.dest_creds.as_ref())?;
    let work = scratch(&args.work_dir)?;
    let avg = args.chunk_size;
    let boot_id = format!("tessera-checkpoint-{}", std::process::id());
    let (source, what) = match (&args.pid, &args.container) {
        (_, Some(id)) => (
            Source::Container {
                containerd: args.containerd.at(),
                id: id.clone(),
            },
            format!("container {id}"),
        ),
        (Some(pid), None) => (Source::Process(*pid), format!("pid {pid}")),
        (None, None) if args.boot.is_some() => (
            Source::Container {
                containerd: args.containerd.at(),
                id: boot_id.clone(),
            },
            format!("container {boot_id}"),
        ),
        (None, None) => anyhow::bail!("give --pid PID, --container ID or --boot APP_IMAGE"),
    };
    let opts = CheckpointOptions {
        source,
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
        (None, None) => "the repository of its image".into(),
    };
    if let (Some(app), Some(probe)) = (&args.boot, &args.ready) {
        anyhow::ensure!(
            args.target.is_none(),
            "with --boot the checkpoint goes beside the image, as its referrer: leave TARGET out"
        );
        let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or(p.clone());
        let run = RunOptions {
            containerd: args.containerd.at(),
            snapshotter: args.snapshotter.clone(),
            id: boot_id,
            hostname: None,
            restore: RestoreChoice::Never,
            criu: args.criu.criu(),
            socket: absolute(&args.socket),
            platform: Platform::host(),
            state_dir: absolute(&args.state_dir),
            log: None,
            prefetch: Prefetch::None,
            lazy_pages: false,
            working_set: WorkingSetChoice::Ignore,
        };
        let ready = Readiness {
            probe: probe.clone(),
            timeout: Duration::from_secs(args.ready_timeout),
            settle: Duration::from_secs(args.settle),
        };
        let summary = runtime()?
            .block_on(release::boot_and_checkpoint(
                client,
                app,
                &run,
                &ready,
                &opts,
                args.record_working_set,
                &progress,
            ))
            .with_context(|| format!("boot {app}, wait until ready, checkpoint"))?;
        drop(display);
        return print_summary(&summary, args.json);
    }
    let summary = runtime()?
        .block_on(checkpoint::checkpoint(
            client,
            args.target.as_ref(),
            &opts,
            &progress,
        ))
        .with_context(|| format!("checkpoint {what} to {destination}"))?;
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

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The app image: a Tessera image (converted or indexed); its checkpoints are its
    /// referrers (`tessera checkpoint --container ID`).
    image: Reference,
    /// The new container's id.
    id: String,
    /// Its hostname [default: its id]. A restored container gets it too: it is a
    /// clone, not a copy of the one checkpointed.
    #[arg(long)]
    hostname: Option<String>,
    /// Boot, whatever checkpoints the image has.
    #[arg(long, conflicts_with = "checkpoint")]
    boot: bool,
    /// Restore this checkpoint instead of the image's newest (booting if this node
    /// cannot restore it).
    #[arg(long, value_name = "REF")]
    checkpoint: Option<Reference>,
    #[command(flatten)]
    containerd: ContainerdArgs,
    /// The Tessera snapshotter's name in containerd's config.
    #[arg(long, default_value = SNAPSHOTTER)]
    snapshotter: String,
    #[command(flatten)]
    criu: CriuArgs,
    /// The agent's socket: the agent mounts the checkpoint lazily.
    #[arg(long, env = "TESSERA_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// Where each container's CRIU config and logs, and by default its output, are
    /// kept while it runs.
    #[arg(long, default_value = "/var/lib/tessera/run", value_name = "DIR")]
    state_dir: PathBuf,
    /// The container's output (appended) [default: in --state-dir].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// How the agent prefetches a checkpoint it mounts, after its working set (if it
    /// has one): `all` fetches every chunk ahead of CRIU (which reads them all), many
    /// at once; `none` only what CRIU reads, as it reads [default: `all`; with
    /// --lazy-pages `none`: the restore and the app's first requests need little of
    /// the heap, and prefetching the rest would share the link with it while the
    /// lazy-pages daemon sends the rest after anyway].
    #[arg(long, value_enum)]
    prefetch: Option<RestorePrefetch>,
    /// CRIU's lazy pages (userfaultfd): the restored app runs before its memory has
    /// arrived; `criu lazy-pages` serves its page faults from the checkpoint's mount
    /// and sends the rest after (this command returns once it has).
    #[arg(long)]
    lazy_pages: bool,
    /// With --lazy-pages: record this restore's working set and push it beside the
    /// checkpoint, as its referrer (push access to the image's repository needed):
    /// the checkpoint's chunks the restore read and the pages the app faulted in until
    /// PROBE first succeeded and --settle after. Later restores of the checkpoint
    /// fetch those chunks first. PROBE is
    /// `http://HOST:PORT/PATH` (a GET answered 2xx or 3xx: the app's first request),
    /// `tcp://HOST:PORT` or `exec:COMMAND`, as `tessera checkpoint --ready`.
    #[arg(
        long,
        value_name = "PROBE",
        conflicts_with = "boot",
        requires = "lazy_pages"
    )]
    record_working_set: Option<Probe>,
    /// Restore without the checkpoint's recorded working set (by default its chunks
    /// are fetched first, when it has one).
    #[arg(long, conflicts_with = "record_working_set")]
    no_working_set: bool,
    /// With --record-working-set: how long the restored app may take to answer.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    ready_timeout: u64,
    /// With --record-working-set: how long to go on recording after the first answer
    /// (more requests the app's clients make early then land in the working set).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    settle: u64,
    /// Registry credentials, `USER:PASSWORD` (else the credentials file); the agent
    /// uses its own for the mounts.
    #[arg(long, env = "TESSERA_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    let refs: Vec<&Reference> = [Some(&args.image), args.checkpoint.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let client = args.registry.client(&refs, args.creds.as_ref())?;
    let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or(p.clone());
    let opts = RunOptions {
        containerd: args.containerd.at(),
        snapshotter: args.snapshotter.clone(),
        id: args.id.clone(),
        hostname: args.hostname.clone(),
        restore: match (&args.checkpoint, args.boot) {
            (Some(r), _) => RestoreChoice::Checkpoint(r.clone()),
            (None, true) => RestoreChoice::Never,
            (None, false) => RestoreChoice::Newest,
        },
        criu: args.criu.criu(),
        // The agent and containerd's shim are told absolute paths: they run elsewhere.
        socket: absolute(&args.socket),
        platform: Platform::host(),
        state_dir: absolute(&args.state_dir),
        log: args.log.as_ref().map(absolute),
        prefetch: match (args.prefetch, args.lazy_pages) {
            (Some(RestorePrefetch::All), _) | (None, false) => Prefetch::All,
            (Some(RestorePrefetch::None), _) | (None, true) => Prefetch::None,
        },
        lazy_pages: args.lazy_pages,
        working_set: match (&args.record_working_set, args.no_working_set) {
            (Some(probe), _) => WorkingSetChoice::Record(Readiness {
                probe: probe.clone(),
                timeout: Duration::from_secs(args.ready_timeout),
                settle: Duration::from_secs(args.settle),
            }),
            (None, true) => WorkingSetChoice::Ignore,
            (None, false) => WorkingSetChoice::Use,
        },
    };
    let summary = runtime()?
        .block_on(checkpoint::run::run(&client, &args.image, &opts))
        .with_context(|| format!("run {} as container {}", args.image, args.id))?;
    print_summary(&summary, args.json)
}

/// `tessera run --prefetch`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RestorePrefetch {
    All,
    None,
}

fn scratch(dir: &Option<PathBuf>) -> Result<tempfile::TempDir> {
    match dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")
}
