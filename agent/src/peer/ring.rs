//! Consistent hashing of blobs over scheduler replicas.
//!
//! Replicas share no state, so every holder of a blob must talk to the same replica
//! about it: each agent places a blob by hashing its digest onto a ring of the
//! configured replicas (many virtual points each, so shares are even) and takes the
//! first replica after it that is up. Every agent configured with the same replica list
//! builds the same ring, so they meet on the same replica; when one goes down only the
//! blobs it owned move (each to the next replica on the ring), and they move back when
//! it returns.

use sha2::{Digest, Sha256};

/// Points per replica on the ring.
const VIRTUAL_NODES: usize = 128;

#[derive(Debug, Clone)]
pub struct Ring {
    /// (position, replica index), sorted by position.
    points: Vec<(u64, usize)>,
}

fn position(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl Ring {
    /// A ring of `replicas`, identified by their URLs (the same strings on every agent).
    pub fn new(replicas: &[String]) -> Ring {
        let mut points: Vec<(u64, usize)> = replicas
            .iter()
            .enumerate()
            .flat_map(|(i, url)| {
                (0..VIRTUAL_NODES).map(move |v| (position(format!("{url}#{v}").as_bytes()), i))
            })
            .collect();
        points.sort_unstable();
        Ring { points }
    }

    /// The replica that owns `blob` among those `up` says are up; `None` if none is.
    pub fn owner(&self, blob: &str, up: impl Fn(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let at = position(blob.as_bytes());
        let start = self.points.partition_point(|&(p, _)| p < at);
        let n = self.points.len();
        (0..n)
            .map(|k| self.points[(start + k) % n].1)
            .find(|&r| up(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blobs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("sha256:{i:064x}")).collect()
    }

    #[test]
    fn shares_are_even_and_a_lost_replica_moves_only_its_own() {
        let urls: Vec<String> = (1..=3).map(|i| format!("http://10.0.0.{i}:7080")).collect();
        let ring = Ring::new(&urls);
        let all = |_: usize| true;
        let owners: Vec<usize> = blobs(3000)
            .iter()
            .map(|b| ring.owner(b, all).unwrap())
            .collect();
        for r in 0..3 {
            let share = owners.iter().filter(|&&o| o == r).count();
            assert!(
                (700..1300).contains(&share),
                "replica {r} owns {share} of 3000"
            );
        }
        let without_1 = |r: usize| r != 1;
        for (b, &before) in blobs(3000).iter().zip(&owners) {
            let after = ring.owner(b, without_1).unwrap();
            if before == 1 {
                assert_ne!(after, 1);
            } else {
                assert_eq!(after, before, "{b} moved though its replica is up");
            }
        }
        // The same list gives the same ring on every agent.
        let again = Ring::new(&urls);
        assert!(blobs(100)
            .iter()
            .all(|b| again.owner(b, all) == ring.owner(b, all)));
        assert_eq!(ring.owner("sha256:x", |_| false), None);
    }
}
