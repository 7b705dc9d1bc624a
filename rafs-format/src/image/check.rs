//! `tessera check`: read and verify every chunk and every blob of an image dir.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{open_validated, walk};
use crate::reader::{FileKind, LocalBlobs};
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
    let blobs = LocalBlobs::new(image_dir);
    let mut report = CheckReport::default();
    let mut verified: HashSet<u32> = HashSet::new();
    walk(&b, |path, inode, first| {
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
            blobs.read_chunk(&b, &info).map_err(|e| Error::InFile {
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
        let path = blobs.path(&blob);
        let f = std::fs::File::open(&path).map_err(|e| Error::io("open blob", &path, e))?;
        let mut hasher = Sha256::new();
        let mut reader = std::io::BufReader::with_capacity(1 << 20, f);
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = reader
                .read(&mut buf)
                .map_err(|e| Error::io("read blob", &path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        let actual: [u8; 32] = hasher.finalize().into();
        if actual != blob.digest || len != blob.size {
            return Err(Error::BadBlob {
                blob: blob.oci_digest(),
                reason: format!(
                    "file {} has {len} bytes hashing to sha256:{}, the bootstrap expects {} bytes",
                    path.display(),
                    hex::encode(actual),
                    blob.size
                ),
            });
        }
        report.blobs_verified += 1;
    }
    Ok(report)
}
