//! The `fuser::Filesystem` of an image: bootstrap records become FUSE replies.
//!
//! Metadata is answered inline on the session thread (the bootstrap is in memory, and
//! a record read is a bounds check and a few loads); reads go to the [`Pool`]. Every
//! operation that would change anything answers `EROFS` — the kernel already refuses
//! them on a read-only mount, this is for requests that reach us anyway.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::consts::{self, FOPEN_KEEP_CACHE};
use fuser::{
    BackingId, FileAttr, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request,
};
use prometheus_client::metrics::histogram::Histogram;
use rafs_format::reader::{Bootstrap, FileChunk, FileKind, Inode};

use super::attr::{self, TTL};
use super::errno::{
    EBADF, EINVAL, EIO, ENODATA, ENOENT, ENOSYS, ENOTDIR, ENOTTY, ERANGE, EROFS, O_ACCMODE,
    O_RDONLY, W_OK,
};
use super::pool::Pool;
use super::read::{clamp, read_range};
use super::{ChunkReader, FsStats};

/// `statfs` block size; also the unit of the image's size there.
const STATFS_BLOCK: u32 = 4096;
/// Longest name, as the format allows (format.md §8).
const NAME_MAX: u32 = 255;
/// A directory listing tells the reader about this many of the regular files it names
/// at most ([`ChunkReader::listed`]), and about files of this many bytes in all.
const LISTED_FILES: usize = 128;
const LISTED_BYTES: u64 = 64 << 20;
/// Closed files whose backing id stays registered at most. Each holds a kernel file
/// open on a chunk file or backing copy (a few hundred bytes of kernel memory; an
/// evicted file's disk space is freed when its id goes), and covers a tree of this
/// many files read twice.
const MAX_IDLE_BACKING: usize = 65_536;

/// One mounted image, owned by the session thread.
pub struct ImageFs {
    bootstrap: Arc<Bootstrap>,
    reader: Arc<dyn ChunkReader>,
    stats: Arc<FsStats>,
    pool: Pool,
    /// Open regular files by inode, with their pieces looked up (and validated) once
    /// at open, so that each read is a binary search instead of a walk of the list.
    /// The file handle given to the kernel is the inode number: a session that takes
    /// over a FUSE connection after a restart (see `handover`) can serve handles it
    /// never gave out. Closed files with a backing file stay here too (see `idle`).
    open_files: HashMap<u64, Opened>,
    /// Closed files kept with their backing id registered, oldest close first
    /// (close sequence → inode): the next open of one is a map lookup, with no chunk
    /// file to open and no backing file to register, nor one to unregister at its
    /// close. A walk that reads a tree twice (a second `tar`, a second start of the
    /// same program) opens each file again. Kept until the kernel forgets the inode or
    /// `MAX_IDLE_BACKING` newer ones push it out.
    idle: BTreeMap<u64, u64>,
    next_close: u64,
    /// Asynchronous requests (readahead) the kernel may keep in flight: enough to keep
    /// every worker busy with some queued behind, rather than the kernel's default 12.
    max_background: u16,
    /// The image's data size in `STATFS_BLOCK`s, computed at the first `statfs`.
    statfs_blocks: Option<u64>,
    /// Where read latency (queueing included) is recorded, if anywhere.
    read_latency: Option<Histogram>,
    /// The mount asked for FUSE passthrough.
    passthrough_wanted: bool,
    /// Open files with a backing file: asked for, accepted by the kernel at `init`
    /// (a session that takes over a connection never sees one), and not refused since.
    passthrough: bool,
}

/// An inode's extended attributes: (name, value), sorted by name.
type Xattrs<'a> = Vec<(&'a [u8], &'a [u8])>;

/// A regular file the kernel has open (`opens` times), or closed but kept for its
/// backing id (`idle`: its key in `ImageFs::idle`).
#[derive(Debug)]
struct Opened {
    file: OpenFile,
    opens: u32,
    idle: Option<u64>,
}

#[derive(Debug)]
struct OpenFile {
    ino: u32,
    size: u64,
    pieces: Arc<[FileChunk]>,
    /// The backing file the kernel reads this file from (FUSE passthrough), kept
    /// registered while the file is open: every open of an inode must name the same.
    backing: Option<BackingId>,
}

impl std::fmt::Debug for ImageFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageFs")
            .field("inodes", &self.bootstrap.inode_count())
            .field("open_files", &self.open_files.len())
            .finish_non_exhaustive()
    }
}

impl ImageFs {
    pub fn new(
        bootstrap: Arc<Bootstrap>,
        reader: Arc<dyn ChunkReader>,
        stats: Arc<FsStats>,
        pool: Pool,
        workers: usize,
        read_latency: Option<Histogram>,
        passthrough: bool,
    ) -> Self {
        let max_background = workers.saturating_mul(2).clamp(16, 1024) as u16;
        ImageFs {
            bootstrap,
            reader,
            stats,
            pool,
            open_files: HashMap::new(),
            idle: BTreeMap::new(),
            next_close: 0,
            max_background,
            statfs_blocks: None,
            read_latency,
            passthrough_wanted: passthrough,
            passthrough: false,
        }
    }

    /// Inode `ino`; ENOENT for a number the image does not have (the kernel only
    /// uses numbers we gave it, so this is defensive), EIO for a corrupt record.
    fn inode(&self, ino: u64) -> Result<Inode, c_int> {
        match u32::try_from(ino) {
            Ok(n) if n != 0 && n <= self.bootstrap.inode_count() => {
                self.bootstrap.inode(n).map_err(|e| self.corrupt(n, &e))
            }
            _ => Err(ENOENT),
        }
    }

    fn attr_of(&self, ino: u32) -> Result<FileAttr, c_int> {
        let inode = self.inode(ino.into())?;
        Ok(attr::attr(&self.bootstrap, &inode))
    }

    fn directory(&self, ino: u64) -> Result<Inode, c_int> {
        let dir = self.inode(ino)?;
        if dir.kind != FileKind::Directory {
            return Err(ENOTDIR);
        }
        Ok(dir)
    }

    /// Logs a bootstrap record that failed validation and gives the errno to answer.
    fn corrupt(&self, ino: u32, error: &rafs_format::Error) -> c_int {
        FsStats::count(&self.stats.errors, 1);
        tracing::error!(ino, %error, "corrupt bootstrap record; answered EIO");
        EIO
    }

    fn find(&self, parent: u64, name: &[u8]) -> Result<Option<FileAttr>, c_int> {
        let dir = self.directory(parent)?;
        match self.bootstrap.lookup(&dir, name) {
            Ok(Some(entry)) => self.attr_of(entry.ino).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(self.corrupt(dir.ino, &e)),
        }
    }

    /// Walks directory `ino` from readdir offset `offset` — `.` is offset 0, `..` is 1,
    /// stored entry `k` is `k + 2` — calling `add(ino, next_offset, kind, name)` for
    /// each until it answers `true` (the reply buffer is full).
    fn list(
        &self,
        ino: u64,
        offset: i64,
        mut add: impl FnMut(u32, i64, FileKind, &[u8]) -> Result<bool, c_int>,
    ) -> Result<(), c_int> {
        let dir = self.directory(ino)?;
        let start = u64::try_from(offset).map_err(|_| EINVAL)?;
        let end = 2 + u64::from(self.bootstrap.dir_len(&dir));
        for k in start..end {
            let next = (k + 1) as i64;
            let full = match k {
                0 => add(dir.ino, next, FileKind::Directory, b".")?,
                // The root's parent is the root (format.md §6.1).
                1 => add(dir.parent, next, FileKind::Directory, b"..")?,
                _ => match self.bootstrap.dir_entry(&dir, (k - 2) as u32) {
                    Ok(Some(e)) => add(e.ino, next, e.kind, e.name)?,
                    Ok(None) => break,
                    Err(e) => return Err(self.corrupt(dir.ino, &e)),
                },
            };
            if full {
                break;
            }
        }
        Ok(())
    }

    fn open_file(&self, ino: u64) -> Result<OpenFile, c_int> {
        let inode = self.inode(ino)?;
        if inode.kind != FileKind::Regular {
            // Directories are opened with opendir; devices, fifos and sockets by the
            // kernel itself.
            return Err(EINVAL);
        }
        let pieces = self
            .bootstrap
            .file_chunks(&inode)
            .map_err(|e| self.corrupt(inode.ino, &e))?;
        Ok(OpenFile {
            ino: inode.ino,
            size: inode.size,
            pieces: pieces.into(),
            backing: None,
        })
    }

    /// A backing file for `file`, registered with the kernel, when passthrough is on
    /// and the reader has one. A refusal turns passthrough off for the mount: the next
    /// file would be refused for the same reason (say, a cache on overlayfs).
    fn backing_for(&mut self, file: &OpenFile, reply: &ReplyOpen) -> Option<BackingId> {
        if !self.passthrough || file.size == 0 {
            return None;
        }
        let backing = self.reader.backing_file(&file.pieces, file.size)?;
        match reply.open_backing(&backing) {
            Ok(id) => {
                FsStats::count(&self.stats.passthrough_opens, 1);
                Some(id)
            }
            Err(error) => {
                self.passthrough = false;
                tracing::warn!(%error, "the kernel refused a FUSE passthrough backing file (is the cache on overlayfs or another FUSE mount?): every read of this mount goes through the agent");
                None
            }
        }
    }

    /// Tells the reader about the regular files `inos` a listing just named, within the
    /// `LISTED_*` budget (a file bigger than what is left of it is skipped).
    fn tell_listed(&self, inos: &[u32]) {
        let mut files = Vec::new();
        let mut bytes = 0;
        for &ino in inos.iter().take(LISTED_FILES) {
            let Ok(inode) = self.bootstrap.inode(ino) else {
                continue;
            };
            if inode.size == 0 || inode.size > LISTED_BYTES - bytes {
                continue;
            }
            if let Ok(pieces) = self.bootstrap.file_chunks(&inode) {
                bytes += inode.size;
                files.push((pieces, inode.size));
            }
        }
        if !files.is_empty() {
            self.reader.listed(files);
        }
    }

    fn xattrs(&self, ino: u64) -> Result<Xattrs<'_>, c_int> {
        let inode = self.inode(ino)?;
        self.bootstrap
            .xattrs(&inode)
            .map_err(|e| self.corrupt(inode.ino, &e))
    }

    /// The image's data in `STATFS_BLOCK`s: what its blobs hold uncompressed (each
    /// chunk once, however many files share it).
    fn data_blocks(&mut self) -> u64 {
        if let Some(blocks) = self.statfs_blocks {
            return blocks;
        }
        let bytes = match self.bootstrap.blobs() {
            Ok(blobs) => blobs.iter().map(|b| b.uncompressed_size).sum(),
            Err(e) => {
                self.corrupt(0, &e);
                0
            }
        };
        let blocks = bytes.div_ceil(STATFS_BLOCK.into());
        self.statfs_blocks = Some(blocks);
        blocks
    }
}

/// Answers an xattr request with the size-probe protocol of getxattr(2): size 0 asks
/// for the length, a buffer too small is ERANGE.
fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    match u32::try_from(bytes.len()) {
        Ok(len) if size == 0 => reply.size(len),
        Ok(len) if len <= size => reply.data(bytes),
        _ => reply.error(ERANGE),
    }
}

impl Filesystem for ImageFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), c_int> {
        // Fails only for 0, which max_background never is.
        let _ = config.set_max_background(self.max_background);
        // Reads of up to a whole 1 MiB chunk per request instead of 128 KiB.
        let _ = config.set_max_readahead(1 << 20);
        // Each is an optimisation the kernel may not offer: ask one by one, so a kernel
        // without one still gets the others.
        for capability in [
            consts::FUSE_DO_READDIRPLUS,
            consts::FUSE_READDIRPLUS_AUTO,
            consts::FUSE_CACHE_SYMLINKS,
            consts::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = config.add_capabilities(capability);
        }
        if self.passthrough_wanted {
            // Depth 1: backing files must sit on an unstacked filesystem (not
            // overlayfs), and overlayfs may stack on this mount (the snapshotter does).
            self.passthrough = config.add_capabilities(consts::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !self.passthrough {
                tracing::info!("this kernel has no FUSE passthrough (Linux 6.9+): every read goes through the agent");
            }
        }
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        FsStats::count(&self.stats.lookups, 1);
        match self.find(parent, name.as_bytes()) {
            Ok(Some(attr)) => reply.entry(&TTL, &attr, 0),
            Ok(None) => reply.entry(&TTL, &attr::negative_entry(), 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        FsStats::count(&self.stats.getattrs, 1);
        match self.inode(ino) {
            Ok(inode) => reply.attr(&TTL, &attr::attr(&self.bootstrap, &inode)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let inode = match self.inode(ino) {
            Ok(inode) if inode.kind == FileKind::Symlink => inode,
            Ok(_) => return reply.error(EINVAL),
            Err(e) => return reply.error(e),
        };
        match self.bootstrap.symlink_target(&inode) {
            Ok(target) => reply.data(target),
            Err(e) => reply.error(self.corrupt(inode.ino, &e)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & O_ACCMODE != O_RDONLY {
            return reply.error(EROFS);
        }
        if !self.passthrough {
            // Without passthrough an open has nothing to hand the kernel: reads name
            // the inode, the data never changes. ENOSYS tells the kernel to stop sending
            // OPEN and RELEASE on this connection (two round trips less per file) and to
            // keep each file's pages across opens (FOPEN_KEEP_CACHE, its default then).
            return reply.error(ENOSYS);
        }
        if !self.open_files.contains_key(&ino) {
            let mut file = match self.open_file(ino) {
                Ok(file) => file,
                Err(e) => return reply.error(e),
            };
            file.backing = self.backing_for(&file, &reply);
            let opened = Opened {
                file,
                opens: 0,
                idle: None,
            };
            self.open_files.insert(ino, opened);
        }
        let Some(opened) = self.open_files.get_mut(&ino) else {
            return reply.error(EIO);
        };
        opened.opens += 1;
        if let Some(closed) = opened.idle.take() {
            self.idle.remove(&closed);
        }
        match &opened.file.backing {
            // The kernel reads the backing file; nothing to keep in our own pages.
            Some(backing) => reply.opened_passthrough(ino, 0, backing),
            // The data never changes: keep cached pages across close and open.
            None => reply.opened(ino, FOPEN_KEEP_CACHE),
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
        FsStats::count(&self.stats.reads, 1);
        if !self.open_files.contains_key(&ino) {
            // Opened before this session took over the connection.
            match self.open_file(ino) {
                Ok(file) => {
                    let opened = Opened {
                        file,
                        opens: 0,
                        idle: None,
                    };
                    self.open_files.insert(ino, opened)
                }
                Err(e) => return reply.error(e),
            };
        }
        let Some(Opened { file, .. }) = self.open_files.get(&ino) else {
            return reply.error(EBADF);
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(EINVAL);
        };
        let range = clamp(offset, size, file.size);
        if range.is_empty() {
            return reply.data(&[]);
        }
        self.reader
            .observe_read(file.ino, range.start, range.end - range.start);
        let (ino, pieces) = (file.ino, file.pieces.clone());
        let (reader, stats) = (self.reader.clone(), self.stats.clone());
        let (started, latency) = (std::time::Instant::now(), self.read_latency.clone());
        self.pool.execute(move |unmounted| {
            if unmounted {
                return reply.error(EIO);
            }
            let result = read_range(&pieces, range.clone(), reader.as_ref());
            let waited = started.elapsed();
            if let Some(h) = &latency {
                h.observe(waited.as_secs_f64());
            }
            reader.read_done(ino, range.end - range.start, waited);
            match result {
                Ok(data) => {
                    let bytes = data.as_slice();
                    FsStats::count(&stats.read_bytes, bytes.len() as u64);
                    reply.data(bytes);
                }
                Err(failure) => {
                    FsStats::count(&stats.errors, 1);
                    tracing::error!(
                        ino,
                        chunk = failure.chunk,
                        offset = range.start,
                        len = range.end - range.start,
                        error = %failure.cause,
                        "chunk read failed; answered EIO"
                    );
                    reply.error(EIO);
                }
            }
        });
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        // Nothing is ever written, so there is nothing to flush. ENOSYS tells the kernel
        // to stop asking (it never sends another FLUSH on this connection): a close is
        // then no round trip to us, which on a walk of many small files (tar, an
        // interpreter's imports) is one wait less per file.
        reply.error(ENOSYS);
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
        let Some(opened) = self.open_files.get_mut(&ino) else {
            return;
        };
        opened.opens = opened.opens.saturating_sub(1);
        if opened.opens > 0 {
            return;
        }
        if opened.file.backing.is_some() {
            // Kept, backing id and all, for the next open (see `idle`).
            let closed = self.next_close;
            self.next_close += 1;
            opened.idle = Some(closed);
            self.idle.insert(closed, ino);
            while self.idle.len() > MAX_IDLE_BACKING {
                if let Some((_, oldest)) = self.idle.pop_first() {
                    // Dropping the backing id unregisters it; the kernel's open files
                    // keep their own reference to the backing file.
                    self.open_files.remove(&oldest);
                }
            }
        } else if let Some(Opened { file, .. }) = self.open_files.remove(&ino) {
            if self.passthrough {
                self.reader.file_closed(&file.pieces, file.size);
            }
        }
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, _nlookup: u64) {
        // The kernel dropped the inode: no open can name it again without a lookup,
        // and the kernel has none left open. Its backing id goes.
        if let Some(opened) = self.open_files.get(&ino) {
            if opened.opens == 0 {
                if let Some(closed) = opened.idle {
                    self.idle.remove(&closed);
                }
                self.open_files.remove(&ino);
            }
        }
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        // As for flush: nothing to sync; the kernel stops asking and answers 0 itself.
        reply.error(ENOSYS);
    }

    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        // Stateless: a readdir offset names its entry, so a directory needs no handle.
        // ENOSYS tells the kernel so: it stops sending OPENDIR and RELEASEDIR on this
        // connection (two round trips less per directory a walk enters) and keeps every
        // listing cached (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, its default then), so a
        // second walk of the tree asks us nothing.
        reply.error(ENOSYS);
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        FsStats::count(&self.stats.readdirs, 1);
        let mut files = Vec::new();
        let listed = self.list(ino, offset, |ino, next, kind, name| {
            let full = reply.add(
                ino.into(),
                next,
                attr::file_type(kind),
                OsStr::from_bytes(name),
            );
            if !full && kind == FileKind::Regular {
                files.push(ino);
            }
            Ok(full)
        });
        match listed {
            Ok(()) => {
                reply.ok();
                self.tell_listed(&files);
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectoryPlus,
    ) {
        FsStats::count(&self.stats.readdirs, 1);
        let mut files = Vec::new();
        let listed = self.list(ino, offset, |ino, next, kind, name| {
            let attr = self.attr_of(ino)?;
            let full = reply.add(ino.into(), next, OsStr::from_bytes(name), &TTL, &attr, 0);
            if !full && kind == FileKind::Regular {
                files.push(ino);
            }
            Ok(full)
        });
        match listed {
            Ok(()) => {
                reply.ok();
                self.tell_listed(&files);
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _data: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let blocks = self.data_blocks();
        let files = self.bootstrap.inode_count().into();
        // Nothing free: the image is all there is.
        reply.statfs(blocks, 0, 0, files, 0, STATFS_BLOCK, NAME_MAX, STATFS_BLOCK);
    }

    fn getxattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        match self.xattrs(ino) {
            Ok(xattrs) => match xattrs.iter().find(|(n, _)| *n == name.as_bytes()) {
                Some((_, value)) => reply_xattr(reply, size, value),
                None => reply.error(ENODATA),
            },
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&mut self, _req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        match self.xattrs(ino) {
            Ok(xattrs) => {
                // Each name NUL-terminated, as listxattr(2) returns them.
                let mut names = Vec::new();
                for (name, _) in xattrs {
                    names.extend_from_slice(name);
                    names.push(0);
                }
                reply_xattr(reply, size, &names);
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&mut self, _req: &Request<'_>, ino: u64, mask: i32, reply: ReplyEmpty) {
        // Only called without `default_permissions`; permission bits are then the
        // kernel's business anyway, writing is ours.
        match self.inode(ino) {
            Ok(_) if mask & W_OK != 0 => reply.error(EROFS),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _flags: u32,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // No file here has ioctls (programs probe, e.g. FS_IOC_GETFLAGS): the usual
        // answer, without fuser's "not implemented" warning in the log for each probe.
        reply.error(ENOTTY);
    }

    // Everything below would change the image.

    super::read_only::refuse_changes!();

    fn rmdir(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(EROFS);
    }

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
        reply.error(EROFS);
    }
}
