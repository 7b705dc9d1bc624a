//! Lays the finished tree out as a bootstrap and a blob.
//!
//! Inode numbers follow a depth-first walk with names in byte order, so a directory's
//! files have neighbouring numbers. Chunks are placed in the blob in the order a reader
//! will want them: the prefetch list's files first, then every file in inode order, so a
//! start-up read is one contiguous range. Everything is derived from the tree alone, so
//! the same inputs give byte-identical output.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest, Sha256};
use zerocopy::IntoBytes;

use super::gzip_index::IndexedLayer;
use super::store::{ChunkStore, Location, Spool, UniqueChunk};
use super::tree::{NodeData, NodeId, Tree, ROOT};
use crate::chunk::{Chunking, DigestAlgo};
use crate::gzip;
use crate::layout::{
    BlobV1, CheckpointV1, ChunkV1, DirentV1, FileChunkV1, InodeV1, PrefetchV1, SuperblockV1,
    TableRefV1, XattrV1, HOLE, MAGIC, VERSION,
};
use crate::reader::{bootstrap_checksum, MAX_SPAN_SIZE};
use crate::{Error, Result};

/// Which blob a placed chunk lives in, before blob indexes are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum BlobKey {
    New,
    Dict(u32),
    /// An indexed gzip layer (format.md §17).
    Layer(u32),
}

/// Where a span chunk is in its layer: compressed size, checkpoint (global index) and
/// output bytes to skip after it.
#[derive(Debug, Clone, Copy)]
struct SpanPlace {
    compressed_size: u32,
    checkpoint: Option<u32>,
    skip: u32,
}

/// What `write` produced.
#[derive(Debug)]
pub(crate) struct Written {
    pub bootstrap_bytes: u64,
    pub bootstrap_sha256: [u8; 32],
    /// The new blob's digest and size, if any chunk was new.
    pub new_blob: Option<([u8; 32], u64)>,
    /// Whether the new blob was copied out of the spool into reading order, rather
    /// than the spool kept as it.
    pub blob_rewritten: bool,
    /// Every blob the image references: (digest, size).
    pub blobs: Vec<([u8; 32], u64)>,
    pub inodes: u32,
    pub regular_files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub others: u64,
    pub file_bytes: u64,
    pub chunk_refs: u64,
    pub holes: u64,
    pub holes_bytes: u64,
    pub dict_chunks: u64,
    pub unique_chunks: u64,
    pub unique_bytes: u64,
    pub stored_bytes: u64,
    pub prefetch_missing: Vec<String>,
    /// The bootstraps of the layer prefixes ([`WriteParams::prefixes`]): how many
    /// layers each covers, its size and sha256.
    pub prefixes: Vec<(u32, u64, [u8; 32])>,
    /// The bootstraps of the layers' own trees ([`WriteParams::own_layers`]): the
    /// layer, its size and sha256.
    pub own_layers: Vec<(u32, u64, [u8; 32])>,
}

/// What every bootstrap of one build shares: the chunks' final numbers and the chunk,
/// blob and checkpoint tables.
struct Tables {
    final_index: HashMap<u32, u32>,
    chunks: Vec<ChunkV1>,
    blobs: Vec<BlobV1>,
    checkpoints: Vec<CheckpointV1>,
}

/// What one tree's records hold, for the build's summary.
#[derive(Default)]
struct TreeCounts {
    regular_files: u64,
    directories: u64,
    symlinks: u64,
    others: u64,
    file_bytes: u64,
    chunk_refs: u64,
    holes: u64,
    holes_bytes: u64,
}

/// Inode numbers: nodes in depth-first order, each numbered on its first visit.
fn number_inodes(tree: &Tree) -> (Vec<NodeId>, HashMap<NodeId, u32>, HashMap<NodeId, NodeId>) {
    let mut order = Vec::new();
    let mut ino_of = HashMap::new();
    let mut parent_of = HashMap::new();
    let mut stack = vec![(ROOT, ROOT)];
    while let Some((node, parent)) = stack.pop() {
        if ino_of.contains_key(&node) {
            continue;
        }
        order.push(node);
        ino_of.insert(node, order.len() as u32);
        parent_of.insert(node, parent);
        if let Some(children) = tree.children(node) {
            // Reverse so the stack pops names in ascending order.
            for child in children.values().rev() {
                stack.push((child.node, node));
            }
        }
    }
    (order, ino_of, parent_of)
}

/// Appends to the string table, refusing to grow it past what u32 offsets address.
fn push_string(strings: &mut Vec<u8>, s: &[u8]) -> Result<u32> {
    let offset = strings.len();
    if offset + s.len() > u32::MAX as usize {
        return Err(Error::InvalidOption(
            "image metadata exceeds the 4 GiB string table".into(),
        ));
    }
    strings.extend_from_slice(s);
    Ok(offset as u32)
}

/// The files a prefetch path names: the file itself, or every file under a directory
/// (depth-first, names in order; iterative, so any depth is fine).
fn expand_prefetch(tree: &Tree, node: NodeId, out: &mut Vec<NodeId>) {
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        match &tree.node(n).data {
            NodeData::Dir(children) => stack.extend(children.values().rev().map(|c| c.node)),
            NodeData::File { .. } => out.push(n),
            _ => {}
        }
    }
}

/// A prefetch list resolved against a tree.
struct Prefetch {
    /// (node, canonical path) of each path found.
    entries: Vec<(NodeId, String)>,
    /// The files they name, in list order (a directory: every file under it).
    files: Vec<NodeId>,
    /// Paths not in the tree.
    missing: Vec<String>,
}

fn resolve_prefetch(tree: &Tree, paths: &[String]) -> Prefetch {
    let mut out = Prefetch {
        entries: Vec::new(),
        files: Vec::new(),
        missing: Vec::new(),
    };
    for p in paths {
        let comps = super::tree::components(p.as_bytes());
        match comps.and_then(|c| tree.lookup(&c)) {
            Some(node) => {
                out.entries.push((node, format!("/{}", comps_join(p))));
                expand_prefetch(tree, node, &mut out.files);
            }
            None => out.missing.push(p.clone()),
        }
    }
    out
}

/// The tree's files in the order [`write`] places their chunks in the blob: the
/// prefetch list's files, then every file in inode order, each once. A source that
/// reads files in this order makes chunks arrive in the blob's order, so the spool
/// becomes the blob without a copy.
pub(crate) fn reading_order(tree: &Tree, prefetch: &[String]) -> Vec<NodeId> {
    let (order, _, _) = number_inodes(tree);
    let first = resolve_prefetch(tree, prefetch).files;
    let mut seen = std::collections::HashSet::new();
    first
        .into_iter()
        .chain(order)
        .filter(|&n| matches!(tree.node(n).data, NodeData::File { .. }) && seen.insert(n))
        .collect()
}

pub(crate) struct WriteParams<'a> {
    pub out_dir: &'a Path,
    pub digest: DigestAlgo,
    pub chunking: Chunking,
    pub prefetch: &'a [String],
    pub indexed: &'a [IndexedLayer],
    /// Trees of the first layers only (an index's layer prefixes, format.md §17.5),
    /// each `(layers, tree)`, written as `bootstrap.layers-<layers>` beside the
    /// bootstrap with the same chunk, blob and checkpoint tables.
    pub prefixes: &'a [(u32, Tree)],
    /// Each indexed layer's own tree (format.md §17.7), `(layer, tree)`, written as
    /// [`own_layer_file`] beside the bootstrap with the same chunk, blob and checkpoint
    /// tables. Adds no chunk to them: every file of a layer's own tree is also in the
    /// tree after that layer, a prefix or the final tree.
    pub own_layers: &'a [(u32, Tree)],
}

/// The file name of layer `layer`'s own-tree bootstrap.
pub(crate) fn own_layer_file(layer: u32) -> String {
    format!("bootstrap.layer-{layer}")
}

pub(crate) fn write(
    tree: &Tree,
    store: &mut ChunkStore,
    params: &WriteParams<'_>,
) -> Result<Written> {
    let spool_path = params.out_dir.join("blobs").join(".spool");
    let spool = store
        .finish_spool()
        .map_err(|e| Error::io("write chunk spool", &spool_path, e))?;

    let (order, ino_of, parent_of) = number_inodes(tree);

    // Prefetch entries: resolve paths, remember which files come first.
    let prefetch = resolve_prefetch(tree, params.prefetch);
    let prefetch_nodes = prefetch.files;
    let prefetch_missing = prefetch.missing;
    let prefetch_entries: Vec<(u32, String)> = prefetch
        .entries
        .into_iter()
        .map(|(node, path)| (ino_of[&node], path))
        .collect();

    // Indexed layers' checkpoints are numbered layer after layer.
    let mut checkpoint_base = Vec::with_capacity(params.indexed.len());
    let mut checkpoint_count = 0u32;
    for layer in params.indexed {
        checkpoint_base.push(checkpoint_count);
        checkpoint_count += layer.checkpoints.len() as u32;
    }
    let mut spans: HashMap<u32, SpanPlace> = HashMap::new();

    // Place chunks: prefetch files first, then all files in inode order.
    let mut final_index: HashMap<u32, u32> = HashMap::new();
    let mut placed: Vec<(u32, BlobKey, u64)> = Vec::new(); // (unique id, blob, offset)
    let mut new_blob_len = 0u64;
    // Files' chunks in reading order, then those only layer prefixes name, then the
    // checkpoint windows: ordinary chunks no file names (`true`: a window, which may
    // not be a span).
    let files = prefetch_nodes.iter().chain(order.iter());
    let file_chunks = files.flat_map(|&node| match &tree.node(node).data {
        NodeData::File { pieces, .. } => {
            &store.occurrences[pieces.start as usize..pieces.end as usize]
        }
        _ => &[][..],
    });
    // Files of the layer prefixes that later layers deleted or replaced.
    let prefix_chunks = params
        .prefixes
        .iter()
        .flat_map(|(_, prefix)| &prefix.nodes)
        .flat_map(|node| match &node.data {
            NodeData::File { pieces, .. } => {
                &store.occurrences[pieces.start as usize..pieces.end as usize]
            }
            _ => &[][..],
        });
    let windows = params.indexed.iter().flat_map(|l| &l.windows);
    let wanted = file_chunks
        .chain(prefix_chunks)
        .map(|occ| (occ.chunk, false))
        .chain(windows.map(|&occ| (store.occurrences[occ as usize].chunk, true)));
    for (id, window) in wanted {
        if id == HOLE || final_index.contains_key(&id) {
            continue;
        }
        let u = store.unique[id as usize];
        let (key, offset) = match u.location {
            Location::Spool { .. } => {
                let at = new_blob_len;
                new_blob_len += u64::from(u.compressed_size);
                (BlobKey::New, at)
            }
            Location::Dict { blob, offset } => (BlobKey::Dict(blob), offset),
            Location::Span { .. } if window => {
                return Err(Error::InvalidInput {
                    path: params.out_dir.to_path_buf(),
                    reason: "a checkpoint window was recorded as a span".into(),
                })
            }
            Location::Span { layer, out } => {
                let (at, place) = place_span(params, &checkpoint_base, layer, out, &u)?;
                spans.insert(id, place);
                (BlobKey::Layer(layer), at)
            }
        };
        final_index.insert(id, placed.len() as u32);
        placed.push((id, key, offset));
    }

    // Blob indexes: the new blob first, then dictionary blobs in first-use order.
    let mut blob_keys: Vec<BlobKey> = Vec::new();
    if placed.iter().any(|p| p.1 == BlobKey::New) {
        blob_keys.push(BlobKey::New);
    }
    for p in &placed {
        if !blob_keys.contains(&p.1) {
            blob_keys.push(p.1);
        }
    }
    // Every indexed layer has its checkpoints' blob record, even one whose files a
    // later layer replaced.
    for l in 0..params.indexed.len() as u32 {
        if !blob_keys.contains(&BlobKey::Layer(l)) {
            blob_keys.push(BlobKey::Layer(l));
        }
    }
    let blob_index: HashMap<BlobKey, u32> = blob_keys
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, i as u32))
        .collect();

    // Write the new blob by copying spooled chunks in placement order.
    let mut new_blob = None;
    let mut blob_rewritten = false;
    if blob_keys.first() == Some(&BlobKey::New) {
        let (digest, len, rewritten) = new_blob_from(spool, store, &placed, params.out_dir)?;
        new_blob = Some((digest, len));
        blob_rewritten = rewritten;
    }
    link_dict_blobs(store, &blob_keys, params.out_dir)?;

    // Per-blob totals for the blob table.
    let mut blob_stats: HashMap<BlobKey, (u64, u32)> = HashMap::new();
    let mut unique_bytes = 0u64;
    let mut stored_bytes = 0u64;
    let mut chunks = Vec::with_capacity(placed.len());
    for &(id, key, offset) in &placed {
        let u = store.unique[id as usize];
        let s = blob_stats.entry(key).or_default();
        s.0 += u64::from(u.uncompressed_size);
        s.1 += 1;
        unique_bytes += u64::from(u.uncompressed_size);
        stored_bytes += u64::from(
            spans
                .get(&id)
                .map_or(u.compressed_size, |p| p.compressed_size),
        );
        let (compressed_size, reserved2) = match spans.get(&id) {
            Some(p) => {
                let mut r = [0u8; 8];
                r[..4].copy_from_slice(&p.checkpoint.unwrap_or(HOLE).to_le_bytes());
                r[4..].copy_from_slice(&p.skip.to_le_bytes());
                (p.compressed_size, r)
            }
            None => (u.compressed_size, [0; 8]),
        };
        chunks.push(ChunkV1 {
            digest: u.digest,
            blob_index: blob_index[&key].into(),
            compression: u.compression.to_byte(),
            compressed_offset: offset.into(),
            compressed_size: compressed_size.into(),
            uncompressed_size: u.uncompressed_size.into(),
            reserved2,
            ..Default::default()
        });
    }
    let blobs: Vec<([u8; 32], u64)> = blob_keys
        .iter()
        .map(|k| match k {
            BlobKey::New => new_blob.unwrap_or_default(),
            BlobKey::Dict(i) => {
                let b = store.dict_blob(*i);
                (b.digest, b.size)
            }
            BlobKey::Layer(l) => {
                let l = &params.indexed[*l as usize];
                (l.digest, l.size)
            }
        })
        .collect();
    let blob_table: Vec<BlobV1> = blob_keys
        .iter()
        .zip(&blobs)
        .map(|(k, (digest, size))| {
            let (uncompressed, count) = blob_stats.get(k).copied().unwrap_or_default();
            BlobV1 {
                digest: *digest,
                size: (*size).into(),
                uncompressed_size: uncompressed.into(),
                chunk_count: count.into(),
                ..Default::default()
            }
        })
        .collect();

    let mut checkpoints: Vec<CheckpointV1> = Vec::with_capacity(checkpoint_count as usize);
    for (l, layer) in params.indexed.iter().enumerate() {
        for (cp, &occ) in layer.checkpoints.iter().zip(&layer.windows) {
            let id = store.occurrences[occ as usize].chunk;
            checkpoints.push(CheckpointV1 {
                in_bits: cp.in_bits.into(),
                out: cp.out.into(),
                blob_index: blob_index[&BlobKey::Layer(l as u32)].into(),
                window_chunk: if id == HOLE { HOLE } else { final_index[&id] }.into(),
                ..Default::default()
            });
        }
    }
    let tables = Tables {
        final_index,
        chunks,
        blobs: blob_table,
        checkpoints,
    };
    let tree_order = TreeOrder {
        order: &order,
        ino_of: &ino_of,
        parent_of: &parent_of,
    };
    let (bytes, counts) =
        tree_bootstrap(tree, &tree_order, store, &tables, params, &prefetch_entries)?;
    let mut w = Written {
        bootstrap_bytes: bytes.len() as u64,
        bootstrap_sha256: Sha256::digest(&bytes).into(),
        new_blob,
        blob_rewritten,
        blobs,
        inodes: order.len() as u32,
        regular_files: counts.regular_files,
        directories: counts.directories,
        symlinks: counts.symlinks,
        others: counts.others,
        file_bytes: counts.file_bytes,
        chunk_refs: counts.chunk_refs,
        holes: counts.holes,
        holes_bytes: counts.holes_bytes,
        dict_chunks: placed.iter().filter(|p| p.1 != BlobKey::New).count() as u64,
        unique_chunks: placed.len() as u64,
        unique_bytes,
        stored_bytes,
        prefetch_missing,
        prefixes: Vec::new(),
        own_layers: Vec::new(),
    };
    write_file(params.out_dir, "bootstrap", &bytes)?;
    for (layers, prefix) in params.prefixes {
        let (order, ino_of, parent_of) = number_inodes(prefix);
        let prefix_order = TreeOrder {
            order: &order,
            ino_of: &ino_of,
            parent_of: &parent_of,
        };
        let (bytes, _) = tree_bootstrap(prefix, &prefix_order, store, &tables, params, &[])?;
        write_file(
            params.out_dir,
            &format!("bootstrap.layers-{layers}"),
            &bytes,
        )?;
        w.prefixes
            .push((*layers, bytes.len() as u64, Sha256::digest(&bytes).into()));
    }
    for (layer, own) in params.own_layers {
        let (order, ino_of, parent_of) = number_inodes(own);
        check_chunks_placed(
            own,
            &order,
            store,
            &tables.final_index,
            *layer,
            params.out_dir,
        )?;
        let own_order = TreeOrder {
            order: &order,
            ino_of: &ino_of,
            parent_of: &parent_of,
        };
        let (bytes, _) = tree_bootstrap(own, &own_order, store, &tables, params, &[])?;
        write_file(params.out_dir, &own_layer_file(*layer), &bytes)?;
        w.own_layers
            .push((*layer, bytes.len() as u64, Sha256::digest(&bytes).into()));
    }
    Ok(w)
}

/// Refuses a layer's own tree (`order`: its nodes) that names a chunk the shared chunk
/// table lacks. None should (its files are all in a tree whose chunks were placed), but
/// the tables are fixed by then, so a miss is a builder bug to report, not a chunk to
/// add.
fn check_chunks_placed(
    tree: &Tree,
    order: &[NodeId],
    store: &ChunkStore,
    final_index: &HashMap<u32, u32>,
    layer: u32,
    out_dir: &Path,
) -> Result<()> {
    for &node in order {
        let NodeData::File { pieces, .. } = &tree.node(node).data else {
            continue;
        };
        let occurrences = &store.occurrences[pieces.start as usize..pieces.end as usize];
        if let Some(occ) = occurrences
            .iter()
            .find(|occ| occ.chunk != HOLE && !final_index.contains_key(&occ.chunk))
        {
            return Err(Error::InvalidInput {
                path: out_dir.to_path_buf(),
                reason: format!(
                    "layer {layer}'s own tree names chunk {} that the index's chunk table \
                     lacks (a builder bug: its files should all be in a prefix or the \
                     final tree)",
                    occ.chunk
                ),
            });
        }
    }
    Ok(())
}

/// Writes `name` in `dir` whole (a temp file renamed into place).
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let final_path = dir.join(name);
    std::fs::write(&tmp, bytes).map_err(|e| Error::io("write bootstrap", &tmp, e))?;
    std::fs::rename(&tmp, &final_path)
        .map_err(|e| Error::io("rename bootstrap into", &final_path, e))
}

/// A tree's inodes in number order, each node's number and each node's parent.
struct TreeOrder<'a> {
    order: &'a [NodeId],
    ino_of: &'a HashMap<NodeId, u32>,
    parent_of: &'a HashMap<NodeId, NodeId>,
}

/// One tree's bootstrap over the build's shared `tables`: its inodes, dirents, file
/// chunks, xattrs, prefetch entries (`(ino, path)`) and strings.
fn tree_bootstrap(
    tree: &Tree,
    numbered: &TreeOrder<'_>,
    store: &ChunkStore,
    tables: &Tables,
    params: &WriteParams<'_>,
    prefetch_entries: &[(u32, String)],
) -> Result<(Vec<u8>, TreeCounts)> {
    let TreeOrder {
        order,
        ino_of,
        parent_of,
    } = *numbered;
    let final_index = &tables.final_index;
    // Inodes, dirents, file chunks, xattrs, strings.
    let mut strings = Vec::new();
    let mut inodes = Vec::with_capacity(order.len());
    let mut dirents = Vec::new();
    let mut file_chunks = Vec::new();
    let mut xattrs = Vec::new();
    let mut links: HashMap<NodeId, u32> = HashMap::new();
    for &node in order {
        if let Some(children) = tree.children(node) {
            for c in children.values() {
                *links.entry(c.node).or_default() += 1;
            }
        }
    }
    let mut w = TreeCounts::default();
    for &node in order {
        let n = tree.node(node);
        let xattr_start = xattrs.len() as u32;
        for (name, value) in &n.meta.xattrs {
            xattrs.push(XattrV1 {
                name_offset: push_string(&mut strings, name)?.into(),
                name_len: (name.len() as u32).into(),
                value_offset: push_string(&mut strings, value)?.into(),
                value_len: (value.len() as u32).into(),
            });
        }
        let (mut size, mut data_start, mut data_count, mut rdev) = (0u64, 0u32, 0u32, (0, 0));
        let nlink = match &n.data {
            NodeData::Dir(children) => {
                w.directories += 1;
                data_start = dirents.len() as u32;
                data_count = children.len() as u32;
                let mut subdirs = 0;
                for (name, c) in children {
                    let kind = tree.node(c.node).kind();
                    subdirs += u32::from(kind == crate::reader::FileKind::Directory);
                    dirents.push(DirentV1 {
                        name_offset: push_string(&mut strings, name)?.into(),
                        name_len: (name.len() as u16).into(),
                        kind: (kind.mode_bits() >> 12) as u8,
                        ino: ino_of[&c.node].into(),
                        ..Default::default()
                    });
                }
                2 + subdirs
            }
            NodeData::File { size: s, pieces } => {
                w.regular_files += 1;
                w.file_bytes += s;
                size = *s;
                data_start = file_chunks.len() as u32;
                let mut offset = 0u64;
                for occ in &store.occurrences[pieces.start as usize..pieces.end as usize] {
                    let index = if occ.chunk == HOLE {
                        w.holes += 1;
                        w.holes_bytes += u64::from(occ.len);
                        HOLE
                    } else {
                        w.chunk_refs += 1;
                        final_index[&occ.chunk]
                    };
                    file_chunks.push(FileChunkV1 {
                        file_offset: offset.into(),
                        chunk_index: index.into(),
                        len: occ.len.into(),
                    });
                    offset += u64::from(occ.len);
                }
                data_count = file_chunks.len() as u32 - data_start;
                links[&node]
            }
            NodeData::Symlink(target) => {
                w.symlinks += 1;
                size = target.len() as u64;
                data_start = push_string(&mut strings, target)?;
                data_count = target.len() as u32;
                links[&node]
            }
            NodeData::Special { major, minor, .. } => {
                w.others += 1;
                rdev = (*major, *minor);
                links[&node]
            }
        };
        inodes.push(InodeV1 {
            mode: (n.kind().mode_bits() | n.meta.perm).into(),
            uid: n.meta.uid.into(),
            gid: n.meta.gid.into(),
            nlink: nlink.into(),
            size: size.into(),
            mtime_sec: n.meta.mtime_sec.into(),
            mtime_nsec: n.meta.mtime_nsec.into(),
            rdev_major: rdev.0.into(),
            rdev_minor: rdev.1.into(),
            parent: ino_of[&parent_of[&node]].into(),
            data_start: data_start.into(),
            data_count: data_count.into(),
            xattr_start: xattr_start.into(),
            xattr_count: (xattrs.len() as u32 - xattr_start).into(),
        });
    }
    let mut prefetch = Vec::new();
    for (ino, path) in prefetch_entries {
        prefetch.push(PrefetchV1 {
            ino: (*ino).into(),
            path_offset: push_string(&mut strings, path.as_bytes())?.into(),
            path_len: (path.len() as u32).into(),
            ..Default::default()
        });
    }

    let bytes = serialize(
        params,
        &inodes,
        &dirents,
        &file_chunks,
        &tables.chunks,
        &tables.blobs,
        &xattrs,
        &prefetch,
        &strings,
        &tables.checkpoints,
    );
    Ok((bytes, w))
}

fn comps_join(p: &str) -> String {
    super::tree::components(p.as_bytes())
        .unwrap_or_default()
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// The span of chunk `u` at output offset `out` of indexed layer `layer`: its byte
/// offset in the layer and its place (format.md §17.3). A layer whose blocks are too
/// long for a span of at most [`MAX_SPAN_SIZE`] cannot be indexed.
fn place_span(
    params: &WriteParams<'_>,
    checkpoint_base: &[u32],
    layer: u32,
    out: u64,
    u: &UniqueChunk,
) -> Result<(u64, SpanPlace)> {
    let l = &params.indexed[layer as usize];
    let end = out + u64::from(u.uncompressed_size);
    let s = gzip::span(&l.checkpoints, &l.marks, out..end, l.size);
    let len = s.compressed.end - s.compressed.start;
    let too_big = |what: &str, value: u64| Error::InvalidInput {
        path: params.out_dir.to_path_buf(),
        reason: format!(
            "gzip layer sha256:{}: the chunk at output offset {out} needs {what} {value}, \
             more than an index can record; the layer's DEFLATE blocks are too long to \
             index (convert the image instead)",
            hex::encode(l.digest)
        ),
    };
    if len > u64::from(MAX_SPAN_SIZE) {
        return Err(too_big("a span of", len));
    }
    let skip = u32::try_from(s.skip).map_err(|_| too_big("a skip of", s.skip))?;
    Ok((
        s.compressed.start,
        SpanPlace {
            compressed_size: len as u32,
            checkpoint: s
                .checkpoint
                .map(|c| checkpoint_base[layer as usize] + c as u32),
            skip,
        },
    ))
}

/// Makes the new blob, `blobs/<sha256>`, from the spool: the spool itself when it
/// holds exactly the placed chunks in placement order (chunks arrived in reading order:
/// one directory, or one layer in tree order) and was hashed as it was written;
/// otherwise a copy of the placed chunks in placement order. Returns the blob's digest,
/// its size and whether it was copied.
fn new_blob_from(
    spool: Spool,
    store: &ChunkStore,
    placed: &[(u32, BlobKey, u64)],
    out_dir: &Path,
) -> Result<([u8; 32], u64, bool)> {
    let spooled = |&(id, key, _): &(u32, BlobKey, u64)| match store.unique[id as usize] {
        u @ UniqueChunk {
            location: Location::Spool { offset },
            ..
        } if key == BlobKey::New => Some((offset, u64::from(u.compressed_size))),
        _ => None,
    };
    let mut end = 0u64;
    let in_order = placed.iter().filter_map(spooled).all(|(offset, len)| {
        let next = offset == end;
        end += len;
        next
    });
    if let (true, true, Some(digest)) = (in_order, end == spool.len, spool.sha256) {
        let final_path = out_dir.join("blobs").join(hex::encode(digest));
        spool
            .named
            .persist(&final_path)
            .map_err(|e| Error::io("rename chunk spool into", &final_path, e.error))?;
        return Ok((digest, end, false));
    }
    let tmp = out_dir.join("blobs").join(".blob.tmp");
    let f = File::create(&tmp).map_err(|e| Error::io("create blob", &tmp, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, f);
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut buf = Vec::new();
    for (offset, size) in placed.iter().filter_map(spooled) {
        buf.resize(size as usize, 0);
        spool
            .file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| Error::io("read chunk spool", out_dir.join("blobs/.spool"), e))?;
        hasher.update(&buf);
        out.write_all(&buf)
            .map_err(|e| Error::io("write blob", &tmp, e))?;
        len += buf.len() as u64;
    }
    out.flush().map_err(|e| Error::io("write blob", &tmp, e))?;
    let digest: [u8; 32] = hasher.finalize().into();
    let final_path = out_dir.join("blobs").join(hex::encode(digest));
    std::fs::rename(&tmp, &final_path)
        .map_err(|e| Error::io("rename blob into", &final_path, e))?;
    Ok((digest, len, true))
}

/// Makes the dictionary blobs the image references available in its own `blobs/`
/// (hardlinked when possible), so the image dir is complete on its own.
fn link_dict_blobs(store: &ChunkStore, keys: &[BlobKey], out_dir: &Path) -> Result<()> {
    for key in keys {
        let BlobKey::Dict(i) = key else { continue };
        let b = store.dict_blob(*i);
        let Some(path) = &b.path else { continue };
        let dest = out_dir.join("blobs").join(hex::encode(b.digest));
        if dest.exists() {
            continue;
        }
        if std::fs::hard_link(path, &dest).is_err() {
            std::fs::copy(path, &dest)
                .map_err(|e| Error::io("copy chunk-dict blob to", &dest, e))?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn serialize(
    params: &WriteParams<'_>,
    inodes: &[InodeV1],
    dirents: &[DirentV1],
    file_chunks: &[FileChunkV1],
    chunks: &[ChunkV1],
    blobs: &[BlobV1],
    xattrs: &[XattrV1],
    prefetch: &[PrefetchV1],
    strings: &[u8],
    checkpoints: &[CheckpointV1],
) -> Vec<u8> {
    let mut out = vec![0u8; size_of::<SuperblockV1>()];
    let mut table = |bytes: &[u8], count: usize| {
        let r = TableRefV1 {
            offset: (out.len() as u64).into(),
            count: (count as u64).into(),
        };
        out.extend_from_slice(bytes);
        r
    };
    let t_inodes = table(inodes.as_bytes(), inodes.len());
    let t_dirents = table(dirents.as_bytes(), dirents.len());
    let t_file_chunks = table(file_chunks.as_bytes(), file_chunks.len());
    let t_chunks = table(chunks.as_bytes(), chunks.len());
    let t_blobs = table(blobs.as_bytes(), blobs.len());
    let t_xattrs = table(xattrs.as_bytes(), xattrs.len());
    let t_prefetch = table(prefetch.as_bytes(), prefetch.len());
    let t_strings = table(strings, strings.len());
    // After the strings, and absent (all zero) in every converted image, whose bytes
    // are then what they were before indexes existed.
    let t_checkpoints = if checkpoints.is_empty() {
        TableRefV1::default()
    } else {
        table(checkpoints.as_bytes(), checkpoints.len())
    };
    let (chunking, chunk_size, cdc_min, cdc_max) = match params.chunking {
        Chunking::Fixed { size } => (1, size, 0, 0),
        Chunking::Cdc { min, avg, max } => (2, avg, min, max),
    };
    let sb = SuperblockV1 {
        magic: MAGIC,
        version: VERSION.into(),
        flags: 0.into(),
        checksum: [0; 32],
        bootstrap_size: (out.len() as u64).into(),
        digest_algo: params.digest.to_byte(),
        chunking,
        reserved0: [0; 2],
        chunk_size: chunk_size.into(),
        cdc_min: cdc_min.into(),
        cdc_max: cdc_max.into(),
        inodes: t_inodes,
        dirents: t_dirents,
        file_chunks: t_file_chunks,
        chunks: t_chunks,
        blobs: t_blobs,
        xattrs: t_xattrs,
        prefetch: t_prefetch,
        strings: t_strings,
        checkpoints: t_checkpoints,
        reserved2: [0; 40],
    };
    out[..size_of::<SuperblockV1>()].copy_from_slice(sb.as_bytes());
    let sum = bootstrap_checksum(&out);
    out[16..48].copy_from_slice(&sum);
    out
}
