//! `tessera index IMAGE`: lets a plain OCI image start lazily without converting it.
//!
//! Per platform: pull the gzip layers (each verified), build an index
//! (`rafs_format::builder::Builder::index_gzip_layer`, format.md §17): a bootstrap whose
//! chunks are spans of the original layers, plus a small blob of checkpoint windows;
//! push both into the image's own repository as an OCI 1.1 artifact whose `subject` is
//! the image manifest ([`crate::registry::referrers`]). The image, its tags and its
//! digests are untouched; the index is found again by the manifest's digest.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rafs_format::builder::{BuildOptions, BuildSummary, Builder};
use serde::Serialize;

use crate::convert::{compress_file, pull_layers, sha256_file, ConvertProgress};
use crate::registry::client::RegistryClient;
use crate::registry::image::{
    self, PlatformImage, BLOB_MEDIA_TYPE, BOOTSTRAP_DIGEST_ANNOTATION, BOOTSTRAP_MEDIA_TYPE,
    INDEX_DIFF_SIZE_ANNOTATION, INDEX_LAYERS_ANNOTATION, INDEX_LAYER_ANNOTATION,
    SOURCE_DIGEST_ANNOTATION,
};
use crate::registry::reference::{Platform, Reference};
use crate::registry::referrers::{self, Artifact, Descriptor};
use crate::{Error, Result};

pub use crate::registry::image::INDEX_ARTIFACT_TYPE;

/// What to index and how.
#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Chunking and digests: the same as `tessera convert`'s, so an index and a
    /// converted image of the same layers share their chunks.
    pub build: BuildOptions,
    pub platform: Platform,
    /// Index every platform of a multi-platform image (one index per manifest).
    pub all_platforms: bool,
    /// Scratch space for layers and the built index (removed by the caller).
    pub work_dir: PathBuf,
}

/// What `tessera index` did, for people (`Display`) and machines (`Serialize`).
#[derive(Debug, Clone, Serialize)]
pub struct IndexSummary {
    pub image: String,
    pub images: Vec<IndexedImage>,
    pub seconds: f64,
}

/// One platform manifest's index.
#[derive(Debug, Clone, Serialize)]
pub struct IndexedImage {
    pub platform: Option<String>,
    /// The image manifest the index is for (its `subject`).
    pub manifest_digest: String,
    /// The index artifact's manifest.
    pub index_digest: String,
    /// Compressed bytes of the image's layers.
    pub layer_bytes: u64,
    /// Bytes of the index in the registry: the bootstraps (zstd; the whole tree's and
    /// its layer prefixes') and the window blob.
    pub index_bytes: u64,
    pub build: BuildSummary,
}

impl std::fmt::Display for IndexSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        writeln!(f, "indexed {}", self.image)?;
        for i in &self.images {
            writeln!(
                f,
                "  {:<10} manifest {}: {} files, {} chunks; index {:.2} MiB for {:.1} MiB of layers ({:.2}%), artifact {}",
                i.platform.as_deref().unwrap_or("image"),
                i.manifest_digest,
                i.build.inodes,
                i.build.unique_chunks,
                mib(i.index_bytes),
                mib(i.layer_bytes),
                100.0 * i.index_bytes as f64 / (i.layer_bytes.max(1)) as f64,
                i.index_digest
            )?;
        }
        writeln!(f, "  time       {:.2} s", self.seconds)
    }
}

fn failed(r: &Reference, reason: impl std::fmt::Display) -> Error {
    Error::Protocol {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        what: "index".into(),
        reason: reason.to_string(),
    }
}

/// Indexes `image` (each platform asked for) and pushes the indexes beside it.
#[tracing::instrument(skip_all, fields(image = %image_ref))]
pub async fn index(
    client: Arc<RegistryClient>,
    image_ref: &Reference,
    opts: &IndexOptions,
    progress: &ConvertProgress,
) -> Result<IndexSummary> {
    let started = Instant::now();
    progress.set_phase("resolve".into());
    let resolved = image::resolve(&client, image_ref).await?;
    let images: Vec<&PlatformImage> = if opts.all_platforms {
        resolved.images.iter().collect()
    } else {
        vec![resolved.pick(image_ref, &opts.platform)?]
    };
    let mut indexed = Vec::new();
    for (n, source) in images.iter().enumerate() {
        let work = opts.work_dir.join(format!("image-{n}"));
        std::fs::create_dir_all(&work).map_err(|e| Error::io("create", &work, e))?;
        indexed.push(index_one(&client, source, opts, progress, &work).await?);
        std::fs::remove_dir_all(&work).map_err(|e| Error::io("remove", &work, e))?;
    }
    Ok(IndexSummary {
        image: image_ref.to_string(),
        images: indexed,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Whether a layer's media type is gzip-compressed tar (OCI or Docker).
fn is_gzip_layer(media_type: &str) -> bool {
    media_type.ends_with("tar+gzip") || media_type.ends_with("tar.gzip")
}

async fn index_one(
    client: &Arc<RegistryClient>,
    source: &PlatformImage,
    opts: &IndexOptions,
    progress: &ConvertProgress,
    work: &Path,
) -> Result<IndexedImage> {
    let label = source.label();
    if image::bootstrap_layer(source).is_ok() {
        return Err(failed(
            &source.reference,
            "this is a Tessera image already: it starts lazily as it is",
        ));
    }
    let layers = source.manifest.layers();
    for (i, layer) in layers.iter().enumerate() {
        let media_type = layer.media_type().to_string();
        if !is_gzip_layer(&media_type) {
            return Err(failed(
                &source.reference,
                format!(
                    "cannot index layer {i} ({}): its media type is {media_type}; only gzip \
                     layers can be indexed (convert this image with `tessera convert` instead)",
                    layer.digest()
                ),
            ));
        }
    }
    progress.set_phase(format!("pull {label}"));
    let paths = pull_layers(client, source, work, progress).await?;

    progress.set_phase(format!("build {label}"));
    let mut build_opts = opts.build.clone();
    build_opts.progress = Some(progress.build.clone());
    let expected: Vec<(String, u64)> = layers
        .iter()
        .map(|l| (l.digest().to_string(), l.size()))
        .collect();
    let out = work.join("index");
    let image_dir = out.clone();
    let reference = source.reference.clone();
    let build = tokio::task::spawn_blocking(move || -> Result<BuildSummary> {
        let mut builder = Builder::new(&out, build_opts)?;
        for (path, (digest, size)) in paths.iter().zip(&expected) {
            let f = std::fs::File::open(path).map_err(|e| Error::io("open layer", path, e))?;
            let (got, got_size) =
                builder.index_gzip_layer(std::io::BufReader::with_capacity(1 << 20, f))?;
            let got = format!("sha256:{}", hex::encode(got));
            if (&got, got_size) != (digest, *size) {
                return Err(failed(
                    &reference,
                    format!("layer {digest} ({size} bytes) read as {got} ({got_size} bytes)"),
                ));
            }
            let _ = std::fs::remove_file(path);
        }
        Ok(builder.finish()?)
    })
    .await
    .map_err(|e| failed(&source.reference, format!("build task: {e}")))??;

    progress.set_phase(format!("push {label}"));
    let repo = Reference {
        tag: None,
        digest: None,
        ..source.reference.clone()
    };
    let bootstrap_zst = work.join("bootstrap.zst");
    compress_file(&image_dir.join("bootstrap"), &bootstrap_zst)?;
    let (bootstrap_digest, bootstrap_size) = sha256_file(&bootstrap_zst)?;
    let mut pushed_layers = Vec::new();
    let on_progress = |n: u64| {
        progress.pushed.fetch_add(n, Ordering::Relaxed);
    };
    let windows = build.new_blob.as_ref();
    progress.push_total.fetch_add(
        windows.map_or(0, |b| b.size) + bootstrap_size,
        Ordering::Relaxed,
    );
    if let Some(blob) = windows {
        let hex = blob.digest.trim_start_matches("sha256:");
        let path = image_dir.join("blobs").join(hex);
        client
            .push_blob(&repo, &blob.digest, blob.size, &path, None, &on_progress)
            .await?;
        pushed_layers.push(Descriptor {
            media_type: BLOB_MEDIA_TYPE.into(),
            digest: blob.digest.clone(),
            size: blob.size,
            artifact_type: None,
            annotations: Default::default(),
        });
    }
    client
        .push_blob(
            &repo,
            &bootstrap_digest,
            bootstrap_size,
            &bootstrap_zst,
            None,
            &on_progress,
        )
        .await?;
    pushed_layers.push(Descriptor {
        media_type: BOOTSTRAP_MEDIA_TYPE.into(),
        digest: bootstrap_digest,
        size: bootstrap_size,
        artifact_type: None,
        annotations: [(
            BOOTSTRAP_DIGEST_ANNOTATION.to_string(),
            build.bootstrap_digest.clone(),
        )]
        .into(),
    });
    // The trees of the first layers (format.md §17.5), for the snapshotter, and each
    // layer's own tree (§17.7), for containers/storage's additional layer store: more
    // bootstraps, each annotated with which tree it holds.
    let prefixes = build.layer_bootstraps.iter().map(|prefix| {
        let tree = vec![(INDEX_LAYERS_ANNOTATION, prefix.layers.to_string())];
        (&prefix.path, &prefix.digest, tree)
    });
    let layer_trees = build.own_layer_bootstraps.iter().map(|layer| {
        let tree = vec![
            (INDEX_LAYER_ANNOTATION, layer.layer.to_string()),
            (INDEX_DIFF_SIZE_ANNOTATION, layer.diff_size.to_string()),
        ];
        (&layer.path, &layer.digest, tree)
    });
    for (path, bootstrap_digest, tree) in prefixes.chain(layer_trees) {
        let mut zst = path.file_name().unwrap_or_default().to_os_string();
        zst.push(".zst");
        let zst = work.join(zst);
        compress_file(path, &zst)?;
        let (digest, size) = sha256_file(&zst)?;
        progress.push_total.fetch_add(size, Ordering::Relaxed);
        client
            .push_blob(&repo, &digest, size, &zst, None, &on_progress)
            .await?;
        let bootstrap = (BOOTSTRAP_DIGEST_ANNOTATION, bootstrap_digest.clone());
        pushed_layers.push(Descriptor {
            media_type: BOOTSTRAP_MEDIA_TYPE.into(),
            digest,
            size,
            artifact_type: None,
            annotations: std::iter::once(bootstrap)
                .chain(tree)
                .map(|(key, value)| (key.to_string(), value))
                .collect(),
        });
    }
    let subject = Descriptor {
        media_type: source.raw.media_type.clone(),
        digest: source.raw.digest.clone(),
        size: source.raw.bytes.len() as u64,
        artifact_type: None,
        annotations: Default::default(),
    };
    let artifact = Artifact {
        subject: &subject,
        artifact_type: INDEX_ARTIFACT_TYPE,
        layers: &pushed_layers,
        annotations: [(
            SOURCE_DIGEST_ANNOTATION.to_string(),
            source.raw.digest.clone(),
        )]
        .into(),
    };
    let pushed = referrers::push(client, &repo, &artifact).await?;
    tracing::info!(platform = %label, index = %pushed.digest, "indexed");
    Ok(IndexedImage {
        platform: source.platform.as_ref().map(ToString::to_string),
        manifest_digest: source.raw.digest.clone(),
        index_digest: pushed.digest,
        layer_bytes: layers.iter().map(|l| l.size()).sum(),
        index_bytes: pushed_layers.iter().map(|l| l.size).sum(),
        build,
    })
}
