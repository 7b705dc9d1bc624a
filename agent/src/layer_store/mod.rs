//! The additional layer store of containers/storage (Podman, Buildah, CRI-O): a
//! read-only FUSE filesystem at `--store-root` in the layout `storage.conf`'s
//! `additionallayerstores = ["ROOT:ref"]` looks up (docs/research/podman-additional-layer-store.md):
//!
//! ```text
//! ROOT/<base64 of the image reference>/<layer digest>/{diff, info, blob}
//! ```
//!
//! For a Tessera image, the bootstrap layer's `diff` is a symlink to the image's lazy
//! mount (the whole merged tree), the blob layers' `diff`s are empty directories (the
//! snapshotter's trick). For a plain image with an index (`tessera index`), each
//! layer's `diff` is the lazy mount of that layer's own tree (format.md §17.7: its
//! whiteouts in overlayfs's form), since plain layers are shared with other images,
//! pulled through the store or not, and each must show exactly its own changes.
//! `info` is the layer's metadata as JSON, and `blob` the layer's bytes, read by Range
//! request. Anything else (a name that is not base64 of a reference, a plain image
//! without an index of per-layer trees, a registry that cannot be reached) is "not
//! here" (ENOENT): containers/storage then pulls the layer as usual.
//!
//! - `mod.rs` — [`LayerStore`]: references resolved (and cached), their layers, the
//!   lazy mounts of their trees; [`LazyMounts`], what it needs of the daemon.
//! - `filesystem` — the `fuser::Filesystem` over it, and [`serve`]: the mount at the
//!   root and its unmount.
//!
//! Architecture invariant: a `diff` that shows a tree is never an empty stand-in. Its
//! lookup mounts the tree first and fails (EIO) if that fails: an overlay lower
//! directory that is empty would start containers on an empty root filesystem.

mod filesystem;

pub use filesystem::{serve, Served};

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;

use crate::registry::client::RegistryClient;
use crate::registry::image::{
    self as registry_image, Layers, PlatformImage, BLOB_ANNOTATION, BLOB_MEDIA_TYPE,
};
use crate::registry::reference::{Platform, Reference};
use crate::{Error, Result};

/// A future the store awaits on the runtime (so `Send`), boxed so that [`LazyMounts`]
/// can be a trait object.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the store needs of whoever owns the node's mounts and registry credentials:
/// the daemon's `Agent` implements it (a trait, so the store sits below the daemon, as
/// the snapshotter does with its `Images`).
pub trait LazyMounts: Send + Sync + std::fmt::Debug {
    /// The node's registry client: manifests and blobs are read with the node's
    /// credentials.
    fn registry_client(&self) -> &Arc<RegistryClient>;
    /// Mounts the tree `layers` of `image` (by digest) lazily at `dir`, an existing
    /// empty directory.
    fn mount<'a>(
        &'a self,
        image: &'a str,
        layers: Layers,
        dir: &'a Path,
    ) -> BoxFuture<'a, Result<()>>;
    /// Whether an image is mounted at `dir` (canonical) now: someone may have
    /// unmounted it (`tessera umount`). Called on the session thread: no waiting.
    fn serves(&self, dir: &Path) -> bool;
    /// The size of `image`'s bootstrap uncompressed (what its diff ID hashes), fetched
    /// and verified as for a mount (and kept for it).
    fn bootstrap_size<'a>(&'a self, image: &'a PlatformImage) -> BoxFuture<'a, Result<u64>>;
}

/// How long a reference by tag is trusted to name the manifest it resolved to (a tag
/// can move; a reference by digest never does).
const TAG_TTL: Duration = Duration::from_secs(60);
/// How long "not here" is remembered for a name: containers/storage stats three paths
/// under each layer it looks up, each a lookup of the name.
const MISS_TTL: Duration = Duration::from_secs(30);

/// `info`'s `compression` (containers/storage's `archive.Compression`).
const COMPRESSION_NONE: u8 = 0;
const COMPRESSION_GZIP: u8 = 2;
const COMPRESSION_ZSTD: u8 = 4;

/// The store: what the filesystem shows, shared by its session thread and the tasks
/// that resolve references and mount images on the runtime.
#[derive(Debug)]
pub struct LayerStore {
    mounts: Box<dyn LazyMounts>,
    /// Where images' trees are mounted, one directory per manifest digest; kept across
    /// restarts (the agent clears its stale mounts at start).
    trees_dir: PathBuf,
    table: Mutex<Table>,
}

/// Resolved names and the inode numbers handed out for them.
#[derive(Debug, Default)]
struct Table {
    /// By the root's entry name (the base64 of the reference as podman wrote it).
    names: HashMap<OsString, Answer>,
    /// By the first inode number of each image's block (see [`StoreImage::base`]).
    by_base: BTreeMap<u64, Arc<StoreImage>>,
    /// The lazy mount of each tree (by manifest digest and which tree), shared by
    /// every name resolving to it.
    trees: HashMap<(String, Layers), Arc<Tree>>,
    /// The next free inode number (1 is the root).
    next: u64,
}

/// An image found for a name, before it has inode numbers.
#[derive(Debug)]
struct Opened {
    reference: Reference,
    manifest: String,
    by_digest: bool,
    layers: Vec<StoreLayer>,
}

/// What a root entry name resolved to, and when.
#[derive(Debug, Clone)]
enum Answer {
    Found(Arc<StoreImage>, Instant),
    Missing(Instant),
}

/// An image as the store shows it: one block of inode numbers, `base` its directory,
/// then four per layer (see [`Node`]).
#[derive(Debug)]
pub struct StoreImage {
    base: u64,
    /// The repository pinned to the manifest's digest: mounts and blob reads use it.
    reference: Reference,
    /// The manifest's digest.
    manifest: String,
    /// Looked up by digest: the answer never goes stale (a tag can move).
    by_digest: bool,
    layers: Vec<StoreLayer>,
}

/// Where an image's tree is mounted.
#[derive(Debug, Default)]
struct Tree {
    /// The mount point (canonical), once mounted: always the same directory.
    dir: std::sync::OnceLock<PathBuf>,
    /// One mount at a time (lookups of the same `diff` arrive together).
    mounting: tokio::sync::Mutex<()>,
}

/// A layer of an image in the store.
#[derive(Debug, Clone)]
pub struct StoreLayer {
    /// The manifest's layer digest: the directory's name.
    digest: String,
    /// The compressed size (the manifest's), `blob`'s size.
    size: u64,
    /// The tree its `diff` shows: the whole image for a Tessera image's bootstrap
    /// layer, the layer's own for an indexed plain image's; none (an empty directory)
    /// for a Tessera image's blob layers.
    shows: Option<Layers>,
    /// Where that tree is mounted (set when the image gets its inode numbers).
    tree: Option<Arc<Tree>>,
    /// The `info` file.
    info: Vec<u8>,
}

/// What an inode number of the store is.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Root,
    Image(Arc<StoreImage>),
    Layer(Arc<StoreImage>, usize),
    File(Arc<StoreImage>, usize, LayerFile),
}

/// The three entries of a layer directory, in the order their inode numbers follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerFile {
    Diff = 1,
    Info = 2,
    Blob = 3,
}

impl LayerFile {
    pub(crate) const ALL: [LayerFile; 3] = [LayerFile::Diff, LayerFile::Info, LayerFile::Blob];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LayerFile::Diff => "diff",
            LayerFile::Info => "info",
            LayerFile::Blob => "blob",
        }
    }
}

/// Inode numbers per layer: its directory, `diff`, `info`, `blob`.
const PER_LAYER: u64 = 4;
pub(crate) const ROOT_INO: u64 = 1;

impl StoreImage {
    pub(crate) fn layer_ino(&self, layer: usize) -> u64 {
        self.base + 1 + layer as u64 * PER_LAYER
    }

    pub(crate) fn file_ino(&self, layer: usize, file: LayerFile) -> u64 {
        self.layer_ino(layer) + file as u64
    }

    pub(crate) fn layers(&self) -> &[StoreLayer] {
        &self.layers
    }

    pub(crate) fn layer_named(&self, name: &[u8]) -> Option<usize> {
        self.layers.iter().position(|l| l.digest.as_bytes() == name)
    }

    pub(crate) fn reference(&self) -> &Reference {
        &self.reference
    }

    fn inodes(&self) -> u64 {
        1 + self.layers.len() as u64 * PER_LAYER
    }
}

impl StoreLayer {
    pub(crate) fn digest(&self) -> &str {
        &self.digest
    }
    pub(crate) fn size(&self) -> u64 {
        self.size
    }
    /// Whether its `diff` is a tree (a symlink to a lazy mount) rather than empty.
    pub(crate) fn shows_tree(&self) -> bool {
        self.shows.is_some()
    }
    /// Where its tree was mounted, if it was (see [`LayerStore::serves`]).
    pub(crate) fn tree(&self) -> Option<&PathBuf> {
        self.tree.as_ref()?.dir.get()
    }
    pub(crate) fn info(&self) -> &[u8] {
        &self.info
    }
}

impl LayerStore {
    /// A store mounting images' trees under `trees_dir` through `mounts`.
    pub fn new(mounts: Box<dyn LazyMounts>, trees_dir: PathBuf) -> LayerStore {
        LayerStore {
            mounts,
            trees_dir,
            table: Mutex::new(Table {
                next: ROOT_INO + 1,
                ..Table::default()
            }),
        }
    }

    pub(crate) fn registry_client(&self) -> &Arc<RegistryClient> {
        self.mounts.registry_client()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What inode `ino` is, if it was handed out.
    pub(crate) fn node(&self, ino: u64) -> Option<Node> {
        if ino == ROOT_INO {
            return Some(Node::Root);
        }
        let table = self.table();
        let (_, image) = table.by_base.range(..=ino).next_back()?;
        let offset = ino - image.base;
        if offset >= image.inodes() {
            return None;
        }
        if offset == 0 {
            return Some(Node::Image(image.clone()));
        }
        let layer = ((offset - 1) / PER_LAYER) as usize;
        Some(match (offset - 1) % PER_LAYER {
            0 => Node::Layer(image.clone(), layer),
            1 => Node::File(image.clone(), layer, LayerFile::Diff),
            2 => Node::File(image.clone(), layer, LayerFile::Info),
            _ => Node::File(image.clone(), layer, LayerFile::Blob),
        })
    }

    /// The answer cached for a root entry `name`, if it is still good.
    pub(crate) fn cached(&self, name: &OsStr) -> Option<Option<Arc<StoreImage>>> {
        match self.table().names.get(name)? {
            Answer::Found(image, at) => {
                let fresh = image.by_digest || at.elapsed() < TAG_TTL;
                fresh.then(|| Some(image.clone()))
            }
            Answer::Missing(at) => (at.elapsed() < MISS_TTL).then_some(None),
        }
    }

    /// Resolves a root entry `name` (base64 of an image reference) to a Tessera image,
    /// or `None` ("not here": logged at debug level, since podman asks about every
    /// image it pulls).
    pub(crate) async fn resolve(&self, name: &OsStr) -> Option<Arc<StoreImage>> {
        if let Some(answer) = self.cached(name) {
            return answer;
        }
        let found = match reference_of(name.as_bytes()) {
            None => None,
            Some(reference) => match self.open(&reference).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(image = %reference, error = %e, "the layer store could not resolve an image; answering \"not here\"");
                    None
                }
            },
        };
        let mut table = self.table();
        let answer = match found {
            None => Answer::Missing(Instant::now()),
            Some(opened) => {
                // The same manifest as before keeps its inodes (and its mount).
                let known = match table.names.get(name) {
                    Some(Answer::Found(old, _)) if old.manifest == opened.manifest => {
                        Some(old.clone())
                    }
                    _ => None,
                };
                let image = known.unwrap_or_else(|| table.insert(opened));
                Answer::Found(image, Instant::now())
            }
        };
        table.names.insert(name.to_os_string(), answer.clone());
        match answer {
            Answer::Found(image, _) => Some(image),
            Answer::Missing(_) => None,
        }
    }

    /// The image `reference` names for this host's platform, if the store can serve
    /// it (a Tessera image, or a plain one with an index of per-layer trees): its
    /// reference pinned to the manifest digest, and its layers.
    async fn open(&self, reference: &Reference) -> Result<Option<Opened>> {
        let client = self.registry_client();
        let image = registry_image::resolve_platform(client, reference, &Platform::host()).await?;
        // What the image is decides whether the store has it, before its config is
        // read: most names podman asks about are "not here".
        enum Kind {
            /// A Tessera image, with its bootstrap layer's digest.
            Converted(String),
            /// A plain image with an index, with its layers' uncompressed sizes.
            Indexed(Vec<u64>),
        }
        let kind = match registry_image::bootstrap_layer(&image) {
            Ok(bootstrap) => Kind::Converted(bootstrap.digest().to_string()),
            Err(_) => match index_diff_sizes(client, &image).await {
                Some(sizes) => Kind::Indexed(sizes),
                None => return Ok(None),
            },
        };
        // containers/storage takes `diff-digest` as the layer's identity without
        // checking it: it comes from the config, verified against the manifest.
        let config = registry_image::fetch_config(client, &image).await?;
        let diff_ids = registry_image::diff_ids(&image, &config)?;
        let layers = match kind {
            Kind::Converted(bootstrap) => {
                self.converted_layers(&image, &bootstrap, &diff_ids).await?
            }
            Kind::Indexed(sizes) => indexed_layers(&image, &sizes, &diff_ids),
        };
        Ok(Some(Opened {
            manifest: image.raw.digest.clone(),
            by_digest: reference.digest.is_some(),
            reference: image.reference,
            layers,
        }))
    }

    /// A Tessera image's layers: the bootstrap layer's `diff` is the whole tree, the
    /// blob layers' are empty.
    async fn converted_layers(
        &self,
        image: &PlatformImage,
        bootstrap: &str,
        diff_ids: &[String],
    ) -> Result<Vec<StoreLayer>> {
        // Podman 4.3 fails to run an image with a layer of unknown size (`diff-size`
        // -1): "size for layer … is unknown". A blob layer is stored uncompressed (its
        // diff ID is its digest), the bootstrap's is the bootstrap's own size.
        let bootstrap_size = self.mounts.bootstrap_size(image).await?;
        let mut layers = Vec::new();
        for (layer, diff_id) in image.manifest.layers().iter().zip(diff_ids) {
            let digest = layer.digest().to_string();
            let media_type = layer.media_type().to_string();
            let is_bootstrap = digest == bootstrap;
            let is_blob = media_type == BLOB_MEDIA_TYPE
                || layer
                    .annotations()
                    .as_ref()
                    .and_then(|a| a.get(BLOB_ANNOTATION))
                    .is_some_and(|v| v == "true");
            if !is_bootstrap && !is_blob {
                // Not Tessera's: podman pulls it as usual.
                continue;
            }
            let uncompressed = match is_bootstrap {
                true => bootstrap_size,
                false => layer.size(),
            };
            let sizes = (layer.size(), uncompressed);
            layers.push(StoreLayer {
                info: info_json(&digest, sizes, diff_id, compression_of(&media_type)),
                digest,
                size: layer.size(),
                shows: is_bootstrap.then_some(Layers::All),
                tree: None,
            });
        }
        Ok(layers)
    }

    /// The image's tree `shows` of layer `layer`, mounted on first need (one mount per
    /// manifest and tree, kept for the agent's life, mounted again if it went away);
    /// its path.
    pub(crate) async fn mount_tree(&self, image: &StoreImage, layer: usize) -> Result<PathBuf> {
        let store_layer = &image.layers[layer];
        let (Some(shows), Some(tree)) = (store_layer.shows, &store_layer.tree) else {
            return Err(Error::Agent(format!(
                "layer {} of {} has no tree to mount",
                store_layer.digest, image.reference
            )));
        };
        let _turn = tree.mounting.lock().await;
        if let Some(dir) = store_layer.tree().filter(|dir| self.serves(dir)) {
            return Ok(dir.clone());
        }
        let mut name = image.manifest.replace(':', "-");
        if let Layers::Only(k) = shows {
            name.push_str(&format!("-layer-{k}"));
        }
        let dir = self.trees_dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| Error::io("resolve", &dir, e))?;
        self.mounts
            .mount(&image.reference.to_string(), shows, &dir)
            .await?;
        tracing::info!(image = %image.reference, tree = %shows, at = %dir.display(), "layer store: mounted an image's tree");
        Ok(tree.dir.get_or_init(|| dir).clone())
    }

    /// Whether the tree at `dir` is mounted now.
    pub(crate) fn serves(&self, dir: &Path) -> bool {
        self.mounts.serves(dir)
    }
}

impl Table {
    /// Hands out a block of inode numbers for a newly resolved image.
    fn insert(&mut self, mut opened: Opened) -> Arc<StoreImage> {
        for layer in &mut opened.layers {
            layer.tree = layer.shows.map(|shows| {
                self.trees
                    .entry((opened.manifest.clone(), shows))
                    .or_default()
                    .clone()
            });
        }
        let image = Arc::new(StoreImage {
            base: self.next,
            reference: opened.reference,
            manifest: opened.manifest,
            by_digest: opened.by_digest,
            layers: opened.layers,
        });
        self.next += image.inodes();
        self.by_base.insert(image.base, image.clone());
        image
    }
}

/// The uncompressed size of each of a plain image's layers, if it has an index with a
/// tree of every layer alone and its size (`tessera index` since format.md §17.7).
/// `None` ("not here", podman pulls as usual) for anything else.
async fn index_diff_sizes(client: &RegistryClient, image: &PlatformImage) -> Option<Vec<u64>> {
    let location = match registry_image::locate_bootstrap(client, image, Layers::All).await {
        Ok(location) => location,
        Err(e) => {
            tracing::debug!(image = %image.reference, error = %e, "neither a Tessera image nor an indexed one: not in the layer store");
            return None;
        }
    };
    let trees = location.index.map(|i| i.layer_trees).unwrap_or_default();
    let sizes = (0..image.manifest.layers().len()).map(|k| {
        let k = u32::try_from(k).ok()?;
        trees.iter().find(|t| t.layer == k)?.diff_size
    });
    let sizes = sizes.collect::<Option<Vec<u64>>>();
    if sizes.is_none() {
        tracing::info!(image = %image.reference, "an index without a tree of each layer alone (made before format.md §17.7): not in the layer store; `tessera index` it again");
    }
    sizes
}

/// An indexed plain image's layers, given their uncompressed sizes: each layer's
/// `diff` is its own tree.
fn indexed_layers(
    image: &PlatformImage,
    diff_sizes: &[u64],
    diff_ids: &[String],
) -> Vec<StoreLayer> {
    let layers = image.manifest.layers().iter().zip(diff_sizes).zip(diff_ids);
    (0u32..)
        .zip(layers)
        .map(|(k, ((layer, &diff_size), diff_id))| {
            let digest = layer.digest().to_string();
            let media_type = layer.media_type().to_string();
            StoreLayer {
                info: info_json(
                    &digest,
                    (layer.size(), diff_size),
                    diff_id,
                    compression_of(&media_type),
                ),
                digest,
                size: layer.size(),
                shows: Some(Layers::Only(k)),
                tree: None,
            }
        })
        .collect()
}

/// The image reference a root entry name encodes: Go's `base64.StdEncoding` (padded)
/// of the reference, as containers/storage writes it.
fn reference_of(name: &[u8]) -> Option<Reference> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(name)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    Reference::parse(&text).ok()
}

/// `info`'s `compression` for a layer of `media_type`.
fn compression_of(media_type: &str) -> u8 {
    if media_type.ends_with("+zstd") || media_type.ends_with(".zstd") {
        COMPRESSION_ZSTD
    } else if media_type.ends_with("+gzip") || media_type.ends_with(".gzip") {
        COMPRESSION_GZIP
    } else {
        COMPRESSION_NONE
    }
}

/// The `info` file: the keys containers/storage's `Layer` reads, as the research
/// found podman 4.3 to take them; `sizes` are the layer's (compressed, uncompressed).
fn info_json(digest: &str, sizes: (u64, u64), diff_id: &str, compression: u8) -> Vec<u8> {
    let mut info = serde_json::json!({
        "compressed-diff-digest": digest,
        "compressed-size": sizes.0,
        "diff-digest": diff_id,
        "diff-size": sizes.1,
        "compression": compression,
    })
    .to_string()
    .into_bytes();
    info.push(b'\n');
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_padded_standard_base64_of_a_reference() {
        // Examples podman 4.3 looked up (the research note).
        let r = reference_of(b"MTI3LjAuMC4xOjUzNzcvdGVzdC9iYjox").unwrap();
        assert_eq!(r.to_string(), "127.0.0.1:5377/test/bb:1");
        let r = reference_of(b"MTI3LjAuMC4xOjUzNzcvdGVzdC9iYjI6MQ==").unwrap();
        assert_eq!(r.to_string(), "127.0.0.1:5377/test/bb2:1");
        // Unpadded, not base64, not a reference.
        assert!(reference_of(b"MTI3LjAuMC4xOjUzNzcvdGVzdC9iYjI6MQ").is_none());
        assert!(reference_of(b"not base64!").is_none());
        let not_a_ref = base64::engine::general_purpose::STANDARD.encode("UPPER/Case:x");
        assert!(reference_of(not_a_ref.as_bytes()).is_none());
    }

    #[test]
    fn info_has_the_keys_podman_reads() {
        let info = info_json(
            "sha256:aa",
            (42, 99),
            "sha256:bb",
            compression_of(registry_image::BOOTSTRAP_MEDIA_TYPE),
        );
        let v: serde_json::Value = serde_json::from_slice(&info).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"compressed-diff-digest": "sha256:aa", "compressed-size": 42,
                "diff-digest": "sha256:bb", "diff-size": 99, "compression": 4})
        );
        assert_eq!(compression_of(BLOB_MEDIA_TYPE), COMPRESSION_NONE);
        assert_eq!(
            compression_of("application/vnd.oci.image.layer.v1.tar+gzip"),
            COMPRESSION_GZIP
        );
    }
}
