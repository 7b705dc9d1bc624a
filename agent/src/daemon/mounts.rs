//! Mounting and unmounting images: resolving an image for a platform, its verified
//! bootstrap (stored by layer digest), the mount through the life cycle
//! (`daemon::lifecycle`) and, after it, prefetch.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rafs_format::reader::{Bootstrap, Verify};

use super::lifecycle::Mount;
use super::mounted::MountedImage;
use super::prefetch::prefetch_image;
use super::recorder::chunks_of;
use super::{Agent, MountStatus, Recorder};
use crate::api::{ChunkList, FileRange, ReadPlan};
use crate::config::Prefetch;
use crate::fetch::{ImageChunks, RegistryOrigin};
use crate::fs::handover::Attach;
use crate::fs::MountOptions;
use crate::peer::access;
use crate::registry::image::{self as registry_image, Layers};
use crate::registry::reference::{Platform, Reference};
use crate::{Error, Result};

/// Which tree of an image a mount shows: the image for `platform` (the host's when
/// `None`), all its layers or, for an indexed plain image, its first `k` (the
/// snapshotter's snapshot of layer `k`: format.md §17.5) or one layer alone (the
/// layer store's `diff` of that layer: §17.7).
#[derive(Debug, Clone, Default)]
pub struct ImageTree {
    pub platform: Option<String>,
    pub layers: Layers,
}

impl Agent {
    /// Mounts `image` at `mountpoint`: resolves it, fetches and verifies its bootstrap,
    /// and serves it at once; data is fetched as it is read.
    pub async fn mount(
        self: &Arc<Self>,
        image: &str,
        mountpoint: &Path,
        platform: Option<String>,
        plan: ReadPlan,
    ) -> Result<MountStatus> {
        let tree = ImageTree {
            platform,
            layers: Layers::All,
        };
        self.mount_with(image, mountpoint, tree, plan, Attach::Mount)
            .await
    }

    /// [`mount`](Self::mount), or taking over a mount an earlier agent left (then
    /// `mountpoint` must be canonical: it is not looked at before it is served).
    #[tracing::instrument(skip_all, fields(image = %image, mountpoint = %mountpoint.display()))]
    pub async fn mount_with(
        self: &Arc<Self>,
        image: &str,
        mountpoint: &Path,
        tree: ImageTree,
        plan: ReadPlan,
        attach: Attach,
    ) -> Result<MountStatus> {
        let started = Instant::now();
        let mountpoint = match attach {
            Attach::TakeOver { .. } => mountpoint.to_path_buf(),
            _ => Self::canonical(mountpoint)?,
        };
        if self
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&mountpoint)
        {
            return Err(Error::Mountpoint {
                path: mountpoint,
                problem: "already a Tessera mount; unmount it first",
            });
        }
        let reference = Reference::parse(image)?;
        let (resolved, chunks) = self
            .open_image(&reference, tree.platform.as_deref(), tree.layers)
            .await?;
        let bootstrap = chunks.bootstrap.clone();
        // Pinned before the first read, released when the mount ends: a running
        // container's chunks are never evicted (the cache's `pins.rs`).
        let pin = self.cache.pin_image(
            format!("{image} at {}", mountpoint.display()),
            chunks.keys(),
        );
        let recorder = match &plan.record {
            Some(path) => Some(Recorder::new(&bootstrap, path)?),
            None => None,
        };
        let mounted_image = Arc::new(MountedImage {
            chunks,
            fetcher: self.fetcher.clone(),
            cache: self.cache.clone(),
            network: self.network.clone(),
            backing_turn: self.backing_turn.clone(),
            readahead: self.config.fetch.readahead_bytes,
            runtime: self.runtime.clone(),
            requested: image.to_string(),
            digest: resolved.raw.digest.clone(),
            started,
            bytes_read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            first_byte: OnceLock::new(),
            recorder,
            slow_read: Duration::from_millis(self.config.fetch.slow_read_ms),
            slow_reads: AtomicU64::new(0),
            slow_logged_ms: AtomicU64::new(0),
        });
        let opts = MountOptions {
            fsname: format!("{}{reference}", super::stale::source_prefix(&self.owner)),
            workers: self.config.fetch.workers,
            allow_other: true,
            read_latency: Some(self.fetcher.metrics.fuse_read_seconds.clone()),
            // A recording must see every read, and passthrough reads never reach us.
            // A mount the keeper holds across restarts cannot have it: the kernel
            // wants every open of a file open with a backing file to name the same
            // one, and a session that takes a connection over cannot register any.
            passthrough: self.config.passthrough
                && plan.record.is_none()
                && matches!(attach, Attach::Mount),
        };
        let mount = Mount::attach(
            mounted_image.clone(),
            bootstrap,
            mountpoint.clone(),
            opts,
            attach,
            started,
            pin,
        )
        .await?;
        let mode = plan.prefetch.unwrap_or(self.config.prefetch);
        if mode != Prefetch::None || !plan.first.is_empty() {
            let task = tokio::spawn(prefetch_image(
                self.fetcher.clone(),
                mounted_image,
                mode,
                plan.first,
                self.config.fetch.prefetch_concurrency,
            ));
            mount.set_prefetch(task);
        }
        self.mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mountpoint, mount.clone());
        let status = mount.status();
        tracing::info!(digest = %status.digest, seconds = status.mount_seconds, "mounted");
        Ok(status)
    }

    pub async fn umount(&self, mountpoint: &Path) -> Result<MountStatus> {
        let key = Self::canonical(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let mount = self
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .ok_or_else(|| Error::Mountpoint {
                path: key.clone(),
                problem: "not a Tessera mount of this agent",
            })?;
        Ok(mount.unmount().await)
    }

    /// The chunks of the image mounted at `mountpoint` that hold `ranges` of its files,
    /// each once, in the order of the ranges.
    pub fn chunks_of(&self, mountpoint: &Path, ranges: &[FileRange]) -> Result<ChunkList> {
        let key = Self::canonical(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let mount = self
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
            .ok_or_else(|| Error::Mountpoint {
                path: key.clone(),
                problem: "not a Tessera mount of this agent",
            })?;
        let bootstrap = &mount.image.chunks.bootstrap;
        let mut inodes: HashMap<&str, Option<u32>> = HashMap::new();
        let resolved = ranges.iter().map(|r| {
            let ino = *inodes.entry(&r.path).or_insert_with(|| {
                bootstrap
                    .resolve(r.path.as_bytes())
                    .ok()
                    .flatten()
                    .map(|inode| inode.ino)
            });
            (ino, r.offset, r.len)
        });
        Ok(chunks_of(bootstrap, resolved))
    }

    /// `reference` resolved for `platform` (the host's when `None`), with its verified
    /// bootstrap (of the tree `layers` names: `ImageTree::layers`) and its
    /// chunks; what this node already holds of it is announced to the swarm in the
    /// background.
    pub(super) async fn open_image(
        &self,
        reference: &Reference,
        platform: Option<&str>,
        layers: Layers,
    ) -> Result<(registry_image::PlatformImage, Arc<ImageChunks>)> {
        let platform = match platform {
            Some(p) => p.parse::<Platform>().map_err(Error::Agent)?,
            None => Platform::host(),
        };
        // The manifest comes from the registry at every mount, with this node's
        // credentials: a node that lost them gets the registry's refusal, whatever its
        // cache holds (the bootstrap and chunks below are only ever used after it).
        let resolved = registry_image::resolve_platform(&self.client, reference, &platform).await?;
        let bootstrap = Arc::new(self.bootstrap_for(&resolved, layers).await?);
        self.protect(&resolved, &bootstrap).await?;
        let origin = Arc::new(RegistryOrigin {
            client: self.client.clone(),
            reference: resolved.reference.clone(),
        });
        let chunks = Arc::new(ImageChunks::new(
            bootstrap,
            resolved.reference.clone(),
            origin,
        )?);
        if let Some(network) = self.network.clone() {
            let (store, chunks) = (self.fetcher.store().clone(), chunks.clone());
            // Blocking: an index probe per chunk.
            tokio::task::spawn_blocking(move || chunks.announce_stored(store.as_ref(), &network));
        }
        Ok((resolved, chunks))
    }

    /// Registers a restricted image (a private repository's, or a checkpoint) with the
    /// peer service's access keys, on disk, before any of its chunks can be fetched:
    /// peers get them only with a proof made from its manifest (`peer::access`).
    async fn protect(
        &self,
        image: &registry_image::PlatformImage,
        bootstrap: &Arc<Bootstrap>,
    ) -> Result<()> {
        let credentials = self.client.used_credentials(&image.reference);
        if !access::is_restricted(credentials, &image.manifest) {
            return Ok(());
        }
        let blobs = bootstrap.blobs()?;
        let mut chunks: Vec<Vec<[u8; 32]>> = vec![Vec::new(); blobs.len()];
        for c in 0..bootstrap.chunk_count() {
            let info = bootstrap.chunk(c)?;
            if let Some(list) = chunks.get_mut(info.blob_index as usize) {
                list.push(info.digest);
            }
        }
        let grant = access::Grant {
            manifest: image.raw.digest.clone(),
            repository: format!(
                "{}/{}",
                image.reference.registry, image.reference.repository
            ),
            key: access::AccessKey::of_manifest(&image.raw.bytes),
            algo: bootstrap.digest_algo(),
            blobs: blobs.iter().map(|b| b.oci_digest()).zip(chunks).collect(),
        };
        let store = self.access.clone();
        crate::fetch::blocking(move || store.grant(&grant))
            .await
            .map_err(|e| Error::Agent(format!("record peer access: {e}")))??;
        tracing::debug!(
            manifest = %image.raw.digest,
            checkpoint = access::is_checkpoint(&image.manifest),
            "a restricted image: peers get its chunks only with a proof of access"
        );
        Ok(())
    }

    /// The image's bootstrap (its own, or its index's for a plain image): from the
    /// local store if this layer was fetched before (it is named by its verified
    /// digest), else fetched, verified and stored. A stored copy that fails its
    /// checksum is fetched again; one that cannot be stored (a full disk) is used from
    /// memory. An index must read this very image (`BootstrapLocation::check`).
    pub(super) async fn bootstrap_for(
        &self,
        image: &registry_image::PlatformImage,
        layers: Layers,
    ) -> Result<Bootstrap> {
        let location = registry_image::locate_bootstrap(&self.client, image, layers).await?;
        let bootstrap = self.bootstrap_at(image, &location.layer).await?;
        location.check(image, &bootstrap)?;
        Ok(bootstrap)
    }

    async fn bootstrap_at(
        &self,
        image: &registry_image::PlatformImage,
        layer: &oci_spec::image::Descriptor,
    ) -> Result<Bootstrap> {
        let name = layer.digest().to_string().replace(':', "-");
        let stored = self.bootstrap_dir.join(&name);
        if let Ok(bytes) = std::fs::read(&stored) {
            match Bootstrap::from_bytes(bytes, Verify::Checksum).and_then(|b| {
                b.validate_all()?;
                Ok(b)
            }) {
                Ok(bootstrap) => return Ok(bootstrap),
                Err(e) => {
                    tracing::warn!(path = %stored.display(), error = %e, "a stored bootstrap is damaged: fetching it again");
                    let _ = std::fs::remove_file(&stored);
                }
            }
        }
        let bytes = registry_image::bootstrap_bytes_at(&self.client, image, layer).await?;
        let bootstrap = Bootstrap::from_bytes(bytes, Verify::Checksum)?;
        bootstrap.validate_all()?;
        if let Err(e) = self.store_bootstrap(&stored, bootstrap.as_bytes()) {
            tracing::warn!(error = %e, "could not store a bootstrap: using it from memory (it is fetched again at the next mount)");
        }
        Ok(bootstrap)
    }

    /// Writes a verified bootstrap to `path` whole (a temp file renamed into place).
    fn store_bootstrap(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let mut tmp = tempfile::NamedTempFile::new_in(&self.bootstrap_dir)
            .map_err(|e| Error::io("create a temp file in", &self.bootstrap_dir, e))?;
        tmp.write_all(bytes)
            .map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.persist(path)
            .map_err(|e| Error::io("store bootstrap", path, e.error))?;
        Ok(())
    }
}
