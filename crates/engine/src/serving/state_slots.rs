//! Recurrent-state slots of a hybrid model's pool (Qwen3-Next, Qwen3.5:
//! linear-attention layers keep a fixed-size state per sequence instead of KV
//! rows; `model::state_cache`), and the prefix cache's state snapshots.
//!
//! The pool has `live + snapshots` slots. A running sequence holds one live
//! slot. A *snapshot* is a slot holding the state of every linear layer after
//! a cached prefix that ends on a snapshot boundary (a multiple of
//! [`StateSlots::granularity`]: whole KV blocks and whole delta-rule chunks),
//! named by the chained hash of that prefix's last block — the same name the
//! block manager gives the block, so a prompt can resume from position `p`
//! only if the KV blocks up to `p` are cached *and* a snapshot at `p` exists.
//! Snapshots are evicted least recently used first; a snapshot whose blocks
//! were evicted is simply never found again and ages out.

use super::blocks::BlockHash;
use std::collections::{BTreeSet, HashMap};

#[derive(Debug)]
pub struct StateSlots {
    /// Positions a snapshot boundary is a multiple of.
    pub granularity: usize,
    free: Vec<u32>,
    /// Snapshot slot and its last-use tick, by prefix hash.
    snaps: HashMap<BlockHash, (u32, u64)>,
    lru: BTreeSet<(u64, BlockHash)>,
    max_snaps: usize,
    tick: u64,
    /// Snapshot slots a sequence will restore from at its next step: never evicted.
    pinned: Vec<u32>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl StateSlots {
    /// Slots `0..live + snapshots`; boundaries at multiples of both `block`
    /// and the delta rule's chunk.
    pub fn new(live: usize, snapshots: usize, block: usize) -> StateSlots {
        let chunk = kernels::delta_rule::CHUNK;
        StateSlots {
            granularity: block / gcd(block, chunk) * chunk,
            free: (0..(live + snapshots) as u32).rev().collect(),
            snaps: HashMap::new(),
            lru: BTreeSet::new(),
            max_snaps: snapshots,
            tick: 0,
            pinned: Vec::new(),
        }
    }

    /// Slots no running sequence holds (free or snapshots).
    pub fn idle_slots(&self) -> usize {
        self.free.len() + self.snaps.len()
    }

    /// A slot for a running sequence (evicting the oldest snapshot when no
    /// slot is free; with at most `live` running sequences one always is).
    pub fn take_live(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        self.evict_oldest()
    }

    pub fn release(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Forgets the least recently used snapshot no sequence is about to restore.
    fn evict_oldest(&mut self) -> Option<u32> {
        let &(t, h) = self.lru.iter().find(|(_, h)| !self.pinned.contains(&self.snaps[h].0))?;
        self.lru.remove(&(t, h));
        self.snaps.remove(&h).map(|(s, _)| s)
    }

    /// Keeps snapshot `slot` until [`Self::unpin`] (a restore is pending).
    pub fn pin(&mut self, slot: u32) {
        self.pinned.push(slot);
    }

    pub fn unpin(&mut self, slot: u32) {
        if let Some(i) = self.pinned.iter().position(|&s| s == slot) {
            self.pinned.swap_remove(i);
        }
    }

    /// The snapshot after the prefix named `hash`, marked recently used.
    pub fn lookup(&mut self, hash: BlockHash) -> Option<u32> {
        self.tick += 1;
        let (slot, last) = self.snaps.get_mut(&hash)?;
        self.lru.remove(&(*last, hash));
        *last = self.tick;
        self.lru.insert((self.tick, hash));
        Some(*slot)
    }

    pub fn has(&self, hash: BlockHash) -> bool {
        self.snaps.contains_key(&hash)
    }

    /// A slot to write a new snapshot into (not yet findable: [`Self::commit`]
    /// names it once the step that fills it succeeded). `None` when snapshots
    /// are off or `hash` is already held.
    pub fn reserve_snapshot(&mut self, hash: BlockHash) -> Option<u32> {
        if self.max_snaps == 0 || self.has(hash) {
            return None;
        }
        if self.snaps.len() >= self.max_snaps {
            let s = self.evict_oldest()?;
            return Some(s);
        }
        self.free.pop().or_else(|| self.evict_oldest())
    }

    /// Names a reserved snapshot slot, now filled.
    pub fn commit(&mut self, hash: BlockHash, slot: u32) {
        self.tick += 1;
        if let Some((old, last)) = self.snaps.insert(hash, (slot, self.tick)) {
            self.lru.remove(&(last, hash));
            self.free.push(old);
        }
        self.lru.insert((self.tick, hash));
    }

    pub fn snapshots(&self) -> usize {
        self.snaps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_found_by_hash_and_evicted_oldest_first() {
        let mut s = StateSlots::new(2, 2, 32);
        assert_eq!(s.granularity, 64);
        let (a, b) = (s.take_live().unwrap(), s.take_live().unwrap());
        let x = s.reserve_snapshot(10).unwrap();
        s.commit(10, x);
        let y = s.reserve_snapshot(11).unwrap();
        s.commit(11, y);
        assert!(s.reserve_snapshot(10).is_none(), "already held");
        assert_eq!(s.lookup(10), Some(x));
        // A third snapshot evicts the least recently used one (11).
        let z = s.reserve_snapshot(12).unwrap();
        assert_eq!(z, y);
        s.commit(12, z);
        assert_eq!(s.lookup(11), None);
        s.release(a);
        s.release(b);
        assert_eq!(s.idle_slots(), 4);
    }
}
