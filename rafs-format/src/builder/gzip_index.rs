//! Indexing an unconverted gzip layer (format.md §17): the layer is read once through
//! the decoder that records checkpoints, its tar entries are applied to the tree like
//! any layer's, and its files' chunks become spans of the layer instead of being
//! compressed into a new blob. Each checkpoint's window is stored as an ordinary chunk.

use std::io::{self, Read};

use sha2::{Digest, Sha256};

use super::layer;
use super::own_tree::OwnTree;
use super::store::ChunkStore;
use super::tree::Tree;
use crate::gzip::{Checkpoint, GzipReader, Mark};
use crate::{Error, Result};

/// Output between checkpoints: a read in the middle of a layer fetches and inflates
/// up to this much more than it needs, and each checkpoint's window costs index space.
/// Windows keep only the bytes later matches copy (format.md §17.1), which zstd then
/// shrinks to a few KiB. On the benchmark image (benches/README.md, issue 22): at 2 MiB
/// without that the index was 2.4% of the layers and a cold start 1.7× the converted
/// image's; at 384 KiB the index is 2.1% and the cold start 1.25×.
pub const CHECKPOINT_SPACING: u64 = 384 << 10;

/// What the writer needs of one indexed layer.
#[derive(Debug)]
pub(crate) struct IndexedLayer {
    /// sha256 and length of the compressed layer: its blob record.
    pub digest: [u8; 32],
    pub size: u64,
    /// The layer decompressed: its tar's length.
    pub uncompressed: u64,
    /// The layer's checkpoints, windows dropped (they are chunks now).
    pub checkpoints: Vec<Checkpoint>,
    /// The occurrence holding each checkpoint's window.
    pub windows: Vec<u32>,
    pub marks: Vec<Mark>,
}

/// Counts and hashes what is read through it: the layer's digest, computed on the one
/// pass that indexes it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    len: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// Applies gzip layer `layer` (the image's `index`-th) to the tree and builds its own
/// tree in `own`, its chunks recorded as spans of indexed layer number `span_layer`.
pub(crate) fn index_layer(
    tree: &mut Tree,
    own: &mut OwnTree<'_>,
    store: &mut ChunkStore,
    layer: impl Read,
    index: u32,
    span_layer: u32,
) -> Result<IndexedLayer> {
    let hashing = Hashing {
        inner: layer,
        hasher: Sha256::new(),
        len: 0,
    };
    let mut gz = GzipReader::indexing(hashing, CHECKPOINT_SPACING);
    store.set_span_layer(Some(span_layer));
    let applied = layer::apply_layer(tree, store, &mut gz, index, Some(own));
    store.set_span_layer(None);
    applied?;
    // The rest (the archive's end blocks, the trailer): every member's CRC is checked
    // and the last marks recorded.
    io::copy(&mut gz, &mut io::sink()).map_err(|e| Error::Layer {
        layer: index as usize,
        entry: "<end of archive>".into(),
        reason: format!("read gzip stream: {e}"),
    })?;
    let uncompressed = gz.position();
    let mut checkpoints = gz.take_checkpoints();
    let marks = gz.take_marks();
    let mut windows = Vec::with_capacity(checkpoints.len());
    for cp in &mut checkpoints {
        let window = std::mem::take(&mut cp.window);
        let occ = store.add_chunk(window).map_err(|e| Error::Layer {
            layer: index as usize,
            entry: String::new(),
            reason: format!("store a checkpoint window: {e}"),
        })?;
        windows.push(occ);
    }
    let hashing = gz.into_inner();
    Ok(IndexedLayer {
        digest: hashing.hasher.finalize().into(),
        size: hashing.len,
        uncompressed,
        checkpoints,
        windows,
        marks,
    })
}
