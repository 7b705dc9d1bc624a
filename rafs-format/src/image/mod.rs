//! Whole-image operations on an image dir (a directory holding `bootstrap` and `blobs/`):
//! verify every chunk, rebuild the tree on disk or as a tar, describe it.

mod check;
mod inspect;
mod unpack;

pub use check::{check, CheckReport};
pub use inspect::{inspect, EntryListing, ImageListing, ImageStats};
pub use unpack::{unpack_to_dir, unpack_to_tar, UnpackSummary};

use std::collections::HashSet;
use std::path::Path;

use crate::reader::{Bootstrap, FileKind, Inode};
use crate::Result;

/// Opens and fully validates an image dir's bootstrap.
pub fn open_validated(image_dir: &Path) -> Result<Bootstrap> {
    let b = Bootstrap::open(&image_dir.join("bootstrap"))?;
    b.validate_all()?;
    Ok(b)
}

/// Visits every directory entry depth-first (pre-order) in name order, with its path
/// (bytes, no leading `/`), its inode, and whether this entry is the first naming the
/// inode. Requires a validated bootstrap (which guarantees the walk ends).
pub(crate) fn walk(
    b: &Bootstrap,
    mut visit: impl FnMut(&[u8], &Inode, bool) -> Result<()>,
) -> Result<()> {
    let mut seen: HashSet<u32> = HashSet::new();
    let root = b.inode(crate::layout::ROOT_INO)?;
    // Each level: the directory, its path, and the index of its next entry.
    let mut stack: Vec<(Inode, Vec<u8>, u32)> = vec![(root, Vec::new(), 0)];
    while let Some((dir, path, next)) = stack.last_mut() {
        let Some(e) = b.dir_entry(dir, *next)? else {
            stack.pop();
            continue;
        };
        *next += 1;
        let inode = b.inode(e.ino)?;
        let mut p = path.clone();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(e.name);
        visit(&p, &inode, seen.insert(e.ino))?;
        if inode.kind == FileKind::Directory {
            stack.push((inode, p, 0));
        }
    }
    Ok(())
}
