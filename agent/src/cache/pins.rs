//! Long-lived pins: the chunks of mounted images, kept from eviction while mounted.
//!
//! [`PinGuard`](super::PinGuard) holds one key for the length of a copy; a mount needs
//! every chunk of its image (~100k for a large one) held for days, whether cached yet
//! or not. Each mount registers its image's keys once, as one shared `Arc<[ChunkKey]>`
//! (a *pin set*), and the index counts, per key, how many sets name it: two mounts of
//! one image pin each chunk twice, and it becomes evictable when both are gone.
//!
//! A pinned chunk's slot is kept **out of the use order** (`Index::order`), so the
//! eviction scan, which walks only that order, never meets one: its cost does not grow
//! with what is pinned, even when pinned chunks alone fill the cache. Its slot still
//! takes a new `seq` at each use, so when its last pin goes it returns to the order
//! where its last use puts it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, PoisonError};

use serde::{Deserialize, Serialize};

use super::{ChunkCache, ChunkKey, Index};

/// A mounted image's chunks, pinned until this is dropped (see the module docs).
/// Dropping it evicts what is then past the capacity: blocking, keep it off async
/// workers.
#[must_use = "the chunks are pinned only while the pin lives"]
pub struct ImagePin {
    cache: Arc<ChunkCache>,
    id: u64,
    keys: Arc<[ChunkKey]>,
    /// Whether the release evicts what is then past the capacity (not when the mount
    /// stays for the next agent, which pins it again).
    evict: bool,
}

impl std::fmt::Debug for ImagePin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagePin")
            .field("id", &self.id)
            .field("chunks", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl ImagePin {
    /// The pinned keys (each once).
    pub fn keys(&self) -> &Arc<[ChunkKey]> {
        &self.keys
    }

    /// Releases the pin without evicting anything: the mount outlives this agent
    /// and the next one pins its chunks again, so they must still be there.
    pub fn release_without_evicting(mut self) {
        self.evict = false;
    }
}

impl Drop for ImagePin {
    fn drop(&mut self) {
        self.cache.unpin_set(self.id, self.evict);
    }
}

/// One pin set as `tessera cache usage` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedSet {
    /// What the pinner called it (a mount: its image and mountpoint).
    pub label: String,
    /// Chunks the set names, and how many of them are cached now.
    pub chunks: u64,
    pub cached_chunks: u64,
    /// Bytes of its chunks cached now (shared chunks count in every set naming them).
    pub cached_bytes: u64,
}

/// The pin sets and counts, kept in [`Index`] so that a put, a use and an eviction
/// see them under the lock they already take.
#[derive(Default)]
pub(super) struct MountPins {
    /// How many sets name each pinned key.
    counts: std::collections::HashMap<ChunkKey, u32>,
    /// The sets by id, with their labels.
    sets: std::collections::BTreeMap<u64, (String, Arc<[ChunkKey]>)>,
    next_id: u64,
    /// Bytes of the cached chunks that are pinned (each once).
    pub(super) bytes: u64,
}

impl MountPins {
    pub(super) fn contains(&self, key: &ChunkKey) -> bool {
        self.counts.contains_key(key)
    }
}

impl Index {
    /// Registers a set; cached keys it pins for the first time leave the use order.
    fn pin_set(&mut self, label: String, keys: Arc<[ChunkKey]>) -> u64 {
        for key in keys.iter() {
            let count = self.pins.counts.entry(*key).or_insert(0);
            *count += 1;
            if *count == 1 {
                if let Some(slot) = self.slots.get(key) {
                    self.order.remove(&slot.seq);
                    self.pins.bytes += slot.size;
                }
            }
        }
        let id = self.pins.next_id;
        self.pins.next_id += 1;
        self.pins.sets.insert(id, (label, keys));
        id
    }

    /// Drops a set; cached keys no other set pins go back into the use order.
    fn unpin_set(&mut self, id: u64) {
        let Some((_, keys)) = self.pins.sets.remove(&id) else {
            return;
        };
        for key in keys.iter() {
            let Some(count) = self.pins.counts.get_mut(key) else {
                continue;
            };
            *count -= 1;
            if *count == 0 {
                self.pins.counts.remove(key);
                if let Some(slot) = self.slots.get(key) {
                    self.order.insert(slot.seq, *key);
                    self.pins.bytes -= slot.size;
                }
            }
        }
    }

    /// Bytes and number of the chunks of `keys` cached now.
    pub(super) fn cached(&self, keys: &[ChunkKey]) -> (u64, u64) {
        keys.iter()
            .filter_map(|key| self.slots.get(key))
            .fold((0, 0), |(bytes, n), slot| (bytes + slot.size, n + 1))
    }
}

impl ChunkCache {
    /// Pins every chunk of `keys` (a mounted image's), cached now or later, until the
    /// returned pin is dropped. Duplicate keys are pinned once.
    pub fn pin_image(self: &Arc<Self>, label: String, keys: Vec<ChunkKey>) -> ImagePin {
        let mut keys = keys;
        keys.sort_unstable_by_key(|key| (key.algo.to_byte(), key.digest));
        keys.dedup();
        let keys: Arc<[ChunkKey]> = keys.into();
        let id = {
            // No eviction scan is under way while a set is added: one that had already
            // chosen a key would otherwise evict it after it was pinned.
            let _evicting = self.evicting.lock().unwrap_or_else(PoisonError::into_inner);
            self.memory().pin_set(label, keys.clone())
        };
        self.check_pinned_capacity();
        ImagePin {
            cache: self.clone(),
            id,
            keys,
            evict: true,
        }
    }

    /// Drops a set and evicts what is past the capacity now that its chunks may go
    /// (the cache may have grown past it while they were pinned).
    fn unpin_set(&self, id: u64, evict: bool) {
        self.memory().unpin_set(id);
        self.check_pinned_capacity();
        if !evict {
            return;
        }
        if let Err(e) = self.keep_capacity() {
            tracing::warn!(error = %e, "could not evict after an unmount");
        }
    }

    /// Bytes of cached chunks that mounts pin.
    pub fn pinned_bytes(&self) -> u64 {
        self.memory().pins.bytes
    }

    /// Bytes of the chunks of `keys` cached now (what a mounted image holds on disk).
    pub fn cached_bytes(&self, keys: &[ChunkKey]) -> u64 {
        self.memory().cached(keys).0
    }

    /// The pin sets, oldest first, with what each holds in the cache now.
    pub fn pinned_sets(&self) -> Vec<PinnedSet> {
        let memory = self.memory();
        memory
            .pins
            .sets
            .values()
            .map(|(label, keys)| {
                let (cached_bytes, cached_chunks) = memory.cached(keys);
                PinnedSet {
                    label: label.clone(),
                    chunks: keys.len() as u64,
                    cached_chunks,
                    cached_bytes,
                }
            })
            .collect()
    }

    /// Notes (once per crossing, in the log and `pinned_over_capacity`) when pinned
    /// chunks alone exceed the capacity: the cache then keeps storing what mounts read,
    /// past its capacity, since a running container must not fail.
    pub(super) fn check_pinned_capacity(&self) {
        let pinned = self.pinned_bytes();
        let over = pinned > self.capacity;
        if over && !self.pinned_over.swap(true, Relaxed) {
            tracing::warn!(
                pinned_bytes = pinned,
                capacity = self.capacity,
                "the chunks of mounted images alone exceed the cache capacity: caching them past it until images are unmounted (raise cache_capacity)"
            );
        } else if !over && self.pinned_over.swap(false, Relaxed) {
            tracing::info!(
                pinned_bytes = pinned,
                capacity = self.capacity,
                "the chunks of mounted images fit the cache capacity again"
            );
        }
    }
}
