//! Where chunk bytes come from: [`BlobSource`] is the one interface, [`LocalBlobs`] the
//! blob files of a local image directory. Other sources (a registry read with Range
//! requests, the agent's cache) live with the code that owns them.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::{BlobInfo, Bootstrap, ChunkInfo, SpanStart};
use crate::chunk::{decode_and_verify, verify_digest};
use crate::gzip;
use crate::{Error, Result};

/// A store of an image's blobs, read by byte range.
pub trait BlobSource: Sync {
    /// The stored bytes `offset..offset + len` of `blob`, exactly `len` of them.
    /// Failures are [`Error::Fetch`]; the bytes are checked by the caller.
    fn read_at(&self, blob: &BlobInfo, offset: u64, len: u32) -> Result<Vec<u8>>;

    /// Checks a whole blob against its recorded sha256 and size
    /// ([`Error::BadBlob`] if it differs).
    fn verify_blob(&self, blob: &BlobInfo) -> Result<()>;
}

/// Reads a chunk's stored bytes from `source`, decompresses them and checks the digest.
pub fn read_chunk(
    source: &dyn BlobSource,
    bootstrap: &Bootstrap,
    chunk: &ChunkInfo,
) -> Result<Vec<u8>> {
    let blob = bootstrap.blob(chunk.blob_index)?;
    let stored = source.read_at(&blob, chunk.compressed_offset, chunk.compressed_size)?;
    let decoded = match chunk.span {
        Some(span) => inflate_span_chunk(source, bootstrap, chunk, span, &stored),
        None => decode_and_verify(
            &stored,
            chunk.compression,
            chunk.uncompressed_size,
            bootstrap.digest_algo(),
            &chunk.digest,
        ),
    };
    decoded.map_err(|reason| Error::BadChunk {
        chunk: chunk.index,
        digest: bootstrap.digest_algo().format(&chunk.digest),
        blob: blob.oci_digest(),
        offset: chunk.compressed_offset,
        compressed_size: chunk.compressed_size,
        reason,
    })
}

/// A span chunk (format.md §17.3): its checkpoint's window (itself a verified chunk),
/// then the span inflated from the checkpoint, `skip` bytes dropped, the chunk's bytes
/// checked against its digest.
fn inflate_span_chunk(
    source: &dyn BlobSource,
    bootstrap: &Bootstrap,
    chunk: &ChunkInfo,
    span: SpanStart,
    stored: &[u8],
) -> Result<Vec<u8>, String> {
    let checkpoint = match span.checkpoint {
        Some(index) => {
            let cp = bootstrap.checkpoint(index).map_err(|e| e.to_string())?;
            let window = match cp.window_chunk {
                Some(w) => {
                    let w = bootstrap.chunk(w).map_err(|e| e.to_string())?;
                    read_chunk(source, bootstrap, &w).map_err(|e| format!("its window: {e}"))?
                }
                None => vec![0; cp.window_len() as usize],
            };
            Some(gzip::Checkpoint {
                in_bits: cp.in_bits,
                out: cp.out,
                window,
            })
        }
        None => None,
    };
    let data = gzip::inflate_span(
        stored,
        checkpoint.as_ref(),
        span.skip.into(),
        chunk.uncompressed_size as usize,
    )
    .map_err(|e| e.to_string())?;
    verify_digest(&data, bootstrap.digest_algo(), &chunk.digest)?;
    Ok(data)
}

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
        read_chunk(self, bootstrap, chunk)
    }
}

impl BlobSource for LocalBlobs {
    fn read_at(&self, blob: &BlobInfo, offset: u64, len: u32) -> Result<Vec<u8>> {
        let file = self.file(blob)?;
        let mut stored = vec![0u8; len as usize];
        file.read_exact_at(&mut stored, offset)
            .map_err(|e| Error::Fetch {
                blob: blob.oci_digest(),
                offset,
                len: len.into(),
                source_name: self.path(blob).display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(stored)
    }

    fn verify_blob(&self, blob: &BlobInfo) -> Result<()> {
        let path = self.path(blob);
        let f = File::open(&path).map_err(|e| Error::io("open blob", &path, e))?;
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
        Ok(())
    }
}
