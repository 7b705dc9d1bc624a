//! Inode records as FUSE attributes, and how long the kernel may trust them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType};
use rafs_format::reader::{Bootstrap, FileKind, Inode};

/// How long the kernel may cache entries (positive and negative) and attributes. The
/// image never changes, so this only bounds how long a dentry pins memory once unused;
/// the kernel drops cached entries under memory pressure regardless.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// `st_blksize`: the largest read the kernel sends (32 pages without `FUSE_MAX_PAGES`),
/// so `cp` and friends read in as few requests as possible.
pub const PREFERRED_IO_SIZE: u32 = 128 * 1024;

/// `st_blocks` counts 512-byte units whatever the block size.
const BLOCK_UNIT: u64 = 512;

/// The FUSE attributes of `inode`. Version 1 stores only the mtime, so atime and ctime
/// are the mtime too (format.md §6.1).
pub fn attr(bootstrap: &Bootstrap, inode: &Inode) -> FileAttr {
    let mtime = timestamp(inode.mtime_sec, inode.mtime_nsec);
    FileAttr {
        ino: inode.ino.into(),
        size: inode.size,
        blocks: stored_bytes(bootstrap, inode).div_ceil(BLOCK_UNIT),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: file_type(inode.kind),
        // At most 0o7777: the reader rejects other bits.
        perm: inode.perm as u16,
        nlink: inode.nlink,
        uid: inode.uid,
        gid: inode.gid,
        rdev: encode_dev(inode.rdev_major, inode.rdev_minor),
        blksize: PREFERRED_IO_SIZE,
        flags: 0,
    }
}

/// The attributes of a negative entry: inode 0 tells the kernel "no such name" and lets
/// it cache that for the entry TTL, which spares us the lookups a `PATH` search or a
/// Python import makes for names that are not there. Only `ino` is read.
pub fn negative_entry() -> FileAttr {
    FileAttr {
        ino: 0,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PREFERRED_IO_SIZE,
        flags: 0,
    }
}

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Directory => FileType::Directory,
        FileKind::Regular => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// Bytes the file really stores: its size less its holes, so `du` and `cp --sparse`
/// see sparse files as sparse. Falls back to the size if the piece list is corrupt;
/// reading the file then fails with EIO, where the corruption is reported.
fn stored_bytes(bootstrap: &Bootstrap, inode: &Inode) -> u64 {
    if inode.kind != FileKind::Regular {
        return inode.size;
    }
    match bootstrap.file_chunks(inode) {
        Ok(pieces) => pieces
            .iter()
            .filter(|p| p.chunk.is_some())
            .map(|p| u64::from(p.len))
            .sum(),
        Err(_) => inode.size,
    }
}

/// Linux's `new_encode_dev`, the 32-bit form FUSE carries `rdev` in: 12 bits of major,
/// 20 of minor. Larger numbers (which Linux itself cannot create) are truncated.
pub fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The `SystemTime` that `fuser` turns into exactly `(sec, nsec)` on the wire.
///
/// `fuser` 0.16 converts a time before the epoch to `(-whole_secs, subsec_nanos)` of its
/// distance from the epoch, which is off by one second whenever there are nanoseconds
/// (1.5 s before the epoch becomes -1 s + 0.5 s). So for negative seconds we hand it a
/// time `|sec|` seconds and `nsec` nanoseconds before the epoch, which it encodes as the
/// `(sec, nsec)` the image recorded. Times a `SystemTime` cannot hold become the epoch.
pub fn timestamp(sec: i64, nsec: u32) -> SystemTime {
    let t = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(sec.unsigned_abs(), nsec))
    } else {
        UNIX_EPOCH.checked_sub(Duration::new(sec.unsigned_abs(), nsec))
    };
    t.unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_devices_as_linux_does() {
        // makedev(1, 3) = /dev/null; makedev(259, 0x12345) = a large minor.
        assert_eq!(encode_dev(1, 3), 0x103);
        assert_eq!(encode_dev(259, 0x12345), 0x45 | (259 << 8) | (0x123 << 20));
        assert_eq!(encode_dev(0xfff, 0xfffff), u32::MAX);
    }

    #[test]
    fn timestamps_survive_fusers_encoding() {
        // What fuser does (reply.rs `time_from_system_time`).
        let wire = |t: SystemTime| match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => (
                -(e.duration().as_secs() as i64),
                e.duration().subsec_nanos(),
            ),
        };
        for (sec, nsec) in [
            (0, 0),
            (1_700_000_000, 999_999_999),
            (-2, 500_000_000),
            (-1, 0),
        ] {
            assert_eq!(wire(timestamp(sec, nsec)), (sec, nsec));
        }
    }
}
