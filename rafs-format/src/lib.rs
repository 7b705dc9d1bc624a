//! Tessera's image format.
//!
//! An image is a **bootstrap** — the whole file tree with its metadata and a table of
//! every chunk's digest and place — plus **blobs** of independently compressed chunks.
//! The layers of this crate:
//!
//! - [`layout`]: the on-disk records, version 1 (specified in `docs/format.md`);
//! - [`chunk`]: digests and compression, the gate every chunk passes;
//! - [`reader`]: a lazily validated view of a bootstrap, and chunks from local blobs;
//! - [`builder`]: directory / layer tarball / OCI layout → bootstrap + blob;
//! - [`gzip`]: a DEFLATE decoder that can start in the middle of a gzip layer, at
//!   checkpoints it recorded while reading the layer once (lazy start without conversion);
//! - [`image`]: whole-image operations on an image dir (`check`, `unpack`, `inspect`).
//!
//! This crate does no network I/O, and the reader never depends on the builder.

pub mod builder;
pub mod chunk;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gzip;
pub mod image;
pub mod layout;
pub mod reader;

pub use error::{Error, Result};
