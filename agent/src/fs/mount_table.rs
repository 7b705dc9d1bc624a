//! The mount table (`/proc/self/mountinfo`) and the lazy unmount: the one parser and
//! the one `fusermount3 -u -z` every part of the agent uses to ask "is it mounted?"
//! (a stat of a FUSE mount whose server is away would wait for it) and to get a busy
//! or dead mount out of the way.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// One line of the mount table, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub device: String,
    pub mountpoint: PathBuf,
    /// `fuse.tessera`, `ext4`, …
    pub fs_type: String,
    /// The mount's source (for our mounts, `tessera@<owner>:<image>`).
    pub source: String,
}

/// This process's mount table.
pub fn read() -> io::Result<Vec<MountEntry>> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|text| parse(&text))
}

/// The entries of a `/proc/*/mountinfo` text; lines that do not parse are skipped.
pub fn parse(mountinfo: &str) -> Vec<MountEntry> {
    mountinfo.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
    let (left, right) = line.split_once(" - ")?;
    let mut left = left.split(' ');
    let device = left.nth(2)?;
    let mountpoint = left.nth(1)?;
    let mut right = right.split(' ');
    let fs_type = right.next()?;
    let source = right.next()?;
    Some(MountEntry {
        device: device.to_string(),
        mountpoint: PathBuf::from(OsString::from_vec(unescape(mountpoint))),
        fs_type: unescape_lossy(fs_type),
        source: unescape_lossy(source),
    })
}

/// `major:minor` of a 64-bit `dev_t` as the mount table writes it (glibc's `major` and
/// `minor`).
pub fn device_of(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// Whether a FUSE filesystem is mounted at `path`, by the mount table.
pub fn fuse_mounted_at(path: &Path) -> bool {
    read()
        .unwrap_or_default()
        .iter()
        .any(|m| m.mountpoint == path && m.fs_type.starts_with("fuse"))
}

/// The mount table writes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match octal {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn unescape_lossy(field: &str) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

/// Detaches a mount (`fusermount3 -u -z`): gone from the namespace now, alive for the
/// processes still using it; a mount whose server is gone stops failing their
/// accesses with "transport endpoint is not connected" for everyone else.
pub fn lazy_unmount(mountpoint: &Path) -> Result<()> {
    let out = Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .output()
        .map_err(|e| {
            Error::io(
                "run fusermount3 -u -z (apt-get install fuse3) for",
                mountpoint,
                e,
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::io(
        "unmount (fusermount3 -u -z)",
        mountpoint,
        io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escaped_fields() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /mnt/img\\040one rw,nosuid,nodev,relatime shared:60 - fuse.tessera tessera@abc:r/a:v1 ro,user_id=0
no separator here
";
        let entries = parse(table);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[1],
            MountEntry {
                device: "0:50".into(),
                mountpoint: PathBuf::from("/mnt/img one"),
                fs_type: "fuse.tessera".into(),
                source: "tessera@abc:r/a:v1".into(),
            }
        );
        assert_eq!(entries[0].mountpoint, PathBuf::from("/"));
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\040b\\134c"), b"a b\\c");
        assert_eq!(unescape("a\\x"), b"a\\x");
        assert_eq!(unescape("end\\04"), b"end\\04");
    }

    #[test]
    fn devices_print_as_the_table_does() {
        assert_eq!(device_of(0x0803), "8:3");
        assert_eq!(device_of(61), "0:61");
    }
}
