//! Building from a directory on the local filesystem (`tessera build --dir`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{self, File, Metadata};
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;

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
const READ_AHEAD_FILES: usize = 256;
const READ_AHEAD_BYTES: u64 = 128 << 20;

/// A regular file found by the walk, read once the whole tree is known.
struct FileToRead {
    path: PathBuf,
    /// From the walk's stat: what read-ahead counts.
    size: u64,
}

/// Files the walk may run ahead of the reads (metadata only, so cheap to hold).
const WALK_AHEAD_FILES: usize = 4096;

/// Reads the tree under `root` into `tree` and its file data into `store`, in the order
/// the blob will hold it ([`writer::reading_order`]: `prefetch` first, then inode
/// order), so chunks arrive in blob order and the spool is kept as the blob. Without a
/// prefetch list the walk (in inode order) runs on its own thread, files read as it
/// finds them; with one, the whole tree is walked first.
pub(crate) fn add_dir(
    tree: &mut Tree,
    store: &mut ChunkStore,
    root: &Path,
    prefetch: &[String],
) -> Result<()> {
    let read = if prefetch.is_empty() {
        let walk_tree = &mut *tree;
        std::thread::scope(|scope| {
            let (found, files) = sync_channel(WALK_AHEAD_FILES);
            let walker = std::thread::Builder::new()
                .name("build-walk".into())
                .spawn_scoped(scope, move || {
                    // A closed queue means the reads failed: their error is reported.
                    walk(walk_tree, root, &mut |node, file| {
                        found.send((node, file)).is_ok()
                    })
                })
                .map_err(|e| Error::io("start the directory walk of", root, e))?;
            let read = read_in_order(store, |wait| {
                if wait {
                    files.recv().ok()
                } else {
                    files.try_recv().ok()
                }
            });
            drop(files);
            let walked = walker.join().unwrap_or_else(|_| {
                Err(Error::io(
                    "walk",
                    root,
                    std::io::Error::other("the directory walk stopped unexpectedly"),
                ))
            });
            walked.and(read)
        })?
    } else {
        let mut found = HashMap::new();
        walk(tree, root, &mut |node, file| {
            found.insert(node, file).is_none()
        })?;
        // Files of an earlier source that this tree replaced are not in `found`.
        let mut order = writer::reading_order(tree, prefetch)
            .into_iter()
            .filter_map(|n| Some((n, found.remove(&n)?)));
        read_in_order(store, |_| order.next())?
    };
    for (node, size, pieces) in read {
        tree.node_mut(node).data = NodeData::File { size, pieces };
    }
    Ok(())
}

/// Reads files into `store` in the order `next` gives them (`next(true)` may wait for
/// one, `next(false)` only takes one that is ready), opening the next ones ahead and
/// asking the kernel to read them. Returns each file's node, size and pieces.
fn read_in_order(
    store: &mut ChunkStore,
    mut next: impl FnMut(bool) -> Option<(NodeId, FileToRead)>,
) -> Result<Vec<(NodeId, u64, Range<u32>)>> {
    let mut read = Vec::new();
    let mut ahead: VecDeque<(NodeId, FileToRead, File)> = VecDeque::new();
    let mut ahead_bytes = 0u64;
    loop {
        while ahead.len() < READ_AHEAD_FILES && ahead_bytes < READ_AHEAD_BYTES {
            let Some((node, file)) = next(ahead.is_empty()) else {
                break;
            };
            let f = File::open(&file.path).map_err(|e| Error::io("open", &file.path, e))?;
            // Only a hint: where the kernel declines, the read below still works.
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::WillNeed);
            ahead_bytes += file.size;
            ahead.push_back((node, file, f));
        }
        let Some((node, file, f)) = ahead.pop_front() else {
            return Ok(read);
        };
        ahead_bytes -= file.size;
        let (size, pieces) = store
            .add_file(f, None)
            .map_err(|e| Error::io("read", &file.path, e))?;
        read.push((node, size, pieces));
    }
}

/// Walks the tree under `root` into `tree` (metadata only) depth-first, names in byte
/// order: inode order. Calls `found` with each regular file the first time its inode is
/// met; stops early (without error) when `found` returns false.
fn walk(
    tree: &mut Tree,
    root: &Path,
    found: &mut dyn FnMut(NodeId, FileToRead) -> bool,
) -> Result<()> {
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
    // Each open directory with its entries still to visit, sorted by name.
    let mut stack = vec![(ROOT, sorted_entries(root)?)];
    while let Some((dir_node, entries)) = stack.last_mut() {
        let dir_node = *dir_node;
        let Some(entry) = entries.next() else {
            stack.pop();
            continue;
        };
        let path = entry.path();
        let md = fs::symlink_metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
        let key = (md.dev(), md.ino());
        let node = match seen.get(&key) {
            Some(&n) if !md.is_dir() => n,
            _ => {
                let n = add_entry(tree, &path, &md)?;
                if md.nlink() > 1 && !md.is_dir() {
                    seen.insert(key, n);
                }
                let name = entry.file_name().as_bytes().to_vec();
                if let Some(children) = tree.children_mut(dir_node) {
                    children.insert(name, Child { node: n, layer: 0 });
                }
                if md.is_file() {
                    let size = md.len();
                    if !found(n, FileToRead { path, size }) {
                        return Ok(());
                    }
                } else if md.is_dir() {
                    stack.push((n, sorted_entries(&path)?));
                }
                continue;
            }
        };
        let name = entry.file_name().as_bytes().to_vec();
        if let Some(children) = tree.children_mut(dir_node) {
            children.insert(name, Child { node, layer: 0 });
        }
    }
    Ok(())
}

/// A directory's entries, sorted by name (bytes).
fn sorted_entries(dir: &Path) -> Result<std::vec::IntoIter<fs::DirEntry>> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(|e| Error::io("read directory", dir, e))?
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::io("read directory", dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries.into_iter())
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
