//! `tessera pull IMAGE`: an image into containerd as its unpacker puts it there with
//! the CRI plugin's snapshot labels, so that `ctr run --snapshotter tessera IMAGE`
//! starts a Tessera image (converted or indexed) lazily without the CRI plugin, and no
//! layer is downloaded (what `ctr-remote image rpull` is for stargz).
//!
//! Over containerd's own socket ([`client`]), under a lease: the platform's manifest
//! and its config go into the content store (the manifest labelled to keep the config,
//! the config to keep the top layer's snapshot, so containerd's GC keeps the chain);
//! each layer's snapshot is prepared by its chain ID with the labels
//! [`snapshotter::remote`](crate::snapshotter::remote) reads, which the Tessera
//! snapshotter answers with "already exists" (containerd then records the committed
//! snapshot under the chain ID); last, the image record names the manifest. A layer
//! the snapshotter would unpack ends the pull: `tessera pull` downloads no layers.
//!
//! A module beside `snapshotter` (same layer): it writes the labels that module reads.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tessera_proto::containerd::types::Descriptor;

use crate::containerd::{Containerd, Prepared};
use crate::registry::client::RegistryClient;
use crate::registry::image::{self as registry_image, PlatformImage};
use crate::registry::reference::{Platform, Reference};
use crate::snapshotter::remote::{IMAGE_REF_LABEL, LAYER_LABEL, MANIFEST_LABEL};
use crate::snapshotter::TARGET_LABEL;
use crate::{Error, Result};

/// Where and how to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// containerd's socket (`/run/containerd/containerd.sock`).
    pub address: PathBuf,
    /// containerd namespace the image goes into (`default`; the CRI plugin's is `k8s.io`).
    pub namespace: String,
    /// The name containerd's config gives the Tessera snapshotter (`tessera`).
    pub snapshotter: String,
    /// Which image of a multi-platform index.
    pub platform: Platform,
}

/// What became of a layer's snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerOutcome {
    /// The snapshotter made it lazily now.
    Lazy,
    /// containerd had it already (an earlier pull, another image on the same layers).
    Present,
}

/// One layer done, for progress lines.
#[derive(Debug, Clone)]
pub struct LayerStep<'a> {
    /// From 1.
    pub number: usize,
    pub count: usize,
    pub digest: &'a str,
    pub chain_id: &'a str,
    pub outcome: LayerOutcome,
}

/// What a pull did.
#[derive(Debug, Clone, Serialize)]
pub struct PullSummary {
    /// The image record's name in containerd.
    pub image: String,
    /// Its manifest's digest.
    pub digest: String,
    pub namespace: String,
    pub snapshotter: String,
    pub layers: usize,
    /// Layers the snapshotter made lazily by this pull.
    pub lazy: usize,
    /// Layers whose snapshot containerd had already.
    pub present: usize,
    /// The top layer's chain ID: the snapshot containers start from.
    pub chain_id: String,
    /// Bytes this pull read from the registry: the manifest and the config, no layer.
    pub bytes_downloaded: u64,
}

impl fmt::Display for PullSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {}: {} layers ({} lazy, {} already present) in snapshotter {}, nothing \
             downloaded (manifest and config: {} bytes)",
            self.image,
            self.digest,
            self.layers,
            self.lazy,
            self.present,
            self.snapshotter,
            self.bytes_downloaded
        )
    }
}

/// Pulls `reference` into containerd (see the module's doc); `progress` hears of each
/// layer as it is done.
pub async fn pull(
    registry: &RegistryClient,
    reference: &Reference,
    opts: &PullOptions,
    progress: &mut (dyn FnMut(&LayerStep<'_>) + Send),
) -> Result<PullSummary> {
    let image = registry_image::resolve_platform(registry, reference, &opts.platform).await?;
    let config = registry_image::fetch_config(registry, &image).await?;
    pull_resolved(reference, &image, &config, opts, progress).await
}

/// [`pull`] of `image` (resolved from `reference` for `opts.platform`) whose config is
/// `config`: for a caller that needs them too.
pub async fn pull_resolved(
    reference: &Reference,
    image: &PlatformImage,
    config: &[u8],
    opts: &PullOptions,
    progress: &mut (dyn FnMut(&LayerStep<'_>) + Send),
) -> Result<PullSummary> {
    let mut containerd = Containerd::connect(&opts.address, &opts.namespace).await?;
    let diff_ids = registry_image::diff_ids(image, config)?;
    let chain = chain_ids(&diff_ids);
    let top = chain.last().cloned().ok_or_else(|| Error::Protocol {
        registry: image.reference.registry.clone(),
        repository: image.reference.repository.clone(),
        what: format!("manifest {}", image.raw.digest),
        reason: "the image has no layers".into(),
    })?;
    // Before anything is written: fails with what to do when containerd lacks the
    // snapshotter or cannot reach it.
    containerd.snapshot_exists(&opts.snapshotter, &top).await?;

    let unique = unique();
    containerd.lease(&format!("tessera-pull-{unique}")).await?;
    let work = Work {
        containerd: &containerd,
        opts,
        name: reference.to_string(),
        image,
        config,
        chain: &chain,
        unique: &unique,
    };
    let result = work.run(progress).await;
    if let Err(e) = containerd.release().await {
        // It expires by itself; what the pull made is kept by the image record.
        tracing::warn!(error = %e, "could not delete the pull's lease");
    }
    let (lazy, present) = result?;
    Ok(PullSummary {
        image: reference.to_string(),
        digest: image.raw.digest.clone(),
        namespace: opts.namespace.clone(),
        snapshotter: opts.snapshotter.clone(),
        layers: chain.len(),
        lazy,
        present,
        chain_id: top,
        bytes_downloaded: (image.raw.bytes.len() + config.len()) as u64,
    })
}

/// The part of a pull done under its lease.
struct Work<'a> {
    containerd: &'a Containerd,
    opts: &'a PullOptions,
    /// The image record's name: the reference as given, normalised.
    name: String,
    image: &'a PlatformImage,
    config: &'a [u8],
    /// The layers' chain IDs, bottom first.
    chain: &'a [String],
    /// Makes this pull's content refs and snapshot keys its own.
    unique: &'a str,
}

impl Work<'_> {
    /// Content, snapshots, image record; the layers made lazily and found present.
    async fn run(
        &self,
        progress: &mut (dyn FnMut(&LayerStep<'_>) + Send),
    ) -> Result<(usize, usize)> {
        let manifest = &self.image.raw;
        let config_digest = self.image.manifest.config().digest().to_string();
        let top = self.chain.last().cloned().unwrap_or_default();
        // What containerd's GC follows: image → manifest → config → top snapshot (→
        // its parents). Layers are not in the content store, so nothing names them.
        self.containerd
            .write_content(
                &format!("tessera-pull-{}-config-{config_digest}", self.unique),
                &config_digest,
                self.config,
                HashMap::from([(
                    format!("containerd.io/gc.ref.snapshot.{}", self.opts.snapshotter),
                    top,
                )]),
            )
            .await?;
        self.containerd
            .write_content(
                &format!("tessera-pull-{}-manifest-{}", self.unique, manifest.digest),
                &manifest.digest,
                &manifest.bytes,
                HashMap::from([(
                    "containerd.io/gc.ref.content.config".to_string(),
                    config_digest,
                )]),
            )
            .await?;

        let (mut lazy, mut present) = (0, 0);
        let layers = self.image.manifest.layers();
        for (i, (layer, chain_id)) in layers.iter().zip(self.chain).enumerate() {
            let digest = layer.digest().to_string();
            let outcome = self.layer(i, &digest, chain_id).await?;
            match outcome {
                LayerOutcome::Lazy => lazy += 1,
                LayerOutcome::Present => present += 1,
            }
            progress(&LayerStep {
                number: i + 1,
                count: layers.len(),
                digest: &digest,
                chain_id,
                outcome,
            });
        }

        let media_type = self
            .image
            .manifest
            .media_type()
            .as_ref()
            .map_or_else(|| manifest.media_type.clone(), ToString::to_string);
        let target = Descriptor {
            media_type,
            digest: manifest.digest.clone(),
            size: manifest.bytes.len() as i64,
            annotations: HashMap::new(),
        };
        self.containerd.put_image(&self.name, target).await?;
        Ok((lazy, present))
    }

    /// The snapshot of layer `i` (chain ID `chain_id`), as containerd's unpacker
    /// prepares it with the CRI plugin's labels.
    async fn layer(&self, i: usize, digest: &str, chain_id: &str) -> Result<LayerOutcome> {
        let snapshotter = &self.opts.snapshotter;
        if self
            .containerd
            .snapshot_exists(snapshotter, chain_id)
            .await?
        {
            return Ok(LayerOutcome::Present);
        }
        let parent = match i {
            0 => "",
            _ => &self.chain[i - 1],
        };
        // containerd's unpack key (`snapshots.UnpackKeyFormat`, "extract-%s %s").
        let key = format!("extract-{}-{i} {chain_id}", self.unique);
        let labels = HashMap::from([
            (TARGET_LABEL.to_string(), chain_id.to_string()),
            (IMAGE_REF_LABEL.to_string(), self.name.clone()),
            (MANIFEST_LABEL.to_string(), self.image.raw.digest.clone()),
            (LAYER_LABEL.to_string(), digest.to_string()),
        ]);
        match self
            .containerd
            .prepare(snapshotter, &key, parent, labels)
            .await?
        {
            Prepared::Exists => Ok(LayerOutcome::Lazy),
            Prepared::Active => {
                // Not a lazy layer: the snapshotter expects it unpacked into this one.
                if let Err(e) = self.containerd.remove_snapshot(snapshotter, &key).await {
                    tracing::warn!(key, error = %e, "could not remove the prepared snapshot; the lease's end lets containerd collect it");
                }
                Err(Error::NotLazy {
                    image: self.name.clone(),
                    layer: digest.to_string(),
                    snapshotter: snapshotter.clone(),
                })
            }
        }
    }
}

/// The layers' chain IDs (OCI image spec, "ChainID"): the first layer's is its diff
/// ID, each next one `sha256(parent's chain ID + " " + its diff ID)`.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chain: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let id = match chain.last() {
            None => diff_id.clone(),
            Some(parent) => format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{parent} {diff_id}")))
            ),
        };
        chain.push(id);
    }
    chain
}

/// Unique to this process and moment (content refs, snapshot keys, the lease).
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain IDs of a two-layer image; the second as `printf '%s %s' A B |
    /// sha256sum` computes it.
    #[test]
    fn chain_ids_follow_the_image_spec() {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        let chain = chain_ids(&[a.clone(), b]);
        assert_eq!(
            chain,
            [
                a,
                "sha256:ccd722928bd92476ba1745586fed6e45a102504185ad88cd89e01ff116fd146c".into()
            ]
        );
        assert!(chain_ids(&[]).is_empty());
    }

    #[test]
    fn only_sha256_digests_are_diff_ids() {
        let is_sha256 = registry_image::is_sha256_digest;
        assert!(is_sha256(&format!("sha256:{}", "0f".repeat(32))));
        assert!(!is_sha256("sha256:abc"));
        assert!(!is_sha256(&format!("sha512:{}", "0".repeat(64))));
        assert!(!is_sha256(&format!("sha256:{}", "A".repeat(64))));
    }
}
