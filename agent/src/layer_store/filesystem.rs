//! The store's `fuser::Filesystem`, and its mount.
//!
//! Everything the store already knows is answered on the session thread; what needs
//! the network (resolving a name, mounting an image's tree, reading a `blob`) is
//! spawned on the agent's runtime, which replies when it is done, so one slow registry
//! never holds up the other lookups.
//!
//! The mount is not read-only at the VFS level, unlike the images' mounts: on a
//! read-only mount the kernel itself answers the `use` file's create with EROFS, and
//! containers/storage wants ENOENT ("reference counted, nothing to clean up"). Every
//! other change is refused with EROFS here.

use std::ffi::{c_int, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, Request, Session, SessionUnmounter,
};

use super::{LayerFile, LayerStore, Node, StoreImage, ROOT_INO};
use crate::fs::errno::{EINVAL, EIO, ENOENT, ENOTDIR, EROFS, O_ACCMODE, O_RDONLY};
use crate::fs::mount_table::{fuse_mounted_at, lazy_unmount};
use crate::{Error, Result};

/// How long the kernel may keep a root entry: a tag can move, so the name is asked
/// about again soon (the store answers from its own cache, `TAG_TTL`).
const NAME_TTL: Duration = Duration::from_secs(1);
/// Everything under a name is named by digest and never changes.
const TTL: Duration = Duration::from_secs(3600);

/// The store mounted at its root; unmounted by [`Served::unmount`] or when dropped.
#[derive(Debug)]
pub struct Served {
    root: PathBuf,
    /// `None` once unmounted.
    unmounter: Option<SessionUnmounter>,
    /// The session thread; it ends when the kernel lets go of the mount.
    _session: JoinHandle<()>,
}

/// Mounts `store` at `root` (created if missing), as `fsname` in the mount table.
/// Call from inside the runtime the store's network work is to run on.
pub fn serve(store: Arc<LayerStore>, root: &Path, fsname: String) -> Result<Served> {
    std::fs::create_dir_all(root).map_err(|e| Error::io("create", root, e))?;
    let root = root
        .canonicalize()
        .map_err(|e| Error::io("mount the layer store on", root, e))?;
    if fuse_mounted_at(&root) {
        // A store a crashed agent left (its connection is gone).
        tracing::warn!(root = %root.display(), "a FUSE mount is at the layer store's root already: detaching it");
        lazy_unmount(&root)?;
    }
    let fs = StoreFs {
        store,
        runtime: tokio::runtime::Handle::current(),
        mounted_at: SystemTime::now(),
    };
    let options = [
        MountOption::FSName(fsname),
        // `fuse.tessera`, so the next agent's sweep of stale mounts finds it.
        MountOption::CUSTOM("subtype=tessera".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        // Podman's and CRI-O's container processes (other users) go through it.
        MountOption::AllowOther,
    ];
    let mut session = Session::new(fs, &root, &options)
        .map_err(|e| Error::io("mount the layer store at", &root, e))?;
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("tessera-store".into())
        .spawn(move || {
            if let Err(e) = session.run() {
                tracing::error!(error = %e, "the layer store's FUSE session failed");
            }
        })
        .map_err(|e| Error::io("start the FUSE session thread of", &root, e))?;
    tracing::info!(root = %root.display(), "layer store mounted");
    Ok(Served {
        root,
        unmounter: Some(unmounter),
        _session: thread,
    })
}

impl Served {
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Unmounts the store (lazily if a process is inside it). The images' trees are
    /// the agent's mounts and go with them.
    pub fn unmount(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(mut unmounter) = self.unmounter.take() else {
            return;
        };
        let _ = unmounter.unmount();
        if fuse_mounted_at(&self.root) {
            if let Err(e) = lazy_unmount(&self.root) {
                tracing::error!(root = %self.root.display(), error = %e, "could not unmount the layer store");
                return;
            }
        }
        tracing::info!(root = %self.root.display(), "layer store unmounted");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct StoreFs {
    store: Arc<LayerStore>,
    runtime: tokio::runtime::Handle,
    /// Every inode's times: nothing here has others.
    mounted_at: SystemTime,
}

impl StoreFs {
    fn attr(&self, ino: u64, kind: FileType, size: u64) -> FileAttr {
        attr(self.mounted_at, ino, kind, size)
    }

    fn node(&self, ino: u64) -> std::result::Result<Node, c_int> {
        self.store.node(ino).ok_or(ENOENT)
    }

    fn attr_of(&self, ino: u64, node: &Node) -> FileAttr {
        match node {
            Node::Root | Node::Image(_) | Node::Layer(..) => self.attr(ino, FileType::Directory, 0),
            Node::File(image, i, file) => {
                let layer = &image.layers()[*i];
                match file {
                    LayerFile::Diff if layer.shows_tree() => {
                        let target = layer.tree().map_or(0, |t| t.as_os_str().len() as u64);
                        self.attr(ino, FileType::Symlink, target)
                    }
                    LayerFile::Diff => self.attr(ino, FileType::Directory, 0),
                    LayerFile::Info => {
                        self.attr(ino, FileType::RegularFile, layer.info().len() as u64)
                    }
                    LayerFile::Blob => self.attr(ino, FileType::RegularFile, layer.size()),
                }
            }
        }
    }

    /// A root entry: resolving the name may take the network.
    fn lookup_name(&self, name: &OsStr, reply: ReplyEntry) {
        let entry = |image: &StoreImage, at: SystemTime, reply: ReplyEntry| {
            reply.entry(&NAME_TTL, &attr(at, image.base, FileType::Directory, 0), 0)
        };
        if let Some(answer) = self.store.cached(name) {
            return match answer {
                Some(image) => entry(&image, self.mounted_at, reply),
                None => reply.error(ENOENT),
            };
        }
        let (store, name, at) = (self.store.clone(), name.to_os_string(), self.mounted_at);
        self.runtime.spawn(async move {
            match store.resolve(&name).await {
                Some(image) => entry(&image, at, reply),
                None => reply.error(ENOENT),
            }
        });
    }

    /// A layer directory's entry: a `diff` that shows a tree (a Tessera image's
    /// bootstrap layer, an indexed image's every layer) is mounted first if it is not
    /// yet.
    fn lookup_in_layer(&self, image: Arc<StoreImage>, i: usize, name: &OsStr, reply: ReplyEntry) {
        let Some(file) = LayerFile::ALL
            .into_iter()
            .find(|f| f.name().as_bytes() == name.as_bytes())
        else {
            // `use` among them: containers/storage's "in use" notification, which a
            // store that counts references answers with ENOENT.
            return reply.error(ENOENT);
        };
        let ino = image.file_ino(i, file);
        let layer = &image.layers()[i];
        let needs_tree = file == LayerFile::Diff && layer.shows_tree();
        if !needs_tree || layer.tree().is_some_and(|t| self.store.serves(t)) {
            let attr = self.attr_of(ino, &Node::File(image.clone(), i, file));
            return reply.entry(&TTL, &attr, 0);
        }
        let (store, at) = (self.store.clone(), self.mounted_at);
        self.runtime.spawn(async move {
            match store.mount_tree(&image, i).await {
                Ok(tree) => {
                    let size = tree.as_os_str().len() as u64;
                    reply.entry(&TTL, &attr(at, ino, FileType::Symlink, size), 0);
                }
                Err(e) => {
                    tracing::error!(image = %image.reference(), error = %e, "layer store: could not mount an image's tree; the layer's diff fails with EIO");
                    reply.error(EIO);
                }
            }
        });
    }

    /// A directory's entries: (inode, kind, name).
    fn entries(
        &self,
        ino: u64,
        node: &Node,
    ) -> std::result::Result<Vec<(u64, FileType, String)>, c_int> {
        let mut list = vec![
            (ino, FileType::Directory, ".".to_string()),
            (ROOT_INO, FileType::Directory, "..".to_string()),
        ];
        match node {
            // Names are never listed: the store only answers lookups.
            Node::Root => {}
            Node::Image(image) => {
                for (i, layer) in image.layers().iter().enumerate() {
                    list.push((
                        image.layer_ino(i),
                        FileType::Directory,
                        layer.digest().to_string(),
                    ));
                }
            }
            Node::Layer(image, i) => {
                for file in LayerFile::ALL {
                    let ino = image.file_ino(*i, file);
                    let kind = self.attr_of(ino, &Node::File(image.clone(), *i, file)).kind;
                    list.push((ino, kind, file.name().to_string()));
                }
            }
            Node::File(image, i, LayerFile::Diff) if !image.layers()[*i].shows_tree() => {}
            Node::File(..) => return Err(ENOTDIR),
        }
        Ok(list)
    }
}

/// The attributes of inode `ino`: everything belongs to root and is read-only, and
/// its times are the mount's.
fn attr(at: SystemTime, ino: u64, kind: FileType, size: u64) -> FileAttr {
    let (perm, nlink) = match kind {
        FileType::Directory => (0o555, 2),
        FileType::Symlink => (0o777, 1),
        _ => (0o444, 1),
    };
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: at,
        mtime: at,
        ctime: at,
        crtime: at,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 128 * 1024,
        flags: 0,
    }
}

impl Filesystem for StoreFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match self.node(parent) {
            Ok(Node::Root) => self.lookup_name(name, reply),
            Ok(Node::Image(image)) => match image.layer_named(name.as_bytes()) {
                Some(i) => {
                    let ino = image.layer_ino(i);
                    reply.entry(&TTL, &self.attr(ino, FileType::Directory, 0), 0)
                }
                None => reply.error(ENOENT),
            },
            Ok(Node::Layer(image, i)) => self.lookup_in_layer(image, i, name, reply),
            // An empty `diff`.
            Ok(Node::File(_, _, LayerFile::Diff)) => reply.error(ENOENT),
            Ok(Node::File(..)) => reply.error(ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.node(ino) {
            Ok(node) => {
                let ttl = if matches!(node, Node::Image(_)) {
                    NAME_TTL
                } else {
                    TTL
                };
                reply.attr(&ttl, &self.attr_of(ino, &node))
            }
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        match self.node(ino) {
            Ok(Node::File(image, i, LayerFile::Diff)) => match image.layers()[i].tree() {
                Some(tree) if self.store.serves(tree) => reply.data(tree.as_os_str().as_bytes()),
                // Unmounted behind our back (the kernel still has the entry): never
                // the empty mount point. Mounted again for the next try.
                _ => {
                    let store = self.store.clone();
                    self.runtime.spawn(async move {
                        if let Err(e) = store.mount_tree(&image, i).await {
                            tracing::error!(image = %image.reference(), error = %e, "layer store: could not mount an image's tree again");
                        }
                    });
                    reply.error(EIO)
                }
            },
            Ok(_) => reply.error(EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & O_ACCMODE != O_RDONLY {
            return reply.error(EROFS);
        }
        match self.node(ino) {
            Ok(Node::File(_, _, LayerFile::Info | LayerFile::Blob)) => {
                reply.opened(0, fuser::consts::FOPEN_KEEP_CACHE)
            }
            Ok(_) => reply.error(EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let (image, i, file) = match self.node(ino) {
            Ok(Node::File(image, i, file)) => (image, i, file),
            Ok(_) => return reply.error(EINVAL),
            Err(e) => return reply.error(e),
        };
        let layer = &image.layers()[i];
        let len = match file {
            LayerFile::Info => layer.info().len() as u64,
            LayerFile::Blob => layer.size(),
            LayerFile::Diff => return reply.error(EINVAL),
        };
        let start = u64::try_from(offset).unwrap_or(0).min(len);
        let end = start.saturating_add(size.into()).min(len);
        if start == end {
            return reply.data(&[]);
        }
        if file == LayerFile::Info {
            return reply.data(&layer.info()[start as usize..end as usize]);
        }
        // `blob` is read only by `podman save` and `push`: straight from the
        // registry, a Range request per read.
        let (store, digest) = (self.store.clone(), layer.digest().to_string());
        self.runtime.spawn(async move {
            let client = store.registry_client();
            match client.blob_range(image.reference(), &digest, start..end).await {
                Ok(bytes) if bytes.len() as u64 == end - start => reply.data(&bytes),
                Ok(bytes) => {
                    tracing::warn!(blob = %digest, got = bytes.len(), wanted = end - start, "layer store: a short blob read");
                    reply.error(EIO)
                }
                Err(e) => {
                    tracing::warn!(blob = %digest, error = %e, "layer store: could not read a blob");
                    reply.error(EIO)
                }
            }
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let list = match self.node(ino).and_then(|node| self.entries(ino, &node)) {
            Ok(list) => list,
            Err(e) => return reply.error(e),
        };
        let skip = usize::try_from(offset).unwrap_or(0);
        for (n, (ino, kind, name)) in list.into_iter().enumerate().skip(skip) {
            if reply.add(ino, (n + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// The `use` notification (containers/storage: "this layer is in use"): ENOENT is
    /// what a store that counts references answers. This one does not count yet.
    fn create(
        &mut self,
        _req: &Request<'_>,
        _parent: u64,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(ENOENT);
    }

    /// The release of a layer (rmdir of its directory): ENOENT, as for `use`.
    fn rmdir(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(ENOENT);
    }

    // Everything below would change the store.

    crate::fs::refuse_changes!();
}
