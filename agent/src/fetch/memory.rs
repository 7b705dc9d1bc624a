//! Units handed out lately, kept in memory up to a byte budget, oldest dropped first:
//! the kernel reads a 1 MiB chunk in several requests (and many readers read the same
//! hot chunks), and each must not cost a disk read and a digest.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::cache::ChunkKey;

#[derive(Debug)]
pub(super) struct Memory {
    budget: u64,
    bytes: u64,
    units: HashMap<ChunkKey, Arc<Vec<u8>>>,
    order: VecDeque<ChunkKey>,
}

impl Memory {
    pub(super) fn new(budget: u64) -> Self {
        Memory {
            budget,
            bytes: 0,
            units: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub(super) fn get(&self, key: &ChunkKey) -> Option<Arc<Vec<u8>>> {
        self.units.get(key).cloned()
    }

    pub(super) fn put(&mut self, key: ChunkKey, data: Arc<Vec<u8>>) {
        let len = data.len() as u64;
        if len > self.budget || self.units.contains_key(&key) {
            return;
        }
        self.units.insert(key, data);
        self.order.push_back(key);
        self.bytes += len;
        while self.bytes > self.budget {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(d) = self.units.remove(&old) {
                self.bytes -= d.len() as u64;
            }
        }
    }
}
