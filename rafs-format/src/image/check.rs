//! `tessera check`: read and verify every chunk and every blob of an image dir.

use std::collections::HashSet;
use std::path::Path;

use serde::Serialize;

use super::{open_validated, walk};
use crate::reader::{read_chunk, BlobSource, Bootstrap, FileKind, LocalBlobs};
use crate::{Error, Result};

/// What `check` verified.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub files: u64,
    pub chunks_verified: u64,
    pub bytes_verified: u64,
    pub blobs_verified: u64,
}

/// Verifies the bootstrap (checksum and structure), every chunk against its digest and
/// every blob against its sha256. The first failure is returned, naming the file, the
/// chunk and its place in the blob.
pub fn check(image_dir: &Path) -> Result<CheckReport> {
    let b = open_validated(image_dir)?;
    check_image(&b, &LocalBlobs::new(image_dir))
}

/// [`check`] for a validated bootstrap whose blobs are read from `blobs`.
pub fn check_image(b: &Bootstrap, blobs: &dyn BlobSource) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let mut verified: HashSet<u32> = HashSet::new();
    walk(b, |path, inode, first| {
        if inode.kind != FileKind::Regular || !first {
            return Ok(());
        }
        report.files += 1;
        for piece in b.file_chunks(inode)? {
            let Some(c) = piece.chunk else { continue };
            if !verified.insert(c) {
                continue;
            }
            let info = b.chunk(c)?;
            read_chunk(blobs, b, &info).map_err(|e| Error::InFile {
                path: format!("/{}", String::from_utf8_lossy(path)),
                file_offset: piece.file_offset,
                cause: Box::new(e),
            })?;
            report.chunks_verified += 1;
            report.bytes_verified += u64::from(info.uncompressed_size);
        }
        Ok(())
    })?;
    for blob in b.blobs()? {
        blobs.verify_blob(&blob)?;
        report.blobs_verified += 1;
    }
    Ok(report)
}
