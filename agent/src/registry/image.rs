//! Images in a registry as Tessera sees them: resolving a reference to the manifest of
//! each platform, the media types and annotations that make an OCI image a Tessera
//! image (specified in docs/format.md), fetching the bootstrap, and reading blobs by
//! Range request as a [`BlobSource`] so `check` and `unpack` work on a registry image.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use rafs_format::reader::{BlobInfo, BlobSource, Bootstrap};

use super::client::{Manifest, RegistryClient};
use super::reference::{Platform, Reference};
use crate::{Error, Result};

/// The bootstrap layer: the bootstrap file compressed with zstd.
pub const BOOTSTRAP_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.tessera.bootstrap.v1+zstd";
/// A blob layer: chunks, each compressed on its own; the layer itself is not.
pub const BLOB_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.tessera.blob.v1";
/// On the bootstrap layer, `"true"`.
pub const BOOTSTRAP_ANNOTATION: &str = "io.tessera.rafs.bootstrap";
/// On the bootstrap layer: `sha256:` of the uncompressed bootstrap.
pub const BOOTSTRAP_DIGEST_ANNOTATION: &str = "io.tessera.rafs.bootstrap.digest";
/// On a blob layer, `"true"`.
pub const BLOB_ANNOTATION: &str = "io.tessera.rafs.blob";
/// On the manifest and the bootstrap layer: the digest of the source image's manifest.
pub const SOURCE_DIGEST_ANNOTATION: &str = "io.tessera.source.digest";
/// On the manifest: the source image reference as given to `tessera convert`.
pub const SOURCE_REF_ANNOTATION: &str = "io.tessera.source.ref";

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// One platform's image manifest, verified, with the reference pinned to its digest.
#[derive(Debug, Clone)]
pub struct PlatformImage {
    /// The repository, pinned `@` this manifest's digest.
    pub reference: Reference,
    pub manifest: ImageManifest,
    pub raw: Manifest,
    /// From the index entry that named it; `None` for a single-manifest image.
    pub platform: Option<Platform>,
}

impl PlatformImage {
    /// Its platform's name for people (`linux/amd64`), or `image` for a
    /// single-manifest image.
    pub fn label(&self) -> String {
        self.platform
            .as_ref()
            .map_or_else(|| "image".to_string(), ToString::to_string)
    }
}

/// What a reference resolved to.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The index, when the reference names a multi-platform image.
    pub index: Option<Manifest>,
    pub images: Vec<PlatformImage>,
}

fn protocol(r: &Reference, what: &str, reason: String) -> Error {
    Error::Protocol {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        what: what.to_string(),
        reason,
    }
}

fn is_index(m: &Manifest) -> bool {
    if m.media_type == OCI_INDEX || m.media_type == DOCKER_LIST {
        return true;
    }
    // Some registries answer `application/json`; the document says what it is.
    #[derive(serde::Deserialize)]
    struct Probe {
        manifests: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Probe>(&m.bytes).is_ok_and(|p| p.manifests.is_some())
}

pub(crate) fn platform_of(d: &Descriptor) -> Option<Platform> {
    d.platform().as_ref().map(|p| Platform {
        os: p.os().to_string(),
        architecture: p.architecture().to_string(),
        variant: p.variant().clone(),
    })
}

fn parse_image(r: &Reference, m: &Manifest) -> Result<ImageManifest> {
    serde_json::from_slice(&m.bytes).map_err(|e| {
        protocol(
            r,
            &format!("manifest {}", m.digest),
            format!("not an image manifest: {e}"),
        )
    })
}

/// What a manifest document is.
#[derive(Debug)]
pub(crate) enum Document {
    Image(Box<ImageManifest>),
    Index(Box<ImageIndex>),
}

/// Parses a verified manifest document as an image manifest or an index.
pub(crate) fn parse_document(r: &Reference, m: &Manifest) -> Result<Document> {
    if !is_index(m) {
        return parse_image(r, m).map(|i| Document::Image(Box::new(i)));
    }
    serde_json::from_slice(&m.bytes)
        .map(|i| Document::Index(Box::new(i)))
        .map_err(|e| {
            protocol(
                r,
                &format!("index {}", m.digest),
                format!("not an image index: {e}"),
            )
        })
}

/// Resolves `r` to every platform image it names (attestation entries, platform
/// `unknown/unknown`, are not images and are left out), or to the one image it is.
pub async fn resolve(client: &RegistryClient, r: &Reference) -> Result<Resolved> {
    let top = client.manifest(r).await?;
    let index = match parse_document(r, &top)? {
        Document::Image(manifest) => {
            let reference = Reference {
                digest: Some(top.digest.clone()),
                ..r.clone()
            };
            return Ok(Resolved {
                index: None,
                images: vec![PlatformImage {
                    reference,
                    manifest: *manifest,
                    raw: top,
                    platform: None,
                }],
            });
        }
        Document::Index(index) => index,
    };
    let mut images = Vec::new();
    for d in index.manifests() {
        let platform = platform_of(d);
        if platform.as_ref().is_some_and(|p| p.os == "unknown") {
            continue;
        }
        let reference = Reference {
            tag: None,
            digest: Some(d.digest().to_string()),
            ..r.clone()
        };
        let raw = client.manifest(&reference).await?;
        let Document::Image(manifest) = parse_document(&reference, &raw)? else {
            return Err(protocol(
                r,
                &format!("index {}", top.digest),
                format!(
                    "entry {} is itself an index; nested indexes are not supported",
                    raw.digest
                ),
            ));
        };
        images.push(PlatformImage {
            manifest: *manifest,
            reference,
            raw,
            platform,
        });
    }
    Ok(Resolved {
        index: Some(top),
        images,
    })
}

/// Resolves `r` to the image for `platform` (the only image if `r` is not an index).
pub async fn resolve_platform(
    client: &RegistryClient,
    r: &Reference,
    platform: &Platform,
) -> Result<PlatformImage> {
    let resolved = resolve(client, r).await?;
    Ok(resolved.pick(r, platform)?.clone())
}

impl Resolved {
    /// The image for `platform`: the only image of a single-manifest reference, else
    /// the index entry that matches.
    pub fn pick(&self, r: &Reference, platform: &Platform) -> Result<&PlatformImage> {
        let found = if self.index.is_none() {
            self.images.first()
        } else {
            self.images.iter().find(|i| {
                i.platform
                    .as_ref()
                    .is_some_and(|p| platform.matches(&p.os, &p.architecture, p.variant.as_deref()))
            })
        };
        found.ok_or_else(|| {
            let offered: Vec<String> = self
                .images
                .iter()
                .filter_map(|i| i.platform.as_ref().map(ToString::to_string))
                .collect();
            protocol(
                r,
                "index",
                format!(
                    "no image for platform {platform}; it has [{}] (pick one with --platform)",
                    offered.join(", ")
                ),
            )
        })
    }
}

/// The image config's `rootfs.diff_ids` (untrusted bytes; the caller checked them
/// against the manifest's config digest), one sha256 digest per layer of the manifest.
pub fn diff_ids(image: &PlatformImage, config: &[u8]) -> Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Config {
        rootfs: RootFs,
    }
    #[derive(serde::Deserialize)]
    struct RootFs {
        diff_ids: Vec<String>,
    }
    let protocol = |reason: String| Error::Protocol {
        registry: image.reference.registry.clone(),
        repository: image.reference.repository.clone(),
        what: format!("config {}", image.manifest.config().digest()),
        reason,
    };
    let config: Config =
        serde_json::from_slice(config).map_err(|e| protocol(format!("no rootfs.diff_ids: {e}")))?;
    let ids = config.rootfs.diff_ids;
    let layers = image.manifest.layers().len();
    if ids.len() != layers {
        return Err(protocol(format!(
            "rootfs.diff_ids has {} entries for {layers} layers",
            ids.len()
        )));
    }
    if let Some(bad) = ids.iter().find(|d| !is_sha256_digest(d)) {
        return Err(protocol(format!(
            "rootfs.diff_ids: {bad:?} is not a sha256 digest"
        )));
    }
    Ok(ids)
}

/// The largest image config read (configs are a few KiB; this bounds a hostile one).
pub const MAX_CONFIG: u64 = 16 << 20;

/// The image's config blob, verified (digest and size).
pub async fn fetch_config(registry: &RegistryClient, image: &PlatformImage) -> Result<Vec<u8>> {
    let desc = image.manifest.config();
    let digest = desc.digest().to_string();
    let protocol = |reason: String| Error::Protocol {
        registry: image.reference.registry.clone(),
        repository: image.reference.repository.clone(),
        what: format!("config {digest}"),
        reason,
    };
    if desc.size() > MAX_CONFIG {
        return Err(protocol(format!(
            "{} bytes, more than the {MAX_CONFIG} an image config may have here",
            desc.size()
        )));
    }
    let mut config = Vec::with_capacity(desc.size() as usize);
    let len = registry
        .blob(&image.reference, &digest, &mut config)
        .await?;
    if len != desc.size() {
        return Err(protocol(format!(
            "{len} bytes where the manifest says {}",
            desc.size()
        )));
    }
    Ok(config)
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The bootstrap layer of a Tessera image, or an error saying the image is not one.
pub fn bootstrap_layer(image: &PlatformImage) -> Result<&Descriptor> {
    image
        .manifest
        .layers()
        .iter()
        .find(|l| {
            l.media_type().to_string() == BOOTSTRAP_MEDIA_TYPE
                || l.annotations()
                    .as_ref()
                    .and_then(|a| a.get(BOOTSTRAP_ANNOTATION))
                    .is_some_and(|v| v == "true")
        })
        .ok_or_else(|| {
            protocol(
                &image.reference,
                &format!("manifest {}", image.raw.digest),
                "not a Tessera image: no bootstrap layer (convert it with `tessera convert`)"
                    .into(),
            )
        })
}

/// The `artifactType` of an index of a plain image (format.md §17), pushed by
/// `tessera index` as a referrer of the image manifest.
pub const INDEX_ARTIFACT_TYPE: &str = "application/vnd.tessera.index.v1";

/// On a bootstrap layer of an index: how many of the image's layers its tree covers
/// (a layer prefix, format.md §17.5); absent on the bootstrap of the whole tree.
pub const INDEX_LAYERS_ANNOTATION: &str = "io.tessera.index.layers";

/// On a bootstrap layer of an index: the one image layer (0-based, in decimal) whose
/// own tree it is, as an overlay layer (format.md §17.7).
pub const INDEX_LAYER_ANNOTATION: &str = "io.tessera.index.layer";

/// Beside [`INDEX_LAYER_ANNOTATION`]: that layer's uncompressed size (its tar's bytes),
/// which containers/storage wants for a layer it did not unpack.
pub const INDEX_DIFF_SIZE_ANNOTATION: &str = "io.tessera.index.diff-size";

/// Which tree of an image a bootstrap holds: an index has one per layer prefix
/// (format.md §17.5) and one per layer (§17.7) beside the whole image's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Layers {
    /// Every layer merged: the image.
    #[default]
    All,
    /// The first `k` layers merged (the whole image when `k` is all of them).
    First(u32),
    /// Layer `k` (0-based) alone, in overlayfs's form: whiteouts as character devices
    /// 0/0, opaque directories marked by an xattr.
    Only(u32),
}

impl Layers {
    /// The snapshotter's "first `k` layers, or all of them".
    pub fn first(layers: Option<u32>) -> Layers {
        layers.map_or(Layers::All, Layers::First)
    }
}

impl std::fmt::Display for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layers::All => f.write_str("all layers"),
            Layers::First(k) => write!(f, "the first {k} layers"),
            Layers::Only(k) => write!(f, "layer {k} alone"),
        }
    }
}

/// Where an image's bootstrap is: a layer of the image itself (a Tessera image), or a
/// layer of the index pushed beside it (a plain image, format.md §17).
#[derive(Debug, Clone)]
pub struct BootstrapLocation {
    /// The (zstd) bootstrap layer, in the image's repository.
    pub layer: Descriptor,
    /// For a plain image: the index's artifact manifest.
    pub index: Option<IndexArtifact>,
}

/// The index of a plain image, as its artifact manifest describes it.
#[derive(Debug, Clone)]
pub struct IndexArtifact {
    /// The artifact manifest's digest.
    pub digest: String,
    /// The digests of its layers: the bootstrap and the blob of checkpoint windows.
    pub layers: Vec<String>,
    /// The image layers it has a tree of their own for (§17.7), in order, with their
    /// uncompressed sizes where the index says.
    pub layer_trees: Vec<LayerTree>,
}

/// An index's tree of one image layer alone (format.md §17.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerTree {
    /// The image layer (0-based).
    pub layer: u32,
    /// Its uncompressed size ([`INDEX_DIFF_SIZE_ANNOTATION`]).
    pub diff_size: Option<u64>,
}

/// Where `image`'s bootstrap of `layers` is: the tree of all its layers, of its first
/// `k` (a prefix an index holds, format.md §17.5; the whole tree when `k` is all of
/// them), or of one layer alone (§17.7, only an index has them). A plain image's index
/// is the newest referrer of its manifest of [`INDEX_ARTIFACT_TYPE`], refused unless
/// its manifest names this manifest as its `subject`; an image with neither is an
/// error saying how to make one.
pub async fn locate_bootstrap(
    client: &RegistryClient,
    image: &PlatformImage,
    layers: Layers,
) -> Result<BootstrapLocation> {
    let count = image.manifest.layers().len();
    let wanted = match layers {
        Layers::First(k) if k as usize >= count => Layers::All,
        other => other,
    };
    if let Ok(layer) = bootstrap_layer(image) {
        if let Layers::Only(k) = wanted {
            return Err(protocol(
                &image.reference,
                &format!("manifest {}", image.raw.digest),
                format!(
                    "a converted image has no tree of layer {k} alone (only an index of a \
                     plain image has one per layer)"
                ),
            ));
        }
        return Ok(BootstrapLocation {
            layer: layer.clone(),
            index: None,
        });
    }
    let subject = &image.raw.digest;
    let found =
        super::referrers::list(client, &image.reference, subject, Some(INDEX_ARTIFACT_TYPE))
            .await?;
    let Some(newest) = found.last() else {
        return Err(protocol(
            &image.reference,
            &format!("manifest {subject}"),
            format!(
                "a plain image with no index: it cannot start lazily until one is made \
                 (`tessera index {}`, which leaves the image as it is) or it is converted \
                 (`tessera convert`)",
                image.reference
            ),
        ));
    };
    let at = Reference {
        tag: None,
        digest: Some(newest.digest.clone()),
        ..image.reference.clone()
    };
    let raw = client.manifest(&at).await?;
    let what = format!("index {} of manifest {subject}", raw.digest);
    let artifact = parse_image(&at, &raw)?;
    let named = artifact.subject().as_ref().map(|d| d.digest().to_string());
    if named.as_deref() != Some(subject.as_str()) {
        return Err(protocol(
            &image.reference,
            &what,
            format!(
                "its subject is {}, not this manifest: refused (make a new index with \
                 `tessera index {}`)",
                named.as_deref().unwrap_or("missing"),
                image.reference
            ),
        ));
    }
    let bootstraps = artifact
        .layers()
        .iter()
        .filter(|l| l.media_type().to_string() == BOOTSTRAP_MEDIA_TYPE);
    let layer = bootstraps
        .clone()
        .find(|l| tree_of(l) == Some(wanted))
        .cloned()
        .ok_or_else(|| {
            let missing = match wanted {
                Layers::All => "it has no bootstrap layer".into(),
                Layers::First(k) => format!("it has no bootstrap of the first {k} layers"),
                Layers::Only(k) => format!(
                    "it has no tree of layer {k} alone (an index made before those existed: \
                     make a new one with `tessera index {}`)",
                    image.reference
                ),
            };
            protocol(&image.reference, &what, missing)
        })?;
    let layer_trees = bootstraps
        .filter_map(|l| match tree_of(l)? {
            Layers::Only(k) if (k as usize) < count => Some(LayerTree {
                layer: k,
                diff_size: annotation(l, INDEX_DIFF_SIZE_ANNOTATION).and_then(|v| v.parse().ok()),
            }),
            _ => None,
        })
        .collect();
    Ok(BootstrapLocation {
        layer,
        index: Some(IndexArtifact {
            digest: raw.digest.clone(),
            layers: artifact
                .layers()
                .iter()
                .map(|l| l.digest().to_string())
                .collect(),
            layer_trees,
        }),
    })
}

fn annotation<'a>(layer: &'a Descriptor, key: &str) -> Option<&'a String> {
    layer.annotations().as_ref()?.get(key)
}

/// Which tree a bootstrap layer of an index holds, by its annotations (`None`: one
/// that does not parse, which nothing asks for).
fn tree_of(layer: &Descriptor) -> Option<Layers> {
    let number = |key| annotation(layer, key).map(|k| k.parse::<u32>().ok());
    match (
        number(INDEX_LAYERS_ANNOTATION),
        number(INDEX_LAYER_ANNOTATION),
    ) {
        (None, None) => Some(Layers::All),
        (Some(k), None) => k.map(Layers::First),
        (None, Some(k)) => k.map(Layers::Only),
        (Some(_), Some(_)) => None,
    }
}

impl BootstrapLocation {
    /// Checks that a bootstrap from here reads the image it was found for: an index's
    /// blobs must be the image's own layers (same digest and size) and its own window
    /// blob, every layer among them. A Tessera image's bootstrap is its own.
    pub fn check(&self, image: &PlatformImage, bootstrap: &Bootstrap) -> Result<()> {
        let Some(index) = &self.index else {
            return Ok(());
        };
        let refuse = |reason: String| {
            protocol(
                &image.reference,
                &format!("index {} of manifest {}", index.digest, image.raw.digest),
                format!(
                    "{reason}: it was made for another image; make a new one with \
                     `tessera index {}`",
                    image.reference
                ),
            )
        };
        let layers: HashMap<String, u64> = image
            .manifest
            .layers()
            .iter()
            .map(|l| (l.digest().to_string(), l.size()))
            .collect();
        let blobs = bootstrap.blobs()?;
        for blob in &blobs {
            let digest = blob.oci_digest();
            match layers.get(&digest) {
                Some(&size) if size == blob.size => {}
                Some(&size) => {
                    return Err(refuse(format!(
                        "its blob {digest} has {} bytes, the image's layer {size}",
                        blob.size
                    )))
                }
                None if index.layers.contains(&digest) => {}
                None => {
                    return Err(refuse(format!(
                        "its blob {digest} is not a layer of this image"
                    )))
                }
            }
        }
        if let Some(missing) = layers
            .keys()
            .find(|l| !blobs.iter().any(|b| &b.oci_digest() == *l))
        {
            return Err(refuse(format!(
                "it does not cover the image's layer {missing}"
            )));
        }
        Ok(())
    }
}

/// Downloads, verifies and decompresses the image's bootstrap into `dir/bootstrap`;
/// returns that path. The caller opens it with its checksum checked.
pub async fn fetch_bootstrap(
    client: &RegistryClient,
    image: &PlatformImage,
    dir: &Path,
) -> Result<PathBuf> {
    let bytes = bootstrap_bytes(client, image).await?;
    let path = dir.join("bootstrap");
    tokio::fs::write(&path, bytes)
        .await
        .map_err(|e| Error::io("write", &path, e))?;
    Ok(path)
}

/// [`fetch_bootstrap`] of a Tessera image, or of a plain image's index
/// ([`locate_bootstrap`]; checked against the image).
pub async fn fetch_bootstrap_or_index(
    client: &RegistryClient,
    image: &PlatformImage,
    dir: &Path,
) -> Result<PathBuf> {
    let location = locate_bootstrap(client, image, Layers::All).await?;
    let bytes = bootstrap_bytes_at(client, image, &location.layer).await?;
    let bootstrap = Bootstrap::from_bytes(bytes, rafs_format::reader::Verify::Checksum)?;
    location.check(image, &bootstrap)?;
    let path = dir.join("bootstrap");
    tokio::fs::write(&path, bootstrap.as_bytes())
        .await
        .map_err(|e| Error::io("write", &path, e))?;
    Ok(path)
}

/// Downloads, verifies and decompresses the image's bootstrap in memory (it is small,
/// and a mount must not need disk space for it); the caller checks its checksum.
pub async fn bootstrap_bytes(client: &RegistryClient, image: &PlatformImage) -> Result<Vec<u8>> {
    bootstrap_bytes_at(client, image, bootstrap_layer(image)?).await
}

/// [`bootstrap_bytes`] of the bootstrap `layer` (the image's own, or its index's).
pub async fn bootstrap_bytes_at(
    client: &RegistryClient,
    image: &PlatformImage,
    layer: &Descriptor,
) -> Result<Vec<u8>> {
    let digest = layer.digest().to_string();
    let mut compressed = Vec::new();
    client
        .blob(&image.reference, &digest, &mut compressed)
        .await?;
    let bad = |reason: String| {
        protocol(
            &image.reference,
            &format!("bootstrap layer {digest}"),
            reason,
        )
    };
    tokio::task::spawn_blocking(move || zstd::stream::decode_all(compressed.as_slice()))
        .await
        .map_err(|e| bad(format!("decompress: {e}")))?
        .map_err(|e| bad(format!("decompress: {e}")))
}

/// Size of the window read around a requested range: chunks are laid out in reading
/// order, so reading ahead turns one request per chunk into one per few MiB.
const READ_AHEAD: u64 = 4 << 20;

/// Bytes of a blob read ahead: where they start, and the bytes.
type Window = (u64, Arc<Vec<u8>>);

/// An image's blobs in a registry, read with Range requests. Synchronous (it implements
/// [`BlobSource`] for `rafs_format::image`), so it must be used from a thread outside
/// the tokio runtime it is given.
#[derive(Debug)]
pub struct RemoteBlobs {
    client: Arc<RegistryClient>,
    reference: Reference,
    runtime: tokio::runtime::Handle,
    /// The last window read from each blob, by blob table index.
    windows: Mutex<HashMap<u32, Window>>,
}

impl RemoteBlobs {
    pub fn new(
        client: Arc<RegistryClient>,
        reference: Reference,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        RemoteBlobs {
            client,
            reference,
            runtime,
            windows: Mutex::new(HashMap::new()),
        }
    }

    fn fetch_error(&self, blob: &BlobInfo, offset: u64, len: u64, e: Error) -> rafs_format::Error {
        rafs_format::Error::Fetch {
            blob: blob.oci_digest(),
            offset,
            len,
            source_name: format!("{}/{}", self.reference.registry, self.reference.repository),
            reason: e.to_string(),
        }
    }
}

impl BlobSource for RemoteBlobs {
    fn read_at(&self, blob: &BlobInfo, offset: u64, len: u32) -> rafs_format::Result<Vec<u8>> {
        let end = offset + u64::from(len);
        {
            let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((start, data)) = windows.get(&blob.index) {
                if *start <= offset && end <= start + data.len() as u64 {
                    let from = (offset - start) as usize;
                    return Ok(data[from..from + len as usize].to_vec());
                }
            }
        }
        let window_end = end.max(offset + READ_AHEAD).min(blob.size.max(end));
        let data = self
            .runtime
            .block_on(self.client.blob_range(
                &self.reference,
                &blob.oci_digest(),
                offset..window_end,
            ))
            .map_err(|e| self.fetch_error(blob, offset, window_end - offset, e))?;
        let out = data[..len as usize].to_vec();
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(blob.index, (offset, Arc::new(data)));
        Ok(out)
    }

    fn verify_blob(&self, blob: &BlobInfo) -> rafs_format::Result<()> {
        // The client hashes the stream and fails on a mismatch; the size is checked here.
        let mut sink = tokio::io::sink();
        let size = self
            .runtime
            .block_on(
                self.client
                    .blob(&self.reference, &blob.oci_digest(), &mut sink),
            )
            .map_err(|e| match e {
                Error::Digest { actual, .. } => rafs_format::Error::BadBlob {
                    blob: blob.oci_digest(),
                    reason: format!("the registry's copy hashes to {actual}"),
                },
                e => self.fetch_error(blob, 0, blob.size, e),
            })?;
        if size != blob.size {
            return Err(rafs_format::Error::BadBlob {
                blob: blob.oci_digest(),
                reason: format!(
                    "the registry's copy has {size} bytes, the bootstrap expects {}",
                    blob.size
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrap(annotations: &[(&str, &str)]) -> Descriptor {
        let mut d = Descriptor::new(
            BOOTSTRAP_MEDIA_TYPE.into(),
            10,
            oci_spec::image::Digest::try_from(format!("sha256:{}", "a".repeat(64))).unwrap(),
        );
        d.set_annotations(Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        d
    }

    #[test]
    fn an_index_bootstrap_says_which_tree_it_holds() {
        assert_eq!(tree_of(&bootstrap(&[])), Some(Layers::All));
        assert_eq!(
            tree_of(&bootstrap(&[(INDEX_LAYERS_ANNOTATION, "2")])),
            Some(Layers::First(2))
        );
        assert_eq!(
            tree_of(&bootstrap(&[(INDEX_LAYER_ANNOTATION, "0")])),
            Some(Layers::Only(0))
        );
        // Nothing asks for a tree that does not parse, or claims to be two.
        assert_eq!(tree_of(&bootstrap(&[(INDEX_LAYER_ANNOTATION, "x")])), None);
        assert_eq!(
            tree_of(&bootstrap(&[
                (INDEX_LAYERS_ANNOTATION, "1"),
                (INDEX_LAYER_ANNOTATION, "1")
            ])),
            None
        );
        assert_eq!(Layers::first(None), Layers::All);
        assert_eq!(Layers::first(Some(3)), Layers::First(3));
    }
}
