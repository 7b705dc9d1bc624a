//! Which layers are lazy, and their mounts.
//!
//! containerd's CRI plugin labels the snapshot of each layer it is about to unpack with
//! the image reference, the manifest digest and the layer digest. The manifest (fetched
//! once per digest with the node's credentials, and verified) says whether the layer is
//! a Tessera blob or bootstrap layer (docs/format.md §13), or, for a plain image with an
//! index beside it (§17.6), which of its layers it is: the `k`-th layer's snapshot is
//! the lazy mount of the tree of its first `k` layers (§17.5), so that it is right for
//! every image that starts with them. Anything else, or a snapshot without those
//! labels, is an ordinary layer that containerd unpacks.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::fs::handover::{Attach, Keeper};
use crate::fs::mount_table::{fuse_mounted_at, lazy_unmount};
use crate::registry::client::RegistryClient;
use crate::registry::image::{self as registry_image, BLOB_ANNOTATION, BLOB_MEDIA_TYPE};
use crate::registry::reference::{Platform, Reference};
use crate::Result;

/// The image the CRI plugin is pulling (as the user named it).
pub const IMAGE_REF_LABEL: &str = "containerd.io/snapshot/cri.image-ref";
/// The digest of the platform's manifest being unpacked.
pub const MANIFEST_LABEL: &str = "containerd.io/snapshot/cri.manifest-digest";
/// The digest of the layer this snapshot is for.
pub const LAYER_LABEL: &str = "containerd.io/snapshot/cri.layer-digest";
/// Set on the snapshots of Tessera layers (nothing was unpacked into them).
pub const REMOTE_LABEL: &str = "io.tessera.snapshot.remote";

/// A future the snapshotter awaits on its gRPC tasks (so `Send`), boxed so that
/// [`Images`] can be a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the snapshotter needs of whoever owns the node's mounts, its chunk cache and
/// its registry credentials: the daemon's `Agent` implements it. A trait here rather
/// than a call into `daemon`, because the daemon starts the snapshotter: so the
/// snapshotter sits below the daemon and the two do not import each other.
pub trait Images: Send + Sync + std::fmt::Debug {
    /// The node's registry client: manifests are read with the node's credentials.
    fn registry_client(&self) -> &Arc<RegistryClient>;
    /// Mounts `image` (by digest) lazily at `dir`, as `attach` says: the tree of all
    /// its layers, or of its first `layers` (a layer prefix of an indexed plain image).
    fn mount<'a>(
        &'a self,
        image: &'a str,
        layers: Option<u32>,
        dir: &'a Path,
        attach: Attach,
    ) -> BoxFuture<'a, Result<()>>;
    /// Unmounts what [`mount`](Self::mount) mounted at `dir`.
    fn unmount<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<()>>;
    /// Bytes of the chunks of the image mounted at `dir` that the node's cache holds
    /// now (what the snapshot really takes on disk); `None` if nothing is mounted there.
    fn mounted_bytes<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Option<u64>>;
}

/// A layer of a Tessera image, or of a plain image with an index, about to be prepared.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The committed snapshot containerd will look for (the layer's chain ID).
    pub target: String,
    /// The image by manifest digest: `registry/repository@sha256:…`.
    pub image: String,
    pub digest: String,
    pub holds: Holds,
}

/// What a lazy layer's snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// Nothing of its own: a blob layer of a converted image.
    Nothing,
    /// The image's merged tree, mounted: of all its layers (`None`: a converted
    /// image's bootstrap layer, an indexed image's last layer) or of its first `k`
    /// (an indexed plain image's `k`-th layer, whose snapshot other images that start
    /// with the same layers share: format.md §17.5).
    Tree(Option<u32>),
}

/// What a manifest's layers are.
#[derive(Debug)]
enum LayerRoles {
    /// A Tessera image's: by digest, `true` for the bootstrap layer, `false` for a blob.
    Converted(HashMap<String, bool>),
    /// A plain image with an index: its layers' digests in order.
    Indexed(Vec<String>),
    /// Neither: every layer is unpacked. Looked up again after [`PLAIN_FOR`] (an index
    /// may be pushed meanwhile).
    Plain(std::time::Instant),
}

/// How long a manifest found to be neither converted nor indexed is taken as plain.
const PLAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Tessera images for the snapshotter: classifies layers, mounts and unmounts images
/// through the agent (which owns the mounts, the cache and the credentials).
#[derive(Debug)]
pub struct Remote {
    /// The agent, which owns the mounts, the cache and the credentials.
    images: Box<dyn Images>,
    /// Holds the mounts' FUSE connections while the agent restarts (absent: mounts
    /// do not outlive the agent).
    keeper: Option<Arc<Keeper>>,
    /// Per manifest digest; only answers are kept (a failed fetch is tried again).
    manifests: Mutex<HashMap<String, Arc<LayerRoles>>>,
}

impl Remote {
    pub fn new(images: Box<dyn Images>, keeper: Option<Keeper>) -> Remote {
        Remote {
            images,
            keeper: keeper.map(Arc::new),
            manifests: Mutex::new(HashMap::new()),
        }
    }

    /// The lazy layer these snapshot labels describe, if they describe one; `depth`
    /// is how many layers are under it (its parent chain's length).
    pub async fn layer(&self, labels: &BTreeMap<String, String>, depth: u32) -> Option<Layer> {
        let target = labels.get(super::TARGET_LABEL)?;
        let image_ref = labels.get(IMAGE_REF_LABEL)?;
        let manifest = labels.get(MANIFEST_LABEL)?;
        let layer = labels.get(LAYER_LABEL)?;
        let mut reference = match Reference::parse(image_ref) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(image = %image_ref, error = %e, "the CRI plugin's image label does not parse; unpacking the layer as usual");
                return None;
            }
        };
        reference.tag = None;
        reference.digest = Some(manifest.clone());
        let roles = match self.roles(&reference, manifest).await {
            Ok(roles) => roles,
            Err(e) => {
                tracing::warn!(image = %reference, error = %e, "could not read the manifest to tell whether this is a Tessera image; unpacking the layer as usual");
                return None;
            }
        };
        let holds = match roles.as_ref() {
            LayerRoles::Converted(roles) => match *roles.get(layer)? {
                true => Holds::Tree(None),
                false => Holds::Nothing,
            },
            LayerRoles::Indexed(layers) => {
                // The layer at this depth of the image, or containerd is preparing
                // something else: then it is unpacked as usual.
                if layers.get(depth as usize) != Some(layer) {
                    tracing::warn!(image = %reference, layer, depth, "a layer of an indexed image prepared at another depth than the image's; unpacking it as usual");
                    return None;
                }
                let k = depth + 1;
                Holds::Tree((k < layers.len() as u32).then_some(k))
            }
            LayerRoles::Plain(_) => return None,
        };
        Some(Layer {
            target: target.clone(),
            image: reference.to_string(),
            digest: layer.clone(),
            holds,
        })
    }

    async fn roles(&self, reference: &Reference, manifest: &str) -> Result<Arc<LayerRoles>> {
        if let Some(known) = self.cached(manifest) {
            return Ok(known);
        }
        let image = registry_image::resolve_platform(
            self.images.registry_client(),
            reference,
            &Platform::host(),
        )
        .await?;
        let client = self.images.registry_client();
        let roles = match registry_image::bootstrap_layer(&image) {
            Ok(bootstrap) => {
                let bootstrap = bootstrap.digest().to_string();
                let mut roles = HashMap::new();
                for l in image.manifest.layers() {
                    let digest = l.digest().to_string();
                    if digest == bootstrap {
                        roles.insert(digest, true);
                    } else if l.media_type().to_string() == BLOB_MEDIA_TYPE
                        || l.annotations()
                            .as_ref()
                            .and_then(|a| a.get(BLOB_ANNOTATION))
                            .is_some_and(|v| v == "true")
                    {
                        roles.insert(digest, false);
                    }
                }
                LayerRoles::Converted(roles)
            }
            Err(_) => {
                match registry_image::locate_bootstrap(client, &image, registry_image::Layers::All)
                    .await
                {
                    Ok(_) => LayerRoles::Indexed(
                        image
                            .manifest
                            .layers()
                            .iter()
                            .map(|l| l.digest().to_string())
                            .collect(),
                    ),
                    Err(e) => {
                        tracing::debug!(image = %reference, error = %e, "a plain image without a usable index: its layers are unpacked");
                        LayerRoles::Plain(std::time::Instant::now())
                    }
                }
            }
        };
        let roles = Arc::new(roles);
        self.manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(manifest.to_string(), roles.clone());
        Ok(roles)
    }

    fn cached(&self, manifest: &str) -> Option<Arc<LayerRoles>> {
        self.manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(manifest)
            .filter(|roles| !matches!(***roles, LayerRoles::Plain(at) if at.elapsed() > PLAIN_FOR))
            .cloned()
    }

    /// Mounts `image` (by digest) lazily at `dir`, through the agent, handing it to
    /// the keeper (if there is one) so it outlives this agent.
    pub async fn mount(&self, image: &str, layers: Option<u32>, dir: &Path) -> Result<()> {
        let attach = match &self.keeper {
            Some(keeper) => Attach::HandOver(keeper.clone()),
            None => Attach::Mount,
        };
        self.images.mount(image, layers, dir, attach).await
    }

    /// Unmounts what [`mount`](Self::mount) mounted at `dir` (the agent lets the
    /// keeper go of it); failures are logged.
    pub async fn unmount(&self, dir: &Path) {
        if let Err(e) = self.images.unmount(dir).await {
            tracing::warn!(dir = %dir.display(), error = %e, "could not unmount a Tessera image snapshot");
            // Not the agent's: whatever the keeper holds there is stray.
            self.release(dir);
        }
    }

    /// Bytes of the image mounted at `dir` held in the cache (see [`Images`]).
    pub async fn mounted_bytes(&self, dir: &Path) -> Option<u64> {
        self.images.mounted_bytes(dir).await
    }

    /// The connections the keeper holds, by mount point (none without a keeper).
    pub fn held(&self) -> HashMap<PathBuf, OwnedFd> {
        match &self.keeper {
            None => HashMap::new(),
            Some(k) => k.held().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not get the mounts the FUSE keeper holds; mounting anew");
                HashMap::new()
            }),
        }
    }

    /// After a restart: serves `image` at `dir` (canonical) again, taking over the
    /// mount the previous agent left if the keeper held it (containers using it never
    /// noticed; `true`), else mounting it anew (`false`).
    pub async fn restore(
        &self,
        image: &str,
        layers: Option<u32>,
        dir: &Path,
        held: Option<OwnedFd>,
    ) -> Result<bool> {
        let alive = fuse_mounted_at(dir);
        if let (Some(connection), true, Some(keeper)) = (held, alive, &self.keeper) {
            let attach = Attach::TakeOver {
                connection,
                keeper: keeper.clone(),
            };
            match self.images.mount(image, layers, dir, attach).await {
                Ok(()) => {
                    tracing::info!(mountpoint = %dir.display(), image, "took over the mount the previous agent left");
                    return Ok(true);
                }
                Err(e) => {
                    tracing::error!(mountpoint = %dir.display(), error = %e, "could not take over a mount; mounting anew (its containers lose it)")
                }
            }
        }
        if fuse_mounted_at(dir) {
            // A mount nobody serves: out of the way (its users see errors already).
            if let Some(keeper) = &self.keeper {
                let _ = keeper.release(dir);
            }
            if let Err(e) = lazy_unmount(dir) {
                tracing::warn!(error = %e, "could not detach a mount nobody serves");
            }
        }
        self.mount(image, layers, dir).await.map(|()| false)
    }

    /// Tells the keeper to let go of a connection nothing uses any more.
    pub fn release(&self, dir: &Path) {
        if let Some(keeper) = &self.keeper {
            let _ = keeper.release(dir);
        }
    }
}
