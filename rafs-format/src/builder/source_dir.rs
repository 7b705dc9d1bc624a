//! Building from a directory on the local filesystem (`tessera build --dir`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{self, File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::store::ChunkStore;
use super::tree::{Child, Meta, Node, NodeData, NodeId, Tree, ROOT};
use super::writer;
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

/// Files opened ahead of the one being read, with the kernel told to read them
/// (`POSIX_FADV_WILLNEED`): on a cold page cache the disk works while the build hashes
/// and compresses. Bounded in files (descriptors) and bytes (page cache).
const READ_AHEAD_FILES: usize = 64;
const READ_AHEAD_BYTES: u64 = 64 << 20;

/// A regular file found by the walk, read once the whole tree is known.
struct FileToRead {
    path: PathBuf,
    /// From the walk's stat: what read-ahead counts.
    size: u64,
}

/// Reads the tree under `root` into `tree`, then file data into `store` in the order
/// the blob will hold it ([`writer::reading_order`]: `prefetch` first, then inode
/// order), so chunks arrive in blob order and the spool is kept as the blob.
pub(crate) fn add_dir(
    tree: &mut Tree,
    store: &mut ChunkStore,
    root: &Path,
    prefetch: &[String],
) -> Result<()> {
    let mut found = HashMap::new();
    walk(tree, root, &mut found)?;
    // Files of an earlier source that this tree replaced are not in `found`.
    let order: Vec<(NodeId, FileToRead)> = writer::reading_order(tree, prefetch)
        .into_iter()
        .filter_map(|n| Some((n, found.remove(&n)?)))
        .collect();
    // order[done..hinted] are open, their reads asked of the kernel.
    let mut open: VecDeque<File> = VecDeque::new();
    let (mut hinted, mut hinted_bytes) = (0usize, 0u64);
    for (done, (node, file)) in order.iter().enumerate() {
        while hinted < order.len()
            && (hinted == done
                || (hinted - done < READ_AHEAD_FILES && hinted_bytes < READ_AHEAD_BYTES))
        {
            let next = &order[hinted].1;
            let f = File::open(&next.path).map_err(|e| Error::io("open", &next.path, e))?;
            // Only a hint: where the kernel declines, the read below still works.
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::WillNeed);
            open.push_back(f);
            hinted_bytes += next.size;
            hinted += 1;
        }
        let Some(f) = open.pop_front() else {
            return Err(Error::io(
                "open",
                &file.path,
                std::io::Error::other("read-ahead lost its place"),
            ));
        };
        hinted_bytes -= file.size;
        let (size, pieces) = store
            .add_file(f, None)
            .map_err(|e| Error::io("read", &file.path, e))?;
        tree.node_mut(*node).data = NodeData::File { size, pieces };
    }
    Ok(())
}

/// Walks the tree under `root` into `tree` (metadata only), collecting its regular
/// files in `found`.
fn walk(tree: &mut Tree, root: &Path, found: &mut HashMap<NodeId, FileToRead>) -> Result<()> {
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
                    let n = add_entry(tree, &path, &md)?;
                    if md.is_file() {
                        let size = md.len();
                        found.insert(
                            n,
                            FileToRead {
                                path: path.clone(),
                                size,
                            },
                        );
                    }
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

/// Adds the node of one entry; a regular file's data is read later (size 0 until then).
fn add_entry(tree: &mut Tree, path: &Path, md: &Metadata) -> Result<NodeId> {
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
        NodeData::File {
            size: 0,
            pieces: 0..0,
        }
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
