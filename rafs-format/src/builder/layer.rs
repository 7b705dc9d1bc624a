//! Applying OCI layer tarballs to the tree, as the OCI image spec's "applying changesets"
//! describes: entries in order, `.wh.NAME` whiteouts deleting NAME from lower layers,
//! `.wh..wh..opq` making a directory opaque (hiding everything lower layers put in it),
//! hardlinks resolved against the merged tree. PAX headers supply long names, xattrs
//! (`SCHILY.xattr.*`), large ids and nanosecond times; GNU long names are handled by the
//! `tar` crate.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};

use super::store::ChunkStore;
use super::tree::{components, Child, Meta, Node, NodeData, NodeId, Tree, ROOT};
use crate::reader::FileKind;
use crate::{Error, Result};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// Wraps a layer stream in the decompressor its first bytes call for: gzip, zstd or a
/// plain tar.
pub(crate) fn decompressed<'a>(reader: impl Read + 'a) -> std::io::Result<Box<dyn Read + 'a>> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(reader)?)
    } else {
        Box::new(reader)
    })
}

/// Applies one layer (an uncompressed tar stream) on top of the tree.
pub(crate) fn apply_layer(
    tree: &mut Tree,
    store: &mut ChunkStore,
    tar_stream: impl Read,
    layer: u32,
) -> Result<()> {
    let mut archive = tar::Archive::new(tar_stream);
    let err = |entry: &[u8], reason: String| Error::Layer {
        layer: layer as usize,
        entry: String::from_utf8_lossy(entry).into_owned(),
        reason,
    };
    let entries = archive
        .entries()
        .map_err(|e| err(b"", format!("read tar: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| err(b"", format!("read tar header: {e}")))?;
        let path = entry.path_bytes().into_owned();
        apply_entry(tree, store, &mut entry, layer).map_err(|reason| err(&path, reason))?;
    }
    Ok(())
}

/// PAX records of an entry, by key.
fn pax_records(entry: &mut tar::Entry<'_, impl Read>) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut out = HashMap::new();
    if let Some(exts) = entry.pax_extensions().map_err(|e| format!("read PAX header: {e}"))? {
        for ext in exts {
            let ext = ext.map_err(|e| format!("bad PAX record: {e}"))?;
            let key = ext.key().map_err(|e| format!("PAX key is not UTF-8: {e}"))?;
            out.insert(key.to_string(), ext.value_bytes().to_vec());
        }
    }
    Ok(out)
}

/// Parses a PAX time (`seconds[.fraction]`, possibly negative) into seconds and ns.
fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = whole.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let nsec: u32 = digits.parse().ok()?;
    Some(match (neg, nsec) {
        (false, n) => (secs, n),
        (true, 0) => (-secs, 0),
        (true, n) => (-secs - 1, 1_000_000_000 - n),
    })
}

fn entry_meta(header: &tar::Header, pax: &HashMap<String, Vec<u8>>) -> Result<Meta, String> {
    let num = |key: &str, header_value: std::io::Result<u64>| -> Result<u64, String> {
        match pax.get(key) {
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("PAX {key} {:?} is not a number", String::from_utf8_lossy(v))),
            None => header_value.map_err(|e| format!("bad {key} field: {e}")),
        }
    };
    let id = |key, v| -> Result<u32, String> {
        let n = num(key, v)?;
        u32::try_from(n).map_err(|_| format!("{key} {n} does not fit in 32 bits"))
    };
    let (mtime_sec, mtime_nsec) = match pax.get("mtime") {
        Some(v) => parse_pax_time(v)
            .ok_or_else(|| format!("PAX mtime {:?} is not a time", String::from_utf8_lossy(v)))?,
        None => (num("mtime", header.mtime())? as i64, 0),
    };
    let xattrs: BTreeMap<Vec<u8>, Vec<u8>> = pax
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("SCHILY.xattr.")
                .map(|name| (name.as_bytes().to_vec(), v.clone()))
        })
        .collect();
    Ok(Meta {
        perm: header.mode().map_err(|e| format!("bad mode field: {e}"))? & 0o7777,
        uid: id("uid", header.uid())?,
        gid: id("gid", header.gid())?,
        mtime_sec,
        mtime_nsec,
        xattrs,
    })
}

/// A directory node made for a path whose parents a layer did not list.
fn implicit_dir() -> Node {
    Node {
        meta: Meta {
            perm: 0o755,
            ..Meta::default()
        },
        data: NodeData::Dir(BTreeMap::new()),
    }
}

/// Finds (creating if needed) the directory at `comps`.
fn ensure_dir(tree: &mut Tree, comps: &[&[u8]], layer: u32) -> Result<NodeId, String> {
    let mut cur = ROOT;
    for c in comps {
        let existing = tree.children(cur).and_then(|ch| ch.get(*c)).copied();
        cur = match existing {
            Some(child) if matches!(tree.node(child.node).data, NodeData::Dir(_)) => child.node,
            Some(_) => {
                return Err(format!(
                    "parent {:?} is not a directory",
                    String::from_utf8_lossy(c)
                ))
            }
            None => {
                let id = tree.add_node(implicit_dir());
                if let Some(ch) = tree.children_mut(cur) {
                    ch.insert(c.to_vec(), Child { node: id, layer });
                }
                id
            }
        };
    }
    Ok(cur)
}

fn apply_entry(
    tree: &mut Tree,
    store: &mut ChunkStore,
    entry: &mut tar::Entry<'_, impl Read>,
    layer: u32,
) -> Result<(), String> {
    let kind = entry.header().entry_type();
    if matches!(kind, tar::EntryType::XGlobalHeader) {
        return Ok(());
    }
    let path = entry.path_bytes().into_owned();
    let comps = components(&path).ok_or("path has a '..' component")?;
    let pax = pax_records(entry)?;
    let meta = entry_meta(entry.header(), &pax)?;

    let Some((name, parent_comps)) = comps.split_last() else {
        // The root itself ("./"): only its metadata can change.
        if kind.is_dir() {
            tree.node_mut(ROOT).meta = meta;
            return Ok(());
        }
        return Err("the root of a layer must be a directory".into());
    };
    let parent = ensure_dir(tree, parent_comps, layer)?;

    if name.starts_with(WHITEOUT_PREFIX) {
        let lower = |c: &Child| c.layer < layer;
        if let Some(children) = tree.children_mut(parent) {
            if *name == OPAQUE_MARKER {
                children.retain(|_, c| !lower(c));
            } else if !name.starts_with(b".wh..wh.") {
                let target = &name[WHITEOUT_PREFIX.len()..];
                if children.get(target).is_some_and(lower) {
                    children.remove(target);
                }
            }
        }
        return Ok(());
    }

    let existing = tree.children(parent).and_then(|c| c.get(*name)).copied();
    let data = match kind {
        tar::EntryType::Directory => {
            if let Some(child) = existing {
                if matches!(tree.node(child.node).data, NodeData::Dir(_)) {
                    // A directory listed again keeps its contents; only metadata changes.
                    tree.node_mut(child.node).meta = meta;
                    if let Some(ch) = tree.children_mut(parent) {
                        ch.insert(name.to_vec(), Child { node: child.node, layer });
                    }
                    return Ok(());
                }
            }
            NodeData::Dir(BTreeMap::new())
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            let (size, pieces) = store
                .add_file(&mut *entry)
                .map_err(|e| format!("read file data: {e}"))?;
            NodeData::File { size, pieces }
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or("hardlink without a target")?
                .into_owned();
            let target_comps = components(&target).ok_or("hardlink target has a '..' component")?;
            let node = tree.lookup(&target_comps).ok_or_else(|| {
                format!("hardlink target {:?} does not exist", String::from_utf8_lossy(&target))
            })?;
            if matches!(tree.node(node).data, NodeData::Dir(_)) {
                return Err("hardlink to a directory".into());
            }
            if let Some(ch) = tree.children_mut(parent) {
                ch.insert(name.to_vec(), Child { node, layer });
            }
            return Ok(());
        }
        tar::EntryType::Symlink => NodeData::Symlink(
            entry
                .link_name_bytes()
                .ok_or("symlink without a target")?
                .into_owned(),
        ),
        tar::EntryType::Char | tar::EntryType::Block => {
            let h = entry.header();
            let major = h.device_major().map_err(|e| format!("bad devmajor: {e}"))?.unwrap_or(0);
            let minor = h.device_minor().map_err(|e| format!("bad devminor: {e}"))?.unwrap_or(0);
            let kind = if kind == tar::EntryType::Char {
                FileKind::CharDevice
            } else {
                FileKind::BlockDevice
            };
            NodeData::Special { kind, major, minor }
        }
        tar::EntryType::Fifo => NodeData::Special {
            kind: FileKind::Fifo,
            major: 0,
            minor: 0,
        },
        other => return Err(format!("unsupported tar entry type {:?}", other.as_byte() as char)),
    };
    let node = tree.add_node(Node { meta, data });
    if let Some(ch) = tree.children_mut(parent) {
        ch.insert(name.to_vec(), Child { node, layer });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_pax_time;

    #[test]
    fn pax_times_keep_nanoseconds() {
        assert_eq!(parse_pax_time(b"1700000000.123456789"), Some((1700000000, 123456789)));
        assert_eq!(parse_pax_time(b"1700000000.5"), Some((1700000000, 500000000)));
        assert_eq!(parse_pax_time(b"1700000000"), Some((1700000000, 0)));
        assert_eq!(parse_pax_time(b"-1.25"), Some((-2, 750000000)));
        assert_eq!(parse_pax_time(b"abc"), None);
        assert_eq!(parse_pax_time(b"1.2x"), None);
    }
}
