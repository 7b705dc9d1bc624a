//! `tessera inspect`: an image's summary and its tree with metadata.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::{open_validated, walk};
use crate::chunk::Chunking;
use crate::reader::{Bootstrap, FileKind};
use crate::Result;

/// Totals of an image.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImageStats {
    pub format_version: u32,
    pub digest_algo: String,
    pub chunking: Option<Chunking>,
    pub bootstrap_bytes: u64,
    pub inodes: u32,
    pub entries: u64,
    pub regular_files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub other_files: u64,
    pub file_bytes: u64,
    pub unique_chunks: u32,
    pub unique_bytes: u64,
    pub stored_bytes: u64,
    pub blobs: Vec<(String, u64)>,
    pub prefetch: Vec<String>,
}

/// One directory entry with its inode's metadata.
#[derive(Debug, Clone, Serialize)]
pub struct EntryListing {
    pub path: String,
    pub kind: FileKind,
    pub ino: u32,
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub mtime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdev: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunks: Option<usize>,
}

/// Everything `inspect` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ImageListing {
    pub stats: ImageStats,
    pub entries: Vec<EntryListing>,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads (and fully validates) an image dir's bootstrap and lists it.
pub fn inspect(image_dir: &Path) -> Result<ImageListing> {
    inspect_bootstrap(&open_validated(image_dir)?)
}

/// [`inspect`] for a validated bootstrap.
pub fn inspect_bootstrap(b: &Bootstrap) -> Result<ImageListing> {
    let mut stats = ImageStats {
        format_version: crate::layout::VERSION,
        digest_algo: b.digest_algo().name().into(),
        chunking: Some(b.chunking()),
        bootstrap_bytes: b.as_bytes().len() as u64,
        inodes: b.inode_count(),
        unique_chunks: b.chunk_count(),
        // The root is a directory no entry names.
        directories: 1,
        ..Default::default()
    };
    for c in 0..b.chunk_count() {
        let info = b.chunk(c)?;
        stats.unique_bytes += u64::from(info.uncompressed_size);
        stats.stored_bytes += u64::from(info.compressed_size);
    }
    stats.blobs = b
        .blobs()?
        .iter()
        .map(|x| (x.oci_digest(), x.size))
        .collect();
    stats.prefetch = b.prefetch()?.iter().map(|p| lossy(p.path)).collect();
    let mut entries = Vec::new();
    walk(b, |path, inode, first| {
        stats.entries += 1;
        if first {
            match inode.kind {
                FileKind::Directory => stats.directories += 1,
                FileKind::Regular => {
                    stats.regular_files += 1;
                    stats.file_bytes += inode.size;
                }
                FileKind::Symlink => stats.symlinks += 1,
                _ => stats.other_files += 1,
            }
        }
        let xattrs = b
            .xattrs(inode)?
            .into_iter()
            .map(|(k, v)| {
                let v = match std::str::from_utf8(v) {
                    Ok(s) if !s.contains('\0') => s.to_string(),
                    _ => format!("0x{}", hex::encode(v)),
                };
                (lossy(k), v)
            })
            .collect();
        entries.push(EntryListing {
            path: format!("/{}", lossy(path)),
            kind: inode.kind,
            ino: inode.ino,
            mode: format!("{:04o}", inode.perm),
            uid: inode.uid,
            gid: inode.gid,
            nlink: inode.nlink,
            size: inode.size,
            mtime: format!("{}.{:09}", inode.mtime_sec, inode.mtime_nsec),
            rdev: matches!(inode.kind, FileKind::CharDevice | FileKind::BlockDevice)
                .then_some((inode.rdev_major, inode.rdev_minor)),
            target: (inode.kind == FileKind::Symlink)
                .then(|| b.symlink_target(inode).map(lossy))
                .transpose()?,
            xattrs,
            chunks: (inode.kind == FileKind::Regular)
                .then(|| b.file_chunks(inode).map(|c| c.len()))
                .transpose()?,
        });
        Ok(())
    })?;
    Ok(ImageListing { stats, entries })
}

impl std::fmt::Display for ImageListing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.stats;
        let chunking = s
            .chunking
            .map_or_else(|| "unknown".to_string(), |c| c.to_string());
        writeln!(
            f,
            "format     version {}, {} chunk digests, {chunking} chunking",
            s.format_version, s.digest_algo
        )?;
        writeln!(f, "bootstrap  {} bytes", s.bootstrap_bytes)?;
        writeln!(
            f,
            "files      {} inodes, {} entries ({} regular, {} directories, {} symlinks, {} other), {} bytes",
            s.inodes, s.entries, s.regular_files, s.directories, s.symlinks, s.other_files, s.file_bytes
        )?;
        writeln!(
            f,
            "chunks     {} unique, {} bytes, {} stored",
            s.unique_chunks, s.unique_bytes, s.stored_bytes
        )?;
        for (d, size) in &s.blobs {
            writeln!(f, "blob       {d} ({size} bytes)")?;
        }
        for p in &s.prefetch {
            writeln!(f, "prefetch   {p}")?;
        }
        writeln!(f)?;
        for e in &self.entries {
            let mut line = format!(
                "{}{} {:>5}:{:<5} {:>12} {} {}",
                e.kind.ls_char(),
                e.mode,
                e.uid,
                e.gid,
                match e.rdev {
                    Some((ma, mi)) => format!("{ma},{mi}"),
                    None => e.size.to_string(),
                },
                e.mtime,
                e.path
            );
            if let Some(t) = &e.target {
                line.push_str(&format!(" -> {t}"));
            }
            if e.nlink > 1 && e.kind != FileKind::Directory {
                line.push_str(&format!(" [inode {}, {} links]", e.ino, e.nlink));
            }
            for (k, v) in &e.xattrs {
                line.push_str(&format!(" {k}={v}"));
            }
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
