//! The `fuser::Filesystem` methods that would change a read-only filesystem, each
//! answering `EROFS` (fuser's defaults answer `ENOSYS`, which tools take for "not
//! supported here" rather than "read-only"). Expanded inside the trait impls of both of
//! the agent's filesystems, the image mount and the layer store, which differ only in
//! `rmdir` and `create` and define those themselves.

/// Expands to the refusing methods; use inside `impl fuser::Filesystem for …`.
macro_rules! refuse_changes {
    () => {
        fn setattr(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _mode: Option<u32>,
            _uid: Option<u32>,
            _gid: Option<u32>,
            _size: Option<u64>,
            _atime: Option<fuser::TimeOrNow>,
            _mtime: Option<fuser::TimeOrNow>,
            _ctime: Option<std::time::SystemTime>,
            _fh: Option<u64>,
            _crtime: Option<std::time::SystemTime>,
            _chgtime: Option<std::time::SystemTime>,
            _bkuptime: Option<std::time::SystemTime>,
            _flags: Option<u32>,
            reply: fuser::ReplyAttr,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn mknod(
            &mut self,
            _req: &fuser::Request<'_>,
            _parent: u64,
            _name: &std::ffi::OsStr,
            _mode: u32,
            _umask: u32,
            _rdev: u32,
            reply: fuser::ReplyEntry,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn mkdir(
            &mut self,
            _req: &fuser::Request<'_>,
            _parent: u64,
            _name: &std::ffi::OsStr,
            _mode: u32,
            _umask: u32,
            reply: fuser::ReplyEntry,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn unlink(
            &mut self,
            _req: &fuser::Request<'_>,
            _parent: u64,
            _name: &std::ffi::OsStr,
            reply: fuser::ReplyEmpty,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn symlink(
            &mut self,
            _req: &fuser::Request<'_>,
            _parent: u64,
            _link_name: &std::ffi::OsStr,
            _target: &std::path::Path,
            reply: fuser::ReplyEntry,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn rename(
            &mut self,
            _req: &fuser::Request<'_>,
            _parent: u64,
            _name: &std::ffi::OsStr,
            _newparent: u64,
            _newname: &std::ffi::OsStr,
            _flags: u32,
            reply: fuser::ReplyEmpty,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn link(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _newparent: u64,
            _newname: &std::ffi::OsStr,
            reply: fuser::ReplyEntry,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn write(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _fh: u64,
            _offset: i64,
            _data: &[u8],
            _write_flags: u32,
            _flags: i32,
            _lock_owner: Option<u64>,
            reply: fuser::ReplyWrite,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn setxattr(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _name: &std::ffi::OsStr,
            _value: &[u8],
            _flags: i32,
            _position: u32,
            reply: fuser::ReplyEmpty,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn removexattr(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _name: &std::ffi::OsStr,
            reply: fuser::ReplyEmpty,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn fallocate(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino: u64,
            _fh: u64,
            _offset: i64,
            _length: i64,
            _mode: i32,
            reply: fuser::ReplyEmpty,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }

        fn copy_file_range(
            &mut self,
            _req: &fuser::Request<'_>,
            _ino_in: u64,
            _fh_in: u64,
            _offset_in: i64,
            _ino_out: u64,
            _fh_out: u64,
            _offset_out: i64,
            _len: u64,
            _flags: u32,
            reply: fuser::ReplyWrite,
        ) {
            reply.error($crate::fs::errno::EROFS);
        }
    };
}

pub(crate) use refuse_changes;
