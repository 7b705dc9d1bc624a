//! Piece tables: how the mirror cuts a plain OCI blob for the swarm. A blob is split
//! into fixed-size pieces; each piece is cached (and served to peers) under the sha256
//! of its bytes, like a chunk. The table — the blob's size, the piece size and every
//! piece's digest — is written here only after the whole blob matched its own digest,
//! and only then are its pieces announced; peers ask for it (`PeerService.PieceTable`)
//! to check each piece they fetch.
//!
//! On disk: `<cache_dir>/pieces/<hex of the blob digest>`, in the format of
//! [`encode`] (docs/format.md §16).

use std::path::{Path, PathBuf};

use rafs_format::chunk::DigestAlgo;
use sha2::{Digest, Sha256};
use tessera_proto::domain::{BlobDigest, PieceTable};

use crate::cache::ChunkKey;
use crate::{Error, Result};

/// The piece size the mirror cuts blobs into: large enough that a piece costs one
/// scheduler question and one peer stream, small enough that a 4-piece window keeps
/// several peers busy on a 30 MB layer.
pub const PIECE_SIZE: u64 = 4 << 20;

const MAGIC: &[u8; 8] = b"TSPIECE1";

/// The cache key of a piece.
pub fn piece_key(digest: [u8; 32]) -> ChunkKey {
    ChunkKey {
        algo: DigestAlgo::Sha256,
        digest,
    }
}

/// The table's bytes: magic `TSPIECE1`, size (u64 LE), piece size (u64 LE), then the
/// 32-byte digests in order.
pub fn encode(table: &PieceTable) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + 32 * table.digests.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&table.size.to_le_bytes());
    out.extend_from_slice(&table.piece_size.to_le_bytes());
    for d in &table.digests {
        out.extend_from_slice(d);
    }
    out
}

/// Reads what [`encode`] wrote, checking it as a peer's table is checked.
pub fn decode(blob: &str, bytes: &[u8]) -> std::result::Result<PieceTable, String> {
    if bytes.len() < 24 || &bytes[..8] != MAGIC || !(bytes.len() - 24).is_multiple_of(32) {
        return Err("not a piece table".into());
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let response = tessera_proto::pb::PieceTableResponse {
        blob: blob.to_string(),
        size: word(8),
        piece_size: word(16),
        digests: bytes[24..].chunks(32).map(<[u8]>::to_vec).collect(),
    };
    PieceTable::try_from(response).map_err(|e| e.to_string())
}

/// The piece tables of the blobs this node verified whole.
#[derive(Debug)]
pub struct PieceTables {
    dir: PathBuf,
}

impl PieceTables {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        Ok(PieceTables {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, blob: &str) -> Option<PathBuf> {
        let hex = BlobDigest::parse("blob", blob.to_string())
            .ok()?
            .0
            .split_off("sha256:".len());
        Some(self.dir.join(hex))
    }

    /// The table of `blob`, if this node verified it whole. A damaged file is removed.
    pub fn get(&self, blob: &str) -> Option<PieceTable> {
        let path = self.path(blob)?;
        let bytes = std::fs::read(&path).ok()?;
        match decode(blob, &bytes) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = e, "removed a damaged piece table");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Records the table of a blob that matched its digest (atomically: a reader sees
    /// the whole table or none).
    pub fn put(&self, table: &PieceTable) -> Result<()> {
        let Some(path) = self.path(&table.blob.0) else {
            return Ok(());
        };
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)
            .map_err(|e| Error::io("create a temporary file in", &self.dir, e))?;
        std::io::Write::write_all(&mut tmp, &encode(table))
            .map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.persist(&path)
            .map_err(|e| Error::io("rename into", &path, e.error))?;
        Ok(())
    }

    pub fn remove(&self, blob: &str) {
        if let Some(path) = self.path(blob) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Cuts a stream of a blob's bytes into pieces as they arrive, hashing each piece and
/// the whole.
#[derive(Debug)]
pub struct Cutter {
    piece_size: u64,
    whole: Sha256,
    current: Vec<u8>,
    pub digests: Vec<[u8; 32]>,
    pub len: u64,
}

impl Cutter {
    pub fn new(piece_size: u64) -> Self {
        Cutter {
            piece_size,
            whole: Sha256::new(),
            current: Vec::new(),
            digests: Vec::new(),
            len: 0,
        }
    }

    /// Takes the next bytes; returns the pieces they completed (digest, bytes).
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<([u8; 32], Vec<u8>)> {
        self.whole.update(bytes);
        self.len += bytes.len() as u64;
        let mut done = Vec::new();
        while !bytes.is_empty() {
            let room = self.piece_size as usize - self.current.len();
            let take = room.min(bytes.len());
            self.current.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.current.len() == self.piece_size as usize {
                done.push(self.finish_piece());
            }
        }
        done
    }

    fn finish_piece(&mut self) -> ([u8; 32], Vec<u8>) {
        let piece = std::mem::take(&mut self.current);
        let digest: [u8; 32] = Sha256::digest(&piece).into();
        self.digests.push(digest);
        (digest, piece)
    }

    /// Ends the stream.
    pub fn finish(mut self) -> Cut {
        let last = (!self.current.is_empty()).then(|| self.finish_piece());
        Cut {
            last,
            digest: format!("sha256:{}", hex::encode(self.whole.finalize())),
            digests: self.digests,
            len: self.len,
        }
    }
}

/// A finished stream.
#[derive(Debug)]
pub struct Cut {
    /// The last, short piece, if any (digest, bytes).
    pub last: Option<([u8; 32], Vec<u8>)>,
    /// `sha256:<hex>` of the whole stream.
    pub digest: String,
    /// Every piece's digest, in order.
    pub digests: Vec<[u8; 32]>,
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_and_tables_round_trip() {
        let data: Vec<u8> = (0..(3 * 65536 + 17) as u32).map(|i| i as u8).collect();
        let mut cutter = Cutter::new(65536);
        let mut pieces = Vec::new();
        for part in data.chunks(10_000) {
            pieces.extend(cutter.push(part));
        }
        let Cut {
            last,
            digest: whole,
            digests,
            len,
        } = cutter.finish();
        pieces.extend(last);
        assert_eq!(len, data.len() as u64);
        assert_eq!(pieces.len(), 4);
        assert_eq!(pieces[3].1.len(), 17);
        let joined: Vec<u8> = pieces.iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(joined, data);
        assert_eq!(
            whole,
            format!("sha256:{}", hex::encode(Sha256::digest(&data)))
        );
        let table = PieceTable {
            blob: BlobDigest(whole.clone()),
            size: len,
            piece_size: 65536,
            digests,
        };
        let dir = tempfile::tempdir().unwrap();
        let tables = PieceTables::open(dir.path()).unwrap();
        assert!(tables.get(&whole).is_none());
        tables.put(&table).unwrap();
        assert_eq!(tables.get(&whole), Some(table.clone()));
        // A damaged file is refused and removed.
        let path = tables.path(&whole).unwrap();
        std::fs::write(&path, &encode(&table)[..30]).unwrap();
        assert!(tables.get(&whole).is_none());
        assert!(!path.exists());
        assert!(decode(&whole, b"TSPIECE1").is_err());
    }
}
