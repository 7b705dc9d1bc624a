//! The in-memory file tree a build assembles before writing the bootstrap.
//!
//! Nodes live in an arena and directories map names to node ids, so a hardlink is simply
//! two entries naming the same node, and replacing or deleting an entry (a later layer, a
//! whiteout) never disturbs other names of the same inode.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::layout::{XATTR_NAME_MAX, XATTR_VALUE_MAX};
use crate::reader::FileKind;

/// Index of a node in [`Tree::nodes`].
pub(crate) type NodeId = u32;

/// The root directory's node id.
pub(crate) const ROOT: NodeId = 0;

/// Metadata every inode has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Permission bits (`0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    /// Sorted by name, which is also the order the bootstrap stores them in.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Meta {
    /// Why this metadata cannot be stored, if it cannot (limits of docs/format.md).
    pub fn validate(&self) -> Result<(), String> {
        if self.mtime_nsec >= 1_000_000_000 {
            return Err(format!(
                "mtime nanoseconds {} are not below 10^9",
                self.mtime_nsec
            ));
        }
        for (name, value) in &self.xattrs {
            if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
                return Err(format!(
                    "xattr name {:?} is not 1..=255 bytes without NUL",
                    String::from_utf8_lossy(name)
                ));
            }
            if value.len() > XATTR_VALUE_MAX {
                return Err(format!(
                    "xattr {} value of {} bytes exceeds 64 KiB",
                    String::from_utf8_lossy(name),
                    value.len()
                ));
            }
        }
        Ok(())
    }
}

/// A directory entry: the node it names and the layer that wrote it (whiteouts and
/// opaque directories only hide entries from lower layers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Child {
    pub node: NodeId,
    pub layer: u32,
}

/// What kind of inode a node is, with its kind-specific data.
#[derive(Debug, Clone)]
pub(crate) enum NodeData {
    Dir(BTreeMap<Vec<u8>, Child>),
    /// A regular file: its size and its pieces, a range of the chunk store's occurrences.
    File {
        size: u64,
        pieces: Range<u32>,
    },
    Symlink(Vec<u8>),
    /// Character or block device, fifo or socket.
    Special {
        kind: FileKind,
        major: u32,
        minor: u32,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub meta: Meta,
    pub data: NodeData,
}

impl Node {
    pub fn kind(&self) -> FileKind {
        match &self.data {
            NodeData::Dir(_) => FileKind::Directory,
            NodeData::File { .. } => FileKind::Regular,
            NodeData::Symlink(_) => FileKind::Symlink,
            NodeData::Special { kind, .. } => *kind,
        }
    }
}

/// The merged file tree.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    /// A tree holding only a root directory with the given metadata.
    pub fn new(root: Meta) -> Self {
        Tree {
            nodes: vec![Node {
                meta: root,
                data: NodeData::Dir(BTreeMap::new()),
            }],
        }
    }

    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    /// The children of a directory node (empty for other nodes).
    pub fn children(&self, id: NodeId) -> Option<&BTreeMap<Vec<u8>, Child>> {
        match &self.node(id).data {
            NodeData::Dir(c) => Some(c),
            _ => None,
        }
    }

    pub fn children_mut(&mut self, id: NodeId) -> Option<&mut BTreeMap<Vec<u8>, Child>> {
        match &mut self.node_mut(id).data {
            NodeData::Dir(c) => Some(c),
            _ => None,
        }
    }

    /// Looks a path up from the root, component by component, without following
    /// symlinks. `None` if a component is missing or not a directory.
    pub fn lookup(&self, components: &[&[u8]]) -> Option<NodeId> {
        let mut cur = ROOT;
        for c in components {
            cur = self.children(cur)?.get(*c)?.node;
        }
        Some(cur)
    }
}

/// Splits a path into normal components, dropping empty ones and `.`; `None` if it has
/// a `..` (which no image may use to escape its root).
pub(crate) fn components(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_normalise_and_refuse_dotdot() {
        assert_eq!(
            components(b"./a//b/./c/"),
            Some(vec![&b"a"[..], b"b", b"c"])
        );
        assert_eq!(components(b"/"), Some(vec![]));
        assert_eq!(components(b"a/../b"), None);
    }
}
