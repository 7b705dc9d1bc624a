//! `tessera snapshotter clean`: what a stopped agent's snapshotter leaves on a node,
//! removed. The snapshotter's mounts outlive the agent on purpose (the FUSE keeper
//! holds them for the next agent), so stopping the agent is not enough to uninstall:
//! this detaches the image mounts (lazily: `umount` on a FUSE mount whose server is
//! gone can hang), lets the keeper exit once it holds nothing, and with `remove`
//! deletes the snapshotter's root, unless a container still runs on one of its layers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fs::mount_table::{self, lazy_unmount};
use crate::{Error, Result};

/// How long the keeper is given to notice it holds nothing and exit (it looks every
/// 2 s).
const KEEPER_EXIT_WAIT: Duration = Duration::from_secs(8);

/// What [`clean`] did.
#[derive(Debug, Default, Serialize)]
pub struct Cleaned {
    /// Image mounts detached.
    pub unmounted: Vec<PathBuf>,
    /// Other mounts under the root: containers' overlays, still running.
    pub in_use: Vec<PathBuf>,
    /// Whether a FUSE keeper was listening under the root and is gone now.
    pub keeper_stopped: bool,
    /// A keeper that stays (`--stay`: a container of its own) holds nothing now but
    /// runs on.
    pub keeper_stays: bool,
    /// The root was deleted.
    pub removed: bool,
}

/// Cleans the snapshotter root `root` of a stopped agent; `serving` is the
/// snapshotter's socket, which must not answer (an agent serving it would be cut off
/// from its own mounts).
pub fn clean(root: &Path, serving: &Path, remove: bool) -> Result<Cleaned> {
    if std::os::unix::net::UnixStream::connect(serving).is_ok() {
        return Err(Error::Service {
            service: "snapshotter".into(),
            reason: format!(
                "an agent still serves it on {}: stop the agent first (its mounts are then left to the FUSE keeper, which this removes)",
                serving.display()
            ),
        });
    }
    let root = root
        .canonicalize()
        .map_err(|e| Error::io("find the snapshotter root", root, e))?;
    let mut cleaned = Cleaned::default();
    let mounts = mount_table::read().map_err(|e| Error::io("read", "/proc/self/mountinfo", e))?;
    // Deepest first: a mount inside another goes before it.
    let mut under: Vec<_> = mounts
        .into_iter()
        .filter(|m| m.mountpoint.starts_with(&root))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.mountpoint.components().count()));
    for m in under {
        if m.fs_type.starts_with("fuse") {
            lazy_unmount(&m.mountpoint)?;
            cleaned.unmounted.push(m.mountpoint);
        } else {
            cleaned.in_use.push(m.mountpoint);
        }
    }
    let keeper = root.join("fuse-keeper.sock");
    if keeper.exists() {
        let deadline = Instant::now() + KEEPER_EXIT_WAIT;
        while keeper.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        cleaned.keeper_stopped = !keeper.exists();
        cleaned.keeper_stays = keeper.exists();
    }
    if remove {
        if !cleaned.in_use.is_empty() {
            return Err(Error::Service {
                service: "snapshotter".into(),
                reason: format!(
                    "containers still run on its layers ({} mounts under {}, e.g. {}): stop them (crictl stop / ctr task kill) and run this again",
                    cleaned.in_use.len(),
                    root.display(),
                    cleaned.in_use[0].display()
                ),
            });
        }
        std::fs::remove_dir_all(&root).map_err(|e| Error::io("remove", &root, e))?;
        cleaned.removed = true;
    }
    Ok(cleaned)
}
