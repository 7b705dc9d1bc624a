//! Who may have the chunks of a *restricted* image from this node's peer service: a
//! private repository's image, or any checkpoint (its pages hold process memory,
//! tokens and keys included). The rule is the mirror's (`mirror::access`): bytes of a
//! private image go only to whoever showed the registry let them read it. Peers cannot
//! be shown a credential (credentials never leave the node), so they are shown what
//! only a reader of the image can know: its manifest's bytes (a digest does not give
//! them; the registry does, to a client it lets pull).
//!
//! - `access_key = SHA-256("tessera peer access v1\0" || manifest bytes)`, kept for
//!   every restricted image this node mounted, with the chunks of each of its blobs;
//! - a request for chunks of a restricted blob carries, for each manifest naming the
//!   blob that the requester read, `HMAC-SHA256(access_key, "tessera peer proof v1\0"
//!   || requester || "\0" || server || "\0" || blob)`;
//! - the server streams the chunks only when one proof checks out against a key of its
//!   own for that blob and every chunk asked for lies in the blob; else the request is
//!   refused (`PERMISSION_DENIED`), counted and logged at debug, and the requester
//!   goes on to the next peer or the origin.
//!
//! The proof names the server (the host id the scheduler gave the requester) as well as
//! the requester: any node can announce that it holds a blob and so be asked for it, and
//! a proof it is shown is worth nothing at any other peer. A chunk that lies in a
//! restricted blob is restricted even when a public image also has it (the server does
//! not track public images); the requester of that public image gets it from the origin.
//!
//! Kept on disk, root-only (a directory 0700, files 0600, written whole and renamed into
//! place), one file per manifest, so a restarted agent still refuses what it refused:
//! its cache outlives it. A record is written before the image is mounted, hence before
//! any of its chunks can enter the cache, and deleted at start once the cache holds
//! none of its chunks.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rafs_format::chunk::DigestAlgo;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tessera_proto::domain::ChunkAccess;

use crate::cache::ChunkKey;
use crate::{Error, Result};

/// What an access key is made from, before the manifest's bytes.
const KEY_CONTEXT: &[u8] = b"tessera peer access v1\0";
/// What a proof signs, before the ids and the blob.
const PROOF_CONTEXT: &[u8] = b"tessera peer proof v1\0";

/// Proofs sent with one request at most (the newest manifests naming the blob): the
/// bound the peer checks (`tessera_proto::domain::MAX_ACCESS_PROOFS`).
const PROOFS_SENT: usize = tessera_proto::domain::MAX_ACCESS_PROOFS;

/// The access key of a manifest: a secret to anyone who has not read its bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AccessKey([u8; 32]);

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessKey(<redacted>)")
    }
}

impl AccessKey {
    /// The key of the manifest whose bytes (exactly as the registry sent them) are
    /// `manifest`.
    pub fn of_manifest(manifest: &[u8]) -> AccessKey {
        let mut hash = Sha256::new();
        hash.update(KEY_CONTEXT);
        hash.update(manifest);
        AccessKey(hash.finalize().into())
    }

    fn hmac(&self) -> ring::hmac::Key {
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.0)
    }

    fn message(requester: &str, server: &str, blob: &str) -> Vec<u8> {
        [
            PROOF_CONTEXT,
            requester.as_bytes(),
            b"\0",
            server.as_bytes(),
            b"\0",
            blob.as_bytes(),
        ]
        .concat()
    }

    /// The proof `requester` shows `server` for `blob` (`sha256:…`).
    pub fn proof(&self, requester: &str, server: &str, blob: &str) -> [u8; 32] {
        let tag = ring::hmac::sign(&self.hmac(), &Self::message(requester, server, blob));
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Whether `proof` is this key's for these names (compared in constant time).
    fn verifies(&self, proof: &[u8; 32], requester: &str, server: &str, blob: &str) -> bool {
        ring::hmac::verify(&self.hmac(), &Self::message(requester, server, blob), proof).is_ok()
    }
}

/// Whether an image must be proven to peers: its registry required credentials for it,
/// or it is a checkpoint (`artifactType` application/vnd.tessera.checkpoint.v1, or
/// annotations `io.tessera.checkpoint.*` on the manifest), whatever its repository.
pub fn is_restricted(used_credentials: bool, manifest: &oci_spec::image::ImageManifest) -> bool {
    used_credentials || is_checkpoint(manifest)
}

/// The `artifactType` of checkpoint images (as `checkpoint::app` pushes them; a layer
/// above this one, hence the copy, which `tests/private_checkpoint.rs` compares).
pub const CHECKPOINT_ARTIFACT_TYPE: &str = "application/vnd.tessera.checkpoint.v1";
/// The prefix of the annotations every checkpoint's manifest carries
/// (`checkpoint::node`), with or without an `artifactType` (`tessera checkpoint`
/// without `--for`).
pub const CHECKPOINT_ANNOTATION_PREFIX: &str = "io.tessera.checkpoint.";

/// Whether a manifest is a checkpoint's.
pub fn is_checkpoint(manifest: &oci_spec::image::ImageManifest) -> bool {
    let typed = manifest
        .artifact_type()
        .as_ref()
        .is_some_and(|t| t.to_string() == CHECKPOINT_ARTIFACT_TYPE);
    let annotated = manifest.annotations().as_ref().is_some_and(|a| {
        a.keys()
            .any(|k| k.starts_with(CHECKPOINT_ANNOTATION_PREFIX))
    });
    typed || annotated
}

/// Why a request was refused (for the debug log; the requester hears only
/// `PERMISSION_DENIED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Restricted chunks were asked for without any proof.
    NoProof,
    /// No proof checked out against a manifest this node read that names the blob.
    BadProof,
    /// A restricted chunk asked for does not lie in the blob the proof is for.
    NotInBlob,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NoProof => "chunks of a restricted image asked for without a proof of access",
            Refusal::BadProof => "no proof of access checked out for this blob",
            Refusal::NotInBlob => "a chunk asked for does not lie in the blob the proof is for",
        })
    }
}

/// One manifest's record, as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    version: u32,
    /// `sha256:…` of the manifest.
    manifest: String,
    /// Which image it is, for people reading the directory.
    repository: String,
    /// The access key, hex.
    key: String,
    /// Each blob's chunks (digest hex), by blob digest.
    blobs: HashMap<String, Vec<String>>,
    /// `sha256` or `blake3`: how the chunk digests were computed.
    algorithm: String,
}

/// A restricted image as the daemon registers it.
#[derive(Debug, Clone)]
pub struct Grant {
    /// `sha256:…` of the manifest.
    pub manifest: String,
    /// `registry/repository`, for the record's reader.
    pub repository: String,
    pub key: AccessKey,
    pub algo: DigestAlgo,
    /// Each blob (`sha256:…`) with the chunks of it the image uses.
    pub blobs: Vec<(String, Vec<[u8; 32]>)>,
}

impl Grant {
    /// Whether `held` holds any of its chunks.
    fn holds_any(&self, held: &impl Fn(&ChunkKey) -> bool) -> bool {
        self.blobs.iter().any(|(_, chunks)| {
            chunks.iter().any(|digest| {
                held(&ChunkKey {
                    algo: self.algo,
                    digest: *digest,
                })
            })
        })
    }
}

#[derive(Debug, Default)]
struct State {
    /// Manifests by digest: their keys.
    keys: HashMap<String, AccessKey>,
    /// For each restricted blob, the manifests naming it, oldest first.
    blobs: HashMap<Arc<str>, Vec<String>>,
    /// Each restricted chunk: the restricted blobs it lies in.
    chunks: HashMap<ChunkKey, Vec<Arc<str>>>,
    /// Manifest and blob pairs known (so a repeated mount changes nothing).
    named: HashSet<(String, Arc<str>)>,
}

impl State {
    fn add(&mut self, grant: &Grant) {
        self.keys.insert(grant.manifest.clone(), grant.key);
        for (blob, chunks) in &grant.blobs {
            let blob: Arc<str> = self
                .blobs
                .get_key_value(blob.as_str())
                .map_or_else(|| Arc::from(blob.as_str()), |(k, _)| k.clone());
            if self.named.insert((grant.manifest.clone(), blob.clone())) {
                self.blobs
                    .entry(blob.clone())
                    .or_default()
                    .push(grant.manifest.clone());
            }
            for digest in chunks {
                let key = ChunkKey {
                    algo: grant.algo,
                    digest: *digest,
                };
                let lies_in = self.chunks.entry(key).or_default();
                if !lies_in.contains(&blob) {
                    lies_in.push(blob.clone());
                }
            }
        }
    }

    /// Whether everything `grant` says is known already (a mount of an image mounted
    /// before: its tree may be another of the same manifest, with other chunks).
    fn knows(&self, grant: &Grant) -> bool {
        self.keys.get(&grant.manifest) == Some(&grant.key)
            && grant.blobs.iter().all(|(blob, chunks)| {
                self.blobs
                    .get(blob.as_str())
                    .is_some_and(|m| m.contains(&grant.manifest))
                    && chunks.iter().all(|digest| {
                        let key = ChunkKey {
                            algo: grant.algo,
                            digest: *digest,
                        };
                        self.chunks
                            .get(&key)
                            .is_some_and(|b| b.iter().any(|b| **b == **blob))
                    })
            })
    }
}

/// The access keys of the restricted images this node mounted, and the check of peers'
/// requests against them (see the module docs).
#[derive(Debug)]
pub struct PeerAccess {
    /// Where records are kept; `None`: memory only (tests).
    dir: Option<PathBuf>,
    state: RwLock<State>,
    /// Requests refused since start (`tessera_agent_peer_requests_refused_total`).
    refused: AtomicU64,
}

fn digest_hex(algo: DigestAlgo) -> &'static str {
    match algo {
        DigestAlgo::Sha256 => "sha256",
        DigestAlgo::Blake3 => "blake3",
    }
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    <[u8; 32]>::try_from(hex::decode(s).ok()?.as_slice()).ok()
}

impl PeerAccess {
    /// Memory only: nothing survives the process.
    pub fn in_memory() -> PeerAccess {
        PeerAccess {
            dir: None,
            state: RwLock::new(State::default()),
            refused: AtomicU64::new(0),
        }
    }

    /// Opens (creating, root-only) the records kept in `dir`. A record none of whose
    /// chunks `held` (the cache) still holds protects nothing and is deleted: a chunk
    /// of a restricted image enters the cache again only through a mount of it, which
    /// records it again (so the directory does not grow without bound). A record that
    /// does not read is reported and left in place: what it protected cannot be known.
    /// Blocking (file I/O).
    pub fn open(dir: &Path, held: impl Fn(&ChunkKey) -> bool) -> Result<PeerAccess> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("make root-only", dir, e))?;
        let mut state = State::default();
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| Self::parse(&b))
            {
                Ok(grant) if !grant.holds_any(&held) => {
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!(path = %path.display(), error = %e, "could not delete a peer access record that protects nothing");
                    }
                }
                Ok(grant) => state.add(&grant),
                Err(reason) => tracing::error!(
                    path = %path.display(),
                    reason,
                    "a peer access record does not read: chunks it restricted may be served \
                     without proof until their image is mounted again"
                ),
            }
        }
        Ok(PeerAccess {
            dir: Some(dir.to_path_buf()),
            state: RwLock::new(state),
            refused: AtomicU64::new(0),
        })
    }

    fn parse(bytes: &[u8]) -> std::result::Result<Grant, String> {
        let record: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if record.version != 1 {
            return Err(format!("version {}, not 1", record.version));
        }
        let algo = match record.algorithm.as_str() {
            "sha256" => DigestAlgo::Sha256,
            "blake3" => DigestAlgo::Blake3,
            other => return Err(format!("algorithm {other:?}")),
        };
        let key = hex32(&record.key).ok_or("key: not 32 bytes of hex")?;
        let mut blobs = Vec::with_capacity(record.blobs.len());
        for (blob, chunks) in record.blobs {
            let chunks = chunks
                .iter()
                .map(|c| {
                    hex32(c).ok_or_else(|| format!("blob {blob}: chunk {c:?} is not a digest"))
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            blobs.push((blob, chunks));
        }
        Ok(Grant {
            manifest: record.manifest,
            repository: record.repository,
            key: AccessKey(key),
            algo,
            blobs,
        })
    }

    /// Registers a restricted image (its manifest's key and its blobs' chunks) and
    /// keeps it on disk before returning, so nothing of it is cached unprotected.
    /// Registering it again changes nothing. Blocking (file I/O).
    pub fn grant(&self, grant: &Grant) -> Result<()> {
        if self
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .knows(grant)
        {
            return Ok(());
        }
        if let Some(dir) = &self.dir {
            self.write(dir, grant)?;
        }
        self.state
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .add(grant);
        Ok(())
    }

    fn write(&self, dir: &Path, grant: &Grant) -> Result<()> {
        let record = Record {
            version: 1,
            manifest: grant.manifest.clone(),
            repository: grant.repository.clone(),
            key: hex::encode(grant.key.0),
            blobs: grant
                .blobs
                .iter()
                .map(|(b, chunks)| (b.clone(), chunks.iter().map(hex::encode).collect()))
                .collect(),
            algorithm: digest_hex(grant.algo).to_string(),
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| Error::Cache {
            reason: format!("encode a peer access record: {e}"),
        })?;
        // One file per manifest and tree: the trees of one manifest (an index's layer
        // prefixes) use other chunks of the same blobs.
        let mut what = Sha256::new();
        for (blob, chunks) in &grant.blobs {
            what.update(blob.as_bytes());
            for c in chunks {
                what.update(c);
            }
        }
        let name = format!(
            "{}-{}.json",
            grant.manifest.replace(':', "-"),
            &hex::encode(what.finalize())[..16]
        );
        let path = dir.join(name);
        // A named temp file is created 0600; renamed whole into place after a sync.
        let mut tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(|e| Error::io("create a temp file in", dir, e))?;
        tmp.write_all(&bytes)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.persist(&path)
            .map_err(|e| Error::io("keep peer access record", &path, e.error))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// The proofs this node shows `server` for chunks of `blob` (`sha256:…`): one per
    /// manifest it read that names the blob, newest first; empty when the blob is not
    /// restricted here.
    pub fn proofs(&self, requester: &str, server: &str, blob: &str) -> Vec<(String, [u8; 32])> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        let Some(manifests) = state.blobs.get(blob) else {
            return Vec::new();
        };
        manifests
            .iter()
            .rev()
            .take(PROOFS_SENT)
            .filter_map(|m| {
                let key = state.keys.get(m)?;
                Some((m.clone(), key.proof(requester, server, blob)))
            })
            .collect()
    }

    /// Whether `server` (this node's host id) may stream the chunks `digests` to the
    /// request that carries `access`. Chunks of no restricted blob need no proof.
    pub fn check(
        &self,
        server: &str,
        algo: DigestAlgo,
        digests: &[[u8; 32]],
        access: Option<&ChunkAccess>,
    ) -> std::result::Result<(), Refusal> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        if state.chunks.is_empty() {
            return Ok(());
        }
        let mut proven: Option<bool> = None;
        for digest in digests {
            let key = ChunkKey {
                algo,
                digest: *digest,
            };
            let Some(lies_in) = state.chunks.get(&key) else {
                continue;
            };
            let Some(access) = access else {
                return Err(Refusal::NoProof);
            };
            if !lies_in.iter().any(|b| **b == *access.blob.0) {
                return Err(Refusal::NotInBlob);
            }
            // Checked once per request, at the first restricted chunk.
            let ok = *proven.get_or_insert_with(|| {
                let blob = access.blob.0.as_str();
                let manifests = state.blobs.get(blob).map(Vec::as_slice).unwrap_or_default();
                access.proofs.iter().any(|p| {
                    manifests.contains(&p.manifest.0)
                        && state.keys.get(&p.manifest.0).is_some_and(|k| {
                            k.verifies(&p.proof, &access.requester.0, server, blob)
                        })
                })
            });
            if !ok {
                return Err(Refusal::BadProof);
            }
        }
        Ok(())
    }

    /// Counts a refused request.
    pub fn count_refusal(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Restricted images registered (manifests).
    pub fn manifests(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::domain::{AccessProof, BlobDigest, HostId};

    fn blob(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn grant(manifest_bytes: &[u8], manifest: char, blobs: &[(char, &[u8])]) -> Grant {
        Grant {
            manifest: blob(manifest),
            repository: "registry.example/private/app".into(),
            key: AccessKey::of_manifest(manifest_bytes),
            algo: DigestAlgo::Sha256,
            blobs: blobs
                .iter()
                .map(|(b, chunks)| (blob(*b), chunks.iter().map(|c| [*c; 32]).collect()))
                .collect(),
        }
    }

    fn access(requester: &str, b: char, proofs: Vec<(String, [u8; 32])>) -> ChunkAccess {
        ChunkAccess {
            requester: HostId(requester.into()),
            blob: BlobDigest(blob(b)),
            proofs: proofs
                .into_iter()
                .map(|(m, proof)| AccessProof {
                    manifest: BlobDigest(m),
                    proof,
                })
                .collect(),
        }
    }

    #[test]
    fn keys_and_proofs_are_bound_to_bytes_and_names() {
        let key = AccessKey::of_manifest(b"{\"manifest\":1}");
        assert_ne!(key, AccessKey::of_manifest(b"{\"manifest\":2}"));
        let p = key.proof("b", "a", &blob('1'));
        assert!(key.verifies(&p, "b", "a", &blob('1')));
        assert!(!key.verifies(&p, "c", "a", &blob('1')), "another requester");
        assert!(!key.verifies(&p, "b", "c", &blob('1')), "another server");
        assert!(!key.verifies(&p, "b", "a", &blob('2')), "another blob");
        // The separators keep the names apart.
        assert_ne!(p, key.proof("ba", "", &blob('1')));
        assert_eq!(format!("{key:?}"), "AccessKey(<redacted>)");
    }

    #[test]
    fn only_a_proof_from_the_manifest_opens_restricted_chunks() {
        let access_store = PeerAccess::in_memory();
        let manifest = b"the private manifest".as_slice();
        access_store
            .grant(&grant(manifest, 'd', &[('1', &[1, 2]), ('2', &[3])]))
            .unwrap();
        let check = |digests: &[[u8; 32]], a: Option<&ChunkAccess>| {
            access_store.check("node-a", DigestAlgo::Sha256, digests, a)
        };
        // Unrestricted chunks need nothing.
        assert_eq!(check(&[[9; 32]], None), Ok(()));
        assert_eq!(check(&[[9; 32], [1; 32]], None), Err(Refusal::NoProof));
        // The right proof, from a requester that read the manifest.
        let key = AccessKey::of_manifest(manifest);
        let good = access(
            "node-b",
            '1',
            vec![(blob('d'), key.proof("node-b", "node-a", &blob('1')))],
        );
        assert_eq!(check(&[[1; 32], [2; 32], [9; 32]], Some(&good)), Ok(()));
        // Its own proofs say the same.
        assert_eq!(
            access_store.proofs("node-b", "node-a", &blob('1')),
            vec![(blob('d'), key.proof("node-b", "node-a", &blob('1')))]
        );
        assert!(access_store
            .proofs("node-b", "node-a", &blob('9'))
            .is_empty());
        // A chunk of another blob under this blob's proof.
        assert_eq!(check(&[[3; 32]], Some(&good)), Err(Refusal::NotInBlob));
        // Wrong bytes, another server's proof, another requester claiming it.
        let wrong = AccessKey::of_manifest(b"a guess");
        for bad in [
            access(
                "node-b",
                '1',
                vec![(blob('d'), wrong.proof("node-b", "node-a", &blob('1')))],
            ),
            access(
                "node-b",
                '1',
                vec![(blob('d'), key.proof("node-b", "node-c", &blob('1')))],
            ),
            access(
                "node-x",
                '1',
                vec![(blob('d'), key.proof("node-b", "node-a", &blob('1')))],
            ),
            access(
                "node-b",
                '1',
                vec![(blob('e'), key.proof("node-b", "node-a", &blob('1')))],
            ),
        ] {
            assert_eq!(check(&[[1; 32]], Some(&bad)), Err(Refusal::BadProof));
        }
    }

    #[test]
    fn a_shared_blob_opens_with_any_manifest_naming_it_and_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("access");
        {
            let store = PeerAccess::open(&records, |_| true).unwrap();
            // Two checkpoints: the second reuses the first's blob (a chunk dictionary).
            store.grant(&grant(b"first", 'd', &[('1', &[1])])).unwrap();
            store
                .grant(&grant(b"second", 'e', &[('1', &[1]), ('2', &[2])]))
                .unwrap();
            store
                .grant(&grant(b"second", 'e', &[('1', &[1]), ('2', &[2])]))
                .unwrap();
            assert_eq!(store.proofs("b", "a", &blob('1')).len(), 2);
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&records), 0o700);
        let files: Vec<PathBuf> = std::fs::read_dir(&records)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 2);
        assert!(files.iter().all(|f| mode(f) == 0o600), "{files:?}");
        let store = PeerAccess::open(&records, |_| true).unwrap();
        assert_eq!(store.manifests(), 2);
        for (bytes, m) in [(b"first".as_slice(), 'd'), (b"second".as_slice(), 'e')] {
            let key = AccessKey::of_manifest(bytes);
            let a = access("b", '1', vec![(blob(m), key.proof("b", "a", &blob('1')))]);
            assert_eq!(
                store.check("a", DigestAlgo::Sha256, &[[1; 32]], Some(&a)),
                Ok(())
            );
        }
        // The first checkpoint's manifest does not name blob 2.
        let key = AccessKey::of_manifest(b"first");
        let a = access("b", '2', vec![(blob('d'), key.proof("b", "a", &blob('2')))]);
        assert_eq!(
            store.check("a", DigestAlgo::Sha256, &[[2; 32]], Some(&a)),
            Err(Refusal::BadProof)
        );
        assert_eq!(
            store.check("a", DigestAlgo::Sha256, &[[2; 32]], None),
            Err(Refusal::NoProof)
        );
        drop(store);
        // The cache dropped chunk 1 (chunk 2 stays): the first checkpoint's record
        // protects nothing and goes; the second's stays, chunk 1 included.
        let store = PeerAccess::open(&records, |k| k.digest == [2; 32]).unwrap();
        assert_eq!(store.manifests(), 1);
        assert_eq!(std::fs::read_dir(&records).unwrap().count(), 1);
        assert_eq!(
            store.check("a", DigestAlgo::Sha256, &[[1; 32]], None),
            Err(Refusal::NoProof)
        );
    }

    #[test]
    fn checkpoints_are_restricted_wherever_they_are() {
        let manifest = |extra: &str| -> oci_spec::image::ImageManifest {
            serde_json::from_str(&format!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
                "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":2}},
                "layers":[]{extra}}}"#,
                blob('c')
            ))
            .unwrap()
        };
        let plain = manifest("");
        assert!(!is_restricted(false, &plain));
        assert!(is_restricted(true, &plain));
        let typed = manifest(&format!(r#","artifactType":"{CHECKPOINT_ARTIFACT_TYPE}""#));
        assert!(is_restricted(false, &typed));
        let annotated =
            manifest(r#","annotations":{"io.tessera.checkpoint.criu-version":"4.2.1"}"#);
        assert!(is_restricted(false, &annotated));
        let other = manifest(r#","annotations":{"io.tessera.source.ref":"x"}"#);
        assert!(!is_restricted(false, &other));
    }
}
