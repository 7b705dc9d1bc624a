//! A checkpoint's working set: the chunks of the checkpoint that a restore with lazy
//! pages and the app's first requests after it need, in that order. `tessera run
//! --lazy-pages --record-working-set PROBE` records it on one restore: every file the
//! restore reads but the page data, the pages it restores itself (the page maps'
//! entries that are not lazy), then each page the app faulted in until PROBE answered,
//! in fault order (the lazy-pages daemon logs each fault; the page maps say where the
//! page lies in the pages file). The agent turns those file ranges into chunks
//! (`Request::ChunksOf`). Reads of the mount cannot tell this apart: the daemon sends
//! every other page through the same files from the moment the restore ends.
//!
//! It is pushed as an OCI 1.1 referrer of the checkpoint manifest (artifactType
//! [`ARTIFACT_TYPE`], one JSON layer); every later `tessera run` that restores the
//! checkpoint finds it and has the agent fetch those chunks first, many at once, before
//! anything else is prefetched (`ReadPlan::first`). With lazy pages the app then
//! faults in memory that is mostly on the node already.
//!
//! The list is a hint, not a trust boundary: it names chunks by their index in the
//! checkpoint's own chunk table, so the worst a wrong list can do is fetch chunks of
//! that checkpoint early (each is verified against the bootstrap as always).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::app::{rfc3339_utc, subject_of, CREATED_ANNOTATION};
use super::pagemap::{self, Pagemap, PAGE_SIZE};
use crate::api::FileRange;
use crate::registry::client::RegistryClient;
use crate::registry::image::PlatformImage;
use crate::registry::reference::Reference;
use crate::registry::referrers::{self, Artifact, Descriptor};
use crate::{Error, Result};

/// The `artifactType` of a working set's manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.tessera.checkpoint.working-set.v1";
/// The media type of its one layer: a [`WorkingSet`] as JSON.
pub const MEDIA_TYPE: &str = "application/vnd.tessera.checkpoint.working-set.v1+json";
/// A working set's layer is read whole into memory: no bigger than this (4 M chunks).
const MAX_BYTES: u64 = 64 << 20;
/// File ranges sent to the agent at most (a request of a few MiB): the first ones, in
/// order, are kept.
const MAX_RANGES: usize = 100_000;

/// What a working set's layer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingSet {
    /// Indices into the checkpoint's chunk table, in first-read order.
    pub chunks: Vec<u32>,
    /// Their stored (compressed) bytes, as recorded: what prefetching them moves.
    pub compressed_bytes: u64,
}

/// Pushes `set` as the working set of `checkpoint` (a referrer of its manifest, in its
/// repository). Returns the working set's manifest, pinned by digest.
pub async fn push(
    client: &RegistryClient,
    checkpoint: &PlatformImage,
    set: &WorkingSet,
) -> Result<Reference> {
    let bytes = serde_json::to_vec(set).map_err(|e| protocol(checkpoint, e.to_string()))?;
    let repo = Reference {
        tag: None,
        digest: None,
        ..checkpoint.reference.clone()
    };
    let layer = referrers::push_small_blob(client, &repo, &bytes, MEDIA_TYPE).await?;
    let subject = subject_of(checkpoint);
    let artifact = Artifact {
        subject: &subject,
        artifact_type: ARTIFACT_TYPE,
        layers: std::slice::from_ref(&layer),
        annotations: BTreeMap::from([(
            CREATED_ANNOTATION.to_string(),
            rfc3339_utc(std::time::SystemTime::now()),
        )]),
    };
    let pushed = referrers::push(client, &repo, &artifact).await?;
    Ok(Reference {
        digest: Some(pushed.digest),
        ..repo
    })
}

/// The newest working set recorded for `checkpoint`, if any.
pub async fn find(
    client: &RegistryClient,
    checkpoint: &PlatformImage,
) -> Result<Option<WorkingSet>> {
    let mut found = referrers::list(
        client,
        &checkpoint.reference,
        &checkpoint.raw.digest,
        Some(ARTIFACT_TYPE),
    )
    .await?;
    // Newest first (RFC 3339 in UTC orders as text), ties by digest.
    found.sort_by(|a, b| {
        let created = |d: &Descriptor| d.annotations.get(CREATED_ANNOTATION).cloned();
        created(b)
            .cmp(&created(a))
            .then_with(|| a.digest.cmp(&b.digest))
    });
    let Some(newest) = found.first() else {
        return Ok(None);
    };
    let manifest_ref = Reference {
        tag: None,
        digest: Some(newest.digest.clone()),
        ..checkpoint.reference.clone()
    };
    let manifest = client.manifest(&manifest_ref).await?;
    let layer = layer_of(&manifest.bytes).map_err(|why| protocol(checkpoint, why))?;
    let mut bytes = Vec::with_capacity(layer.size as usize);
    let len = client
        .blob(&checkpoint.reference, &layer.digest, &mut bytes)
        .await?;
    if len != layer.size {
        return Err(protocol(
            checkpoint,
            format!(
                "its layer is {len} bytes where its manifest says {}",
                layer.size
            ),
        ));
    }
    parse(&bytes)
        .map(Some)
        .map_err(|why| protocol(checkpoint, why))
}

/// The file ranges of the checkpoint in `dir` (its mount) that a restore with lazy
/// pages read and the app faulted in, from `faults_log` (`criu lazy-pages -v4`'s):
/// every file but the page data, whole, in restore order; the pages the restore reads
/// itself; the pages faulted in, in fault order.
pub fn ranges(dir: &Path, faults_log: &str) -> Result<Vec<FileRange>> {
    let mut ranges = Vec::new();
    let mut maps = BTreeMap::new();
    for path in super::restore_order(dir)? {
        let name = path.trim_start_matches('/');
        if name.starts_with("pages-") {
            continue;
        }
        let file = dir.join(name);
        let len = std::fs::metadata(&file)
            .map_err(|e| Error::io("stat", &file, e))?
            .len();
        ranges.push(FileRange {
            path: path.clone(),
            offset: 0,
            len,
        });
        let pid = name
            .strip_prefix("pagemap-")
            .and_then(|rest| rest.strip_suffix(".img"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            let bytes = std::fs::read(&file).map_err(|e| Error::io("read", &file, e))?;
            maps.insert(pid, Pagemap::parse(name, &bytes)?);
        }
    }
    for map in maps.values() {
        for e in map.entries.iter().filter(|e| !e.lazy) {
            ranges.push(FileRange {
                path: format!("/{}", map.pages_file),
                offset: e.offset,
                len: e.pages * PAGE_SIZE,
            });
        }
    }
    let faults = pagemap::faults(faults_log);
    if faults.is_empty() {
        return Err(Error::Criu {
            action: "lazy-pages".into(),
            reason: "its log names no page fault: was it run at -v4, and did the app run?".into(),
        });
    }
    for (pid, addr) in faults {
        // A page no entry holds was zero-filled: nothing to fetch.
        if let Some((map, offset)) = maps
            .get(&pid)
            .and_then(|m| m.offset_of(addr).map(|o| (m, o)))
        {
            push_merged(
                &mut ranges,
                FileRange {
                    path: format!("/{}", map.pages_file),
                    offset,
                    len: PAGE_SIZE,
                },
            );
        }
    }
    if ranges.len() > MAX_RANGES {
        tracing::warn!(
            ranges = ranges.len(),
            kept = MAX_RANGES,
            "the working set names more ranges than are sent to the agent; its first ones are kept"
        );
        ranges.truncate(MAX_RANGES);
    }
    Ok(ranges)
}

/// Appends `next`, or extends the last range with it when it follows on in the same
/// file (faults in a row over a page run are one range).
fn push_merged(ranges: &mut Vec<FileRange>, next: FileRange) {
    if let Some(last) = ranges.last_mut() {
        if last.path == next.path && last.offset + last.len == next.offset {
            last.len += next.len;
            return;
        }
    }
    ranges.push(next);
}

/// The one layer of a working set's manifest: its digest and size, checked.
fn layer_of(manifest: &[u8]) -> std::result::Result<Descriptor, String> {
    let v: Value =
        serde_json::from_slice(manifest).map_err(|e| format!("its manifest is not JSON: {e}"))?;
    let layer = v
        .get("layers")
        .and_then(Value::as_array)
        .and_then(|l| l.first())
        .ok_or("its manifest has no layer")?;
    let field = |k: &str| layer.get(k).and_then(Value::as_str);
    if field("mediaType") != Some(MEDIA_TYPE) {
        return Err(format!("its layer is not a {MEDIA_TYPE}"));
    }
    let digest = field("digest")
        .filter(|d| d.starts_with("sha256:"))
        .ok_or("its layer has no sha256 digest")?;
    let size = layer
        .get("size")
        .and_then(Value::as_u64)
        .ok_or("its layer has no size")?;
    if size > MAX_BYTES {
        return Err(format!(
            "its layer is {size} bytes, more than the {MAX_BYTES} a working set may have"
        ));
    }
    Ok(Descriptor {
        media_type: MEDIA_TYPE.into(),
        digest: digest.to_string(),
        size,
        artifact_type: None,
        annotations: BTreeMap::new(),
    })
}

/// A working set's layer, parsed.
fn parse(bytes: &[u8]) -> std::result::Result<WorkingSet, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("its layer is not a working set: {e}"))
}

fn protocol(checkpoint: &PlatformImage, reason: impl Into<String>) -> Error {
    Error::Protocol {
        registry: checkpoint.reference.registry.clone(),
        repository: checkpoint.reference.repository.clone(),
        what: format!("working set of {}", checkpoint.raw.digest),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_set_manifest_names_one_json_layer_of_bounded_size() {
        let manifest = |media: &str, size: u64| {
            serde_json::to_vec(&serde_json::json!({
                "layers": [{"mediaType": media, "digest": format!("sha256:{}", "a".repeat(64)), "size": size}]
            }))
            .unwrap()
        };
        let layer = layer_of(&manifest(MEDIA_TYPE, 120)).unwrap();
        assert_eq!(layer.size, 120);
        assert!(layer_of(&manifest("application/octet-stream", 120))
            .unwrap_err()
            .contains("not a application/vnd.tessera.checkpoint.working-set.v1+json"));
        assert!(layer_of(&manifest(MEDIA_TYPE, MAX_BYTES + 1))
            .unwrap_err()
            .contains("more than"));
        assert!(layer_of(b"{\"layers\": []}")
            .unwrap_err()
            .contains("no layer"));
        assert!(layer_of(b"not json").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn faults_in_a_row_are_one_range_and_order_is_kept() {
        let range = |path: &str, offset: u64| FileRange {
            path: path.into(),
            offset,
            len: PAGE_SIZE,
        };
        let mut ranges = Vec::new();
        for r in [
            range("/pages-1.img", 0),
            range("/pages-1.img", PAGE_SIZE),
            range("/pages-2.img", 2 * PAGE_SIZE),
            range("/pages-1.img", 2 * PAGE_SIZE),
            range("/pages-1.img", 0),
        ] {
            push_merged(&mut ranges, r);
        }
        let got: Vec<_> = ranges
            .iter()
            .map(|r| (r.path.as_str(), r.offset / PAGE_SIZE, r.len / PAGE_SIZE))
            .collect();
        assert_eq!(
            got,
            [
                ("/pages-1.img", 0, 2),
                ("/pages-2.img", 2, 1),
                ("/pages-1.img", 2, 1),
                ("/pages-1.img", 0, 1)
            ]
        );
    }

    #[test]
    fn a_working_set_reads_back_as_written_and_junk_is_refused() {
        let set = WorkingSet {
            chunks: vec![7, 3, 9],
            compressed_bytes: 4096,
        };
        assert_eq!(parse(&serde_json::to_vec(&set).unwrap()).unwrap(), set);
        assert!(parse(b"{\"chunks\": [-1]}").is_err());
        assert!(parse(b"[]").is_err());
    }
}
