//! Who may read what. Cached and peer data carry no credentials, so before the mirror
//! serves a blob from its cache or from peers it asks the upstream registry whether
//! *this request's* credentials may read it: a `HEAD` of the blob in the requested
//! repository, with the request's `Authorization` (or, if the request has none, the
//! node's own credentials). A yes is remembered briefly per credential, registry,
//! repository and blob — per blob because a registry answers 404 for a blob that is
//! not linked into the repository asked through, and a blob of a private repository
//! must not be readable through a public one. A no is never remembered.
//!
//! Credentials are held only as a sha256 fingerprint here, never logged.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Most entries kept; past it the expired ones go, then everything (a burst of
/// distinct credentials must not grow memory without bound).
const MAX_ENTRIES: usize = 16_384;

/// A credential's fingerprint: sha256 of the `Authorization` value; empty for none.
pub fn fingerprint(authorization: Option<&str>) -> [u8; 32] {
    match authorization {
        Some(a) => Sha256::digest(a.as_bytes()).into(),
        None => [0; 32],
    }
}

/// What a request asked to read, and as whom.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessKey {
    pub credential: [u8; 32],
    pub registry: String,
    pub repository: String,
    pub blob: String,
}

/// Recent "yes" answers, with the blob's size the upstream gave.
#[derive(Debug)]
pub struct AccessCache {
    ttl: Duration,
    /// How long a yes is kept at all (at least `ttl`; longer for `allowed_within`).
    keep: Duration,
    allowed: Mutex<HashMap<AccessKey, (u64, Instant)>>,
}

impl AccessCache {
    pub fn new(ttl: Duration, keep: Duration) -> Self {
        AccessCache {
            ttl,
            keep,
            allowed: Mutex::new(HashMap::new()),
        }
    }

    /// The blob's size if this access was allowed within the last `ttl`.
    pub fn allowed(&self, key: &AccessKey, now: Instant) -> Option<u64> {
        let allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        allowed
            .get(key)
            .filter(|(_, at)| now.duration_since(*at) < self.ttl)
            .map(|(size, _)| *size)
    }

    /// The blob's size if this access was allowed within `within` (longer than the
    /// ttl: `mirror.last_known_secs`, while the upstream cannot be asked).
    pub fn allowed_within(&self, key: &AccessKey, now: Instant, within: Duration) -> Option<u64> {
        let allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        allowed
            .get(key)
            .filter(|(_, at)| now.duration_since(*at) < within)
            .map(|(size, _)| *size)
    }

    pub fn allow(&self, key: AccessKey, size: u64, now: Instant) {
        let mut allowed = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        if allowed.len() >= MAX_ENTRIES {
            let ttl = self.ttl.max(self.keep);
            allowed.retain(|_, (_, at)| now.duration_since(*at) < ttl);
            if allowed.len() >= MAX_ENTRIES {
                allowed.clear();
            }
        }
        allowed.insert(key, (size, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cred: Option<&str>, repo: &str) -> AccessKey {
        AccessKey {
            credential: fingerprint(cred),
            registry: "r".into(),
            repository: repo.into(),
            blob: "sha256:aa".into(),
        }
    }

    #[test]
    fn an_answer_is_per_credential_and_repository_and_expires() {
        let cache = AccessCache::new(Duration::from_secs(60), Duration::ZERO);
        let now = Instant::now();
        cache.allow(key(Some("Basic a"), "private"), 42, now);
        assert_eq!(
            cache.allowed(&key(Some("Basic a"), "private"), now),
            Some(42)
        );
        assert_eq!(cache.allowed(&key(None, "private"), now), None);
        assert_eq!(cache.allowed(&key(Some("Basic b"), "private"), now), None);
        assert_eq!(cache.allowed(&key(Some("Basic a"), "public"), now), None);
        let later = now + Duration::from_secs(61);
        assert_eq!(cache.allowed(&key(Some("Basic a"), "private"), later), None);
        let hour = Duration::from_secs(3600);
        assert_eq!(
            cache.allowed_within(&key(Some("Basic a"), "private"), later, hour),
            Some(42),
            "kept longer for an upstream that cannot be reached"
        );
        assert_eq!(
            cache.allowed_within(&key(None, "private"), later, hour),
            None
        );
    }
}
