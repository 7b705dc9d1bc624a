//! Building from a directory on the local filesystem (`tessera build --dir`).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::store::ChunkStore;
use super::tree::{Child, Meta, Node, NodeData, NodeId, Tree, ROOT};
use crate::reader::FileKind;
use crate::{Error, Result};

/// Metadata of a path, without following symlinks.
fn meta_of(path: &Path, md: &Metadata) -> Result<Meta> {
    let mut xattrs = BTreeMap::new();
    let names = xattr::list(path).map_err(|e| Error::io("list xattrs of", path, e))?;
    for name in names {
        if let Some(value) =
            xattr::get(path, &name).map_err(|e| Error::io("read xattr of", path, e))?
        {
            xattrs.insert(name.as_bytes().to_vec(), value);
        }
    }
    Ok(Meta {
        perm: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        mtime_sec: md.mtime(),
        mtime_nsec: md.mtime_nsec() as u32,
        xattrs,
    })
}

/// Reads the tree under `root` into `tree`, file data into `store`.
pub(crate) fn add_dir(tree: &mut Tree, store: &mut ChunkStore, root: &Path) -> Result<()> {
    let md = fs::symlink_metadata(root).map_err(|e| Error::io("stat", root, e))?;
    if !md.is_dir() {
        return Err(Error::io(
            "read directory",
            root,
            std::io::Error::from(std::io::ErrorKind::NotADirectory),
        ));
    }
    tree.node_mut(ROOT).meta = meta_of(root, &md)?;
    // (device, inode) of files with several links, so each inode is read once.
    let mut seen: HashMap<(u64, u64), NodeId> = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), ROOT)];
    while let Some((dir, dir_node)) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| Error::io("read directory", &dir, e))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io("read directory", &dir, e))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let md = fs::symlink_metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
            let key = (md.dev(), md.ino());
            let node = match seen.get(&key) {
                Some(&n) if !md.is_dir() => n,
                _ => {
                    let n = add_entry(tree, store, &path, &md)?;
                    if md.nlink() > 1 && !md.is_dir() {
                        seen.insert(key, n);
                    }
                    if md.is_dir() {
                        stack.push((path.clone(), n));
                    }
                    n
                }
            };
            let name = entry.file_name().as_bytes().to_vec();
            if let Some(children) = tree.children_mut(dir_node) {
                children.insert(name, Child { node, layer: 0 });
            }
        }
    }
    Ok(())
}

fn add_entry(
    tree: &mut Tree,
    store: &mut ChunkStore,
    path: &Path,
    md: &Metadata,
) -> Result<NodeId> {
    let meta = meta_of(path, md)?;
    meta.validate().map_err(|why| Error::InvalidInput {
        path: path.to_path_buf(),
        reason: why,
    })?;
    let ft = md.file_type();
    let rdev = md.rdev();
    let special = |kind| NodeData::Special {
        kind,
        major: rustix::fs::major(rdev),
        minor: rustix::fs::minor(rdev),
    };
    let data = if ft.is_dir() {
        NodeData::Dir(BTreeMap::new())
    } else if ft.is_file() {
        let f = File::open(path).map_err(|e| Error::io("open", path, e))?;
        let (size, pieces) = store
            .add_file(f, None)
            .map_err(|e| Error::io("read", path, e))?;
        NodeData::File { size, pieces }
    } else if ft.is_symlink() {
        let target = fs::read_link(path).map_err(|e| Error::io("read symlink", path, e))?;
        NodeData::Symlink(target.as_os_str().as_bytes().to_vec())
    } else if ft.is_char_device() {
        special(FileKind::CharDevice)
    } else if ft.is_block_device() {
        special(FileKind::BlockDevice)
    } else if ft.is_fifo() {
        NodeData::Special {
            kind: FileKind::Fifo,
            major: 0,
            minor: 0,
        }
    } else {
        NodeData::Special {
            kind: FileKind::Socket,
            major: 0,
            minor: 0,
        }
    };
    Ok(tree.add_node(Node { meta, data }))
}
