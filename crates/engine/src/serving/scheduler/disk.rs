//! The scheduler's use of the prefix cache's disk tier
//! ([`super::super::disk_tier`]): turning it on, and admission's load of the
//! blocks (and state snapshot) RAM lost.

use super::super::blocks::BlockHash;
use super::super::disk_tier::DiskTier;
use super::super::seq::Seq;
use super::Scheduler;
use crate::generate::Engine;
use crate::EngineError;

impl Scheduler {
    /// Turns on the prefix cache's disk tier (`serve --kv-disk`): opens it on
    /// every rank, keeping the blocks a former run left there.
    pub fn enable_disk(&mut self, engine: &mut Engine, cfg: crate::kv_disk::KvDiskConfig) -> Result<(), EngineError> {
        let refuse = |why: &str| Err(EngineError::BadArgument(format!("--kv-disk: {why}")));
        if !self.cfg.prefix_cache {
            return refuse("needs the prefix cache (--prefix-cache on)");
        }
        if self.windows.is_some() {
            return refuse("sliding-window block groups are not kept on disk (give windowed layers full blocks)");
        }
        self.disk = Some(DiskTier::open(engine, cfg, &mut self.blocks)?);
        Ok(())
    }

    /// Admission's disk load for `s` (holding its RAM prefix `0..in_ram` and
    /// fresh blocks after it): loads blocks `in_ram..j` and, for a hybrid
    /// model, the state snapshot at `j` (`state_from_disk`). Returns how many
    /// blocks the prefix reuses: as deep as every rank loaded and a state
    /// snapshot exists in RAM (after the load). Loaded blocks within it are
    /// registered; RAM blocks beyond it, should the load fall short, are
    /// swapped for fresh ones (they will be recomputed). `None`: the pool has
    /// no fresh blocks for that swap now.
    pub(super) fn load_from_disk(
        &mut self,
        engine: &mut Engine,
        s: &mut Seq,
        hashes: &[BlockHash],
        in_ram: usize,
        j: usize,
        state_from_disk: bool,
    ) -> Result<Option<usize>, EngineError> {
        let b = self.cfg.block;
        let Some(d) = self.disk.as_mut() else { return Ok(Some(in_ram)) };
        let loads: Vec<(u32, BlockHash)> = (in_ram..j).map(|k| (s.blocks[k], hashes[k])).collect();
        let slot = match self.states.as_mut() {
            Some(st) if state_from_disk => st.reserve_snapshot(hashes[j - 1]),
            _ => None,
        };
        let loaded = match d.load(engine, &mut self.blocks, &loads, slot.map(|x| (x, hashes[j - 1], j * b))) {
            Ok(l) => l,
            Err(e) => {
                if let (Some(st), Some(x)) = (self.states.as_mut(), slot) {
                    st.release(x);
                }
                return Err(e);
            }
        };
        if let (Some(st), Some(x)) = (self.states.as_mut(), slot) {
            if loaded.state {
                st.commit(hashes[j - 1], x);
            } else {
                st.release(x);
            }
        }
        let depth = in_ram + loaded.blocks.iter().take_while(|&&ok| ok).count();
        let mut reused = depth;
        while reused > 0 {
            let ok = self
                .states
                .as_ref()
                .is_none_or(|st| (reused * b).is_multiple_of(st.granularity) && st.has(hashes[reused - 1]));
            if ok {
                break;
            }
            reused -= 1;
        }
        let fresh = in_ram.min(reused)..reused;
        for (&blk, &h) in s.blocks[fresh.clone()].iter().zip(&hashes[fresh]) {
            self.blocks.register(blk, h);
        }
        // Shared RAM blocks this sequence would now recompute: swap them.
        for k in reused..in_ram {
            let Some(fresh) = self.blocks.allocate() else { return Ok(None) };
            let old = std::mem::replace(&mut s.blocks[k], fresh);
            self.blocks.release(&[old]);
        }
        Ok(Some(reused))
    }
}
