//! Rank 0's view of the disk tier: which block keys every rank holds, in
//! least-recently-used order, within a bound counted in blocks.
//!
//! Rank 0 makes every decision (write, delete, load) and the other ranks
//! follow in order, so all ranks hold the same keys; the bound in blocks is
//! `--kv-disk-bytes` over the largest rank's block file, so no rank's
//! directory exceeds it.

use super::BlockHash;
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub struct DiskIndex {
    /// Bound on the summed weights (a KV block weighs 1, a state snapshot
    /// as many blocks as its file is larger).
    cap: usize,
    total: usize,
    by_key: HashMap<BlockHash, (u64, usize)>,
    lru: BTreeSet<(u64, BlockHash)>,
    tick: u64,
}

impl DiskIndex {
    /// An index of at most `cap` weight holding `keys` (key, weight), oldest
    /// first (only the newest that fit are kept; the rest are returned, to be
    /// deleted).
    pub fn new(cap: usize, keys: impl IntoIterator<Item = (BlockHash, usize)>) -> (DiskIndex, Vec<BlockHash>) {
        let mut ix = DiskIndex { cap, ..Default::default() };
        let mut dropped = Vec::new();
        for (k, w) in keys {
            dropped.extend(ix.insert(k, w));
        }
        (ix, dropped)
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn contains(&self, key: BlockHash) -> bool {
        self.by_key.contains_key(&key)
    }

    pub fn keys(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.lru.iter().map(|&(_, k)| k)
    }

    /// Marks `key` used now.
    pub fn touch(&mut self, key: BlockHash) {
        if let Some((t, _)) = self.by_key.get_mut(&key) {
            self.lru.remove(&(*t, key));
            self.tick += 1;
            *t = self.tick;
            self.lru.insert((self.tick, key));
        }
    }

    /// Adds `key` of `weight` as the most recent (or touches it), and returns
    /// the keys evicted to stay within the bound, oldest first. What cannot
    /// fit at all comes back itself.
    pub fn insert(&mut self, key: BlockHash, weight: usize) -> Vec<BlockHash> {
        if self.contains(key) {
            self.touch(key);
            return Vec::new();
        }
        self.tick += 1;
        self.by_key.insert(key, (self.tick, weight));
        self.lru.insert((self.tick, key));
        self.total += weight;
        let mut out = Vec::new();
        while self.total > self.cap {
            let Some((_, victim)) = self.lru.pop_first() else { break };
            if let Some((_, w)) = self.by_key.remove(&victim) {
                self.total -= w;
            }
            out.push(victim);
        }
        out
    }

    pub fn remove(&mut self, key: BlockHash) {
        if let Some((t, w)) = self.by_key.remove(&key) {
            self.lru.remove(&(t, key));
            self.total -= w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_the_bound() {
        let (mut ix, dropped) = DiskIndex::new(3, [(1, 1), (2, 1), (3, 1), (4, 1)]);
        assert_eq!(dropped, vec![1]);
        ix.touch(2);
        assert_eq!(ix.insert(5, 1), vec![3]);
        assert_eq!(ix.insert(6, 1), vec![4]);
        assert_eq!(ix.keys().collect::<Vec<_>>(), vec![2, 5, 6]);
        assert!(ix.insert(5, 1).is_empty());
        // A heavier entry (a state snapshot) pushes out as many as it weighs
        // (5 was touched by its re-insert: 2 and 6 are the oldest).
        assert_eq!(ix.insert(7, 2), vec![2, 6]);
        ix.remove(7);
        assert_eq!(ix.len(), 1);
        let (mut none, _) = DiskIndex::new(0, []);
        assert_eq!(none.insert(9, 1), vec![9]);
        assert!(none.is_empty());
    }
}
