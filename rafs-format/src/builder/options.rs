//! What a build can be asked to do.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub use crate::chunk::Chunking;
use crate::chunk::{Compression, DigestAlgo};
use crate::{Error, Result};

/// Options of one build. `Default` is what `tessera build` does without flags.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub chunking: Chunking,
    pub compression: Compression,
    /// zstd level (1..=22) or gzip level (0..=9).
    pub compression_level: i32,
    pub digest: DigestAlgo,
    /// An earlier image whose chunks are referenced rather than stored again.
    pub chunk_dict: Option<ChunkDict>,
    /// Paths (from the image root) whose data readers will want first.
    pub prefetch: Vec<String>,
    /// Counters the build updates as it reads input, for a progress display.
    pub progress: Option<Arc<BuildProgress>>,
}

/// Live counters of a running build (read them from another thread).
#[derive(Debug, Default)]
pub struct BuildProgress {
    /// Regular files read so far.
    pub files: AtomicU64,
    /// File bytes read so far.
    pub bytes: AtomicU64,
}

/// A chunk dictionary: an earlier image whose chunks a build references instead of
/// storing them again.
#[derive(Debug, Clone)]
pub struct ChunkDict {
    /// The image dir holding the dictionary's `bootstrap`.
    pub image_dir: PathBuf,
    /// Whether the dictionary's blob files are in `image_dir/blobs/`, to be linked into
    /// the new image dir so it is complete on its own. `false` when they are kept
    /// elsewhere (a registry, where `tessera convert` finds them) and the new image
    /// dir holds only the blobs this build wrote.
    pub link_blobs: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            chunking: Chunking::default(),
            compression: Compression::Zstd,
            compression_level: 3,
            digest: DigestAlgo::Sha256,
            chunk_dict: None,
            prefetch: Vec::new(),
            progress: None,
        }
    }
}

impl BuildOptions {
    /// Checks the options, naming the first one that is not allowed.
    pub fn validate(&self) -> Result<()> {
        self.chunking.validate().map_err(Error::InvalidOption)?;
        let levels = match self.compression {
            Compression::Zstd => 1..=22,
            Compression::Gzip => 0..=9,
            Compression::None => i32::MIN..=i32::MAX,
            Compression::GzipSpan => return Err(Error::InvalidOption(
                "gzip-span is how an index refers to its layers, not a compression to build with"
                    .into(),
            )),
        };
        if !levels.contains(&self.compression_level) {
            return Err(Error::InvalidOption(format!(
                "{} level {} is out of range {levels:?}",
                self.compression.name(),
                self.compression_level
            )));
        }
        Ok(())
    }
}
