//! Building images: from a directory, from layer tarballs or from an OCI image layout.
//!
//! A build has two phases. Sources (`source_dir`, `layer`, `oci_layout`) fill an
//! in-memory [`tree`] while the [`store`] cuts file data into chunks, deduplicates,
//! compresses and spools them; then [`writer`] numbers the inodes, lays the chunks out in
//! reading order and writes the bootstrap and the blob. Memory holds metadata and chunk
//! digests, never file data beyond one batch, so image size does not bound the build.

mod gzip_index;
mod layer;
mod oci_layout;
mod options;
mod own_tree;
mod source_dir;
mod store;
pub(crate) mod tar;
mod tree;
mod writer;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

pub use options::{BuildOptions, BuildProgress, ChunkDict};
use store::ChunkStore;
use tree::{Meta, Tree};
use writer::own_layer_file;

use crate::{Error, Result};

/// What a build did, for people (`Display`) and machines (`Serialize`).
#[derive(Debug, Clone, Serialize)]
pub struct BuildSummary {
    pub image_dir: PathBuf,
    pub inodes: u32,
    pub regular_files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub other_files: u64,
    /// File bytes read from the input (including files a later layer replaced).
    pub bytes_in: u64,
    /// Bytes of the files in the final tree.
    pub file_bytes: u64,
    /// Chunk references of all files (holes excluded).
    pub chunks: u64,
    /// Distinct chunks the image references.
    pub unique_chunks: u64,
    /// All-zero pieces stored as holes.
    pub holes: u64,
    /// Chunks referenced from the chunk dictionary instead of written again.
    pub dict_chunks: u64,
    /// Uncompressed bytes of the unique chunks.
    pub unique_bytes: u64,
    /// Stored (compressed) bytes of the unique chunks.
    pub stored_bytes: u64,
    /// Bytes this build wrote: the new blob plus the bootstrap.
    pub bytes_written: u64,
    pub bootstrap_bytes: u64,
    /// `sha256:<hex>` of the bootstrap.
    pub bootstrap_digest: String,
    /// The blob this build wrote, if any chunk was new.
    pub new_blob: Option<BlobSummary>,
    /// Whether that blob was copied out of the build's spool into reading order (the
    /// input did not arrive in that order: several layers, or one out of tree order)
    /// rather than the spool kept as the blob.
    pub blob_rewritten: bool,
    /// Every blob the image references.
    pub blobs: Vec<BlobSummary>,
    /// File bytes / unique bytes.
    pub dedup_ratio: f64,
    /// Unique bytes / stored bytes.
    pub compression_ratio: f64,
    pub seconds: f64,
    /// Input megabytes (10^6) per second.
    pub mb_per_s: f64,
    /// Prefetch paths that are not in the image (skipped).
    pub prefetch_missing: Vec<String>,
    /// For an index of several layers: the bootstraps of its layer prefixes (the tree
    /// of the first `layers` layers; format.md §17.5), each beside the bootstrap.
    pub layer_bootstraps: Vec<LayerBootstrap>,
    /// For an index: the bootstrap of each layer's own tree (its changes alone, in
    /// overlayfs's convention; format.md §17.7), in layer order, each beside the
    /// bootstrap. Empty for other builds.
    pub own_layer_bootstraps: Vec<OwnLayerBootstrap>,
}

/// The bootstrap of an index's first `layers` layers.
#[derive(Debug, Clone, Serialize)]
pub struct LayerBootstrap {
    pub layers: u32,
    pub path: PathBuf,
    pub bytes: u64,
    /// `sha256:<hex>` of the bootstrap.
    pub digest: String,
}

/// The bootstrap of one layer's own tree, `bootstrap.layer-<layer>`.
#[derive(Debug, Clone, Serialize)]
pub struct OwnLayerBootstrap {
    /// The layer's position in the image, 0-based.
    pub layer: u32,
    pub path: PathBuf,
    pub bytes: u64,
    /// `sha256:<hex>` of the bootstrap.
    pub digest: String,
    /// The layer's own length uncompressed (its tar's): what containers/storage calls
    /// its diff size.
    pub diff_size: u64,
}

/// A blob's digest and size.
#[derive(Debug, Clone, Serialize)]
pub struct BlobSummary {
    pub digest: String,
    pub size: u64,
}

impl std::fmt::Display for BuildSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(f, "image {}:", self.image_dir.display())?;
        writeln!(
            f,
            "  files      {} ({} regular, {} directories, {} symlinks, {} other)",
            self.inodes, self.regular_files, self.directories, self.symlinks, self.other_files
        )?;
        writeln!(
            f,
            "  bytes in   {:.1} MiB read, {:.1} MiB in the final tree",
            mib(self.bytes_in),
            mib(self.file_bytes)
        )?;
        writeln!(
            f,
            "  chunks     {} ({} unique, {} from the chunk dictionary, {} holes)",
            self.chunks, self.unique_chunks, self.dict_chunks, self.holes
        )?;
        writeln!(
            f,
            "  written    {:.1} MiB (blob {:.1} MiB + bootstrap {:.1} KiB)",
            mib(self.bytes_written),
            mib(self.new_blob.as_ref().map_or(0, |b| b.size)),
            self.bootstrap_bytes as f64 / 1024.0
        )?;
        writeln!(
            f,
            "  dedup      {:.2}x, compression {:.2}x",
            self.dedup_ratio, self.compression_ratio
        )?;
        writeln!(
            f,
            "  time       {:.2} s, {:.1} MB/s",
            self.seconds, self.mb_per_s
        )?;
        writeln!(f, "  bootstrap  {}", self.bootstrap_digest)?;
        for b in &self.blobs {
            writeln!(f, "  blob       {} ({} bytes)", b.digest, b.size)?;
        }
        if !self.layer_bootstraps.is_empty() {
            let bytes: u64 = self.layer_bootstraps.iter().map(|b| b.bytes).sum();
            writeln!(
                f,
                "  prefixes   {} bootstraps (bootstrap.layers-<k>, {:.1} KiB)",
                self.layer_bootstraps.len(),
                bytes as f64 / 1024.0
            )?;
        }
        if !self.own_layer_bootstraps.is_empty() {
            let bytes: u64 = self.own_layer_bootstraps.iter().map(|b| b.bytes).sum();
            writeln!(
                f,
                "  layers     {} own-tree bootstraps (bootstrap.layer-<k>, {:.1} KiB)",
                self.own_layer_bootstraps.len(),
                bytes as f64 / 1024.0
            )?;
        }
        for p in &self.prefetch_missing {
            writeln!(
                f,
                "  warning    prefetch path {p:?} is not in the image; skipped"
            )?;
        }
        Ok(())
    }
}

/// Blocks of a decompressed layer read ahead of the tar reader (1 MiB each).
const INFLATE_AHEAD_BLOCKS: usize = 8;
const INFLATE_BLOCK: u64 = 1 << 20;

/// Reads `stream` to its end in blocks into `blocks` (an error ends it); stops early
/// when the reading side is gone.
fn inflate_ahead(
    mut stream: impl Read,
    blocks: &std::sync::mpsc::SyncSender<std::io::Result<Vec<u8>>>,
) {
    loop {
        let mut block = Vec::with_capacity(INFLATE_BLOCK as usize);
        match (&mut stream).take(INFLATE_BLOCK).read_to_end(&mut block) {
            Ok(0) => return,
            Ok(_) => {
                if blocks.send(Ok(block)).is_err() {
                    return;
                }
            }
            Err(e) => {
                // What was read before the error first, as a direct reader would see it.
                if !block.is_empty() && blocks.send(Ok(block)).is_err() {
                    return;
                }
                let _ = blocks.send(Err(e));
                return;
            }
        }
    }
}

/// The reading side of [`inflate_ahead`]: a `Read` over its blocks.
struct BlockReader {
    blocks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    block: Vec<u8>,
    at: usize,
}

impl Read for BlockReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.block.len() {
            match self.blocks.recv() {
                Ok(block) => {
                    self.block = block?;
                    self.at = 0;
                }
                // The stream ended.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Builds one image into an image dir.
#[derive(Debug)]
pub struct Builder {
    out_dir: PathBuf,
    opts: BuildOptions,
    tree: Tree,
    store: ChunkStore,
    layers: u32,
    /// Layers added by [`Builder::index_gzip_layer`], in order.
    indexed: Vec<gzip_index::IndexedLayer>,
    /// The tree as it stood after each indexed layer but the last, with the number of
    /// layers applied: an index's layer prefixes (format.md §17.5).
    prefixes: Vec<(u32, Tree)>,
    /// Each indexed layer's own tree, with the layer's position in the image
    /// (format.md §17.7).
    own_layers: Vec<(u32, Tree)>,
    started: Instant,
}

impl Builder {
    /// Starts a build into `out_dir`, which must be absent or empty.
    pub fn new(out_dir: &Path, opts: BuildOptions) -> Result<Self> {
        opts.validate()?;
        let started = Instant::now();
        if out_dir.exists() {
            let mut entries = std::fs::read_dir(out_dir)
                .map_err(|e| Error::io("read output directory", out_dir, e))?;
            if entries.next().is_some() {
                return Err(Error::InvalidOption(format!(
                    "output directory {} is not empty: pass a new or empty directory",
                    out_dir.display()
                )));
            }
        }
        let blobs = out_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|e| Error::io("create", &blobs, e))?;
        let store = ChunkStore::new(&opts, &blobs)?;
        let root = Meta {
            perm: 0o755,
            ..Meta::default()
        };
        Ok(Builder {
            out_dir: out_dir.to_path_buf(),
            opts,
            tree: Tree::new(root),
            store,
            layers: 0,
            indexed: Vec::new(),
            prefixes: Vec::new(),
            own_layers: Vec::new(),
            started,
        })
    }

    /// Counts a source in; from the second on, chunks no longer arrive in the blob's
    /// order, so the spool is copied into the blob rather than kept as it.
    fn next_source(&mut self) -> u32 {
        if self.layers > 0 {
            self.store.stop_hashing_spool();
        }
        self.layers += 1;
        self.layers - 1
    }

    /// Adds a directory tree as the image's content.
    pub fn add_dir(&mut self, root: &Path) -> Result<()> {
        self.next_source();
        source_dir::add_dir(&mut self.tree, &mut self.store, root, &self.opts.prefetch)
    }

    /// Applies a layer tarball (plain, gzip or zstd) on top of what is there. The layer
    /// is decompressed on a thread of its own, a few MiB ahead of the tar reader, so
    /// inflating overlaps cutting and storing (the tar side is the build's one serial
    /// path).
    pub fn add_layer(&mut self, layer: impl Read + Send) -> Result<()> {
        let index = self.next_source();
        let stream = layer::decompressed(layer).map_err(|e| Error::Layer {
            layer: index as usize,
            entry: String::new(),
            reason: format!("read compression header: {e}"),
        })?;
        let (tree, store) = (&mut self.tree, &mut self.store);
        std::thread::scope(|scope| {
            let (blocks, from_inflater) = std::sync::mpsc::sync_channel(INFLATE_AHEAD_BLOCKS);
            std::thread::Builder::new()
                .name("build-inflate".into())
                .spawn_scoped(scope, move || inflate_ahead(stream, &blocks))
                .map_err(|e| Error::Layer {
                    layer: index as usize,
                    entry: String::new(),
                    reason: format!("start the decompression thread: {e}"),
                })?;
            let reader = BlockReader {
                blocks: from_inflater,
                block: Vec::new(),
                at: 0,
            };
            // Returning drops the reader, which stops the thread if the archive ended
            // before the stream did.
            layer::apply_layer(tree, store, reader, index, None)
        })
    }

    /// Applies a gzip layer on top of what is there *as an index* (format.md §17): its
    /// files' chunks are spans of the layer itself, which the image then references as
    /// a blob, instead of chunks compressed into the new blob. Returns the layer's
    /// sha256 and size, for the caller to check against the layer's descriptor.
    pub fn index_gzip_layer(&mut self, layer: impl Read) -> Result<([u8; 32], u64)> {
        if self.opts.chunk_dict.is_some() {
            return Err(Error::InvalidOption(
                "an index of gzip layers takes no chunk dictionary".into(),
            ));
        }
        let index = self.next_source();
        let span_layer = self.indexed.len() as u32;
        // The tree of the layers before this one: what the own tree's directories stand
        // on, and from the second layer on a prefix (the last tree is the bootstrap's).
        let lower = self.tree.clone();
        let mut own = own_tree::OwnTree::new(&lower);
        let indexed = gzip_index::index_layer(
            &mut self.tree,
            &mut own,
            &mut self.store,
            layer,
            index,
            span_layer,
        )?;
        self.own_layers.push((index, own.into_tree()));
        if !self.indexed.is_empty() {
            self.prefixes.push((index, lower));
        }
        let id = (indexed.digest, indexed.size);
        self.indexed.push(indexed);
        Ok(id)
    }

    /// Applies every layer of an image in an OCI image layout, verifying each.
    pub fn add_oci_layout(&mut self, layout: &Path, tag: Option<&str>) -> Result<()> {
        let image = oci_layout::open(layout, tag)?;
        for desc in &image.layers {
            let mut reader = oci_layout::open_layer(layout, desc)?;
            self.add_layer(&mut reader)?;
            let (digest, size) = reader.finish().map_err(|e| {
                Error::io(
                    "read layer",
                    oci_layout::blob_path(layout, desc.digest().as_ref()).unwrap_or_default(),
                    e,
                )
            })?;
            if digest != desc.digest().to_string() || size != desc.size() {
                return Err(Error::OciLayout {
                    path: layout.to_path_buf(),
                    reason: format!(
                        "layer {} ({} bytes) has digest {digest} and {size} bytes",
                        desc.digest(),
                        desc.size()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Writes the bootstrap and blob and reports what was done.
    pub fn finish(mut self) -> Result<BuildSummary> {
        let params = writer::WriteParams {
            out_dir: &self.out_dir,
            digest: self.opts.digest,
            chunking: self.opts.chunking,
            prefetch: &self.opts.prefetch,
            indexed: &self.indexed,
            prefixes: &self.prefixes,
            own_layers: &self.own_layers,
        };
        let w = writer::write(&self.tree, &mut self.store, &params)?;
        let seconds = self.started.elapsed().as_secs_f64();
        let bytes_in = self.store.stats.bytes_in;
        let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        let blob = |(d, s): &([u8; 32], u64)| BlobSummary {
            digest: format!("sha256:{}", hex::encode(d)),
            size: *s,
        };
        Ok(BuildSummary {
            image_dir: self.out_dir.clone(),
            inodes: w.inodes,
            regular_files: w.regular_files,
            directories: w.directories,
            symlinks: w.symlinks,
            other_files: w.others,
            bytes_in,
            file_bytes: w.file_bytes,
            chunks: w.chunk_refs,
            unique_chunks: w.unique_chunks,
            holes: w.holes,
            dict_chunks: w.dict_chunks,
            unique_bytes: w.unique_bytes,
            stored_bytes: w.stored_bytes,
            bytes_written: w.new_blob.map_or(0, |b| b.1) + w.bootstrap_bytes,
            bootstrap_bytes: w.bootstrap_bytes,
            bootstrap_digest: format!("sha256:{}", hex::encode(w.bootstrap_sha256)),
            new_blob: w.new_blob.as_ref().map(blob),
            blob_rewritten: w.blob_rewritten,
            blobs: w.blobs.iter().map(blob).collect(),
            dedup_ratio: ratio(w.file_bytes - w.holes_bytes, w.unique_bytes),
            compression_ratio: ratio(w.unique_bytes, w.stored_bytes),
            seconds,
            mb_per_s: bytes_in as f64 / 1e6 / seconds.max(1e-9),
            prefetch_missing: w.prefetch_missing,
            layer_bootstraps: w
                .prefixes
                .iter()
                .map(|&(layers, bytes, sha256)| LayerBootstrap {
                    layers,
                    path: self.out_dir.join(format!("bootstrap.layers-{layers}")),
                    bytes,
                    digest: format!("sha256:{}", hex::encode(sha256)),
                })
                .collect(),
            // One tree per indexed layer, in the same order.
            own_layer_bootstraps: w
                .own_layers
                .iter()
                .zip(&self.indexed)
                .map(|(&(layer, bytes, sha256), indexed)| OwnLayerBootstrap {
                    layer,
                    path: self.out_dir.join(own_layer_file(layer)),
                    bytes,
                    digest: format!("sha256:{}", hex::encode(sha256)),
                    diff_size: indexed.uncompressed,
                })
                .collect(),
        })
    }
}
