//! The one error type of `rafs-format`.
//!
//! Every variant names what was wrong so that a user (or a caller deciding whether to
//! retry elsewhere) can act on it: corrupt input names the structure, the field, the
//! byte offset and the bad value.

use std::path::PathBuf;

/// Errors from reading, building, checking and unpacking images.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    // The cause is part of the message rather than a `source()`, so that printing the
    // error chain does not repeat it.
    #[error("{action} {path}: {cause}")]
    Io {
        /// What was being done, as a verb phrase ("read bootstrap").
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        cause: std::io::Error,
    },

    /// The bootstrap does not start with the Tessera magic bytes.
    #[error("not a Tessera bootstrap: magic bytes are {found:02x?}, expected {expected:02x?}")]
    BadMagic { found: Vec<u8>, expected: Vec<u8> },

    /// The bootstrap was written by a format version this reader does not know.
    #[error(
        "bootstrap format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion { found: u32, supported: u32 },

    /// The bootstrap is shorter than a structure inside it claims.
    #[error(
        "bootstrap truncated: {what} needs bytes {start}..{end} but the bootstrap has {len} bytes"
    )]
    Truncated {
        what: String,
        start: u64,
        end: u64,
        len: u64,
    },

    /// The bootstrap's bytes do not match the checksum stored in its superblock.
    #[error("bootstrap checksum mismatch: superblock says {expected}, contents hash to {actual}; the file is corrupt")]
    ChecksumMismatch { expected: String, actual: String },

    /// A field of an on-disk record holds a value that is not allowed.
    #[error("corrupt bootstrap: {structure}.{field} at offset {offset} is {value}: {reason}")]
    Corrupt {
        /// The record or table, e.g. `inode[17]`.
        structure: String,
        /// The field name as in docs/format.md.
        field: &'static str,
        /// Byte offset of the field in the bootstrap.
        offset: u64,
        /// The bad value, formatted.
        value: String,
        /// Why it is not allowed.
        reason: String,
    },

    /// A chunk's data did not decompress or did not match its digest.
    #[error("chunk {chunk} ({digest}) in blob {blob} at offset {offset} (+{compressed_size} bytes): {reason}")]
    BadChunk {
        chunk: u32,
        digest: String,
        blob: String,
        offset: u64,
        compressed_size: u32,
        reason: String,
    },

    /// A chunk of a file failed; names the file so people know what is affected.
    #[error("file {path} at offset {file_offset}: {cause}")]
    InFile {
        path: String,
        file_offset: u64,
        cause: Box<Error>,
    },

    /// A blob's bytes could not be read from where they are kept (a file, a registry).
    #[error("blob {blob}: reading {len} bytes at offset {offset} from {source_name}: {reason}")]
    Fetch {
        blob: String,
        offset: u64,
        len: u64,
        source_name: String,
        reason: String,
    },

    /// A blob file does not match the digest or size recorded for it.
    #[error("blob {blob}: {reason}")]
    BadBlob { blob: String, reason: String },

    /// A layer tarball could not be applied.
    #[error("layer {layer}: entry {entry:?}: {reason}")]
    Layer {
        layer: usize,
        entry: String,
        reason: String,
    },

    /// A file of the input cannot be represented in an image.
    #[error("input {path}: {reason}")]
    InvalidInput { path: PathBuf, reason: String },

    /// An OCI image layout could not be read.
    #[error("OCI image layout {path}: {reason}")]
    OciLayout { path: PathBuf, reason: String },

    /// The options given to the builder are inconsistent.
    #[error("invalid build option: {0}")]
    InvalidOption(String),

    /// A gzip stream (an unconverted layer) is not valid gzip or DEFLATE.
    #[error("gzip stream at compressed byte {offset}: {reason}")]
    Gzip { offset: u64, reason: String },

    /// A path asked for (prefetch list, lookup) does not exist in the image.
    #[error("path {path:?} not found in the image: {reason}")]
    NotFound { path: String, reason: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with the action and the path it concerned.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            cause: source,
        }
    }

    /// A corrupt field, for validation code.
    pub(crate) fn corrupt(
        structure: impl std::fmt::Display,
        field: &'static str,
        offset: u64,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Error::Corrupt {
            structure: structure.to_string(),
            field,
            offset,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
