//! `tessera unpack`: rebuild an image's tree exactly, on disk or as a tar stream.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, CWD};
use serde::Serialize;

use super::{open_validated, walk};
use crate::reader::{read_chunk, BlobSource, Bootstrap, FileKind, Inode, LocalBlobs};
use crate::{Error, Result};

/// What an unpack produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UnpackSummary {
    pub entries: u64,
    pub file_bytes: u64,
    /// Sockets cannot be represented in a tar; they are left out of `--tar` output.
    pub skipped_sockets: u64,
}

/// Writes a regular file's data, leaving holes as holes.
fn write_file_data(
    b: &Bootstrap,
    blobs: &dyn BlobSource,
    inode: &Inode,
    out: &File,
    path: &Path,
) -> Result<()> {
    for piece in b.file_chunks(inode)? {
        let Some(c) = piece.chunk else { continue };
        let data = read_chunk(blobs, b, &b.chunk(c)?).map_err(|e| Error::InFile {
            path: path.display().to_string(),
            file_offset: piece.file_offset,
            cause: Box::new(e),
        })?;
        out.write_all_at(&data, piece.file_offset)
            .map_err(|e| Error::io("write", path, e))?;
    }
    out.set_len(inode.size)
        .map_err(|e| Error::io("set length of", path, e))
}

/// Applies ownership, xattrs, permissions and mtime, in the order that keeps each:
/// chown clears set-id bits, so it comes before chmod; times come last.
fn apply_metadata(b: &Bootstrap, inode: &Inode, path: &Path) -> Result<()> {
    let io = |action, e: rustix::io::Errno| Error::io(action, path, e.into());
    rustix::fs::chownat(
        CWD,
        path,
        Some(rustix::fs::Uid::from_raw(inode.uid)),
        Some(rustix::fs::Gid::from_raw(inode.gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| io("chown", e))?;
    for (name, value) in b.xattrs(inode)? {
        xattr::set(path, OsStr::from_bytes(name), value)
            .map_err(|e| Error::io("set xattr on", path, e))?;
    }
    if inode.kind != FileKind::Symlink {
        rustix::fs::chmodat(CWD, path, Mode::from_raw_mode(inode.perm), AtFlags::empty())
            .map_err(|e| io("chmod", e))?;
    }
    let t = Timespec {
        tv_sec: inode.mtime_sec,
        tv_nsec: inode.mtime_nsec.into(),
    };
    let times = Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| io("set times of", e))
}

/// Rebuilds the image's tree under `dest` (created if absent; must be empty).
pub fn unpack_to_dir(image_dir: &Path, dest: &Path) -> Result<UnpackSummary> {
    let b = open_validated(image_dir)?;
    unpack_image_to_dir(&b, &LocalBlobs::new(image_dir), dest)
}

/// [`unpack_to_dir`] for a validated bootstrap whose blobs are read from `blobs`.
pub fn unpack_image_to_dir(
    b: &Bootstrap,
    blobs: &dyn BlobSource,
    dest: &Path,
) -> Result<UnpackSummary> {
    std::fs::create_dir_all(dest).map_err(|e| Error::io("create", dest, e))?;
    if std::fs::read_dir(dest)
        .map_err(|e| Error::io("read", dest, e))?
        .next()
        .is_some()
    {
        return Err(Error::InvalidOption(format!(
            "unpack target {} is not empty",
            dest.display()
        )));
    }
    let mut summary = UnpackSummary::default();
    let mut first_path: HashMap<u32, PathBuf> = HashMap::new();
    let mut dirs: Vec<(PathBuf, Inode)> = Vec::new();
    walk(b, |rel, inode, first| {
        let path = dest.join(OsStr::from_bytes(rel));
        summary.entries += 1;
        if !first {
            let original = &first_path[&inode.ino];
            return std::fs::hard_link(original, &path)
                .map_err(|e| Error::io("hardlink", &path, e));
        }
        let io = |action, e: rustix::io::Errno| Error::io(action, &path, e.into());
        let dev = rustix::fs::makedev(inode.rdev_major, inode.rdev_minor);
        match inode.kind {
            FileKind::Directory => {
                std::fs::create_dir(&path).map_err(|e| Error::io("create directory", &path, e))?;
                dirs.push((path.clone(), *inode));
                return Ok(());
            }
            FileKind::Regular => {
                let f = File::create(&path).map_err(|e| Error::io("create", &path, e))?;
                write_file_data(b, blobs, inode, &f, &path)?;
                summary.file_bytes += inode.size;
            }
            FileKind::Symlink => {
                let target = OsStr::from_bytes(b.symlink_target(inode)?);
                std::os::unix::fs::symlink(target, &path)
                    .map_err(|e| Error::io("create symlink", &path, e))?;
            }
            FileKind::CharDevice | FileKind::BlockDevice | FileKind::Fifo | FileKind::Socket => {
                let ft = rustix::fs::FileType::from_raw_mode(inode.kind.mode_bits());
                rustix::fs::mknodat(CWD, &path, ft, Mode::from_raw_mode(inode.perm), dev)
                    .map_err(|e| io("mknod", e))?;
            }
        }
        apply_metadata(b, inode, &path)?;
        first_path.insert(inode.ino, path);
        Ok(())
    })?;
    // Directories last, deepest first, so creating their entries does not move mtimes.
    for (path, inode) in dirs.iter().rev() {
        apply_metadata(b, inode, path)?;
    }
    apply_metadata(b, &b.inode(crate::layout::ROOT_INO)?, dest)?;
    Ok(summary)
}

/// Writes the image's tree as a tar stream: PAX headers carry nanosecond mtimes, xattrs
/// and large ids; long names use GNU extensions; later names of an inode are hardlinks.
pub fn unpack_to_tar(image_dir: &Path, out: impl Write) -> Result<UnpackSummary> {
    let b = open_validated(image_dir)?;
    unpack_image_to_tar(&b, &LocalBlobs::new(image_dir), out)
}

/// [`unpack_to_tar`] for a validated bootstrap whose blobs are read from `blobs`.
pub fn unpack_image_to_tar(
    b: &Bootstrap,
    blobs: &dyn BlobSource,
    out: impl Write,
) -> Result<UnpackSummary> {
    let mut tar = tar::Builder::new(out);
    tar.mode(tar::HeaderMode::Complete);
    let mut summary = UnpackSummary::default();
    let mut first_path: HashMap<u32, Vec<u8>> = HashMap::new();
    let io = |e: std::io::Error| Error::io("write tar", "<output>", e);
    let root = b.inode(crate::layout::ROOT_INO)?;
    append_entry(b, blobs, &mut tar, b"./", &root, None).map_err(io)?;
    walk(b, |rel, inode, first| {
        if inode.kind == FileKind::Socket {
            summary.skipped_sockets += 1;
            return Ok(());
        }
        summary.entries += 1;
        let link = if first {
            first_path.insert(inode.ino, rel.to_vec());
            if inode.kind == FileKind::Regular {
                summary.file_bytes += inode.size;
            }
            None
        } else {
            first_path.get(&inode.ino).map(Vec::as_slice)
        };
        append_entry(b, blobs, &mut tar, rel, inode, link).map_err(|e| {
            match e.downcast::<Error>() {
                Ok(inner) => inner,
                Err(e) => io(e),
            }
        })
    })?;
    tar.into_inner().map_err(io)?.flush().map_err(io)?;
    Ok(summary)
}

/// A reader over a file's data that verifies each chunk as it goes.
struct FileData<'a> {
    b: &'a Bootstrap,
    blobs: &'a dyn BlobSource,
    pieces: std::vec::IntoIter<crate::reader::FileChunk>,
    current: Vec<u8>,
    pos: usize,
}

impl std::io::Read for FileData<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.current.len() {
            let Some(piece) = self.pieces.next() else {
                return Ok(0);
            };
            self.current = match piece.chunk {
                None => vec![0; piece.len as usize],
                Some(c) => {
                    let info = self.b.chunk(c).map_err(std::io::Error::other)?;
                    read_chunk(self.blobs, self.b, &info).map_err(std::io::Error::other)?
                }
            };
            self.pos = 0;
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn append_entry(
    b: &Bootstrap,
    blobs: &dyn BlobSource,
    tar: &mut tar::Builder<impl Write>,
    path: &[u8],
    inode: &Inode,
    hardlink_to: Option<&[u8]>,
) -> std::io::Result<()> {
    let mut pax: Vec<(String, Vec<u8>)> = vec![(
        "mtime".into(),
        format_pax_time(inode.mtime_sec, inode.mtime_nsec).into_bytes(),
    )];
    let xattrs = b.xattrs(inode).map_err(std::io::Error::other)?;
    for (name, value) in xattrs {
        pax.push((
            format!("SCHILY.xattr.{}", String::from_utf8_lossy(name)),
            value.to_vec(),
        ));
    }
    // Link targets go in a PAX `linkpath` record, byte for byte: the `tar` crate's
    // own link-name setter normalises paths (`./a` becomes `a`), which would change
    // symlinks.
    let link_target: Option<&[u8]> = match (hardlink_to, inode.kind) {
        (Some(t), _) => Some(t),
        (None, FileKind::Symlink) => Some(b.symlink_target(inode).map_err(std::io::Error::other)?),
        _ => None,
    };
    if let Some(t) = link_target {
        pax.push(("linkpath".into(), t.to_vec()));
    }
    tar.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
    let mut h = tar::Header::new_gnu();
    h.set_mode(inode.perm);
    h.set_uid(inode.uid.into());
    h.set_gid(inode.gid.into());
    h.set_mtime(inode.mtime_sec.max(0) as u64);
    h.set_size(0);
    let path = Path::new(OsStr::from_bytes(path));
    if let Some(t) = link_target {
        // The header field holds at most 100 bytes; readers take the PAX record.
        h.set_link_name_literal(&t[..t.len().min(100)])?;
        h.set_entry_type(if hardlink_to.is_some() {
            tar::EntryType::Link
        } else {
            tar::EntryType::Symlink
        });
        return tar.append_data(&mut h, path, std::io::empty());
    }
    match inode.kind {
        FileKind::Directory => {
            h.set_entry_type(tar::EntryType::Directory);
            tar.append_data(&mut h, path, std::io::empty())
        }
        FileKind::Regular => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(inode.size);
            let pieces = b.file_chunks(inode).map_err(std::io::Error::other)?;
            let data = FileData {
                b,
                blobs,
                pieces: pieces.into_iter(),
                current: Vec::new(),
                pos: 0,
            };
            tar.append_data(&mut h, path, data)
        }
        FileKind::CharDevice | FileKind::BlockDevice | FileKind::Fifo => {
            h.set_entry_type(match inode.kind {
                FileKind::CharDevice => tar::EntryType::Char,
                FileKind::BlockDevice => tar::EntryType::Block,
                _ => tar::EntryType::Fifo,
            });
            h.set_device_major(inode.rdev_major)?;
            h.set_device_minor(inode.rdev_minor)?;
            tar.append_data(&mut h, path, std::io::empty())
        }
        FileKind::Symlink | FileKind::Socket => Ok(()),
    }
}

/// `seconds.nanoseconds` as PAX writes times (negative times count down from 1970).
fn format_pax_time(sec: i64, nsec: u32) -> String {
    if sec < 0 && nsec > 0 {
        let total = -(sec as i128 * 1_000_000_000 + nsec as i128);
        format!("-{}.{:09}", total / 1_000_000_000, total % 1_000_000_000)
    } else {
        format!("{sec}.{nsec:09}")
    }
}

#[cfg(test)]
mod tests {
    use super::format_pax_time;

    #[test]
    fn pax_time_format() {
        assert_eq!(format_pax_time(5, 1), "5.000000001");
        assert_eq!(format_pax_time(-2, 750_000_000), "-1.250000000");
    }
}
