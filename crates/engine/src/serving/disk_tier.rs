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
use crate::kv_disk::{index::DiskIndex, DiskOp, KvDiskConfig};
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
    /// Admission found blocks on disk while steps were in flight: send no
    /// more steps until they are back, then admit again.
    pub drain: bool,
    pub stats: DiskTierStats,
}

impl DiskTier {
    /// Opens the tier on every rank: the index holds the keys every rank has
    /// (rank 0's age order), bounded by `max_bytes` over the largest rank's
    /// block file; every rank deletes the rest.
    pub fn open(engine: &mut Engine, cfg: KvDiskConfig, blocks: &mut BlockManager) -> Result<DiskTier, EngineError> {
        let replies = engine.disk_open(&cfg.dir)?;
        let file = replies.iter().map(|r| r.file_bytes).max().unwrap_or(1).max(1);
        let cap = (cfg.max_bytes / file) as usize;
        let others: Vec<std::collections::HashSet<BlockHash>> =
            replies[1..].iter().map(|r| r.keys.iter().copied().collect()).collect();
        let common = replies[0].keys.iter().copied().filter(|k| others.iter().all(|o| o.contains(k)));
        let (index, _dropped) = DiskIndex::new(cap, common);
        engine.disk_ops(&[DiskOp::Prune(index.keys().collect())])?;
        tracing::info!(
            "kv disk: {} blocks kept in {} (bound {} blocks of {} bytes)",
            index.len(),
            cfg.dir.display(),
            cap,
            file
        );
        blocks.just_cached = Some(Vec::new());
        let stats = DiskTierStats { blocks: index.len(), capacity: cap, ..Default::default() };
        Ok(DiskTier { cfg, index, pending: Vec::new(), drain: false, stats })
    }

    /// Queues a write of every block that became cached and is not on disk
    /// yet (evicting the least recently used beyond the bound), and sends
    /// what is queued.
    pub fn sync(&mut self, engine: &mut Engine, blocks: &mut BlockManager) -> Result<(), EngineError> {
        // Blocks come in release order, a sequence's last block first, which
        // is the index's LRU order (a prefix's first blocks serve the most
        // continuations, so they go last). The writes go the other way, first
        // blocks first: a prefix is useful from its start.
        let mut saves: Vec<(u32, BlockHash)> = Vec::new();
        let mut deletes: Vec<BlockHash> = Vec::new();
        for (block, key) in blocks.just_cached.as_mut().map(std::mem::take).unwrap_or_default() {
            if self.index.contains(key) {
                self.index.touch(key);
                continue;
            }
            saves.push((block, key));
            deletes.extend(self.index.insert(key));
        }
        // A key evicted in this same pass is not written at all.
        saves.retain(|(_, k)| !deletes.contains(k));
        deletes.retain(|k| !saves.iter().any(|s| s.1 == *k));
        self.stats.blocks_written += saves.len() as u64;
        self.pending.extend(saves.into_iter().rev().map(|(block, key)| DiskOp::Save { block, key }));
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

    /// Loads `loads` (pool block, key) on every rank; the blocks every rank
    /// loaded, from the first, are registered in `blocks` under their keys.
    /// Returns how many. Every block some rank could not load is dropped
    /// from the index and deleted everywhere (so one pass finds all the
    /// damage; the blocks after the first failure are recomputed anyway).
    pub fn load(
        &mut self,
        engine: &mut Engine,
        blocks: &mut BlockManager,
        loads: &[(u32, BlockHash)],
    ) -> Result<usize, EngineError> {
        self.sync(engine, blocks)?;
        let started = std::time::Instant::now();
        let good = engine.disk_load(loads)?;
        self.stats.load_us += started.elapsed().as_micros() as u64;
        let ok = good.iter().take_while(|&&g| g).count();
        for &(b, key) in &loads[..ok] {
            blocks.register(b, key);
            self.index.touch(key);
        }
        self.stats.blocks_loaded += ok as u64;
        for (&(_, bad), _) in loads.iter().zip(&good).filter(|(_, &g)| !g) {
            self.stats.load_failures += 1;
            self.index.remove(bad);
            self.pending.push(DiskOp::Delete(bad));
            tracing::warn!("kv disk: block {bad:032x} could not be loaded on every rank; it is recomputed");
        }
        self.stats.blocks = self.index.len();
        Ok(ok)
    }

    /// After the cluster was lost: the queued writes name blocks of a pool
    /// that is gone. The index is rebuilt when the tier is opened again.
    pub fn forget_pending(&mut self) {
        self.pending.clear();
        self.drain = false;
    }
}
