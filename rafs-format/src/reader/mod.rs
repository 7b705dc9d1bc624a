//! Reading images: the bootstrap (metadata) and chunks from local blob files.
//!
//! The reader never depends on the builder: a second implementation of the format, or the
//! agent's FUSE filesystem, needs only this module and `layout`.

mod blobs;
mod bootstrap;

pub use blobs::{read_chunk, BlobSource, LocalBlobs};
pub(crate) use bootstrap::{check_name, checksum as bootstrap_checksum};
pub use bootstrap::{
    BlobInfo, Bootstrap, CheckpointInfo, ChunkInfo, DirEntry, FileChunk, FileKind, Inode,
    PrefetchEntry, SpanStart, Verify, MAX_SPAN_SIZE,
};
