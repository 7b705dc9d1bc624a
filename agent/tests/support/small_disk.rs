//! A small filesystem (tmpfs) to fill up: the cache disk of the full-disk tests.
//! Unmounted when dropped, even after a failed assertion.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct SmallDisk {
    pub path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB at `path` (created).
    pub fn mount(path: &Path, mib: u64) -> SmallDisk {
        std::fs::create_dir_all(path).expect("small disk mountpoint");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tessera-test"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}", path.display());
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    /// Writes the foreign file `name` until the disk has no byte left; returns its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let path = self.path.join(name);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("create the foreign file");
        for block in [1 << 20, 4096] {
            let buf = vec![0x5a_u8; block];
            loop {
                match file.write(&buf) {
                    Ok(n) if n == block => {}
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                    Err(e) => panic!("fill {}: {e}", path.display()),
                }
            }
        }
        assert_eq!(self.free_bytes(), 0, "{} is not full", self.path.display());
        path
    }

    /// Bytes still free (`df`'s available figure).
    pub fn free_bytes(&self) -> u64 {
        let stat = rustix::fs::statvfs(&self.path).expect("statvfs");
        stat.f_bavail * stat.f_frsize
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
