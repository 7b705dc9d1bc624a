//! Mounts a crashed agent left behind: their FUSE connection is gone, so any access
//! fails with "transport endpoint is not connected" until they are unmounted. They
//! are found in this process's mount table by their filesystem type, `fuse.tessera`,
//! and their source, `tessera@<owner>:<image>`, where the owner names the agent by its
//! cache directory: an agent clears its own predecessor's mounts, never those of
//! another agent on the same machine (tests run several).

use std::path::{Path, PathBuf};

use crate::fs::mount_table::{self, MountEntry};

/// The filesystem type our mounts have (`fuse.` + the subtype we mount with).
pub const FS_TYPE: &str = "fuse.tessera";

/// The mount source of an agent's mounts: `tessera@<owner>:` + the image.
pub fn source_prefix(owner: &str) -> String {
    format!("tessera@{owner}:")
}

/// Names an agent by its cache directory (a short hash: mount sources are visible to
/// every user and need not spell out paths).
pub fn owner_of(cache_dir: &Path) -> String {
    use sha2::Digest;
    let canonical = std::fs::canonicalize(cache_dir).unwrap_or_else(|_| cache_dir.to_path_buf());
    let hash = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    hex::encode(&hash[..6])
}

/// Unmounts (lazily, so a process still inside does not block it) every mount of
/// `owner` in the mount table; returns each path with how it went. Called before the
/// agent mounts anything, so every such mount is a stale one.
pub fn clear_stale_mounts(
    owner: &str,
    keep_under: Option<&Path>,
) -> Vec<(PathBuf, Result<(), String>)> {
    let Ok(table) = mount_table::read() else {
        return Vec::new();
    };
    tessera_mounts(&table, &source_prefix(owner))
        .into_iter()
        // The snapshotter's mounts may be alive (the FUSE keeper holds them): it
        // takes them over or clears them itself.
        .filter(|path| keep_under.is_none_or(|k| !path.starts_with(k)))
        .map(|path| {
            let outcome = mount_table::lazy_unmount(&path).map_err(|e| e.to_string());
            (path, outcome)
        })
        .collect()
}

/// Mount points of Tessera filesystems whose source starts with `prefix`, in mount-table
/// `entries`.
fn tessera_mounts(entries: &[MountEntry], prefix: &str) -> Vec<PathBuf> {
    entries
        .iter()
        .filter(|m| m.fs_type == FS_TYPE && m.source.starts_with(prefix))
        .map(|m| m.mountpoint.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_tessera_mounts_only() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /mnt/img\\040one rw,nosuid,nodev,relatime shared:60 - fuse.tessera tessera@abc:r/a:v1 ro,user_id=0,group_id=0
91 22 0:51 / /mnt/other rw,relatime - fuse.sshfs host: rw
92 22 0:52 / /mnt/theirs rw,relatime - fuse.tessera tessera@def:r/a:v1 ro
";
        assert_eq!(
            tessera_mounts(&mount_table::parse(table), &source_prefix("abc")),
            [PathBuf::from("/mnt/img one")]
        );
    }
}
