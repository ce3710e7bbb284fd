//! The scheduler's side of the prefix cache's disk tier ([`crate::kv_disk`]):
//! it writes every block that becomes cached through to disk, and at
//! admission loads the blocks of a prompt's prefix that RAM lost.
//!
//! Ordering: the writes are queued as [`DiskOp::Save`] when blocks become
//! cached and sent ([`DiskTier::sync`]) before the next step leaves, so every
//! rank copies a block out before any later step can reuse it. A load needs
//! every rank's answer, so it is made with no step in flight: admission asks
//! the scheduler to drain first ([`DiskTier::drain`]).

use super::blocks::{BlockHash, BlockManager};
use crate::generate::Engine;
use crate::kv_disk::{self, index::DiskIndex, DiskOp, Kind, KvDiskConfig};
use crate::EngineError;

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskTierStats {
    /// Blocks on disk now, and the bound.
    pub blocks: usize,
    pub capacity: usize,
    /// Prompt tokens whose KV came from disk.
    pub hit_tokens: u64,
    pub blocks_written: u64,
    pub blocks_loaded: u64,
    /// Loads that some rank could not make (missing, torn or corrupt file).
    pub load_failures: u64,
    /// Time spent loading (every rank's reads and the round trip), µs.
    pub load_us: u64,
}

pub(super) struct DiskTier {
    pub cfg: KvDiskConfig,
    index: DiskIndex,
    pending: Vec<DiskOp>,
    /// State snapshots committed since the last sync: (slot, prefix hash).
    snapshots: Vec<(u32, BlockHash)>,
    /// Index weight of a state snapshot (its file over a block's, rounded up).
    state_weight: usize,
    /// Admission found blocks on disk while steps were in flight: send no
    /// more steps until they are back, then admit again.
    pub drain: bool,
    pub stats: DiskTierStats,
}

/// One sync's decisions: `cached` (pool block, key) in release order (a
/// sequence's last block first, which is the index's LRU order: a prefix's
/// first blocks serve the most continuations, so they go in last) and
/// `snapshots` (state slot, state key) enter the index; returns the writes
/// (first blocks first: a prefix is useful from its start) and the deletes.
///
/// What counts is the index after the pass against before it: a key is
/// written when it is indexed now and was not before, and deleted when it
/// was and is not. A key may come twice in one pass (a block released by its
/// sequence and again by the re-warm that shared it), evicted in between by
/// newer ones: it is judged by where it ends, never both written and deleted.
fn plan_pass(
    index: &mut DiskIndex,
    cached: &[(u32, BlockHash)],
    snapshots: &[(u32, BlockHash)],
    state_weight: usize,
) -> (Vec<DiskOp>, Vec<BlockHash>) {
    // Every key this pass saw or evicted, with whether it was indexed before.
    let mut before: std::collections::HashMap<BlockHash, bool> = std::collections::HashMap::new();
    let mut order: Vec<BlockHash> = Vec::new();
    let mut added: std::collections::HashMap<BlockHash, DiskOp> = std::collections::HashMap::new();
    let mut note = |key: BlockHash, indexed: bool, order: &mut Vec<BlockHash>| {
        before.entry(key).or_insert_with(|| {
            order.push(key);
            indexed
        });
    };
    let blocks = cached.iter().map(|&(block, key)| (DiskOp::Save { block, key }, key, 1));
    let states = snapshots.iter().map(|&(slot, key)| (DiskOp::SaveState { slot, key }, key, state_weight));
    let mut adds: Vec<BlockHash> = Vec::new();
    for (op, key, weight) in blocks.chain(states) {
        note(key, index.contains(key), &mut order);
        if index.contains(key) {
            index.touch(key);
            continue;
        }
        for victim in index.insert(key, weight) {
            note(victim, true, &mut order);
        }
        adds.push(key);
        added.insert(key, op);
    }
    let mut deletes = Vec::new();
    for key in order {
        if before[&key] && !index.contains(key) {
            deletes.push(key);
        }
    }
    // Blocks first blocks first (the reverse of release order), then states.
    let mut saves: Vec<DiskOp> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let is_state = |k: &BlockHash| matches!(added.get(k), Some(DiskOp::SaveState { .. }));
    let block_keys = adds.iter().filter(|k| !is_state(k)).rev();
    let state_keys = adds.iter().filter(|k| is_state(k));
    for key in block_keys.chain(state_keys) {
        if index.contains(*key) && !before[key] && seen.insert(*key) {
            saves.extend(added.get(key).cloned());
        }
    }
    (saves, deletes)
}

/// What a load brought back: per block whether every rank loaded it, and
/// whether the state snapshot (if one was asked for) loaded everywhere.
pub(super) struct Loaded {
    pub blocks: Vec<bool>,
    pub state: bool,
}

impl DiskTier {
    /// Opens the tier on every rank: the index holds the keys every rank has
    /// (rank 0's age order), bounded by `max_bytes` over the largest rank's
    /// block file; every rank deletes the rest.
    pub fn open(engine: &mut Engine, cfg: KvDiskConfig, blocks: &mut BlockManager) -> Result<DiskTier, EngineError> {
        let replies = engine.disk_open(&cfg.dir)?;
        let file = replies.iter().map(|r| r.file_bytes).max().unwrap_or(1).max(1);
        let state_file = replies.iter().map(|r| r.state_file_bytes).max().unwrap_or(0);
        let state_weight = state_file.div_ceil(file).max(1) as usize;
        let cap = (cfg.max_bytes / file) as usize;
        let others: Vec<std::collections::HashSet<(BlockHash, Kind)>> =
            replies[1..].iter().map(|r| r.keys.iter().copied().collect()).collect();
        let common = replies[0].keys.iter().copied().filter(|k| others.iter().all(|o| o.contains(k)));
        let weighted = common.map(|(k, kind)| (k, if kind == Kind::State { state_weight } else { 1 }));
        let (index, _dropped) = DiskIndex::new(cap, weighted);
        engine.disk_ops(&[DiskOp::Prune(index.keys().collect())])?;
        tracing::info!(
            "kv disk: {} files kept in {} (bound {} blocks of {} bytes)",
            index.len(),
            cfg.dir.display(),
            cap,
            file
        );
        blocks.just_cached = Some(Vec::new());
        let stats = DiskTierStats { blocks: index.len(), capacity: cap, ..Default::default() };
        Ok(DiskTier { cfg, index, pending: Vec::new(), snapshots: Vec::new(), state_weight, drain: false, stats })
    }

    /// A hybrid model's state snapshot after the prefix named `hash` was
    /// committed in `slot`: written at the next [`DiskTier::sync`].
    pub fn note_snapshot(&mut self, slot: u32, hash: BlockHash) {
        self.snapshots.push((slot, hash));
    }

    /// Queues a write of every block that became cached and every state
    /// snapshot taken that is not on disk yet (evicting the least recently
    /// used beyond the bound), and sends what is queued.
    pub fn sync(&mut self, engine: &mut Engine, blocks: &mut BlockManager) -> Result<(), EngineError> {
        let cached = blocks.just_cached.as_mut().map(std::mem::take).unwrap_or_default();
        let snapshots: Vec<(u32, BlockHash)> = std::mem::take(&mut self.snapshots)
            .into_iter()
            .map(|(slot, hash)| (slot, kv_disk::state_key(hash)))
            .collect();
        let (saves, deletes) = plan_pass(&mut self.index, &cached, &snapshots, self.state_weight);
        self.stats.blocks_written += saves.len() as u64;
        self.pending.extend(saves);
        self.pending.extend(deletes.into_iter().map(DiskOp::Delete));
        self.stats.blocks = self.index.len();
        if self.pending.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut self.pending);
        engine.disk_ops(&ops).map(|_| ())
    }

    /// How many of `hashes`, from the first, are on disk.
    pub fn on_disk(&self, hashes: &[BlockHash]) -> usize {
        hashes.iter().take_while(|&&h| self.index.contains(h)).count()
    }

    /// Whether the state snapshot after the prefix named `hash` is on disk.
    pub fn has_state(&self, hash: BlockHash) -> bool {
        self.index.contains(kv_disk::state_key(hash))
    }

    /// Loads `loads` (pool block, block key) and, when given, the state
    /// snapshot (slot, prefix hash, position) on every rank. Every file some
    /// rank could not load is dropped from the index and deleted everywhere
    /// (so one pass finds all the damage). The caller registers what it uses.
    pub fn load(
        &mut self,
        engine: &mut Engine,
        blocks: &mut BlockManager,
        loads: &[(u32, BlockHash)],
        state: Option<(u32, BlockHash, usize)>,
    ) -> Result<Loaded, EngineError> {
        self.sync(engine, blocks)?;
        let mut ops: Vec<DiskOp> = loads.iter().map(|&(block, key)| DiskOp::Load { block, key }).collect();
        let state_key = state.map(|(slot, h, pos)| {
            let key = kv_disk::state_key(h);
            ops.push(DiskOp::LoadState { slot, key, pos: pos as u32 });
            key
        });
        let started = std::time::Instant::now();
        let mut good = engine.disk_load(&ops)?;
        self.stats.load_us += started.elapsed().as_micros() as u64;
        let state_ok = state_key.is_some() && good.pop() == Some(true);
        let keys = loads.iter().map(|&(_, k)| k).chain(state_key.filter(|_| !state_ok));
        for (key, ok) in keys.zip(good.iter().copied().chain([false])) {
            if ok {
                self.index.touch(key);
                self.stats.blocks_loaded += 1;
            } else {
                self.stats.load_failures += 1;
                self.index.remove(key);
                self.pending.push(DiskOp::Delete(key));
                tracing::warn!("kv disk: file {key:032x} could not be loaded on every rank; it is recomputed");
            }
        }
        if let Some(key) = state_key.filter(|_| state_ok) {
            self.index.touch(key);
        }
        self.stats.blocks = self.index.len();
        Ok(Loaded { blocks: good, state: state_ok })
    }

    /// After the cluster was lost: the queued writes name blocks and slots
    /// of a pool that is gone. The index is rebuilt when the tier is opened
    /// again.
    pub fn forget_pending(&mut self) {
        self.pending.clear();
        self.snapshots.clear();
        self.drain = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(ops: &[DiskOp]) -> Vec<BlockHash> {
        ops.iter()
            .map(|op| match op {
                DiskOp::Save { key, .. } | DiskOp::SaveState { key, .. } => *key,
                _ => panic!("not a save: {op:?}"),
            })
            .collect()
    }

    /// Release order is last block first: keys 60 down to 1 for a
    /// sequence of blocks 1..=60.
    fn released(range: std::ops::RangeInclusive<u128>) -> Vec<(u32, BlockHash)> {
        range.rev().map(|k| (k as u32, k)).collect()
    }

    #[test]
    fn a_pass_writes_what_it_indexes_and_deletes_what_it_evicts() {
        // Ten files from before; a new sequence of 45 blocks under a bound of 10.
        let (mut ix, _) = DiskIndex::new(10, (1000..1010).map(|k| (k, 1)));
        let (saves, deletes) = plan_pass(&mut ix, &released(1..=45), &[], 2);
        assert_eq!(saved(&saves), (1..=10).collect::<Vec<_>>(), "first blocks first");
        assert_eq!(deletes, (1000..1010).collect::<Vec<_>>());
        assert_eq!(ix.len(), 10);
    }

    #[test]
    fn a_key_evicted_and_indexed_again_in_one_pass_stays_on_disk() {
        // Blocks 1..=10 went to disk in an earlier pass; now the same
        // sequence's 60 blocks are released again (by a re-warm that shared
        // them): 60..=11 push 1..=10 out, then 10..=1 come back.
        let (mut ix, _) = DiskIndex::new(10, []);
        let (first, _) = plan_pass(&mut ix, &released(1..=60), &[], 2);
        assert_eq!(saved(&first), (1..=10).collect::<Vec<_>>());
        let (saves, deletes) = plan_pass(&mut ix, &released(1..=60), &[], 2);
        assert!(saves.is_empty(), "{saves:?}");
        assert!(deletes.is_empty(), "{deletes:?}");
        assert_eq!(ix.keys().collect::<std::collections::HashSet<_>>(), (1..=10).collect());
        // The same key twice in one pass, new both times: written once.
        let (mut ix, _) = DiskIndex::new(3, []);
        let (saves, deletes) = plan_pass(&mut ix, &[(7, 7), (8, 8), (9, 9), (1, 1), (7, 7)], &[], 2);
        assert_eq!(saved(&saves), vec![7, 1, 9]);
        assert!(deletes.is_empty());
    }

    #[test]
    fn a_state_snapshot_weighs_its_size() {
        let (mut ix, _) = DiskIndex::new(4, (1..=4).map(|k| (k, 1)));
        let (saves, deletes) = plan_pass(&mut ix, &[], &[(3, 99)], 2);
        assert_eq!(saves, vec![DiskOp::SaveState { slot: 3, key: 99 }]);
        assert_eq!(deletes, vec![1, 2]);
    }
}
