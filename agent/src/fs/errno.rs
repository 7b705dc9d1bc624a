//! The error numbers the filesystem answers with.
//!
//! `fuser` takes raw `c_int` errnos, and the agent's library links neither `libc` nor
//! `rustix` (rustix is only a dev-dependency), so the few we need are spelled out here.
//! These are Linux's generic values (`asm-generic/errno*.h`), which x86-64 and arm64
//! use; the FUSE filesystem only builds for Linux (fuser's pure-Rust mount is Linux-only).

use std::ffi::c_int;

pub const ENOENT: c_int = 2;
pub const EIO: c_int = 5;
pub const EBADF: c_int = 9;
pub const ENOTDIR: c_int = 20;
pub const ENOTTY: c_int = 25;
pub const EINVAL: c_int = 22;
pub const EROFS: c_int = 30;
pub const ERANGE: c_int = 34;
pub const ENODATA: c_int = 61;
pub const ENOSYS: c_int = 38;

/// `O_ACCMODE` and the one access mode a read-only filesystem opens with.
pub const O_ACCMODE: i32 = 0o3;
pub const O_RDONLY: i32 = 0;
/// `access(2)`'s write bit.
pub const W_OK: i32 = 2;
