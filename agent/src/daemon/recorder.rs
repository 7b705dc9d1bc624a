//! `mount --record`: the paths of the files a workload reads, in first-read order,
//! written as they are read — a prefetch list for `tessera convert --prefetch-list`.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use rafs_format::reader::{Bootstrap, FileKind};

use crate::{Error, Result};

/// Writes the path of each regular file the workload reads, once, in first-read order:
/// a prefetch list for `tessera convert --prefetch-list`.
#[derive(Debug)]
pub struct Recorder {
    /// Path (from the root, with a leading `/`) of each regular file, by inode.
    paths: HashMap<u32, Vec<u8>>,
    /// The inodes recorded already, and the file they were written to.
    seen: Mutex<(HashSet<u32>, std::fs::File)>,
}

impl Recorder {
    pub(super) fn new(bootstrap: &Bootstrap, out: &Path) -> Result<Self> {
        let mut paths = HashMap::new();
        rafs_format::image::for_each_entry(bootstrap, |path, inode, first| {
            if first && inode.kind == FileKind::Regular {
                let mut p = Vec::with_capacity(path.len() + 1);
                p.push(b'/');
                p.extend_from_slice(path);
                paths.insert(inode.ino, p);
            }
        })?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| Error::io("open record file", out, e))?;
        Ok(Recorder {
            paths,
            seen: Mutex::new((HashSet::new(), file)),
        })
    }

    pub(super) fn saw(&self, ino: u32) {
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, file) = &mut *guard;
        if !seen.insert(ino) {
            return;
        }
        if let Some(path) = self.paths.get(&ino) {
            let mut line = path.clone();
            line.push(b'\n');
            if let Err(e) = file.write_all(&line) {
                tracing::warn!(error = %e, "could not record a read");
            }
        }
    }
}
