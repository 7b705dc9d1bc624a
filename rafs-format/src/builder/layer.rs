//! Applying OCI layer tarballs to the tree, as the OCI image spec's "applying changesets"
//! describes: entries in order, `.wh.NAME` whiteouts deleting NAME from lower layers,
//! `.wh..wh..opq` making a directory opaque (hiding everything lower layers put in it),
//! hardlinks resolved against the merged tree. PAX headers supply long names, xattrs
//! (`SCHILY.xattr.*`), large ids and nanosecond times (see [`super::tar`]).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read};

use super::own_tree::{Change, OwnTree};
use super::store::ChunkStore;
use super::tar::{EntryType, TarEntry, TarReader};
use super::tree::{components, Child, Meta, Node, NodeData, NodeId, Tree, ROOT};
use crate::layout::PATH_MAX;
use crate::reader::{check_name, FileKind};
use crate::{Error, Result};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// Wraps a layer stream in the decompressor its first bytes call for: gzip, zstd or a
/// plain tar.
pub(crate) fn decompressed<'a>(
    reader: impl Read + Send + 'a,
) -> std::io::Result<Box<dyn Read + Send + 'a>> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(reader)?)
    } else {
        Box::new(reader)
    })
}

/// Applies one layer (an uncompressed tar stream) on top of the tree, and for an index
/// also builds the layer's own tree (`own`, format.md §17.7) from the same entries.
pub(crate) fn apply_layer(
    tree: &mut Tree,
    store: &mut ChunkStore,
    tar_stream: impl Read,
    layer: u32,
    mut own: Option<&mut OwnTree<'_>>,
) -> Result<()> {
    let mut tar = TarReader::new(tar_stream);
    let mut opaque = Vec::new();
    loop {
        let entry = tar.next_entry().map_err(|e| Error::Layer {
            layer: layer as usize,
            entry: format!("<entry {} at byte {}>", tar.count, tar.offset()),
            reason: format!("read tar: {e}"),
        })?;
        let Some(entry) = entry else {
            hide_lower_entries(tree, &opaque, layer);
            if let Some(own) = own {
                own.finish(tree, &opaque);
            }
            return Ok(());
        };
        let comps = components(&entry.path).ok_or_else(|| Error::Layer {
            layer: layer as usize,
            entry: String::from_utf8_lossy(&entry.path).into_owned(),
            reason: "path has a '..' component".into(),
        })?;
        let change = apply_entry(tree, store, &mut tar, &entry, &comps, layer, &mut opaque)
            .map_err(|reason| Error::Layer {
                layer: layer as usize,
                entry: String::from_utf8_lossy(&entry.path).into_owned(),
                reason,
            })?;
        if let Some(own) = own.as_deref_mut() {
            own.apply(tree, change);
        }
    }
}

fn entry_meta(e: &TarEntry) -> Result<Meta, String> {
    let id =
        |what, n: u64| u32::try_from(n).map_err(|_| format!("{what} {n} does not fit in 32 bits"));
    Ok(Meta {
        perm: e.mode,
        uid: id("uid", e.uid)?,
        gid: id("gid", e.gid)?,
        mtime_sec: e.mtime.0,
        mtime_nsec: e.mtime.1,
        xattrs: e.xattrs.iter().cloned().collect::<BTreeMap<_, _>>(),
    })
}

/// Makes the directories of `opaque` (marked by `.wh..wh..opq` in `layer`) opaque:
/// everything lower layers put beneath them disappears, while what this layer put there
/// stays, wherever the marker came in the tar. A subdirectory from a lower layer
/// survives only as the path to this layer's entries, emptied of its lower contents.
///
/// Runs once at the end of the layer, iteratively and visiting each directory once,
/// so neither deep nor repeatedly marked trees cost more than one walk.
fn hide_lower_entries(tree: &mut Tree, opaque: &[NodeId], layer: u32) {
    let is_dir = |tree: &Tree, n: NodeId| matches!(tree.node(n).data, NodeData::Dir(_));
    let mut visited: HashSet<NodeId> = HashSet::new();
    for &root in opaque {
        // Directories under `root` in pre-order; pruned in reverse (children first).
        let mut order = Vec::new();
        let mut stack = vec![root];
        while let Some(d) = stack.pop() {
            if !visited.insert(d) {
                continue;
            }
            order.push(d);
            if let Some(children) = tree.children(d) {
                stack.extend(
                    children
                        .values()
                        .map(|c| c.node)
                        .filter(|&n| is_dir(tree, n)),
                );
            }
        }
        for &d in order.iter().rev() {
            let Some(children) = tree.children(d) else {
                continue;
            };
            let hidden: Vec<Vec<u8>> = children
                .iter()
                .filter(|(_, c)| {
                    let lives_on = is_dir(tree, c.node)
                        && tree.children(c.node).is_some_and(|cc| !cc.is_empty());
                    c.layer < layer && !lives_on
                })
                .map(|(name, _)| name.clone())
                .collect();
            if let Some(children) = tree.children_mut(d) {
                for name in hidden {
                    children.remove(&name);
                }
            }
        }
    }
}

/// A directory node made for a path whose parents a layer did not list.
pub(crate) fn implicit_dir() -> Node {
    Node {
        meta: Meta {
            perm: 0o755,
            ..Meta::default()
        },
        data: NodeData::Dir(BTreeMap::new()),
    }
}

/// Finds (creating if needed) the directory at `comps`.
fn ensure_dir(tree: &mut Tree, comps: &[&[u8]], layer: u32) -> Result<NodeId, String> {
    let mut cur = ROOT;
    for c in comps {
        let existing = tree.children(cur).and_then(|ch| ch.get(*c)).copied();
        cur = match existing {
            Some(child) if matches!(tree.node(child.node).data, NodeData::Dir(_)) => child.node,
            Some(_) => {
                return Err(format!(
                    "parent {:?} is not a directory",
                    String::from_utf8_lossy(c)
                ))
            }
            None => {
                let id = tree.add_node(implicit_dir());
                if let Some(ch) = tree.children_mut(cur) {
                    ch.insert(c.to_vec(), Child { node: id, layer });
                }
                id
            }
        };
    }
    Ok(cur)
}

/// Applies one entry to the merged tree and says what it did, for the layer's own tree.
/// A regular file's data is read and chunked here, once, for both.
fn apply_entry<'e>(
    tree: &mut Tree,
    store: &mut ChunkStore,
    tar: &mut TarReader<impl Read>,
    entry: &'e TarEntry,
    comps: &'e [&'e [u8]],
    layer: u32,
    opaque: &mut Vec<NodeId>,
) -> Result<Change<'e>, String> {
    let path_len = comps
        .iter()
        .map(|c| c.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if path_len > PATH_MAX as usize {
        return Err(format!(
            "path of {path_len} bytes is longer than {PATH_MAX} (PATH_MAX)"
        ));
    }
    let meta = entry_meta(entry)?;
    meta.validate()
        .map_err(|why| format!("bad metadata: {why}"))?;

    let Some((name, parent_comps)) = comps.split_last() else {
        // The root itself ("./"): only its metadata can change.
        if entry.kind == EntryType::Directory {
            tree.node_mut(ROOT).meta = meta.clone();
            return Ok(Change::RootMeta(meta));
        }
        return Err("the root of a layer must be a directory".into());
    };
    if let Err(why) = check_name(name) {
        return Err(format!("bad file name: {why}"));
    }
    if name.starts_with(WHITEOUT_PREFIX) {
        // A whiteout in a directory that does not exist hides nothing.
        let Some(parent) = tree.lookup(parent_comps) else {
            return Ok(Change::Nothing);
        };
        if *name == OPAQUE_MARKER {
            opaque.push(parent);
            // A marker under a file hides nothing; the own tree makes no directory of it.
            let is_dir = matches!(tree.node(parent).data, NodeData::Dir(_));
            return Ok(if is_dir {
                Change::Opaque(parent_comps)
            } else {
                Change::Nothing
            });
        }
        if name.starts_with(b".wh..wh.") {
            return Ok(Change::Nothing);
        }
        let target = &name[WHITEOUT_PREFIX.len()..];
        let Some(children) = tree.children_mut(parent) else {
            return Ok(Change::Nothing);
        };
        match children.get(target) {
            // This layer's own entry of that name stays.
            Some(c) if c.layer == layer => return Ok(Change::Nothing),
            Some(_) => {
                children.remove(target);
            }
            None => {}
        }
        return Ok(Change::Whiteout {
            parent: parent_comps,
            name: target,
            meta,
        });
    }
    let parent = ensure_dir(tree, parent_comps, layer)?;

    let existing = tree.children(parent).and_then(|c| c.get(*name)).copied();
    let data = match entry.kind {
        EntryType::Directory => {
            if let Some(child) = existing {
                if matches!(tree.node(child.node).data, NodeData::Dir(_)) {
                    // A directory listed again keeps its contents; only metadata changes.
                    tree.node_mut(child.node).meta = meta.clone();
                    if let Some(ch) = tree.children_mut(parent) {
                        ch.insert(
                            name.to_vec(),
                            Child {
                                node: child.node,
                                layer,
                            },
                        );
                    }
                    return Ok(Change::Entry {
                        parent: parent_comps,
                        name,
                        node: Node {
                            meta,
                            data: NodeData::Dir(BTreeMap::new()),
                        },
                    });
                }
            }
            NodeData::Dir(BTreeMap::new())
        }
        EntryType::Regular => {
            let at = tar.offset();
            let (size, pieces) = store
                .add_file(tar.data(), Some(at))
                .map_err(|e| format!("read file data: {e}"))?;
            if size != entry.size {
                return Err(format!(
                    "file data is {size} bytes, the header says {}",
                    entry.size
                ));
            }
            NodeData::File { size, pieces }
        }
        EntryType::Hardlink => {
            let target_path =
                components(&entry.link_name).ok_or("hardlink target has a '..' component")?;
            let target = tree.lookup(&target_path).ok_or_else(|| {
                format!(
                    "hardlink target {:?} does not exist",
                    String::from_utf8_lossy(&entry.link_name)
                )
            })?;
            if matches!(tree.node(target).data, NodeData::Dir(_)) {
                return Err("hardlink to a directory".into());
            }
            if let Some(ch) = tree.children_mut(parent) {
                ch.insert(
                    name.to_vec(),
                    Child {
                        node: target,
                        layer,
                    },
                );
            }
            return Ok(Change::Hardlink {
                parent: parent_comps,
                name,
                target_path,
                target,
            });
        }
        EntryType::Symlink => {
            if entry.link_name.is_empty() {
                return Err("symlink without a target".into());
            }
            NodeData::Symlink(entry.link_name.clone())
        }
        EntryType::Char | EntryType::Block => NodeData::Special {
            kind: if entry.kind == EntryType::Char {
                FileKind::CharDevice
            } else {
                FileKind::BlockDevice
            },
            major: entry.dev_major,
            minor: entry.dev_minor,
        },
        EntryType::Fifo => NodeData::Special {
            kind: FileKind::Fifo,
            major: 0,
            minor: 0,
        },
    };
    let node = Node { meta, data };
    let id = tree.add_node(node.clone());
    if let Some(ch) = tree.children_mut(parent) {
        ch.insert(name.to_vec(), Child { node: id, layer });
    }
    Ok(Change::Entry {
        parent: parent_comps,
        name,
        node,
    })
}
