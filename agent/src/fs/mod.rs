//! The read-only FUSE filesystem of a mounted image.
//!
//! The whole tree is in memory (the [`Bootstrap`]), so every metadata operation —
//! lookup, getattr, readdir, readlink, xattrs, statfs — is answered at once on the
//! session thread, the one thread `fuser` reads kernel requests on. Only `read` may have
//! to wait for data (a chunk from the cache, a peer or the origin), so each read is
//! handed to a pool of worker threads that reply when their chunks arrive: a read
//! waiting on a slow chunk never holds up lookups or reads of other files.
//!
//! Where data comes from is not this module's business: it asks a [`ChunkReader`] for
//! a chunk by its index in the bootstrap's chunk table and gets verified bytes back.
//!
//! - `filesystem` — the `fuser::Filesystem`: bootstrap records become FUSE replies.
//! - `attr` — inode records as FUSE attributes, and the cache lifetimes we promise.
//! - `read` — a byte range of a file assembled from its pieces (chunks and holes).
//! - `pool` — the worker threads reads run on.
//! - `errno` — the error numbers we answer with.
//! - `session` — [`mount`] and [`Mounted`]: the mount point, the session thread, a
//!   clean unmount; [`attach`]: serving a mount an earlier agent made.
//! - `mount_table` — the one parser of `/proc/self/mountinfo` and the one lazy unmount
//!   (`fusermount3 -u -z`) the agent uses.
//! - `handover` — the FUSE keeper that holds mounts' connections while the agent
//!   restarts, and the relay that lets a new session take one over.
//!
//! Architecture invariant: the image is immutable, so the kernel may cache everything
//! (entries, attributes, negative lookups, file pages) for as long as the mount lives,
//! and nothing ever invalidates it.
//!
//! [`Bootstrap`]: rafs_format::reader::Bootstrap

mod attr;
pub(crate) mod errno;
mod filesystem;
pub mod handover;
pub mod mount_table;
mod pool;
mod read;
mod read_only;
mod session;

pub(crate) use read_only::refuse_changes;

pub use session::{attach, mount, Mounted};

pub use read::Data;

use std::borrow::Borrow;
use std::ops::Range;
use std::sync::Arc;

use rafs_format::reader::FileChunk;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a mounted image's file data comes from.
pub trait ChunkReader: Send + Sync + 'static {
    /// Bytes `within` (a range of the uncompressed chunk) of chunk `chunk` (an index
    /// into the bootstrap's chunk table), verified. Blocks; called on the filesystem's
    /// worker threads (never on an async runtime's), possibly many at once, and for one
    /// chunk as often as the kernel reads inside it: a reader should keep recently used
    /// chunks at hand, or read only the bytes asked for.
    ///
    /// A result that is not exactly `within`'s length is treated as an error. Errors
    /// are logged by the filesystem (with the inode and chunk) and the read fails with
    /// `EIO`.
    fn read_chunk(&self, chunk: u32, within: Range<u32>) -> std::io::Result<Data>;

    /// A file on local disk holding exactly the `size` bytes of the file made of
    /// `pieces`, verified, for the kernel to read with no round trip to us (FUSE
    /// passthrough); `None` when there is none yet. Called on the session thread at
    /// open: it may look on local disk, never wait on the network. Default: none.
    fn backing_file(&self, _pieces: &[FileChunk], _size: u64) -> Option<std::fs::File> {
        None
    }

    /// Told when the last open of a file read through us (not passthrough) closes: the
    /// reader may now hold all of its data and prepare a backing file for its next
    /// open. Called on the session thread, so it must not block. Default: nothing.
    fn file_closed(&self, _pieces: &Arc<[FileChunk]>, _size: u64) {}

    /// Told about the regular files a directory listing just named (each file's pieces
    /// and size, in listing order, within a budget): a walk of a tree reads the files
    /// it lists, so the reader may bring what it holds of them on local disk into
    /// memory first. Called on the session thread, so it must not block. Default:
    /// nothing.
    fn listed(&self, _files: Vec<(Vec<FileChunk>, u64)>) {}

    /// Told about every read the workload makes, clamped to the file's size (for stats
    /// and `mount --record`). Called on the session thread in the order the kernel sent
    /// the reads, before any data is fetched, so it must not block. Default: nothing.
    fn observe_read(&self, _ino: u32, _offset: u64, _len: u64) {}

    /// Told when a read has been answered: how long the workload waited for `len` bytes
    /// of inode `ino` (fetching included). Called on the worker thread. Default: nothing.
    fn read_done(&self, _ino: u32, _len: u64, _waited: std::time::Duration) {}
}

/// How to mount an image.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The mount's source as `/proc/mounts` shows it, e.g. `tessera:<image ref>`: what
    /// people see in `mount` and `df`, and the name of the tracing span of the mount.
    /// (Stale mounts are found by the filesystem type, `fuse.tessera`.)
    pub fsname: String,
    /// Worker threads that serve reads: how many chunk fetches can be waited on at once.
    pub workers: usize,
    /// Let users other than the one mounting (root) use the mount, as containers need.
    pub allow_other: bool,
    /// Records each read's latency, queueing for a worker included.
    pub read_latency: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Open files whose data the reader has on local disk with FUSE passthrough (Linux
    /// ≥ 6.9): the kernel then reads the [`ChunkReader::backing_file`] itself, and
    /// those reads never reach the reader (nor [`ChunkReader::observe_read`]). Off on
    /// kernels without it, and for a session that takes over a connection.
    pub passthrough: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fsname: "tessera".into(),
            workers: 16,
            allow_other: false,
            read_latency: None,
            passthrough: false,
        }
    }
}

/// Counters of the operations one mount served, for metrics. Relaxed atomics: each is
/// exact on its own; a snapshot of several is not taken at one instant.
#[derive(Debug, Default)]
pub struct FsStats {
    /// Lookups, found or not (misses are then cached by the kernel).
    pub lookups: AtomicU64,
    pub getattrs: AtomicU64,
    /// `readdir` and `readdirplus` requests (one per buffer the kernel fills).
    pub readdirs: AtomicU64,
    /// `read` requests.
    pub reads: AtomicU64,
    /// Bytes returned by reads.
    pub read_bytes: AtomicU64,
    /// Operations answered with `EIO`: a chunk that could not be had, or a corrupt
    /// bootstrap record. (Expected errors — `ENOENT`, `ENODATA`, `EROFS` — do not count.)
    pub errors: AtomicU64,
    /// Opens answered with a backing file (FUSE passthrough): their reads never come
    /// here, so `reads` and `read_bytes` do not count them.
    pub passthrough_opens: AtomicU64,
}

impl FsStats {
    /// Each counter with the name it has in metrics (`tessera_agent_fuse_<name>`).
    pub fn snapshot(&self) -> [(&'static str, u64); 7] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("lookups", get(&self.lookups)),
            ("getattrs", get(&self.getattrs)),
            ("readdirs", get(&self.readdirs)),
            ("reads", get(&self.reads)),
            ("read_bytes", get(&self.read_bytes)),
            ("errors", get(&self.errors)),
            ("passthrough_opens", get(&self.passthrough_opens)),
        ]
    }

    pub(crate) fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The counters of several mounts added up, by name (see [`FsStats::snapshot`]).
pub fn sum_stats<S: Borrow<FsStats>>(
    stats: impl IntoIterator<Item = S>,
) -> Vec<(&'static str, u64)> {
    let mut total = FsStats::default().snapshot();
    for s in stats {
        for (sum, (_, value)) in total.iter_mut().zip(s.borrow().snapshot()) {
            sum.1 += value;
        }
    }
    total.to_vec()
}
