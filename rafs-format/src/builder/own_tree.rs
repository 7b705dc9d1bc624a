//! A layer's own tree (format.md §17.7): what one layer changes, in overlayfs's on-disk
//! convention, so that a layer can be an overlay lower dir on its own (containers/storage's
//! additional layer store) and stacking every layer's own tree gives the merged tree.
//!
//! It is built beside the merged tree from the same entries: [`super::layer`] applies an
//! entry to the merged tree and hands the result here as a [`Change`], so a file's data
//! is read and chunked once and both trees name the same pieces. Whiteouts become
//! character devices 0/0, opaque directories get `trusted.overlay.opaque` = `y`, and
//! directories the layer does not list show the merged tree's metadata there, since an
//! overlay shows the upper-most directory's attributes.

use std::collections::{HashMap, HashSet};

use super::layer::implicit_dir;
use super::tree::{Child, Meta, Node, NodeData, NodeId, Tree, ROOT};
use crate::reader::FileKind;

/// The xattr that makes a directory of an overlay layer hide the directories below it.
const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

/// What one tar entry did to the merged tree, for the layer's own tree to do as well.
/// Paths are the entry's components, the parent's and the entry's name.
#[derive(Debug)]
pub(crate) enum Change<'e> {
    /// Nothing an overlay layer shows: `.wh..wh.*` names other than the opaque marker,
    /// a whiteout or marker in a directory that does not exist, a whiteout of a name
    /// this layer already wrote.
    Nothing,
    /// The root's metadata (a `./` entry).
    RootMeta(Meta),
    /// `.wh..wh..opq` in this directory.
    Opaque(&'e [&'e [u8]]),
    /// `.wh.NAME` in `parent`, where this layer has no NAME (yet): NAME is deleted from
    /// the layers below.
    Whiteout {
        parent: &'e [&'e [u8]],
        name: &'e [u8],
        meta: Meta,
    },
    /// A new entry; a directory over a directory changes only its metadata, as in the
    /// merged tree.
    Entry {
        parent: &'e [&'e [u8]],
        name: &'e [u8],
        node: Node,
    },
    /// A hard link to `target`, the merged tree's node at `target_path`.
    Hardlink {
        parent: &'e [&'e [u8]],
        name: &'e [u8],
        target_path: Vec<&'e [u8]>,
        target: NodeId,
    },
}

/// One layer's own tree while its entries are applied.
#[derive(Debug)]
pub(crate) struct OwnTree<'a> {
    tree: Tree,
    /// The merged tree before this layer: a directory this layer replaced there needs
    /// to hide the old one's contents.
    lower: &'a Tree,
    /// Merged-tree node ids from here on were made by this layer (the arena only grows).
    first_new: NodeId,
    /// The character devices standing for this layer's whiteouts: a real entry of the
    /// same name replaces one, and the merged tree has nothing there.
    whiteouts: HashSet<NodeId>,
    /// Lower-layer files this layer hard-links to, copied into this tree (an overlay
    /// layer holds whole files): merged node → its copy, so several links share one.
    copies: HashMap<NodeId, NodeId>,
}

impl<'a> OwnTree<'a> {
    /// An empty own tree for the layer about to be applied on `lower`, whose root has
    /// `lower`'s root metadata until the layer lists `./` itself.
    pub fn new(lower: &'a Tree) -> Self {
        OwnTree {
            tree: Tree::new(lower.node(ROOT).meta.clone()),
            lower,
            first_new: lower.nodes.len() as NodeId,
            whiteouts: HashSet::new(),
            copies: HashMap::new(),
        }
    }

    /// The finished tree.
    pub fn into_tree(self) -> Tree {
        self.tree
    }

    /// Does in this tree what `change` did in `merged` (which it has been applied to).
    pub fn apply(&mut self, merged: &Tree, change: Change<'_>) {
        match change {
            Change::Nothing => {}
            Change::RootMeta(meta) => self.tree.node_mut(ROOT).meta = meta,
            Change::Opaque(dir) => {
                // Made opaque in `finish`, once the layer can no longer replace its
                // metadata.
                self.ensure_dir(merged, dir);
            }
            Change::Whiteout { parent, name, meta } => {
                // Whatever the own tree has there is only a path to entries the whiteout
                // just deleted from the merged tree too (the layer's own entries win, and
                // then there is no `Whiteout`).
                let dir = self.ensure_dir(merged, parent);
                let node = self.tree.add_node(Node {
                    meta,
                    data: NodeData::Special {
                        kind: FileKind::CharDevice,
                        major: 0,
                        minor: 0,
                    },
                });
                self.whiteouts.insert(node);
                self.insert(dir, name, node);
            }
            Change::Entry { parent, name, node } => {
                let dir = self.ensure_dir(merged, parent);
                if let (NodeData::Dir(_), Some(existing)) = (&node.data, self.child(dir, name)) {
                    if matches!(self.tree.node(existing).data, NodeData::Dir(_)) {
                        self.tree.node_mut(existing).meta = node.meta;
                        return;
                    }
                }
                let node = self.tree.add_node(node);
                self.insert(dir, name, node);
            }
            Change::Hardlink {
                parent,
                name,
                target_path,
                target,
            } => {
                let dir = self.ensure_dir(merged, parent);
                let own_target = self.tree.lookup(&target_path).filter(|n| {
                    !self.whiteouts.contains(n)
                        && !matches!(self.tree.node(*n).data, NodeData::Dir(_))
                });
                let node = match own_target.or_else(|| self.copies.get(&target).copied()) {
                    Some(node) => node,
                    None => {
                        // The target is a lower layer's: this layer holds a copy.
                        let copy = self.tree.add_node(merged.node(target).clone());
                        self.copies.insert(target, copy);
                        copy
                    }
                };
                self.insert(dir, name, node);
            }
        }
    }

    /// Ends the layer, after the merged tree hid what the layer's opaque markers hide:
    /// makes opaque the directories marked so (`opaque`, merged node ids) and those
    /// that replaced a lower directory (whose contents the merged tree dropped), and
    /// drops the directories the merged tree no longer has (lower directories under an
    /// opaque one that held only whiteouts of this layer).
    pub fn finish(&mut self, merged: &Tree, opaque: &[NodeId]) {
        let opaque: HashSet<NodeId> = opaque.iter().copied().collect();
        // (own dir, the merged tree's dir at the same path, the lower tree's dir there)
        let mut stack = vec![(ROOT, ROOT, Some(ROOT))];
        while let Some((dir, merged_dir, lower_dir)) = stack.pop() {
            let replaced_lower_dir = merged_dir >= self.first_new && lower_dir.is_some();
            if opaque.contains(&merged_dir) || replaced_lower_dir {
                self.tree
                    .node_mut(dir)
                    .meta
                    .xattrs
                    .insert(OPAQUE_XATTR.to_vec(), b"y".to_vec());
            }
            let Some(children) = self.tree.children(dir) else {
                continue;
            };
            let mut gone = Vec::new();
            for (name, c) in children {
                if self.whiteouts.contains(&c.node) {
                    continue;
                }
                let Some(in_merged) = merged.children(merged_dir).and_then(|m| m.get(name)) else {
                    gone.push(name.clone());
                    continue;
                };
                if matches!(self.tree.node(c.node).data, NodeData::Dir(_)) {
                    let in_lower = lower_dir
                        .and_then(|l| self.lower.children(l)?.get(name))
                        .map(|l| l.node)
                        .filter(|&l| matches!(self.lower.node(l).data, NodeData::Dir(_)));
                    stack.push((c.node, in_merged.node, in_lower));
                }
            }
            if let Some(children) = self.tree.children_mut(dir) {
                for name in gone {
                    children.remove(&name);
                }
            }
        }
    }

    fn child(&self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        self.tree.children(dir)?.get(name).map(|c| c.node)
    }

    /// Names `node` in `dir`, replacing whatever had the name.
    fn insert(&mut self, dir: NodeId, name: &[u8], node: NodeId) {
        if let Some(children) = self.tree.children_mut(dir) {
            // The layer number is the merged tree's business; here every entry is the
            // layer's own.
            children.insert(name.to_vec(), Child { node, layer: 0 });
        }
    }

    /// Finds (creating if needed) the directory at `path`, which the merged tree has.
    /// One this layer did not list takes the merged tree's metadata there: the lower
    /// layers' directory's, or the implicit default where they have none or this layer
    /// whited it out and made it again. A whiteout of this layer in the way is replaced.
    fn ensure_dir(&mut self, merged: &Tree, path: &[&[u8]]) -> NodeId {
        let (mut dir, mut merged_dir) = (ROOT, Some(ROOT));
        for name in path {
            merged_dir = merged_dir.and_then(|m| Some(merged.children(m)?.get(*name)?.node));
            dir = match self.child(dir, name) {
                Some(n) if matches!(self.tree.node(n).data, NodeData::Dir(_)) => n,
                _ => {
                    let mut node = implicit_dir();
                    if let Some(m) = merged_dir {
                        node.meta = merged.node(m).meta.clone();
                    }
                    let n = self.tree.add_node(node);
                    self.insert(dir, name, n);
                    n
                }
            };
        }
        dir
    }
}
