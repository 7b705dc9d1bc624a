//! `tessera convert SRC DST`: pull an OCI image, build it into the Tessera format and
//! push it as an OCI image whose layers are the blobs and the bootstrap.
//!
//! Three phases per platform — pull (layers streamed to disk, each verified), build
//! (`rafs_format::builder`, bounded memory), push (blobs, bootstrap, config, then the
//! manifest) — and, for `--all-platforms`, an index last. Pull and build overlap: the
//! build reads each layer's file while it downloads ([`downloads`]). The manifest (or index) is
//! always pushed after everything it names, so a failed conversion leaves DST as it
//! was: blobs without a manifest are invisible and collected by the registry's GC.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rafs_format::builder::{BuildOptions, BuildProgress, BuildSummary, Builder, ChunkDict};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

mod downloads;

use downloads::{Downloads, LayerFile};

use crate::registry::client::{Manifest, PushOutcome, RegistryClient};
use crate::registry::image::{
    self, PlatformImage, BLOB_ANNOTATION, BLOB_MEDIA_TYPE, BOOTSTRAP_ANNOTATION,
    BOOTSTRAP_DIGEST_ANNOTATION, BOOTSTRAP_MEDIA_TYPE, SOURCE_DIGEST_ANNOTATION,
    SOURCE_REF_ANNOTATION,
};
use crate::registry::reference::{Platform, Reference};
use crate::registry::referrers::{self, Descriptor};
use crate::{Error, Result};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Layers downloaded at once.
const PULL_CONCURRENCY: usize = 3;
/// Largest image config accepted (a JSON document; this bounds a hostile one).
const MAX_CONFIG: u64 = 16 << 20;
/// Bootstraps compress well (names, fixed records); they are fetched before a mount
/// is usable, so a higher level pays.
const BOOTSTRAP_ZSTD_LEVEL: i32 = 10;

/// What to convert and how.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Format options, as for `tessera build` (its `chunk_dict` is set from `chunk_dict`).
    pub build: BuildOptions,
    /// The platform to convert from a multi-platform source.
    pub platform: Platform,
    /// Convert every platform of a multi-platform source and push an index.
    pub all_platforms: bool,
    /// An image converted earlier (same registry as DST for blob mounts): its chunks
    /// are referenced instead of pushed again.
    pub chunk_dict: Option<Reference>,
    /// Scratch space for layers and the built image (removed by the caller).
    pub work_dir: PathBuf,
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct ConvertProgress {
    /// What is happening now.
    pub phase: Mutex<Phase>,
    pub pulled: AtomicU64,
    pub pull_total: AtomicU64,
    pub build: Arc<BuildProgress>,
    pub pushed: AtomicU64,
    pub push_total: AtomicU64,
}

/// A phase of a conversion, for rates over the phase alone.
#[derive(Debug, Clone)]
pub struct Phase {
    /// `pull linux/amd64`, `build image`, `push image`, …
    pub name: String,
    pub started: Instant,
    /// The phase's counter (`done`) when it started: counters add up over platforms.
    pub base: u64,
}

impl Default for Phase {
    fn default() -> Self {
        Phase {
            name: String::new(),
            started: Instant::now(),
            base: 0,
        }
    }
}

impl ConvertProgress {
    pub(crate) fn set_phase(&self, name: String) {
        tracing::info!(phase = %name, "convert");
        let mut phase = Phase {
            name,
            started: Instant::now(),
            base: 0,
        };
        phase.base = self.done(&phase).0;
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    /// Bytes done so far in `phase`'s counter, and its total if it has one.
    pub fn done(&self, phase: &Phase) -> (u64, Option<u64>) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        if phase.name.starts_with("pull") {
            (load(&self.pulled), Some(load(&self.pull_total)))
        } else if phase.name.starts_with("build") {
            (load(&self.build.bytes), None)
        } else {
            (load(&self.pushed), Some(load(&self.push_total)))
        }
    }
}

/// What a conversion did, for people (`Display`) and machines (`Serialize`).
#[derive(Debug, Clone, Serialize)]
pub struct ConvertSummary {
    pub source: String,
    pub target: String,
    /// Digest of what `target` now names: the manifest, or the index.
    pub digest: String,
    pub media_type: String,
    pub images: Vec<ImageSummary>,
    /// Compressed bytes of the source's layers (all platforms converted).
    pub source_bytes: u64,
    /// Bytes uploaded to the registry.
    pub pushed_bytes: u64,
    /// Bytes of blobs the registry already had or mounted from the chunk dictionary.
    pub reused_bytes: u64,
    /// From the first layer download's start to the last one's end; the build reads
    /// each layer as it lands, so this overlaps `build_seconds`.
    pub pull_seconds: f64,
    pub build_seconds: f64,
    pub push_seconds: f64,
    pub seconds: f64,
}

/// One platform's conversion.
#[derive(Debug, Clone, Serialize)]
pub struct ImageSummary {
    pub platform: Option<String>,
    pub source_digest: String,
    pub digest: String,
    pub source_bytes: u64,
    pub pushed_bytes: u64,
    pub reused_bytes: u64,
    pub build: BuildSummary,
}

impl std::fmt::Display for ConvertSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        writeln!(f, "converted {} -> {}", self.source, self.target)?;
        writeln!(f, "  digest     {} ({})", self.digest, self.media_type)?;
        for i in &self.images {
            writeln!(
                f,
                "  {:<10} {} files, {} chunks ({} unique, {} from the chunk dictionary), {:.1} MiB pushed, manifest {}",
                i.platform.as_deref().unwrap_or("image"),
                i.build.inodes,
                i.build.chunks,
                i.build.unique_chunks,
                i.build.dict_chunks,
                mib(i.pushed_bytes),
                i.digest
            )?;
        }
        writeln!(
            f,
            "  bytes      {:.1} MiB of source layers; {:.1} MiB pushed, {:.1} MiB already in the registry",
            mib(self.source_bytes),
            mib(self.pushed_bytes),
            mib(self.reused_bytes)
        )?;
        writeln!(
            f,
            "  time       {:.2} s (pull {:.2} s and build {:.2} s overlapping, push {:.2} s)",
            self.seconds, self.pull_seconds, self.build_seconds, self.push_seconds
        )
    }
}

/// Seconds spent per phase, summed over platforms.
#[derive(Debug, Default)]
struct Tally {
    pull: f64,
    build: f64,
    push: f64,
}

/// What every step of one conversion shares.
struct Job<'a> {
    src_client: &'a Arc<RegistryClient>,
    dst_client: &'a Arc<RegistryClient>,
    src: &'a Reference,
    dst: &'a Reference,
    opts: &'a ConvertOptions,
    progress: &'a ConvertProgress,
    tally: Mutex<Tally>,
}

/// Converts `src` and pushes the result as `dst` (a tag).
#[tracing::instrument(skip_all, fields(source = %src, target = %dst))]
pub async fn convert(
    src_client: Arc<RegistryClient>,
    dst_client: Arc<RegistryClient>,
    src: &Reference,
    dst: &Reference,
    opts: &ConvertOptions,
    progress: &ConvertProgress,
) -> Result<ConvertSummary> {
    let started = Instant::now();
    if dst.digest.is_some() {
        return Err(Error::Reference {
            input: dst.to_string(),
            reason: "the target must be a tag: its digest is only known after the conversion"
                .into(),
        });
    }
    let job = Job {
        src_client: &src_client,
        dst_client: &dst_client,
        src,
        dst,
        opts,
        progress,
        tally: Mutex::default(),
    };
    progress.set_phase("resolve".into());
    let resolved = image::resolve(&src_client, src).await?;
    let images: Vec<&PlatformImage> = if opts.all_platforms {
        resolved.images.iter().collect()
    } else {
        vec![resolved.pick(src, &opts.platform)?]
    };
    // Platform manifests of an index are pushed by digest; the index takes the tag.
    let multi = opts.all_platforms && resolved.index.is_some();
    let target = if multi {
        Reference {
            tag: None,
            ..dst.clone()
        }
    } else {
        dst.clone()
    };
    let mut converted = Vec::new();
    for (n, source) in images.iter().enumerate() {
        let work = opts.work_dir.join(format!("image-{n}"));
        std::fs::create_dir_all(&work).map_err(|e| Error::io("create", &work, e))?;
        converted.push(job.convert_one(source, &target, &work).await?);
        std::fs::remove_dir_all(&work).map_err(|e| Error::io("remove", &work, e))?;
    }
    let (digest, media_type) = match (&resolved.index, multi) {
        (Some(index), true) => (job.push_index(index, &images, &converted).await?, OCI_INDEX),
        _ => {
            let one = converted.first().ok_or_else(|| Error::Protocol {
                registry: src.registry.clone(),
                repository: src.repository.clone(),
                what: "resolve".into(),
                reason: "the index lists no images".into(),
            })?;
            (one.summary.digest.clone(), OCI_MANIFEST)
        }
    };
    let tally = job.tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let images: Vec<ImageSummary> = converted.into_iter().map(|c| c.summary).collect();
    Ok(ConvertSummary {
        source: src.to_string(),
        target: dst.to_string(),
        digest,
        media_type: media_type.to_string(),
        source_bytes: images.iter().map(|i| i.source_bytes).sum(),
        pushed_bytes: images.iter().map(|i| i.pushed_bytes).sum(),
        reused_bytes: images.iter().map(|i| i.reused_bytes).sum(),
        images,
        pull_seconds: tally.pull,
        build_seconds: tally.build,
        push_seconds: tally.push,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn internal(r: &Reference, e: impl std::fmt::Display) -> Error {
    Error::Protocol {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        what: "convert".into(),
        reason: e.to_string(),
    }
}

/// One platform's summary and what an index entry needs of its manifest.
struct Converted {
    summary: ImageSummary,
    manifest_size: u64,
}

/// A built image dir and where it came from.
struct Built {
    /// Its `image_dir` is the built image.
    summary: BuildSummary,
    /// The chunk dictionary's image, whose blobs the new image references.
    dict: Option<PlatformImage>,
}

/// Bytes a push sent and bytes it found already there.
#[derive(Debug, Default)]
struct PushTally {
    pushed: u64,
    reused: u64,
}

impl PushTally {
    fn count(&mut self, outcome: PushOutcome, size: u64) {
        match outcome {
            PushOutcome::Uploaded { bytes } => self.pushed += bytes,
            PushOutcome::Existed | PushOutcome::Mounted => self.reused += size,
        }
    }
}

impl Job<'_> {
    fn time(&self, phase: fn(&mut Tally) -> &mut f64, since: Instant) {
        self.time_seconds(phase, since.elapsed().as_secs_f64());
    }

    fn time_seconds(&self, phase: fn(&mut Tally) -> &mut f64, seconds: f64) {
        let mut tally = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        *phase(&mut tally) += seconds;
    }

    /// Pull, build and push one platform's image; its manifest goes to `target`.
    async fn convert_one(
        &self,
        source: &PlatformImage,
        target: &Reference,
        work: &Path,
    ) -> Result<Converted> {
        let label = source.label();
        if image::bootstrap_layer(source).is_ok() {
            return Err(internal(
                &source.reference,
                "the source is already a Tessera image; convert its source instead",
            ));
        }
        self.progress.set_phase(format!("pull {label}"));
        let config = pull_config(self.src_client, source).await?;
        let downloads = start_downloads(self.src_client, source, work, self.progress)?;
        let layers = downloads.layers.clone();
        // The build reads each layer as it lands; every download is then joined, so a
        // layer that fails its digest fails the conversion even if the build stopped
        // reading it early.
        // A failed build drops the downloads, which stops them; its error carries a
        // download's own when that is what stopped it.
        let built = self.build(source, layers, work, &label).await?;
        let (bytes, pull_seconds) = downloads.finish().await?;
        self.progress
            .pulled
            .fetch_add(bytes.iter().sum(), Ordering::Relaxed);
        self.time_seconds(|t| &mut t.pull, pull_seconds);

        self.progress.set_phase(format!("push {label}"));
        let t = Instant::now();
        let converted = self.push(source, target, &config, &built, work).await?;
        self.time(|t| &mut t.push, t);
        tracing::info!(
            platform = %label,
            digest = %converted.summary.digest,
            pushed = converted.summary.pushed_bytes,
            reused = converted.summary.reused_bytes,
            "converted"
        );
        Ok(converted)
    }

    /// Builds the layers (each read as it downloads, deleted once applied) into
    /// `work/image`, against the chunk dictionary's bootstrap if one was asked for.
    async fn build(
        &self,
        source: &PlatformImage,
        layers: Vec<LayerFile>,
        work: &Path,
        label: &str,
    ) -> Result<Built> {
        let mut opts = self.opts.build.clone();
        opts.progress = Some(self.progress.build.clone());
        let mut dict = None;
        if let Some(dict_ref) = &self.opts.chunk_dict {
            self.progress
                .set_phase(format!("fetch chunk dictionary {dict_ref}"));
            let platform = source
                .platform
                .clone()
                .unwrap_or_else(|| self.opts.platform.clone());
            let dict_image = image::resolve_platform(self.dst_client, dict_ref, &platform).await?;
            let dict_dir = work.join("dict");
            std::fs::create_dir_all(&dict_dir).map_err(|e| Error::io("create", &dict_dir, e))?;
            image::fetch_bootstrap(self.dst_client, &dict_image, &dict_dir).await?;
            opts.chunk_dict = Some(ChunkDict {
                image_dir: dict_dir,
                link_blobs: false,
            });
            dict = Some(dict_image);
        }
        self.progress.set_phase(format!("build {label}"));
        let t = Instant::now();
        let out = work.join("image");
        let summary = tokio::task::spawn_blocking(move || -> rafs_format::Result<BuildSummary> {
            let mut builder = Builder::new(&out, opts)?;
            for layer in &layers {
                let f = layer
                    .follow()
                    .map_err(|e| rafs_format::Error::io("open layer", &layer.path, e))?;
                builder.add_layer(std::io::BufReader::with_capacity(1 << 20, f))?;
                // The layer is in the chunk store now; free the disk early.
                let _ = std::fs::remove_file(&layer.path);
            }
            builder.finish()
        })
        .await
        .map_err(|e| internal(self.dst, format!("build task: {e}")))??;
        self.time(|t| &mut t.build, t);
        Ok(Built { summary, dict })
    }

    /// Pushes the blobs, the bootstrap layer, the config and, last, the manifest.
    async fn push(
        &self,
        source: &PlatformImage,
        target: &Reference,
        source_config: &[u8],
        built: &Built,
        work: &Path,
    ) -> Result<Converted> {
        let build = &built.summary;
        let mut source_digest = serde_json::Map::new();
        source_digest.insert(SOURCE_DIGEST_ANNOTATION.into(), json!(source.raw.digest));
        let mut annotations = source_digest.clone();
        annotations.insert(SOURCE_REF_ANNOTATION.into(), json!(self.src.to_string()));
        let spec = PushSpec {
            config: rewrite_config(source_config, build, target)?,
            annotations,
            layer_annotations: source_digest,
            dict: built.dict.as_ref(),
            subject: None,
        };
        let pushed = push_built(self.dst_client, target, build, spec, work, self.progress).await?;
        Ok(Converted {
            summary: ImageSummary {
                platform: source.platform.as_ref().map(ToString::to_string),
                source_digest: source.raw.digest.clone(),
                digest: pushed.digest,
                source_bytes: source.manifest.layers().iter().map(|l| l.size()).sum(),
                pushed_bytes: pushed.pushed,
                reused_bytes: pushed.reused,
                build: build.clone(),
            },
            manifest_size: pushed.manifest_size,
        })
    }

    /// Pushes the index naming every converted platform manifest under the tag.
    async fn push_index(
        &self,
        source_index: &Manifest,
        images: &[&PlatformImage],
        converted: &[Converted],
    ) -> Result<String> {
        self.progress.set_phase("push index".into());
        let t = Instant::now();
        let manifests: Vec<serde_json::Value> = converted
            .iter()
            .zip(images)
            .map(|(c, source)| {
                let mut entry = json!({
                    "mediaType": OCI_MANIFEST,
                    "digest": c.summary.digest,
                    "size": c.manifest_size,
                });
                if let Some(p) = &source.platform {
                    let mut platform = json!({"os": p.os, "architecture": p.architecture});
                    if let Some(v) = &p.variant {
                        platform["variant"] = json!(v);
                    }
                    entry["platform"] = platform;
                }
                entry
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": manifests,
            "annotations": {
                SOURCE_DIGEST_ANNOTATION: source_index.digest,
                SOURCE_REF_ANNOTATION: self.src.to_string(),
            },
        });
        let bytes = serde_json::to_vec(&index).map_err(|e| internal(self.dst, e))?;
        let digest = self
            .dst_client
            .push_manifest(self.dst, OCI_INDEX, bytes)
            .await?;
        self.time(|t| &mut t.push, t);
        Ok(digest)
    }
}

/// The layer descriptors of a Tessera image's manifest: its blobs, then its bootstrap
/// (zstd) annotated with its uncompressed digest and `bootstrap_annotations`.
fn tessera_layers(
    build: &BuildSummary,
    bootstrap_digest: &str,
    bootstrap_size: u64,
    bootstrap_annotations: serde_json::Map<String, serde_json::Value>,
) -> Vec<serde_json::Value> {
    let mut layers: Vec<serde_json::Value> = build
        .blobs
        .iter()
        .map(|b| {
            json!({
                "mediaType": BLOB_MEDIA_TYPE,
                "digest": b.digest,
                "size": b.size,
                "annotations": { BLOB_ANNOTATION: "true" },
            })
        })
        .collect();
    let mut annotations = bootstrap_annotations;
    annotations.insert(BOOTSTRAP_ANNOTATION.into(), json!("true"));
    annotations.insert(
        BOOTSTRAP_DIGEST_ANNOTATION.into(),
        json!(build.bootstrap_digest),
    );
    layers.push(json!({
        "mediaType": BOOTSTRAP_MEDIA_TYPE,
        "digest": bootstrap_digest,
        "size": bootstrap_size,
        "annotations": annotations,
    }));
    layers
}

/// What [`push_built`] stored in the registry.
#[derive(Debug, Clone)]
pub(crate) struct Pushed {
    /// The manifest's digest.
    pub digest: String,
    /// Bytes of the image in the registry: blobs, bootstrap (zstd), config, manifest.
    pub stored: u64,
    /// Bytes of blobs uploaded (the rest the registry had already); the manifest aside.
    pub pushed: u64,
    /// Bytes the registry had already: the chunk dictionary's blobs (mounted or found
    /// in the repository) and anything pushed before.
    pub reused: u64,
    /// The manifest's length (an index names it with its size).
    pub manifest_size: u64,
}

/// What [`push_built`] pushes beside the build itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct PushSpec<'a> {
    /// The image config (OCI), as is.
    pub config: Vec<u8>,
    /// The manifest's annotations.
    pub annotations: serde_json::Map<String, serde_json::Value>,
    /// Annotations every layer (blob and bootstrap) carries besides Tessera's own.
    pub layer_annotations: serde_json::Map<String, serde_json::Value>,
    /// The chunk dictionary the build was given: its blobs that the image references
    /// are mounted (or copied) into the target's repository, not uploaded.
    pub dict: Option<&'a PlatformImage>,
    /// OCI 1.1: the manifest (of the target's repository) this image is about, and
    /// the `artifactType` saying what it is to it. The image is then registered as a
    /// referrer of that manifest ([`referrers::register`]).
    pub subject: Option<(&'a Descriptor, &'a str)>,
}

/// Pushes an image dir as a Tessera image `target` (a tag, or untagged: pushed by
/// digest): its blobs (the build's own uploaded, the chunk dictionary's mounted or
/// copied), its bootstrap (zstd, in `work`), the config, and last the manifest, so a
/// failed push leaves `target` as it was. A `subject` goes on the manifest with its
/// `artifactType`; the agent's mount reads such a manifest as any Tessera image.
pub(crate) async fn push_built(
    client: &RegistryClient,
    target: &Reference,
    build: &BuildSummary,
    spec: PushSpec<'_>,
    work: &Path,
    progress: &ConvertProgress,
) -> Result<Pushed> {
    let bootstrap_zst = work.join("bootstrap.zst");
    compress_file(&build.image_dir.join("bootstrap"), &bootstrap_zst)?;
    let (bootstrap_digest, bootstrap_size) = sha256_file(&bootstrap_zst)?;
    let config_path = work.join("config.json");
    std::fs::write(&config_path, &spec.config).map_err(|e| Error::io("write", &config_path, e))?;
    let config_digest = format!("sha256:{}", hex::encode(Sha256::digest(&spec.config)));
    let config_size = spec.config.len() as u64;
    let blobs_size: u64 = build.blobs.iter().map(|b| b.size).sum();
    progress.push_total.fetch_add(
        build.new_blob.as_ref().map_or(0, |b| b.size) + bootstrap_size + config_size,
        Ordering::Relaxed,
    );
    let on_progress = |n: u64| {
        progress.pushed.fetch_add(n, Ordering::Relaxed);
    };
    let mut tally = PushTally::default();
    push_blobs(
        client,
        target,
        build,
        spec.dict,
        work,
        &on_progress,
        &mut tally,
    )
    .await?;
    for (digest, size, path) in [
        (&bootstrap_digest, bootstrap_size, &bootstrap_zst),
        (&config_digest, config_size, &config_path),
    ] {
        let outcome = client
            .push_blob(target, digest, size, path, None, &on_progress)
            .await?;
        tally.count(outcome, size);
    }
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": config_digest,
            "size": config_size,
        },
        "layers": tessera_layers(build, &bootstrap_digest, bootstrap_size, spec.layer_annotations),
        "annotations": spec.annotations,
    });
    if let Some((subject, artifact_type)) = spec.subject {
        manifest["artifactType"] = json!(artifact_type);
        let subject = Descriptor {
            artifact_type: None,
            annotations: Default::default(),
            ..subject.clone()
        };
        manifest["subject"] = subject.to_json();
    }
    let manifest = serde_json::to_vec(&manifest).map_err(|e| internal(target, e))?;
    let manifest_size = manifest.len() as u64;
    let digest = client.push_manifest(target, OCI_MANIFEST, manifest).await?;
    if let Some((subject, artifact_type)) = spec.subject {
        let entry = Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: digest.clone(),
            size: manifest_size,
            artifact_type: Some(artifact_type.to_string()),
            annotations: spec
                .annotations
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
        };
        referrers::register(client, target, &subject.digest, &entry).await?;
    }
    Ok(Pushed {
        digest,
        stored: blobs_size + bootstrap_size + config_size + manifest_size,
        pushed: tally.pushed,
        reused: tally.reused,
        manifest_size,
    })
}

/// Makes every blob `build` references present in `target`'s repository: the one the
/// build wrote is uploaded, the chunk dictionary's (`dict`) are mounted or copied.
async fn push_blobs(
    client: &RegistryClient,
    target: &Reference,
    build: &BuildSummary,
    dict: Option<&PlatformImage>,
    work: &Path,
    on_progress: &(dyn Fn(u64) + Sync),
    tally: &mut PushTally,
) -> Result<()> {
    let new_blob = build.new_blob.as_ref().map(|b| &b.digest);
    for blob in &build.blobs {
        if Some(&blob.digest) == new_blob {
            let path = build.image_dir.join("blobs").join(hex_of(&blob.digest));
            let outcome = client
                .push_blob(target, &blob.digest, blob.size, &path, None, on_progress)
                .await?;
            tally.count(outcome, blob.size);
        } else {
            let dict = dict.ok_or_else(|| {
                internal(
                    target,
                    format!(
                        "blob {} is neither new nor from the chunk dictionary",
                        blob.digest
                    ),
                )
            })?;
            let outcome =
                copy_dict_blob(client, dict, target, &blob.digest, blob.size, work).await?;
            tally.count(outcome, blob.size);
        }
    }
    Ok(())
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

async fn pull_config(client: &RegistryClient, source: &PlatformImage) -> Result<Vec<u8>> {
    let desc = source.manifest.config();
    if desc.size() > MAX_CONFIG {
        return Err(internal(
            &source.reference,
            format!(
                "image config of {} bytes is larger than {MAX_CONFIG}",
                desc.size()
            ),
        ));
    }
    let mut config = Vec::new();
    client
        .blob(&source.reference, desc.digest().as_ref(), &mut config)
        .await?;
    Ok(config)
}

/// Starts downloading every layer (tar layers only) into `work/layers/`, a few at once.
fn start_downloads(
    client: &Arc<RegistryClient>,
    source: &PlatformImage,
    work: &Path,
    progress: &ConvertProgress,
) -> Result<Downloads> {
    let layers = source.manifest.layers();
    for (i, layer) in layers.iter().enumerate() {
        let media_type = layer.media_type().to_string();
        if !media_type.contains("tar") {
            return Err(internal(
                &source.reference,
                format!("layer {i} has media type {media_type}, not a tar layer"),
            ));
        }
    }
    progress
        .pull_total
        .fetch_add(layers.iter().map(|l| l.size()).sum(), Ordering::Relaxed);
    Downloads::start(client, source, &work.join("layers"), PULL_CONCURRENCY)
}

/// Downloads every layer into `work/layers/`, a few at once; returns their paths in
/// layer order once all are complete and verified.
pub(crate) async fn pull_layers(
    client: &Arc<RegistryClient>,
    source: &PlatformImage,
    work: &Path,
    progress: &ConvertProgress,
) -> Result<Vec<PathBuf>> {
    let downloads = start_downloads(client, source, work, progress)?;
    let paths = downloads.layers.iter().map(|l| l.path.clone()).collect();
    let (bytes, _) = downloads.finish().await?;
    progress
        .pulled
        .fetch_add(bytes.iter().sum(), Ordering::Relaxed);
    Ok(paths)
}

/// Makes a chunk-dictionary blob present in DST: already there, mounted from the
/// dictionary's repository (same registry), or copied through a local file.
async fn copy_dict_blob(
    client: &RegistryClient,
    dict: &PlatformImage,
    dst: &Reference,
    digest: &str,
    size: u64,
    work: &Path,
) -> Result<PushOutcome> {
    if dict.reference.registry == dst.registry
        && client
            .mount_blob(dst, digest, &dict.reference.repository)
            .await?
    {
        return Ok(PushOutcome::Mounted);
    }
    let path = work.join(format!("dict-{}", hex_of(digest)));
    let mut f = tokio::fs::File::create(&path)
        .await
        .map_err(|e| Error::io("create", &path, e))?;
    client.blob(&dict.reference, digest, &mut f).await?;
    drop(f);
    let outcome = client
        .push_blob(dst, digest, size, &path, None, &|_| {})
        .await?;
    std::fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
    Ok(outcome)
}

/// The source config with `rootfs.diff_ids` naming the new layers (uncompressed
/// digests: the blob itself, the bootstrap before zstd), so tools that match layers
/// to diff IDs — containerd's unpacker and snapshotters — see a consistent image.
/// Everything else (Entrypoint, Env, history, labels) is kept as it was.
fn rewrite_config(config: &[u8], build: &BuildSummary, dst: &Reference) -> Result<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(config)
        .map_err(|e| internal(dst, format!("source image config is not JSON: {e}")))?;
    let obj = value
        .as_object_mut()
        .ok_or_else(|| internal(dst, "source image config is not a JSON object"))?;
    let mut diff_ids: Vec<String> = build.blobs.iter().map(|b| b.digest.clone()).collect();
    diff_ids.push(build.bootstrap_digest.clone());
    obj.insert(
        "rootfs".into(),
        json!({ "type": "layers", "diff_ids": diff_ids }),
    );
    serde_json::to_vec(&value).map_err(|e| internal(dst, e))
}

pub(crate) fn compress_file(from: &Path, to: &Path) -> Result<()> {
    let input = std::fs::File::open(from).map_err(|e| Error::io("open", from, e))?;
    let output = std::fs::File::create(to).map_err(|e| Error::io("create", to, e))?;
    zstd::stream::copy_encode(input, output, BOOTSTRAP_ZSTD_LEVEL)
        .map_err(|e| Error::io("compress into", to, e))
}

pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut hasher = Sha256::new();
    let size = std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io("read", path, e))?;
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), size))
}
