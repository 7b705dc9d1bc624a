//! The containerd snapshotter (`tessera agent --snapshotter-socket PATH`, named in
//! containerd's `[proxy_plugins]`): containerd's snapshots API over a unix socket, so
//! containerd asks the agent for every container's root filesystem.
//!
//! For ordinary images it behaves as containerd's overlayfs snapshotter: containerd
//! unpacks each layer into a directory of ours (`snapshots/<id>/fs`) and a container's
//! root is an overlay of them with a writable upper directory.
//!
//! For a Tessera image (one `tessera convert` made) pulled through the CRI plugin, which
//! labels each layer's snapshot with the image, its manifest and the layer
//! (`disable_snapshot_annotations = false`), nothing is unpacked ([`remote`]): every
//! blob layer becomes an empty committed snapshot at once, and the bootstrap layer's
//! snapshot is the image's lazy FUSE mount, the whole merged file tree; containerd is
//! told each layer already exists, so it downloads none of them. A container's root is
//! then an overlay whose one lower directory is that mount. A plain image with an index
//! beside it (`tessera index`) is the same, except that each of its layers' snapshots
//! is a lazy mount: of the tree of the layers up to it, since another image that
//! starts with the same layers will find and build on that snapshot.
//!
//! Metadata lives in sled ([`store`]) and outlives the agent.

pub mod clean;
pub mod remote;
mod service;
mod store;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

/// What kind of failure a snapshot operation met (defined with the crate's error,
/// which carries it).
pub use crate::error::SnapshotCode as Code;
pub use remote::Images;
pub use service::{listen, serve};
use store::{Record, Store};

use crate::{Error, Result};

/// The label containerd's unpacker puts on a layer's snapshot: the chain ID the
/// committed snapshot will have. A snapshotter that already has it answers "exists".
pub const TARGET_LABEL: &str = "containerd.io/snapshot.ref";

/// A snapshot's kind, as containerd names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Read-only, from `View`.
    View,
    /// Writable, from `Prepare`; becomes committed by `Commit`.
    Active,
    /// A layer others are made from.
    Committed,
}

fn fail(code: Code, key: &str, reason: impl Into<String>) -> Error {
    Error::Snapshot {
        code,
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// One mount of a container's root, as containerd's `Mount` message has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// A snapshot as `Stat` and `List` describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub name: String,
    pub parent: String,
    pub kind: Kind,
    pub created: SystemTime,
    pub updated: SystemTime,
    pub labels: BTreeMap<String, String>,
}

impl Info {
    fn of(name: &str, r: &Record) -> Info {
        Info {
            name: name.to_string(),
            parent: r.parent.clone(),
            kind: r.kind,
            created: r.created,
            updated: r.updated,
            labels: r.labels.clone(),
        }
    }
}

/// Prometheus metrics of the snapshotter.
#[derive(Debug, Default)]
pub struct SnapshotterMetrics {
    /// Calls from containerd, by operation and outcome (`ok` or the error's code;
    /// `already_exists` answers to `prepare` are mostly Tessera layers skipped).
    requests: Family<RequestLabel, Counter>,
    /// Tessera layers made without unpacking, by kind (`blob`, `bootstrap`).
    lazy_layers: Family<KindLabel, Counter>,
    /// Image mounts served again after a restart, by how (`taken_over`: the keeper
    /// held the connection and containers kept it; `mounted_again`; `failed`).
    restored: Family<KindLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

impl SnapshotterMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_agent_snapshotter_requests",
            "containerd's calls to the snapshotter, by operation and outcome",
            self.requests.clone(),
        );
        registry.register(
            "tessera_agent_snapshotter_lazy_layers",
            "Tessera image layers made without unpacking, by kind (blob, bootstrap)",
            self.lazy_layers.clone(),
        );
        registry.register(
            "tessera_agent_snapshotter_restored_mounts",
            "Image mounts served again after an agent restart, by how",
            self.restored.clone(),
        );
    }

    /// Counts one call of `op` that ended with `result`.
    pub fn count<T>(&self, op: &'static str, result: &Result<T>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(Error::Snapshot { code, .. }) => match code {
                Code::NotFound => "not_found",
                Code::AlreadyExists => "already_exists",
                Code::FailedPrecondition => "failed_precondition",
                Code::InvalidArgument => "invalid_argument",
                Code::Internal => "internal",
            },
            Err(_) => "error",
        };
        self.requests
            .get_or_create(&RequestLabel { op, outcome })
            .inc();
    }
}

/// Bytes and inodes a snapshot uses of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub size: i64,
    pub inodes: i64,
}

/// The snapshotter: a root directory and its metadata.
#[derive(Debug)]
pub struct Snapshotter {
    root: PathBuf,
    store: Store,
    /// Tessera images: mounted lazily instead of unpacked (absent in unit tests).
    remote: Option<remote::Remote>,
    /// Serialises changes to the metadata and the directories (reads go freely).
    changes: tokio::sync::Mutex<()>,
    pub metrics: SnapshotterMetrics,
}

impl Snapshotter {
    /// Opens (or creates) the snapshotter's root: `metadata.db` and `snapshots/`.
    pub fn open(root: &Path, remote: Option<remote::Remote>) -> Result<Arc<Snapshotter>> {
        let snapshots = root.join("snapshots");
        std::fs::create_dir_all(&snapshots).map_err(|e| Error::io("create", &snapshots, e))?;
        // Canonical, so that mount points are named as the mount table names them
        // (and never looked up through a mount whose server is away).
        let root = &std::fs::canonicalize(root).map_err(|e| Error::io("find", root, e))?;
        let store = Store::open(&root.join("metadata.db"))?;
        Ok(Arc::new(Snapshotter {
            root: root.to_path_buf(),
            store,
            remote,
            changes: tokio::sync::Mutex::new(()),
            metrics: SnapshotterMetrics::default(),
        }))
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.root.join("snapshots").join(id.to_string())
    }

    fn fs(&self, id: u64) -> PathBuf {
        self.dir(id).join("fs")
    }

    /// A new active (or, `readonly`, view) snapshot `key` on `parent`; its mounts.
    /// For a layer of a Tessera image the answer is `AlreadyExists`: the layer's
    /// committed snapshot was made without unpacking anything.
    pub async fn prepare(
        &self,
        key: &str,
        parent: &str,
        labels: BTreeMap<String, String>,
        readonly: bool,
    ) -> Result<Vec<MountSpec>> {
        if key.is_empty() {
            return Err(fail(Code::InvalidArgument, key, "a snapshot needs a key"));
        }
        if !readonly {
            if let Some(remote) = &self.remote {
                let depth = self.depth(parent)?;
                if let Some(layer) = remote.layer(&labels, depth).await {
                    return self.prepare_remote(key, parent, labels, layer).await;
                }
            }
        }
        let _changing = self.changes.lock().await;
        if self.store.get(key)?.is_some() {
            return Err(fail(
                Code::AlreadyExists,
                key,
                "a snapshot with this key exists",
            ));
        }
        self.check_parent(key, parent)?;
        let id = self.store.next_id()?;
        let dir = self.dir(id);
        for sub in ["fs", "work"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| Error::io("create", &path, e))?;
        }
        let kind = if readonly { Kind::View } else { Kind::Active };
        let record = Record::new(id, kind, parent, labels, None);
        if let Err(e) = self.store.insert_new(key, &record) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        self.mounts_of(key, &record)
    }

    /// A Tessera image's layer: its committed snapshot, named by the chain ID containerd
    /// asked for, is made at once (the bootstrap layer's with the image mounted in it),
    /// and the answer is `AlreadyExists`, which tells containerd to skip the layer.
    async fn prepare_remote(
        &self,
        key: &str,
        parent: &str,
        mut labels: BTreeMap<String, String>,
        layer: remote::Layer,
    ) -> Result<Vec<MountSpec>> {
        let exists = |why: &str| {
            fail(
                Code::AlreadyExists,
                &layer.target,
                format!("target of {key}: {why}"),
            )
        };
        {
            let _changing = self.changes.lock().await;
            if let Some(r) = self.store.get(&layer.target)? {
                if r.kind == Kind::Committed && r.parent == parent {
                    return Err(exists("already here"));
                }
                return Err(fail(
                    Code::FailedPrecondition,
                    &layer.target,
                    "a snapshot of this name exists with another parent or kind",
                ));
            }
            self.check_parent(key, parent)?;
        }
        let id = self.store.next_id()?;
        let fs = self.fs(id);
        std::fs::create_dir_all(&fs).map_err(|e| Error::io("create", &fs, e))?;
        let remote = self.remote.as_ref().expect("a remote layer comes from it");
        let tree = match layer.holds {
            remote::Holds::Tree(layers) => Some(layers),
            remote::Holds::Nothing => None,
        };
        if let Some(layers) = tree {
            if let Err(e) = remote.mount(&layer.image, layers, &fs).await {
                let _ = std::fs::remove_dir_all(self.dir(id));
                return Err(e);
            }
        }
        labels.insert(TARGET_LABEL.into(), layer.target.clone());
        labels.insert(remote::REMOTE_LABEL.into(), "true".into());
        let remote_of = store::Remote {
            image: layer.image.clone(),
            layer: layer.digest.clone(),
            mounted: tree.is_some(),
            layers: tree.flatten(),
        };
        let record = Record::new(id, Kind::Committed, parent, labels, Some(remote_of));
        let _changing = self.changes.lock().await;
        if let Err(e) = self.store.insert_new(&layer.target, &record) {
            // Another pull of the same image made it meanwhile: ours goes.
            if tree.is_some() {
                remote.unmount(&fs).await;
            }
            let _ = std::fs::remove_dir_all(self.dir(id));
            return match e {
                Error::Snapshot {
                    code: Code::AlreadyExists,
                    ..
                } => Err(exists("made meanwhile")),
                e => Err(e),
            };
        }
        tracing::info!(
            image = %layer.image,
            layer = %layer.digest,
            snapshot = %layer.target,
            holds = ?layer.holds,
            "Tessera layer: nothing to unpack"
        );
        let kind = match tree {
            Some(None) => "bootstrap",
            Some(Some(_)) => "layer_prefix",
            None => "blob",
        };
        self.metrics
            .lazy_layers
            .get_or_create(&KindLabel { kind })
            .inc();
        Err(exists("a Tessera layer, mounted lazily"))
    }

    /// How many snapshots the chain from `parent` down holds (a layer prepared on it is
    /// the image's layer at that index).
    fn depth(&self, parent: &str) -> Result<u32> {
        let (mut depth, mut key) = (0, parent.to_string());
        while !key.is_empty() {
            depth += 1;
            key = self.store.require(&key)?.parent;
        }
        Ok(depth)
    }

    /// A parent must be committed (an active snapshot changes under its children).
    fn check_parent(&self, key: &str, parent: &str) -> Result<()> {
        if parent.is_empty() {
            return Ok(());
        }
        match self.store.get(parent)? {
            None => Err(fail(
                Code::NotFound,
                key,
                format!("parent {parent:?} does not exist"),
            )),
            Some(p) if p.kind != Kind::Committed => Err(fail(
                Code::InvalidArgument,
                key,
                format!("parent {parent:?} is not a committed snapshot"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// The mounts of an active snapshot or a view.
    pub fn mounts(&self, key: &str) -> Result<Vec<MountSpec>> {
        let record = self.store.require(key)?;
        self.mounts_of(key, &record)
    }

    fn mounts_of(&self, key: &str, record: &Record) -> Result<Vec<MountSpec>> {
        if record.kind == Kind::Committed {
            return Err(fail(
                Code::FailedPrecondition,
                key,
                "a committed snapshot has no mounts: view or prepare on it",
            ));
        }
        let lowers = self.lower_dirs(&record.parent)?;
        let path = |p: &Path| p.display().to_string();
        let bind = |source: &Path, readonly: bool| MountSpec {
            kind: "bind".into(),
            source: path(source),
            options: vec![if readonly { "ro" } else { "rw" }.into(), "rbind".into()],
        };
        let lowerdir = || {
            let dirs: Vec<String> = lowers.iter().map(|p| path(p)).collect();
            format!("lowerdir={}", dirs.join(":"))
        };
        let view = record.kind == Kind::View;
        Ok(vec![match lowers.len() {
            0 => bind(&self.fs(record.id), view),
            1 if view => bind(&lowers[0], true),
            _ if view => MountSpec {
                kind: "overlay".into(),
                source: "overlay".into(),
                options: vec![lowerdir()],
            },
            _ => MountSpec {
                kind: "overlay".into(),
                source: "overlay".into(),
                options: vec![
                    format!("workdir={}", path(&self.dir(record.id).join("work"))),
                    format!("upperdir={}", path(&self.fs(record.id))),
                    lowerdir(),
                ],
            },
        }])
    }

    /// The directories under a snapshot on `parent`, nearest first. A Tessera image's
    /// mount is the whole merged tree, so the walk ends there; its blob layers hold
    /// nothing.
    fn lower_dirs(&self, parent: &str) -> Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        let mut key = parent.to_string();
        while !key.is_empty() {
            let record = self.store.require(&key)?;
            match &record.remote {
                Some(r) if r.mounted => {
                    dirs.push(self.fs(record.id));
                    break;
                }
                Some(_) => {}
                None => dirs.push(self.fs(record.id)),
            }
            key = record.parent;
        }
        Ok(dirs)
    }

    /// Makes active snapshot `key` the committed snapshot `name`.
    pub async fn commit(
        &self,
        name: &str,
        key: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<()> {
        let _changing = self.changes.lock().await;
        let mut record = self.store.require(key)?;
        if record.kind != Kind::Active {
            return Err(fail(
                Code::FailedPrecondition,
                key,
                "only an active snapshot can be committed",
            ));
        }
        if self.store.get(name)?.is_some() {
            return Err(fail(
                Code::AlreadyExists,
                name,
                "a snapshot with this name exists",
            ));
        }
        let fs = self.fs(record.id);
        let usage = tokio::task::spawn_blocking(move || disk_usage(&fs))
            .await
            .map_err(|e| fail(Code::Internal, key, format!("measure usage: {e}")))??;
        record.kind = Kind::Committed;
        record.labels = labels;
        record.updated = SystemTime::now();
        record.size = usage.size;
        record.inodes = usage.inodes;
        self.store.rename(key, name, &record)
    }

    /// Removes snapshot `key` (it must have no children): its record, then its
    /// directory (a Tessera image's mount is unmounted first).
    pub async fn remove(&self, key: &str) -> Result<()> {
        let record = {
            let _changing = self.changes.lock().await;
            let record = self.store.require(key)?;
            if self.store.has_children(key)? {
                return Err(fail(
                    Code::FailedPrecondition,
                    key,
                    "other snapshots are based on it; remove them first",
                ));
            }
            self.store.remove(key)?;
            record
        };
        let dir = self.dir(record.id);
        if record.remote.as_ref().is_some_and(|r| r.mounted) {
            if let Some(remote) = &self.remote {
                remote.unmount(&dir.join("fs")).await;
            }
        }
        self.remove_dir(dir).await;
        Ok(())
    }

    /// Removes a snapshot's directory, unless something is still mounted in it (then it
    /// is left for `Cleanup`, and said so).
    async fn remove_dir(&self, dir: PathBuf) {
        let root_dev = std::fs::metadata(&self.root).map(|m| m.dev()).ok();
        let _ = tokio::task::spawn_blocking(move || {
            let mounted = std::fs::metadata(dir.join("fs"))
                .map(|m| Some(m.dev()) != root_dev)
                .unwrap_or(false);
            if mounted {
                tracing::warn!(dir = %dir.display(), "a snapshot's directory is still a mount point; left in place");
                return;
            }
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove a snapshot's directory");
                }
            }
        })
        .await;
    }

    pub fn stat(&self, key: &str) -> Result<Info> {
        Ok(Info::of(key, &self.store.require(key)?))
    }

    /// Changes a snapshot's labels (the one thing that may change): all of them when
    /// `paths` is empty or holds `labels`, else each `labels.<key>` named.
    pub async fn update(&self, info: Info, paths: &[String]) -> Result<Info> {
        let _changing = self.changes.lock().await;
        let mut record = self.store.require(&info.name)?;
        if paths.is_empty() {
            record.labels = info.labels.clone();
        }
        for path in paths {
            if path == "labels" {
                record.labels = info.labels.clone();
            } else if let Some(label) = path.strip_prefix("labels.") {
                match info.labels.get(label) {
                    Some(v) => record.labels.insert(label.to_string(), v.clone()),
                    None => record.labels.remove(label),
                };
            } else {
                return Err(fail(
                    Code::InvalidArgument,
                    &info.name,
                    format!("cannot update {path:?}: only labels change"),
                ));
            }
        }
        record.updated = SystemTime::now();
        self.store.put(&info.name, &record)?;
        Ok(Info::of(&info.name, &record))
    }

    /// Every snapshot matching any of `filters` (containerd's filter syntax: terms
    /// joined by `,` must all hold; see [`Filter`]), every one when there are none.
    pub fn list(&self, filters: &[String]) -> Result<Vec<Info>> {
        let filters = filters
            .iter()
            .filter(|f| !f.trim().is_empty())
            .map(|f| Filter::parse(f))
            .collect::<Result<Vec<_>>>()?;
        Ok(self
            .store
            .all()?
            .into_iter()
            .map(|(key, r)| Info::of(&key, &r))
            .filter(|info| filters.is_empty() || filters.iter().any(|f| f.matches(info)))
            .collect())
    }

    /// What a snapshot uses of its own: measured now for an active one, at commit for a
    /// committed one; for a Tessera image's mount, the bytes of its chunks the cache
    /// holds now (shared chunks count in every image holding them); nothing for a
    /// layer that only names a blob. Removing the image does not free those bytes at
    /// once: it unpins them, and the cache evicts them when it is past its capacity
    /// or its disk watermarks, or at a prune.
    pub async fn usage(&self, key: &str) -> Result<Usage> {
        let record = self.store.require(key)?;
        if let Some(remote_of) = &record.remote {
            let held = match (&self.remote, remote_of.mounted) {
                (Some(remote), true) => remote.mounted_bytes(&self.fs(record.id)).await,
                _ => None,
            };
            return Ok(Usage {
                size: held.map_or(0, |bytes| bytes as i64),
                inodes: 0,
            });
        }
        if record.kind == Kind::Committed {
            return Ok(Usage {
                size: record.size,
                inodes: record.inodes,
            });
        }
        let fs = self.fs(record.id);
        tokio::task::spawn_blocking(move || disk_usage(&fs))
            .await
            .map_err(|e| fail(Code::Internal, key, format!("measure usage: {e}")))?
    }

    /// Removes directories no snapshot names (left by a crash, or by a remove that
    /// found a mount still in place).
    pub async fn cleanup(&self) -> Result<()> {
        let _changing = self.changes.lock().await;
        let known: std::collections::HashSet<u64> =
            self.store.all()?.iter().map(|(_, r)| r.id).collect();
        let snapshots = self.root.join("snapshots");
        let entries =
            std::fs::read_dir(&snapshots).map_err(|e| Error::io("read", &snapshots, e))?;
        for entry in entries.flatten() {
            let id = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok());
            if id.is_some_and(|id| !known.contains(&id)) {
                self.remove_dir(entry.path()).await;
            }
        }
        Ok(())
    }

    /// Mounts again what was mounted before the agent restarted: each Tessera image
    /// snapshot's lazy mount.
    pub async fn restore(&self) -> Result<()> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        let mut held = remote.held();
        for (key, record) in self.store.all()? {
            let Some(r) = record.remote.filter(|r| r.mounted) else {
                continue;
            };
            let fs = self.fs(record.id);
            let connection = held.remove(&fs);
            let outcome = remote.restore(&r.image, r.layers, &fs, connection).await;
            let kind = match &outcome {
                Ok(true) => "taken_over",
                Ok(false) => "mounted_again",
                Err(_) => "failed",
            };
            self.metrics
                .restored
                .get_or_create(&KindLabel { kind })
                .inc();
            match outcome {
                Ok(_) => {
                    tracing::info!(snapshot = %key, image = %r.image, how = kind, "serving again")
                }
                Err(e) => {
                    tracing::error!(snapshot = %key, image = %r.image, error = %e, "could not mount a Tessera image snapshot again; containers from it will not start until it is")
                }
            }
        }
        for stray in held.keys() {
            remote.release(stray);
        }
        Ok(())
    }
}

/// Bytes (allocated blocks) and inodes under `dir`, each inode counted once, as
/// containerd's `fs.DiskUsage` counts them.
fn disk_usage(dir: &Path) -> Result<Usage> {
    let mut seen = std::collections::HashSet::new();
    let mut usage = Usage::default();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(|e| Error::io("stat", &path, e))?;
        if seen.insert((meta.dev(), meta.ino())) {
            usage.size += (meta.blocks() * 512) as i64;
            usage.inodes += 1;
        }
        if meta.is_dir() {
            let entries = std::fs::read_dir(&path).map_err(|e| Error::io("read", &path, e))?;
            todo.extend(entries.flatten().map(|e| e.path()));
        }
    }
    Ok(usage)
}

/// One of containerd's snapshot filters: terms joined by `,`, each `field`,
/// `field==value` or `field!=value` with `field` one of `name`, `parent`, `kind`,
/// `labels.<key>` (the key or value may be double-quoted).
#[derive(Debug, PartialEq)]
struct Filter(Vec<Term>);

#[derive(Debug, PartialEq)]
struct Term {
    field: Field,
    /// `None`: the field is present (non-empty).
    test: Option<(bool, String)>,
}

#[derive(Debug, PartialEq)]
enum Field {
    Name,
    Parent,
    Kind,
    Label(String),
}

impl Filter {
    fn parse(input: &str) -> Result<Filter> {
        let bad = |why: &str| {
            fail(
                Code::InvalidArgument,
                "",
                format!("filter {input:?}: {why}"),
            )
        };
        let mut terms = Vec::new();
        for term in split_outside_quotes(input, ',') {
            let term = term.trim();
            let (field, test) = match (term.find("=="), term.find("!=")) {
                (Some(i), _) => (&term[..i], Some((true, &term[i + 2..]))),
                (None, Some(i)) => (&term[..i], Some((false, &term[i + 2..]))),
                (None, None) => (term, None),
            };
            let field = match field.trim() {
                "name" => Field::Name,
                "parent" => Field::Parent,
                "kind" => Field::Kind,
                f => match f.strip_prefix("labels.") {
                    Some(k) if !k.is_empty() => Field::Label(unquote(k)),
                    _ => return Err(bad(&format!("unknown field {f:?}"))),
                },
            };
            terms.push(Term {
                field,
                test: test.map(|(eq, v)| (eq, unquote(v.trim()))),
            });
        }
        if terms.is_empty() {
            return Err(bad("empty"));
        }
        Ok(Filter(terms))
    }

    fn matches(&self, info: &Info) -> bool {
        self.0.iter().all(|t| {
            let value = match &t.field {
                Field::Name => Some(info.name.clone()),
                Field::Parent => Some(info.parent.clone()),
                Field::Kind => Some(
                    match info.kind {
                        Kind::View => "view",
                        Kind::Active => "active",
                        Kind::Committed => "committed",
                    }
                    .to_string(),
                ),
                Field::Label(k) => info.labels.get(k).cloned(),
            };
            match (&t.test, value) {
                (None, v) => v.is_some_and(|v| !v.is_empty()),
                (Some((eq, want)), v) => (v.as_deref().unwrap_or("") == want) == *eq,
            }
        })
    }
}

fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let (mut parts, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn unquote(s: &str) -> String {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .map(|s| s.replace("\\\"", "\""))
        .unwrap_or_else(|| s.to_string())
}

#[cfg(test)]
mod tests;
