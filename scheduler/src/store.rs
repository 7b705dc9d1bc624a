//! What the scheduler keeps across restarts: administrators' decisions (the blocklist)
//! and preheat jobs, in sled under `--state-dir`. Host state is not kept: agents repopulate it by
//! re-registering and re-announcing.

use std::path::Path;

use crate::Error;

/// The scheduler's durable state.
#[derive(Debug, Clone)]
pub struct Store {
    blocked: sled::Tree,
    /// Preheat jobs by id, as JSON.
    preheat: sled::Tree,
    db: sled::Db,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store, Error> {
        // sled lets go of its lock file from a background thread after the last handle
        // drops, so a reopen in the same process may briefly find it held; another
        // process holding it is still refused after the wait.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let db = loop {
            match sled::open(dir) {
                Ok(db) => break db,
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::Store {
                        what: format!("open {}", dir.display()),
                        reason: format!("{e} (is another scheduler using this --state-dir?)"),
                    })
                }
            }
        };
        let blocked = db
            .open_tree("blocked")
            .map_err(store("open the blocklist"))?;
        let preheat = db
            .open_tree("preheat")
            .map_err(store("open the preheat jobs"))?;
        Ok(Store {
            blocked,
            preheat,
            db,
        })
    }

    /// Blocked host ids.
    pub fn blocked(&self) -> Result<Vec<String>, Error> {
        self.blocked
            .iter()
            .keys()
            .map(|k| {
                k.map(|k| String::from_utf8_lossy(&k).into_owned())
                    .map_err(store("read the blocklist"))
            })
            .collect()
    }

    /// Adds `host` to the blocklist (durably); `false` if it was already there.
    pub fn block(&self, host: &str) -> Result<bool, Error> {
        let before = self
            .blocked
            .insert(host.as_bytes(), &[][..])
            .map_err(store("write the blocklist"))?;
        self.flush()?;
        Ok(before.is_none())
    }

    /// Removes `host` from the blocklist (durably); `false` if it was not there.
    pub fn unblock(&self, host: &str) -> Result<bool, Error> {
        let before = self
            .blocked
            .remove(host.as_bytes())
            .map_err(store("write the blocklist"))?;
        self.flush()?;
        Ok(before.is_some())
    }

    /// Every preheat job kept, as written.
    pub fn preheat_jobs(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.preheat
            .iter()
            .values()
            .map(|v| {
                v.map(|v| v.to_vec())
                    .map_err(store("read the preheat jobs"))
            })
            .collect()
    }

    /// Keeps preheat job `id` (durably).
    pub fn put_preheat_job(&self, id: &str, job: &[u8]) -> Result<(), Error> {
        self.preheat
            .insert(id.as_bytes(), job)
            .map_err(store("write a preheat job"))?;
        self.flush()
    }

    pub fn remove_preheat_job(&self, id: &str) -> Result<(), Error> {
        self.preheat
            .remove(id.as_bytes())
            .map_err(store("remove a preheat job"))?;
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        self.db.flush().map(drop).map_err(store("flush"))
    }
}

fn store(what: &'static str) -> impl Fn(sled::Error) -> Error {
    move |e| Error::Store {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocklist_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert!(store.block("node-1").unwrap());
            assert!(!store.block("node-1").unwrap());
            assert!(store.block("node-2").unwrap());
            assert!(store.unblock("node-2").unwrap());
            assert!(!store.unblock("node-9").unwrap());
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.blocked().unwrap(), vec!["node-1".to_string()]);
    }
}
