//! The agent library's one error type. Every variant names what it was about (the
//! registry and repository, the file, the setting) so the message tells people what to
//! fix; none carries a credential.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An image reference does not parse.
    #[error("invalid image reference {input:?}: {reason}")]
    Reference { input: String, reason: String },

    /// The registry answered with an HTTP status that ends the operation.
    #[error("{registry}/{repository}: {what}: HTTP {status}{said}{hint}")]
    Status {
        registry: String,
        repository: String,
        what: String,
        status: u16,
        /// What the registry's error body said (` CODE: message`), or empty.
        said: String,
        hint: &'static str,
    },

    /// The registry could not be reached, or a body was cut off, after the retries.
    #[error("{registry}/{repository}: {what}: {reason}")]
    Transport {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },

    /// Content did not hash to the digest it was asked for by.
    #[error("{registry}/{repository}: {what}: digest mismatch: expected {expected}, got {actual}")]
    Digest {
        registry: String,
        repository: String,
        what: String,
        expected: String,
        actual: String,
    },

    /// The registry's answer broke the distribution protocol, or an image is not what
    /// Tessera can use (no platform matches, no bootstrap layer, a bad manifest).
    #[error("{registry}/{repository}: {what}: {reason}")]
    Protocol {
        registry: String,
        repository: String,
        what: String,
        reason: String,
    },

    /// A configuration or credentials file is unreadable or wrong.
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },

    /// A local file operation failed.
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },

    /// A chunk of a mounted image could not be had from any source.
    #[error("image {image}: chunk {chunk} ({digest}): {reason}")]
    Chunk {
        image: String,
        chunk: u32,
        digest: String,
        reason: ChunkFailure,
    },

    /// The agent daemon refused or failed a request (the message says what to do).
    #[error("{0}")]
    Agent(String),

    /// A snapshot operation of the containerd snapshotter failed; `code` is what
    /// containerd is told (e.g. "already exists" makes it skip a layer).
    #[error("snapshot {key:?}: {reason} ({code})")]
    Snapshot {
        code: SnapshotCode,
        key: String,
        reason: String,
    },

    /// containerd refused or failed a call of `tessera pull`; the reason says what to
    /// do where that is known (containerd not there, the snapshotter not configured).
    #[error("containerd at {}: {what}: {reason}", address.display())]
    Containerd {
        address: PathBuf,
        what: String,
        reason: String,
    },

    /// `tessera pull` of an image whose layers the snapshotter would unpack: it is
    /// neither converted nor indexed.
    #[error(
        "{image} is neither converted (`tessera convert`) nor indexed (`tessera index`): \
         snapshotter {snapshotter} would unpack its layer {layer}, and `tessera pull` \
         downloads no layers. Pull it with `ctr image pull --snapshotter {snapshotter} \
         {image}`, or make it lazy first with `tessera convert {image} NEW-REF` (then \
         pull NEW-REF) or `tessera index {image}`"
    )]
    NotLazy {
        image: String,
        layer: String,
        snapshotter: String,
    },

    /// The TCP listeners handed to the daemon do not match the addresses its
    /// configuration names (its caller binds them; the setting is named).
    #[error("{setting}: {problem}")]
    Listener {
        setting: &'static str,
        problem: &'static str,
    },

    /// A setting (of the configuration or a command line) cannot work as given; the
    /// setting is named and the problem says what to change.
    #[error("{setting}: {problem}")]
    Setting { setting: String, problem: String },

    /// The configuration has problems, each naming its setting.
    #[error("invalid configuration:\n  {}", problems.join("\n  "))]
    InvalidConfig { problems: Vec<String> },

    /// A mount request names a mountpoint in the wrong state for it.
    #[error("{}: {problem}", path.display())]
    Mountpoint {
        path: PathBuf,
        problem: &'static str,
    },

    /// A preheat job ended with chunks it could not fetch.
    #[error("{failed} of {total} chunks could not be fetched; the first: {first}")]
    Preheat {
        failed: u64,
        total: usize,
        first: String,
    },

    /// A service of the agent (the peer service, the snapshotter) stopped serving,
    /// or a task of it ended without finishing.
    #[error("{service}: {reason}")]
    Service { service: String, reason: String },

    /// The HTTP client for registries cannot be made (its TLS backend did not start).
    #[error(transparent)]
    HttpClient(reqwest::Error),

    /// A certificate or key cannot serve TLS (the agent's TCP API).
    #[error(transparent)]
    Tls(#[from] tessera_proto::tls::TlsSetupError),

    /// The cache's disk is full and nothing more could be evicted: the chunk was served
    /// but not cached.
    #[error("chunk cache: {} is full and nothing more can be evicted; serving chunks without caching them until space returns", dir.display())]
    CacheDiskFull { dir: PathBuf },

    /// The local chunk cache's index (sled) failed.
    #[error("chunk cache: {reason}")]
    Cache { reason: String },

    /// CRIU could not be run, or a dump or restore failed; `reason` carries what CRIU
    /// logged last and what to do (`tessera checkpoint`, `tessera restore`).
    #[error("criu {action}: {reason}")]
    Criu { action: String, reason: String },

    /// One of CRIU's image files in a checkpoint is not what CRIU writes (a truncated
    /// or foreign file): `file` is its name in the checkpoint.
    #[error("CRIU image {file}: {reason}")]
    CriuImage { file: String, reason: String },

    /// `tessera checkpoint --boot`: the booted app did not become ready (its probe
    /// never succeeded within the timeout, or the app exited).
    #[error("the app never became ready ({probe}): {reason}")]
    NotReady { probe: String, reason: String },

    /// A checkpoint image cannot be restored on this node: it records no CRIU version,
    /// or one this node's CRIU cannot restore; `reason` names both and what to do.
    #[error("checkpoint {image} cannot be restored here: {reason}")]
    CheckpointIncompatible { image: String, reason: String },

    /// `tessera restore --for IMAGE` found no checkpoint of IMAGE (for this node's
    /// platform) that this node can restore: the caller should boot the image instead.
    /// `rejected` is empty when the image has no checkpoint at all; else it says, newest
    /// first, why each one was refused. `tessera restore` exits with its own code
    /// (`checkpoint::NO_USABLE_CHECKPOINT_EXIT_CODE`) for it.
    #[error(
        "no usable checkpoint: boot the image {image}: {}",
        no_checkpoint_reason(subject, rejected)
    )]
    NoUsableCheckpoint {
        image: String,
        /// The manifest (this node's platform) whose referrers were looked at.
        subject: String,
        rejected: Vec<RejectedCheckpoint>,
    },

    /// `tessera checkpoint` dumped and stopped a process but could not push its
    /// checkpoint: the CRIU images are kept so the process is not lost.
    #[error(
        "process {pid} was dumped and stopped, but its checkpoint was not pushed: {cause}. \
         Its CRIU images are kept in {}: `criu restore -D {} --shell-job --restore-detached` \
         starts it again",
        kept.display(), kept.display()
    )]
    CheckpointNotPushed {
        pid: u32,
        kept: PathBuf,
        cause: Box<Error>,
    },

    /// Building or reading the image format failed.
    #[error(transparent)]
    Format(#[from] rafs_format::Error),
}

/// Why the fetch pipeline could not give a chunk of an image or a piece of a blob (the
/// reason inside [`Error::Chunk`], and what the mirror cuts a response off with). It is
/// `Clone` because one fetch answers everyone waiting for the same chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkFailure {
    /// Bytes from a source did not decode to the recorded size or digest.
    #[error("failed verification ({from}): {reason}")]
    Verification { from: &'static str, reason: String },
    /// Every attempt at the origin failed; the last one's reason.
    #[error("not fetched after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: String },
    /// The agent is stopping: the fetch was dropped before it answered.
    #[error("the agent is stopping; the fetch was abandoned")]
    Stopped,
}

/// A checkpoint `tessera restore --for` did not restore, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedCheckpoint {
    /// The checkpoint, pinned by digest.
    pub checkpoint: String,
    /// When it was made (its `org.opencontainers.image.created`), if recorded.
    pub created: Option<String>,
    pub reason: String,
}

impl RejectedCheckpoint {
    /// `CHECKPOINT: REASON`, as summaries list the checkpoints skipped.
    pub fn line(&self) -> String {
        format!("{}: {}", self.checkpoint, self.reason)
    }
}

fn no_checkpoint_reason(subject: &str, rejected: &[RejectedCheckpoint]) -> String {
    if rejected.is_empty() {
        return format!("it has no checkpoint (no referrer of {subject} is a checkpoint)");
    }
    let each: Vec<String> = rejected
        .iter()
        .map(|r| {
            let created = r.created.as_deref().unwrap_or("creation time not recorded");
            format!("{} ({created}): {}", r.checkpoint, r.reason)
        })
        .collect();
    format!(
        "none of its {} checkpoints can be restored here: {}",
        rejected.len(),
        each.join("; ")
    )
}

/// What kind of failure a snapshot operation met: containerd tells them apart (an
/// "already exists" answer to `Prepare` means "skip this layer"). Here rather than in
/// `snapshotter` (which re-exports it as `Code`) so the error module depends on
/// nothing of the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotCode {
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    Internal,
}

impl std::fmt::Display for SnapshotCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotCode::NotFound => "not found",
            SnapshotCode::AlreadyExists => "already exists",
            SnapshotCode::FailedPrecondition => "failed precondition",
            SnapshotCode::InvalidArgument => "invalid argument",
            SnapshotCode::Internal => "internal",
        })
    }
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        cause: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            cause,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
