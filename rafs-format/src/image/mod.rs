//! Whole-image operations on an image dir (a directory holding `bootstrap` and `blobs/`):
//! verify every chunk, rebuild the tree on disk or as a tar, describe it.

mod check;
mod inspect;
mod unpack;

pub use check::{check, check_image, CheckReport};
pub use inspect::{inspect, inspect_bootstrap, EntryListing, ImageListing, ImageStats};
pub use unpack::{
    unpack_image_to_dir, unpack_image_to_tar, unpack_to_dir, unpack_to_tar, UnpackSummary,
};

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

/// Calls `visit` with every directory entry's path (bytes, no leading `/`), its inode,
/// and whether this entry is the first naming the inode, depth-first in name order.
/// The bootstrap must have been validated (`validate_all`).
pub fn for_each_entry(b: &Bootstrap, mut visit: impl FnMut(&[u8], &Inode, bool)) -> Result<()> {
    walk(b, |path, inode, first| {
        visit(path, inode, first);
        Ok(())
    })
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
    // One path buffer, cut back to a directory's own path before each of its entries.
    let mut path: Vec<u8> = Vec::new();
    // Each level: the directory, the length of its path, and its next entry's index.
    let mut stack: Vec<(Inode, usize, u32)> = vec![(root, 0, 0)];
    while let Some((dir, dir_len, next)) = stack.last_mut() {
        let Some(e) = b.dir_entry(dir, *next)? else {
            stack.pop();
            continue;
        };
        *next += 1;
        path.truncate(*dir_len);
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(e.name);
        let inode = b.inode(e.ino)?;
        visit(&path, &inode, seen.insert(e.ino))?;
        if inode.kind == FileKind::Directory {
            stack.push((inode, path.len(), 0));
        }
    }
    Ok(())
}
