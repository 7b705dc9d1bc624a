//! Reading verified chunks from the blob files of a local image directory.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{BlobInfo, Bootstrap, ChunkInfo};
use crate::chunk::decode_and_verify;
use crate::{Error, Result};

/// The `blobs/` directory of an image dir, with blob files opened on first use.
#[derive(Debug)]
pub struct LocalBlobs {
    dir: PathBuf,
    /// Open blob files by table index; reads use `pread`, so one handle serves all threads.
    open: Mutex<HashMap<u32, std::sync::Arc<File>>>,
}

impl LocalBlobs {
    /// Blobs of the image at `image_dir` (the directory holding `bootstrap` and `blobs/`).
    pub fn new(image_dir: &Path) -> Self {
        LocalBlobs {
            dir: image_dir.join("blobs"),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Path of a blob's file.
    pub fn path(&self, blob: &BlobInfo) -> PathBuf {
        self.dir.join(blob.hex())
    }

    fn file(&self, blob: &BlobInfo) -> Result<std::sync::Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = open.get(&blob.index) {
            return Ok(f.clone());
        }
        let path = self.path(blob);
        let f = File::open(&path).map_err(|e| Error::io("open blob", &path, e))?;
        let f = std::sync::Arc::new(f);
        open.insert(blob.index, f.clone());
        Ok(f)
    }

    /// Reads a chunk's stored bytes, decompresses them and checks the digest.
    pub fn read_chunk(&self, bootstrap: &Bootstrap, chunk: &ChunkInfo) -> Result<Vec<u8>> {
        let blob = bootstrap.blob(chunk.blob_index)?;
        let bad = |reason: String| Error::BadChunk {
            chunk: chunk.index,
            digest: bootstrap.digest_algo().format(&chunk.digest),
            blob: blob.oci_digest(),
            offset: chunk.compressed_offset,
            compressed_size: chunk.compressed_size,
            reason,
        };
        let file = self.file(&blob)?;
        let mut stored = vec![0u8; chunk.compressed_size as usize];
        file.read_exact_at(&mut stored, chunk.compressed_offset)
            .map_err(|e| bad(format!("read from {}: {e}", self.path(&blob).display())))?;
        decode_and_verify(
            &stored,
            chunk.compression,
            chunk.uncompressed_size,
            bootstrap.digest_algo(),
            &chunk.digest,
        )
        .map_err(bad)
    }
}
