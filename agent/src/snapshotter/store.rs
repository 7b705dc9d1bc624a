//! The snapshotter's metadata in sled: one record per snapshot, by key (active and view
//! snapshots) or name (committed ones), as containerd's own snapshotters keep it. It
//! survives a restart of the agent; the directories it names are under the root.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Code, Kind};
use crate::{Error, Result};

/// One snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Names its directory, `snapshots/<id>`.
    pub id: u64,
    pub kind: Kind,
    /// The parent's key (a committed snapshot), empty for none.
    pub parent: String,
    pub labels: BTreeMap<String, String>,
    pub created: SystemTime,
    pub updated: SystemTime,
    /// Bytes and inodes of a committed snapshot's own directory (measured at commit).
    pub size: i64,
    pub inodes: i64,
    /// Set for a layer of a Tessera image: nothing was unpacked into it.
    pub remote: Option<Remote>,
}

impl Record {
    /// A snapshot made now, with nothing measured yet.
    pub fn new(
        id: u64,
        kind: Kind,
        parent: &str,
        labels: BTreeMap<String, String>,
        remote: Option<Remote>,
    ) -> Record {
        let now = SystemTime::now();
        Record {
            id,
            kind,
            parent: parent.to_string(),
            labels,
            created: now,
            updated: now,
            size: 0,
            inodes: 0,
            remote,
        }
    }
}

/// What a snapshot of a Tessera image stands for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remote {
    /// The image by digest (`registry/repository@sha256:…`).
    pub image: String,
    /// The layer of the image this snapshot stands for.
    pub layer: String,
    /// True when this snapshot's `fs` is the image's lazy mount, a merged file tree
    /// (the bootstrap layer of a converted image, every layer of an indexed plain
    /// image). Blob layers of a converted image hold nothing of their own.
    pub mounted: bool,
    /// The mount shows the image's first `layers` layers only (an indexed plain
    /// image's layer prefix); `None`: all of them.
    #[serde(default)]
    pub layers: Option<u32>,
}

/// The records, in sled.
#[derive(Debug)]
pub struct Store {
    db: sled::Db,
}

fn db_error(e: impl std::fmt::Display) -> Error {
    Error::Snapshot {
        code: Code::Internal,
        key: String::new(),
        reason: format!("snapshot metadata (sled): {e}"),
    }
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let db = sled::open(path).map_err(|e| Error::Snapshot {
            code: Code::Internal,
            key: String::new(),
            reason: format!(
                "open the snapshot metadata {}: {e} (is another agent using this snapshotter root?)",
                path.display()
            ),
        })?;
        Ok(Store { db })
    }

    /// A new snapshot id, never given before in this store.
    pub fn next_id(&self) -> Result<u64> {
        self.db.generate_id().map_err(db_error)
    }

    pub fn get(&self, key: &str) -> Result<Option<Record>> {
        match self.db.get(key.as_bytes()).map_err(db_error)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| db_error(format!("record {key:?} is unreadable: {e}"))),
        }
    }

    /// The record of `key`, or a `NotFound` error naming it.
    pub fn require(&self, key: &str) -> Result<Record> {
        self.get(key)?.ok_or_else(|| Error::Snapshot {
            code: Code::NotFound,
            key: key.to_string(),
            reason: "no such snapshot".into(),
        })
    }

    /// Writes `record` under `key` only if `key` is free: `AlreadyExists` otherwise.
    pub fn insert_new(&self, key: &str, record: &Record) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(db_error)?;
        match self
            .db
            .compare_and_swap(key.as_bytes(), None::<&[u8]>, Some(bytes))
            .map_err(db_error)?
        {
            Ok(()) => self.flush(),
            Err(_) => Err(Error::Snapshot {
                code: Code::AlreadyExists,
                key: key.to_string(),
                reason: "a snapshot with this key exists".into(),
            }),
        }
    }

    pub fn put(&self, key: &str, record: &Record) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(db_error)?;
        self.db.insert(key.as_bytes(), bytes).map_err(db_error)?;
        self.flush()
    }

    /// Moves `from`'s record to `to` (commit), atomically.
    pub fn rename(&self, from: &str, to: &str, record: &Record) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(db_error)?;
        let mut batch = sled::Batch::default();
        batch.remove(from.as_bytes());
        batch.insert(to.as_bytes(), bytes);
        self.db.apply_batch(batch).map_err(db_error)?;
        self.flush()
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        self.db.remove(key.as_bytes()).map_err(db_error)?;
        self.flush()
    }

    /// Every record with its key.
    pub fn all(&self) -> Result<Vec<(String, Record)>> {
        let mut out = Vec::new();
        for item in self.db.iter() {
            let (k, v) = item.map_err(db_error)?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let record = serde_json::from_slice(&v)
                .map_err(|e| db_error(format!("record {key:?} is unreadable: {e}")))?;
            out.push((key, record));
        }
        Ok(out)
    }

    /// Whether any snapshot names `key` as its parent.
    pub fn has_children(&self, key: &str) -> Result<bool> {
        Ok(self.all()?.iter().any(|(_, r)| r.parent == key))
    }

    /// containerd treats an answered call as done: make it durable first.
    fn flush(&self) -> Result<()> {
        self.db.flush().map(|_| ()).map_err(db_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, parent: &str) -> Record {
        Record::new(id, Kind::Active, parent, BTreeMap::new(), None)
    }

    #[test]
    fn records_survive_a_reopen_and_keys_are_unique() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.db");
        {
            let store = Store::open(&path).unwrap();
            let id = store.next_id().unwrap();
            store.insert_new("a", &record(id, "")).unwrap();
            let err = store.insert_new("a", &record(id, "")).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Snapshot {
                        code: Code::AlreadyExists,
                        ..
                    }
                ),
                "{err}"
            );
            store.insert_new("b", &record(id + 1, "a")).unwrap();
            let mut committed = record(id, "");
            committed.kind = Kind::Committed;
            store.rename("a", "a-committed", &committed).unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get("a").unwrap(), None);
        assert_eq!(store.require("a-committed").unwrap().kind, Kind::Committed);
        assert!(!store.has_children("a-committed").unwrap());
        assert!(store.has_children("a").unwrap(), "b still names a");
        let err = store.require("nope").unwrap_err();
        assert!(
            matches!(
                err,
                Error::Snapshot {
                    code: Code::NotFound,
                    ..
                }
            ),
            "{err}"
        );
        assert!(store.next_id().unwrap() > 0);
    }
}
