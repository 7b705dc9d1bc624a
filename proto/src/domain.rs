//! Checked forms of the protocol's messages. Receivers convert every message with
//! `TryFrom` before using it, so nothing downstream sees an empty id, a malformed
//! digest, an inverted range or an address that does not parse.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::pb;

/// A message field that does not hold what the protocol promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct Invalid {
    /// Dotted path of the field (`host.address`, `held[2].ranges[0]`).
    pub field: String,
    pub reason: String,
}

impl Invalid {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same problem, one level deeper in the message (`held[2]` + `.blob`).
    fn within(self, parent: impl std::fmt::Display) -> Self {
        Invalid {
            field: format!("{parent}.{}", self.field),
            reason: self.reason,
        }
    }
}

impl From<Invalid> for tonic::Status {
    fn from(e: Invalid) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// Longest host id, label key or value accepted.
const MAX_NAME: usize = 253;

fn name(field: &str, value: String) -> Result<String, Invalid> {
    if value.is_empty() {
        return Err(Invalid::new(field, "must not be empty"));
    }
    if value.len() > MAX_NAME {
        return Err(Invalid::new(field, format!("longer than {MAX_NAME} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(Invalid::new(field, "contains control characters"));
    }
    Ok(value)
}

/// A host's id in the swarm.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub String);

impl HostId {
    pub fn parse(field: &str, value: String) -> Result<Self, Invalid> {
        name(field, value).map(HostId)
    }
}

/// A blob's digest, `sha256:<64 lowercase hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobDigest(pub String);

impl BlobDigest {
    pub fn parse(field: &str, value: String) -> Result<Self, Invalid> {
        let hex = value
            .strip_prefix("sha256:")
            .ok_or_else(|| Invalid::new(field, "must start with sha256:"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Invalid::new(
                field,
                "must be sha256: and 64 lowercase hex digits",
            ));
        }
        Ok(BlobDigest(value))
    }
}

/// `[start, end)` of a blob, non-empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl TryFrom<pb::ByteRange> for ByteRange {
    type Error = Invalid;
    fn try_from(r: pb::ByteRange) -> Result<Self, Invalid> {
        if r.start >= r.end {
            return Err(Invalid::new(
                "",
                format!("start {} is not before end {}", r.start, r.end),
            ));
        }
        Ok(ByteRange {
            start: r.start,
            end: r.end,
        })
    }
}

impl From<ByteRange> for pb::ByteRange {
    fn from(r: ByteRange) -> Self {
        pb::ByteRange {
            start: r.start,
            end: r.end,
        }
    }
}

fn range(field: &str, r: Option<pb::ByteRange>) -> Result<ByteRange, Invalid> {
    let r = r.ok_or_else(|| Invalid::new(field, "missing"))?;
    ByteRange::try_from(r).map_err(|e| Invalid::new(field, e.reason))
}

/// A host as it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub id: HostId,
    pub address: SocketAddr,
    pub labels: BTreeMap<String, String>,
    /// Bytes per second the host uploads at most; `None`: unlimited.
    pub upload_limit_bps: Option<u64>,
    pub max_uploads: u32,
}

impl TryFrom<pb::Host> for Host {
    type Error = Invalid;
    fn try_from(h: pb::Host) -> Result<Self, Invalid> {
        let id = HostId::parse("id", h.id)?;
        let address = h
            .address
            .parse()
            .map_err(|_| Invalid::new("address", format!("{:?} is not host:port", h.address)))?;
        let mut labels = BTreeMap::new();
        for (k, v) in h.labels {
            let key = name("labels", k)?;
            let value = name(&format!("labels[{key}]"), v)?;
            labels.insert(key, value);
        }
        if h.max_uploads == 0 {
            return Err(Invalid::new("max_uploads", "must be at least 1"));
        }
        Ok(Host {
            id,
            address,
            labels,
            upload_limit_bps: (h.upload_limit_bps > 0).then_some(h.upload_limit_bps),
            max_uploads: h.max_uploads,
        })
    }
}

impl From<Host> for pb::Host {
    fn from(h: Host) -> Self {
        pb::Host {
            id: h.id.0,
            address: h.address.to_string(),
            labels: h.labels.into_iter().collect(),
            upload_limit_bps: h.upload_limit_bps.unwrap_or(0),
            max_uploads: h.max_uploads,
        }
    }
}

/// Byte ranges of one blob, sorted and merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRanges {
    pub blob: BlobDigest,
    pub ranges: Vec<ByteRange>,
    /// The whole blob's size, when the announcer knows it.
    pub size: Option<u64>,
}

impl TryFrom<pb::BlobRanges> for BlobRanges {
    type Error = Invalid;
    fn try_from(b: pb::BlobRanges) -> Result<Self, Invalid> {
        let blob = BlobDigest::parse("blob", b.blob)?;
        let mut ranges = b
            .ranges
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                ByteRange::try_from(r).map_err(|e| Invalid::new(format!("ranges[{i}]"), e.reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        ranges.sort_unstable();
        let mut merged: Vec<ByteRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let size = (b.size > 0).then_some(b.size);
        if let (Some(size), Some(last)) = (size, merged.last()) {
            if last.end > size {
                return Err(Invalid::new(
                    "ranges",
                    format!("a range ends at {} past the blob's size {size}", last.end),
                ));
            }
        }
        Ok(BlobRanges {
            blob,
            ranges: merged,
            size,
        })
    }
}

fn blob_ranges(field: &str, list: Vec<pb::BlobRanges>) -> Result<Vec<BlobRanges>, Invalid> {
    list.into_iter()
        .enumerate()
        .map(|(i, b)| BlobRanges::try_from(b).map_err(|e| e.within(format!("{field}[{i}]"))))
        .collect()
}

/// What a host announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    pub host: HostId,
    pub held: Vec<BlobRanges>,
    pub dropped: Vec<BlobRanges>,
    pub full: bool,
    /// Images the host uses and their blobs.
    pub images: Vec<ImageBlobs>,
}

/// An image a host uses and the blobs it is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBlobs {
    pub image: String,
    pub blobs: Vec<BlobDigest>,
}

/// Most blobs one image may name (more than any real image has layers).
const MAX_IMAGE_BLOBS: usize = 1024;

impl TryFrom<pb::ImageBlobs> for ImageBlobs {
    type Error = Invalid;
    fn try_from(i: pb::ImageBlobs) -> Result<Self, Invalid> {
        if i.image.is_empty()
            || i.image.len() > 1024
            || i.image.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(Invalid::new(
                "image",
                "an image reference of 1 to 1024 characters without spaces",
            ));
        }
        if i.blobs.len() > MAX_IMAGE_BLOBS {
            return Err(Invalid::new(
                "blobs",
                format!("more than {MAX_IMAGE_BLOBS} blobs"),
            ));
        }
        let blobs = i
            .blobs
            .into_iter()
            .enumerate()
            .map(|(n, b)| BlobDigest::parse(&format!("blobs[{n}]"), b))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ImageBlobs {
            image: i.image,
            blobs,
        })
    }
}

impl TryFrom<pb::AnnounceRequest> for Announce {
    type Error = Invalid;
    fn try_from(a: pb::AnnounceRequest) -> Result<Self, Invalid> {
        Ok(Announce {
            host: HostId::parse("host_id", a.host_id)?,
            held: blob_ranges("held", a.held)?,
            dropped: blob_ranges("dropped", a.dropped)?,
            full: a.full,
            images: a
                .images
                .into_iter()
                .enumerate()
                .map(|(n, i)| ImageBlobs::try_from(i).map_err(|e| e.within(format!("images[{n}]"))))
                .collect::<Result<Vec<_>, _>>()?,
        })
    }
}

/// A request for who holds a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindPeers {
    pub host: HostId,
    pub blob: BlobDigest,
    pub range: ByteRange,
}

impl TryFrom<pb::FindPeersRequest> for FindPeers {
    type Error = Invalid;
    fn try_from(f: pb::FindPeersRequest) -> Result<Self, Invalid> {
        Ok(FindPeers {
            host: HostId::parse("host_id", f.host_id)?,
            blob: BlobDigest::parse("blob", f.blob)?,
            range: range("range", f.range)?,
        })
    }
}

/// The scheduler's answer to "who holds this range", as the agent receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChoice {
    /// Fetch from these peers, best first.
    Peers(Vec<Peer>),
    /// Nobody holds it yet: fetch it from the origin.
    Origin,
    /// Others are fetching it from the origin: ask again after this long.
    Wait(std::time::Duration),
}

/// A peer as the scheduler names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    pub id: HostId,
    pub address: SocketAddr,
    /// It holds the whole blob: worth asking again for other ranges of it.
    pub whole_blob: bool,
}

/// Longest wait a scheduler may ask for; more is a broken or hostile answer.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl TryFrom<pb::FindPeersResponse> for PeerChoice {
    type Error = Invalid;
    fn try_from(r: pb::FindPeersResponse) -> Result<Self, Invalid> {
        match pb::Action::try_from(r.action) {
            Ok(pb::Action::Peers) => {
                if r.peers.is_empty() {
                    return Err(Invalid::new("peers", "empty with ACTION_PEERS"));
                }
                let peers = r
                    .peers
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let field = format!("peers[{i}]");
                        Ok(Peer {
                            id: HostId::parse(&format!("{field}.host_id"), p.host_id)?,
                            address: p.address.parse().map_err(|_| {
                                Invalid::new(
                                    format!("{field}.address"),
                                    format!("{:?} is not host:port", p.address),
                                )
                            })?,
                            whole_blob: p.whole_blob,
                        })
                    })
                    .collect::<Result<Vec<_>, Invalid>>()?;
                Ok(PeerChoice::Peers(peers))
            }
            Ok(pb::Action::Origin) => Ok(PeerChoice::Origin),
            Ok(pb::Action::Wait) => {
                let wait = std::time::Duration::from_millis(r.wait_ms);
                if wait.is_zero() || wait > MAX_WAIT {
                    return Err(Invalid::new(
                        "wait_ms",
                        format!("{} is not in 1..={}", r.wait_ms, MAX_WAIT.as_millis()),
                    ));
                }
                Ok(PeerChoice::Wait(wait))
            }
            Ok(pb::Action::Unspecified) | Err(_) => Err(Invalid::new(
                "action",
                format!("{} is not an action", r.action),
            )),
        }
    }
}

/// One chunk a peer sent: a 32-byte digest and the bytes it claims to be, as
/// `encoding` says (decoded and verified by the receiver before anything else).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkData {
    pub digest: [u8; 32],
    pub data: Vec<u8>,
    pub encoding: ChunkEncoding,
}

/// How a peer encoded a chunk it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkEncoding {
    /// The uncompressed bytes.
    Plain,
    /// One zstd frame of them.
    Zstd,
}

impl ChunkEncoding {
    pub fn name(self) -> &'static str {
        match self {
            ChunkEncoding::Plain => "",
            ChunkEncoding::Zstd => "zstd",
        }
    }
}

impl TryFrom<pb::ChunkData> for ChunkData {
    type Error = Invalid;
    fn try_from(c: pb::ChunkData) -> Result<Self, Invalid> {
        let digest = <[u8; 32]>::try_from(c.digest.as_slice())
            .map_err(|_| Invalid::new("digest", format!("{} bytes, not 32", c.digest.len())))?;
        let encoding = match c.encoding.as_str() {
            "" => ChunkEncoding::Plain,
            "zstd" => ChunkEncoding::Zstd,
            other => {
                return Err(Invalid::new(
                    "encoding",
                    format!("{other:?} is not \"\" or \"zstd\""),
                ))
            }
        };
        Ok(ChunkData {
            digest,
            data: c.data,
            encoding,
        })
    }
}

/// How a transfer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    Timeout,
    Connection,
    VerificationFailed,
    NotFound,
    Other,
}

/// One transfer's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// `None`: from the origin.
    pub peer: Option<HostId>,
    pub blob: BlobDigest,
    pub range: ByteRange,
    pub bytes: u64,
    pub duration_us: u64,
    pub outcome: Outcome,
}

impl TryFrom<pb::Transfer> for Transfer {
    type Error = Invalid;
    fn try_from(t: pb::Transfer) -> Result<Self, Invalid> {
        let outcome = match pb::Outcome::try_from(t.outcome) {
            Ok(pb::Outcome::Ok) => Outcome::Ok,
            Ok(pb::Outcome::Timeout) => Outcome::Timeout,
            Ok(pb::Outcome::Connection) => Outcome::Connection,
            Ok(pb::Outcome::VerificationFailed) => Outcome::VerificationFailed,
            Ok(pb::Outcome::NotFound) => Outcome::NotFound,
            Ok(pb::Outcome::Other) => Outcome::Other,
            Ok(pb::Outcome::Unspecified) | Err(_) => {
                return Err(Invalid::new(
                    "outcome",
                    format!("{} is not an outcome", t.outcome),
                ))
            }
        };
        Ok(Transfer {
            peer: if t.peer_id.is_empty() {
                None
            } else {
                Some(HostId::parse("peer_id", t.peer_id)?)
            },
            blob: BlobDigest::parse("blob", t.blob)?,
            range: range("range", t.range)?,
            bytes: t.bytes,
            duration_us: t.duration_us,
            outcome,
        })
    }
}

/// The chunks a peer is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchChunks {
    pub algorithm: DigestAlgorithm,
    pub digests: Vec<[u8; 32]>,
    /// The requester decodes zstd-encoded chunks.
    pub accepts_zstd: bool,
    /// Its proof of pull access, for chunks of a restricted image.
    pub access: Option<ChunkAccess>,
}

/// A requester's proof that it read manifests naming `blob` (`pb::ChunkAccess`): each
/// proof an HMAC only a holder of that manifest's bytes can make. Checked for shape
/// here; whether the proofs are true only the serving peer can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkAccess {
    pub requester: HostId,
    pub blob: BlobDigest,
    pub proofs: Vec<AccessProof>,
}

/// One manifest's proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessProof {
    /// The manifest's digest (`sha256:…`).
    pub manifest: BlobDigest,
    pub proof: [u8; 32],
}

/// Most proofs one request may carry (each costs the peer an HMAC).
pub const MAX_ACCESS_PROOFS: usize = 16;

impl TryFrom<pb::ChunkAccess> for ChunkAccess {
    type Error = Invalid;
    fn try_from(a: pb::ChunkAccess) -> Result<Self, Invalid> {
        if a.proofs.is_empty() || a.proofs.len() > MAX_ACCESS_PROOFS {
            return Err(Invalid::new(
                "access.proofs",
                format!("{} proofs; 1..={MAX_ACCESS_PROOFS} allowed", a.proofs.len()),
            ));
        }
        let proofs = a
            .proofs
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let field = format!("access.proofs[{i}]");
                Ok(AccessProof {
                    manifest: BlobDigest::parse(&format!("{field}.manifest"), p.manifest)?,
                    proof: <[u8; 32]>::try_from(p.proof.as_slice()).map_err(|_| {
                        Invalid::new(
                            format!("{field}.proof"),
                            format!("{} bytes, not 32", p.proof.len()),
                        )
                    })?,
                })
            })
            .collect::<Result<Vec<_>, Invalid>>()?;
        Ok(ChunkAccess {
            requester: HostId::parse("access.requester", a.requester)?,
            blob: BlobDigest::parse("access.blob", a.blob)?,
            proofs,
        })
    }
}

/// How chunk digests are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestAlgorithm {
    Sha256,
    Blake3,
}

/// Most chunks asked for in one request (bounds the work one request can cause).
pub const MAX_FETCH_CHUNKS: usize = 1024;

impl TryFrom<pb::FetchChunksRequest> for FetchChunks {
    type Error = Invalid;
    fn try_from(f: pb::FetchChunksRequest) -> Result<Self, Invalid> {
        let algorithm = match f.digest_algorithm.as_str() {
            "sha256" => DigestAlgorithm::Sha256,
            "blake3" => DigestAlgorithm::Blake3,
            other => {
                return Err(Invalid::new(
                    "digest_algorithm",
                    format!("{other:?} is not sha256 or blake3"),
                ))
            }
        };
        if f.digests.is_empty() || f.digests.len() > MAX_FETCH_CHUNKS {
            return Err(Invalid::new(
                "digests",
                format!(
                    "{} digests; 1..={MAX_FETCH_CHUNKS} allowed",
                    f.digests.len()
                ),
            ));
        }
        let digests = f
            .digests
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                <[u8; 32]>::try_from(d.as_slice()).map_err(|_| {
                    Invalid::new(
                        format!("digests[{i}]"),
                        format!("{} bytes, not 32", d.len()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Encodings it does not know are ignored: it gets plain bytes.
        let accepts_zstd = f.accept_encodings.iter().any(|e| e == "zstd");
        let access = f.access.map(ChunkAccess::try_from).transpose()?;
        Ok(FetchChunks {
            algorithm,
            digests,
            accepts_zstd,
            access,
        })
    }
}

/// Smallest and largest piece a piece table may use: a piece travels as one message.
pub const PIECE_SIZES: std::ops::RangeInclusive<u64> = (64 << 10)..=(16 << 20);

/// A checked piece table (see `PeerService.PieceTable`): the piece count matches the
/// size and the piece size, every digest has 32 bytes. Whether the digests are true is
/// for the receiver to find out, piece by piece and finally by the blob's digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceTable {
    pub blob: BlobDigest,
    pub size: u64,
    pub piece_size: u64,
    pub digests: Vec<[u8; 32]>,
}

impl PieceTable {
    /// `[start, end)` of piece `index` in the blob.
    pub fn piece_range(&self, index: usize) -> (u64, u64) {
        let start = index as u64 * self.piece_size;
        (start, (start + self.piece_size).min(self.size))
    }

    /// The pieces covering `[start, end)` of the blob.
    pub fn pieces_covering(&self, start: u64, end: u64) -> std::ops::Range<usize> {
        if start >= end || self.piece_size == 0 {
            return 0..0;
        }
        let first = (start / self.piece_size) as usize;
        let last = ((end - 1) / self.piece_size) as usize;
        first..(last + 1).min(self.digests.len())
    }
}

impl From<&PieceTable> for pb::PieceTableResponse {
    fn from(t: &PieceTable) -> Self {
        pb::PieceTableResponse {
            blob: t.blob.0.clone(),
            size: t.size,
            piece_size: t.piece_size,
            digests: t.digests.iter().map(|d| d.to_vec()).collect(),
        }
    }
}

impl TryFrom<pb::PieceTableResponse> for PieceTable {
    type Error = Invalid;
    fn try_from(t: pb::PieceTableResponse) -> Result<Self, Invalid> {
        let blob = BlobDigest::parse("blob", t.blob)?;
        if !PIECE_SIZES.contains(&t.piece_size) {
            return Err(Invalid::new(
                "piece_size",
                format!(
                    "{} is outside {}..={}",
                    t.piece_size,
                    PIECE_SIZES.start(),
                    PIECE_SIZES.end()
                ),
            ));
        }
        let expected = t.size.div_ceil(t.piece_size);
        if t.digests.len() as u64 != expected {
            return Err(Invalid::new(
                "digests",
                format!(
                    "{} digests for {} bytes in pieces of {}; expected {expected}",
                    t.digests.len(),
                    t.size,
                    t.piece_size
                ),
            ));
        }
        let digests = t
            .digests
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                <[u8; 32]>::try_from(d.as_slice()).map_err(|_| {
                    Invalid::new(
                        format!("digests[{i}]"),
                        format!("{} bytes, not 32", d.len()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PieceTable {
            blob,
            size: t.size,
            piece_size: t.piece_size,
            digests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn chunk_encodings_are_named_or_refused() {
        let chunk = |encoding: &str| {
            ChunkData::try_from(pb::ChunkData {
                digest: vec![7; 32],
                data: vec![1, 2],
                encoding: encoding.into(),
            })
        };
        assert_eq!(chunk("").unwrap().encoding, ChunkEncoding::Plain);
        assert_eq!(chunk("zstd").unwrap().encoding, ChunkEncoding::Zstd);
        let e = chunk("gzip").unwrap_err();
        assert!(e.to_string().contains("encoding"), "{e}");
        let asked = |accept: &[&str]| {
            FetchChunks::try_from(pb::FetchChunksRequest {
                digest_algorithm: "sha256".into(),
                digests: vec![vec![0; 32]],
                accept_encodings: accept.iter().map(|s| s.to_string()).collect(),
                access: None,
            })
            .unwrap()
            .accepts_zstd
        };
        assert!(asked(&["br", "zstd"]) && !asked(&[]) && !asked(&["br"]));
    }

    #[test]
    fn scheduler_answers_are_checked() {
        let peer = |id: &str, addr: &str| pb::Peer {
            host_id: id.into(),
            address: addr.into(),
            whole_blob: true,
        };
        let answer = |action: pb::Action, peers: Vec<pb::Peer>, wait_ms: u64| {
            PeerChoice::try_from(pb::FindPeersResponse {
                action: action.into(),
                peers,
                wait_ms,
            })
        };
        assert_eq!(
            answer(pb::Action::Peers, vec![peer("b", "10.0.0.2:7081")], 0).unwrap(),
            PeerChoice::Peers(vec![Peer {
                id: HostId("b".into()),
                address: "10.0.0.2:7081".parse().unwrap(),
                whole_blob: true,
            }])
        );
        assert_eq!(
            answer(pb::Action::Origin, vec![], 0).unwrap(),
            PeerChoice::Origin
        );
        assert_eq!(
            answer(pb::Action::Wait, vec![], 200).unwrap(),
            PeerChoice::Wait(std::time::Duration::from_millis(200))
        );
        for (bad, field) in [
            (answer(pb::Action::Peers, vec![], 0), "peers"),
            (
                answer(pb::Action::Peers, vec![peer("b", "nowhere")], 0),
                "peers[0].address",
            ),
            (
                answer(pb::Action::Peers, vec![peer("", "10.0.0.2:1")], 0),
                "peers[0].host_id",
            ),
            (answer(pb::Action::Wait, vec![], 0), "wait_ms"),
            (answer(pb::Action::Wait, vec![], 3_600_000), "wait_ms"),
            (answer(pb::Action::Unspecified, vec![], 0), "action"),
        ] {
            assert_eq!(bad.unwrap_err().field, field);
        }
        let short = ChunkData::try_from(pb::ChunkData {
            digest: vec![1; 31],
            data: vec![],
            encoding: String::new(),
        });
        assert_eq!(short.unwrap_err().field, "digest");
    }

    #[test]
    fn hosts_are_checked_field_by_field() {
        let good = pb::Host {
            id: "node-1".into(),
            address: "10.0.0.1:7070".into(),
            labels: [("zone".to_string(), "a".to_string())].into(),
            upload_limit_bps: 0,
            max_uploads: 8,
        };
        let host = Host::try_from(good.clone()).unwrap();
        assert_eq!(host.upload_limit_bps, None);
        assert_eq!(pb::Host::from(host), good);
        for (bad, field) in [
            (
                pb::Host {
                    id: String::new(),
                    ..good.clone()
                },
                "id",
            ),
            (
                pb::Host {
                    address: "nope".into(),
                    ..good.clone()
                },
                "address",
            ),
            (
                pb::Host {
                    max_uploads: 0,
                    ..good.clone()
                },
                "max_uploads",
            ),
            (
                pb::Host {
                    labels: [("zone".to_string(), String::new())].into(),
                    ..good.clone()
                },
                "labels[zone]",
            ),
        ] {
            let e = Host::try_from(bad).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            let status = tonic::Status::from(e);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(field));
        }
    }

    #[test]
    fn announcements_merge_ranges_and_name_bad_fields() {
        let a = Announce::try_from(pb::AnnounceRequest {
            host_id: "h".into(),
            held: vec![pb::BlobRanges {
                blob: digest('a'),
                ranges: vec![
                    pb::ByteRange { start: 10, end: 20 },
                    pb::ByteRange { start: 0, end: 10 },
                    pb::ByteRange { start: 30, end: 40 },
                ],
                size: 0,
            }],
            full: true,
            dropped: vec![],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            a.held[0].ranges,
            [
                ByteRange { start: 0, end: 20 },
                ByteRange { start: 30, end: 40 }
            ]
        );
        let e = Announce::try_from(pb::AnnounceRequest {
            host_id: "h".into(),
            held: vec![
                pb::BlobRanges {
                    blob: digest('a'),
                    ranges: vec![],
                    size: 0,
                },
                pb::BlobRanges {
                    blob: digest('b'),
                    ranges: vec![pb::ByteRange { start: 5, end: 5 }],
                    size: 0,
                },
            ],
            full: false,
            dropped: vec![],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "held[1].ranges[0]", "{e}");
        let e = Announce::try_from(pb::AnnounceRequest {
            host_id: "h".into(),
            held: vec![pb::BlobRanges {
                blob: digest('a'),
                ranges: vec![pb::ByteRange { start: 0, end: 11 }],
                size: 10,
            }],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "held[0].ranges", "{e}");
        let e = Announce::try_from(pb::AnnounceRequest {
            host_id: "h".into(),
            images: vec![pb::ImageBlobs {
                image: "reg/app:v1".into(),
                blobs: vec![digest('a'), "md5:x".into()],
            }],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "images[0].blobs[1]", "{e}");
        let e = BlobDigest::parse("blob", "sha256:ABC".into()).unwrap_err();
        assert_eq!(e.field, "blob");
    }

    #[test]
    fn peer_requests_are_bounded() {
        let ok = FetchChunks::try_from(pb::FetchChunksRequest {
            accept_encodings: Vec::new(),
            digest_algorithm: "blake3".into(),
            digests: vec![vec![7; 32]],
            access: None,
        })
        .unwrap();
        assert_eq!(ok.algorithm, DigestAlgorithm::Blake3);
        for (req, field) in [
            (
                pb::FetchChunksRequest {
                    accept_encodings: Vec::new(),
                    digest_algorithm: "md5".into(),
                    digests: vec![vec![0; 32]],
                    access: None,
                },
                "digest_algorithm",
            ),
            (
                pb::FetchChunksRequest {
                    accept_encodings: Vec::new(),
                    digest_algorithm: "sha256".into(),
                    digests: vec![],
                    access: None,
                },
                "digests",
            ),
            (
                pb::FetchChunksRequest {
                    accept_encodings: Vec::new(),
                    digest_algorithm: "sha256".into(),
                    digests: vec![vec![0; 32], vec![0; 31]],
                    access: None,
                },
                "digests[1]",
            ),
        ] {
            assert_eq!(FetchChunks::try_from(req).unwrap_err().field, field);
        }
        let proof = |manifest: String, len: usize| pb::AccessProof {
            manifest,
            proof: vec![1; len],
        };
        let with = |access: pb::ChunkAccess| {
            FetchChunks::try_from(pb::FetchChunksRequest {
                accept_encodings: Vec::new(),
                digest_algorithm: "sha256".into(),
                digests: vec![vec![0; 32]],
                access: Some(access),
            })
        };
        let good = pb::ChunkAccess {
            requester: "node-b".into(),
            blob: digest('b'),
            proofs: vec![proof(digest('d'), 32)],
        };
        let checked = with(good.clone()).unwrap().access.unwrap();
        assert_eq!(checked.requester.0, "node-b");
        assert_eq!(checked.proofs[0].proof, [1; 32]);
        for (access, field) in [
            (
                pb::ChunkAccess {
                    proofs: vec![],
                    ..good.clone()
                },
                "access.proofs",
            ),
            (
                pb::ChunkAccess {
                    proofs: vec![proof(digest('d'), 32); MAX_ACCESS_PROOFS + 1],
                    ..good.clone()
                },
                "access.proofs",
            ),
            (
                pb::ChunkAccess {
                    proofs: vec![proof(digest('d'), 32), proof(digest('d'), 31)],
                    ..good.clone()
                },
                "access.proofs[1].proof",
            ),
            (
                pb::ChunkAccess {
                    proofs: vec![proof("md5:00".into(), 32)],
                    ..good.clone()
                },
                "access.proofs[0].manifest",
            ),
            (
                pb::ChunkAccess {
                    requester: String::new(),
                    ..good.clone()
                },
                "access.requester",
            ),
            (
                pb::ChunkAccess {
                    blob: "sha256:ab".into(),
                    ..good.clone()
                },
                "access.blob",
            ),
        ] {
            assert_eq!(with(access).unwrap_err().field, field);
        }
        let e = FindPeers::try_from(pb::FindPeersRequest {
            host_id: "h".into(),
            blob: digest('c'),
            range: None,
        })
        .unwrap_err();
        assert_eq!(e.field, "range");
        let e = Transfer::try_from(pb::Transfer {
            peer_id: String::new(),
            blob: digest('c'),
            range: Some(pb::ByteRange { start: 0, end: 1 }),
            bytes: 1,
            duration_us: 1,
            outcome: 0,
        })
        .unwrap_err();
        assert_eq!(e.field, "outcome");
    }

    #[test]
    fn piece_tables_are_checked() {
        let table = pb::PieceTableResponse {
            blob: digest('a'),
            size: (1 << 20) + 1,
            piece_size: 1 << 20,
            digests: vec![vec![1; 32], vec![2; 32]],
        };
        let t = PieceTable::try_from(table.clone()).unwrap();
        assert_eq!(t.piece_range(1), (1 << 20, (1 << 20) + 1));
        assert_eq!(t.pieces_covering(0, 1), 0..1);
        assert_eq!(t.pieces_covering((1 << 20) - 1, (1 << 20) + 1), 0..2);
        assert_eq!(pb::PieceTableResponse::from(&t), table);
        let short = pb::PieceTableResponse {
            digests: vec![vec![1; 32]],
            ..table.clone()
        };
        assert_eq!(PieceTable::try_from(short).unwrap_err().field, "digests");
        let tiny = pb::PieceTableResponse {
            piece_size: 1,
            ..table.clone()
        };
        assert_eq!(PieceTable::try_from(tiny).unwrap_err().field, "piece_size");
        let bad = pb::PieceTableResponse {
            digests: vec![vec![1; 32], vec![2; 31]],
            ..table
        };
        assert_eq!(PieceTable::try_from(bad).unwrap_err().field, "digests[1]");
    }
}
