//! Mounting and unmounting: the mount point, the session thread, a clean unmount.
//!
//! `fuser` mounts (with `mount(2)` as root, through `fusermount3` otherwise) and gives
//! us the session loop, which we run on a thread of our own so that unmounting can
//! tell a clean end from a busy mount. An unmount first tries the ordinary way; if a
//! process still has a file open or its working directory inside, it detaches the
//! mount lazily instead (`fusermount3 -u -z`): the mount point is at once an ordinary
//! directory again, and the session keeps serving those processes until they let go.
//! Either way no "transport endpoint is not connected" mount is left behind.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{MountOption, Session, SessionUnmounter};
use rafs_format::reader::Bootstrap;

use super::filesystem::ImageFs;
use super::mount_table::{self, MountEntry};
use super::pool::Pool;
use super::{ChunkReader, FsStats, MountOptions};
use crate::{Error, Result};

/// The filesystem subtype: mounts show as type `fuse.tessera`, which is how the agent
/// finds stale ones after a crash.
const SUBTYPE: &str = "tessera";

/// How long an unmount waits for the session thread once the kernel has let go of the
/// mount. It ends as soon as its next read of `/dev/fuse` fails, so this is only a
/// bound against hanging forever on something unforeseen.
const SESSION_END_WAIT: Duration = Duration::from_secs(10);

/// A mounted image; unmounted when dropped, or by [`Mounted::unmount`].
#[derive(Debug)]
pub struct Mounted {
    /// Canonical path of the mount point.
    mountpoint: PathBuf,
    /// Device number of the mounted filesystem: tells our mount from anything mounted
    /// at the same place before or after it.
    dev: u64,
    /// How to unmount; `None` once unmounted or left mounted.
    unmounter: Option<Unmounter>,
    session: Option<JoinHandle<io::Result<()>>>,
    /// Sent to when the session thread has finished (the filesystem is dropped).
    ended: Receiver<()>,
    /// A copy of the FUSE connection (`/dev/fuse`), for [`handover`](super::handover).
    connection: Option<OwnedFd>,
    stats: Arc<FsStats>,
    span: tracing::Span,
}

/// How the process serving a mount unmounts it.
#[derive(Debug)]
enum Unmounter {
    /// `fuser` mounted it ([`mount`]): its unmounter.
    Fuser(SessionUnmounter),
    /// Served on a connection another process mounted ([`attach`]): `fuser` has no
    /// unmount of its own for it, so umount(2).
    Syscall,
}

/// Mounts `bootstrap` read-only at `mountpoint`, an existing empty directory, serving
/// file data from `reader`. Returns once the filesystem answers.
pub fn mount(
    bootstrap: Arc<Bootstrap>,
    reader: Arc<dyn ChunkReader>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mounted> {
    let mountpoint = check_mountpoint(mountpoint)?;
    let underneath = std::fs::metadata(&mountpoint)
        .map_err(|e| Error::io("mount on", &mountpoint, e))?
        .dev();
    let (fs, stats, span) = image_fs(bootstrap, reader, &mountpoint, opts)?;
    let session = Session::new(fs, &mountpoint, &mount_options(opts))
        .map_err(|e| Error::io("mount FUSE filesystem at", &mountpoint, e))?;
    let connection = session
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("copy the FUSE connection of", &mountpoint, e))?;
    let mut mounted = run_session(session, mountpoint, stats, span)?;
    mounted.connection = Some(connection);
    // Served by the session thread: when it answers, the filesystem is up. (On an
    // error, dropping `mounted` unmounts.)
    match std::fs::metadata(&mounted.mountpoint) {
        Ok(meta) if meta.dev() != underneath => mounted.dev = meta.dev(),
        Ok(_) => {
            let why = io::Error::other("the FUSE session ended at once (see the log)");
            return Err(Error::io(
                "mount FUSE filesystem at",
                &mounted.mountpoint,
                why,
            ));
        }
        Err(e) => return Err(Error::io("stat new mount", &mounted.mountpoint, e)),
    }
    let (path, workers) = (mounted.mountpoint.display(), opts.workers);
    mounted
        .span
        .in_scope(|| tracing::info!(mountpoint = %path, workers, "mounted"));
    Ok(mounted)
}

/// The filesystem of a mount with its statistics, read workers and tracing span.
fn image_fs(
    bootstrap: Arc<Bootstrap>,
    reader: Arc<dyn ChunkReader>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<(ImageFs, Arc<FsStats>, tracing::Span)> {
    let span = tracing::info_span!("mount", fsname = %opts.fsname);
    let stats = Arc::new(FsStats::default());
    let pool = Pool::new(opts.workers, &span)
        .map_err(|e| Error::io("start read workers for", mountpoint, e))?;
    let fs = ImageFs::new(
        bootstrap,
        reader,
        stats.clone(),
        pool,
        opts.workers,
        opts.read_latency.clone(),
        opts.passthrough,
    );
    Ok((fs, stats, span))
}

/// Serves `bootstrap` on `connection`, the FUSE connection of a mount already at
/// `mountpoint` that an earlier process served (see [`handover`](super::handover)).
/// `mountpoint` must be canonical: it is not looked at (a stat would wait for a
/// server until this one runs).
pub fn attach(
    bootstrap: Arc<Bootstrap>,
    reader: Arc<dyn ChunkReader>,
    mountpoint: &Path,
    connection: OwnedFd,
    opts: &MountOptions,
) -> Result<Mounted> {
    let (fs, stats, span) = image_fs(bootstrap, reader, mountpoint, opts)?;
    let copy = connection
        .try_clone()
        .map_err(|e| Error::io("copy the FUSE connection of", mountpoint, e))?;
    let relayed = super::handover::relay(connection)
        .map_err(|e| Error::io("take over the FUSE connection of", mountpoint, e))?;
    let session = Session::from_fd(fs, relayed, fuser::SessionACL::All);
    let mut mounted = run_session(session, mountpoint.to_path_buf(), stats, span)?;
    mounted.connection = Some(copy);
    mounted.unmounter = Some(Unmounter::Syscall);
    match std::fs::metadata(mountpoint) {
        Ok(meta) => mounted.dev = meta.dev(),
        Err(e) => return Err(Error::io("stat taken-over mount", mountpoint, e)),
    }
    mounted
        .span
        .in_scope(|| tracing::info!(mountpoint = %mountpoint.display(), "took over the mount"));
    Ok(mounted)
}

/// Runs the session loop on a thread of its own, inside the mount's span.
fn run_session(
    mut session: Session<ImageFs>,
    mountpoint: PathBuf,
    stats: Arc<FsStats>,
    span: tracing::Span,
) -> Result<Mounted> {
    let unmounter = session.unmount_callable();
    let (ended_tx, ended) = mpsc::channel();
    let session_span = span.clone();
    // If spawning fails, the closure and the session in it are dropped: that unmounts.
    let thread = std::thread::Builder::new()
        .name("tessera-fuse".into())
        .spawn(move || {
            let _entered = session_span.enter();
            let result = session.run();
            if let Err(e) = &result {
                tracing::error!(error = %e, "FUSE session failed");
            }
            // Dropping the session unmounts (if still mounted) and stops the workers.
            drop(session);
            let _ = ended_tx.send(());
            result
        })
        .map_err(|e| Error::io("start FUSE session thread for", &mountpoint, e))?;
    Ok(Mounted {
        mountpoint,
        dev: 0,
        unmounter: Some(Unmounter::Fuser(unmounter)),
        session: Some(thread),
        ended,
        connection: None,
        stats,
        span,
    })
}

/// The `fuser` options of a mount, and why:
fn mount_options(opts: &MountOptions) -> Vec<MountOption> {
    let mut options = vec![
        // An image is immutable: the kernel refuses every write with EROFS itself.
        MountOption::RO,
        MountOption::FSName(opts.fsname.clone()),
        // `MountOption::Subtype` only reaches fusermount3; as root fuser calls mount(2)
        // with type "fuse", so the subtype goes to the kernel as a mount parameter.
        MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
        // The kernel checks modes and owners, as on any filesystem, so the image's
        // permissions mean what they say (and `access` never reaches us).
        MountOption::DefaultPermissions,
        // Nothing could record an access time.
        MountOption::NoAtime,
        // fuser's defaults stay: nodev and nosuid, as for any image content the node
        // does not vouch for; a container runtime's own mounts on top decide for it.
    ];
    if opts.allow_other {
        options.push(MountOption::AllowOther);
    }
    options
}

/// The canonical path of `path` if it is an existing, empty directory.
fn check_mountpoint(path: &Path) -> Result<PathBuf> {
    let canonical = path
        .canonicalize()
        .map_err(|e| Error::io("mount on", path, e))?;
    let mut entries = std::fs::read_dir(&canonical).map_err(|e| Error::io("mount on", path, e))?;
    if entries.next().is_some() {
        return Err(Error::io(
            "mount on",
            path,
            io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                "the mount point is not an empty directory",
            ),
        ));
    }
    Ok(canonical)
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The mount's operation counters.
    pub fn stats(&self) -> Arc<FsStats> {
        self.stats.clone()
    }

    /// Unmounts, lazily if the mount is busy (see the module documentation). Errors
    /// only if the mount could not be removed at all.
    pub fn unmount(mut self) -> Result<()> {
        self.shutdown()
    }

    /// The copy of the FUSE connection taken at mount (once).
    pub fn take_connection(&mut self) -> Option<OwnedFd> {
        self.connection.take()
    }

    /// Leaves the filesystem mounted as this process ends: another process holds the
    /// connection and the next agent serves it ([`handover`](super::handover)).
    pub fn leave_mounted(mut self) {
        self.unmounter = None;
        self.session = None;
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(unmounter) = self.unmounter.take() else {
            return Ok(());
        };
        let span = self.span.clone();
        let _entered = span.enter();
        // umount(2), unless the session already ended; fuser only logs a failure.
        match unmounter {
            Unmounter::Syscall => {
                let _ =
                    rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::empty());
            }
            Unmounter::Fuser(mut unmounter) => {
                let _ = unmounter.unmount();
            }
        }
        if self.still_mounted() {
            mount_table::lazy_unmount(&self.mountpoint)?;
            // The session lives on for the processes inside; its thread ends with them.
            self.session = None;
            tracing::warn!(
                mountpoint = %self.mountpoint.display(),
                "mount busy: detached it; it serves open files until they are closed"
            );
            return Ok(());
        }
        match self.ended.recv_timeout(SESSION_END_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.session.take() {
                    match thread.join() {
                        Ok(_) => {} // a session error was logged by the thread
                        Err(_) => tracing::error!("the FUSE session thread panicked"),
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                self.session = None;
                tracing::warn!("the FUSE session did not end after unmount; left it running");
            }
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "unmounted");
        Ok(())
    }

    /// Whether our filesystem is still mounted at the mount point (this process's view).
    fn still_mounted(&self) -> bool {
        match mount_table::read() {
            Ok(table) => mounted_in(&table, self.dev, &self.mountpoint),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read /proc/self/mountinfo; assuming unmounted");
                false
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "unmount failed");
        }
    }
}

/// Whether mount-table `entries` have a mount of device `dev` at `mountpoint`.
fn mounted_in(entries: &[MountEntry], dev: u64, mountpoint: &Path) -> bool {
    let device = mount_table::device_of(dev);
    entries
        .iter()
        .any(|m| m.device == device && m.mountpoint == mountpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_mount_by_device_and_escaped_path() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
97 22 0:61 / /tmp/a\\040b ro,nosuid,nodev,noatime - fuse.tessera tessera:img ro
";
        let table = mount_table::parse(table);
        let dev = 61; // makedev(0, 61)
        assert!(mounted_in(&table, dev, Path::new("/tmp/a b")));
        assert!(!mounted_in(&table, dev, Path::new("/tmp/a")));
        assert!(!mounted_in(&table, dev + 1, Path::new("/tmp/a b")));
    }
}
