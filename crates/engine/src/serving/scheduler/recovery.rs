//! After the cluster was lost: the scheduler's side of re-forming it
//! (every sequence back to the queue with its history, and the pool
//! allocated again on the re-formed ranks).

use super::super::blocks::BlockManager;
use super::super::disk_tier::{DiskTier, DiskTierStats};
use super::super::state_slots::StateSlots;
use super::super::windows::WindowGroup;
use super::Scheduler;
use crate::dist_batch::PoolShape;
use crate::generate::Engine;
use crate::EngineError;

impl Scheduler {
    /// After the cluster was lost: every running sequence goes back to the
    /// front of the queue, in admission order, with its history (prompt and
    /// the tokens streamed so far) kept and its KV dropped, as preemption does;
    /// the prefix cache is emptied, since the re-formed ranks hold no KV.
    /// Call [`Scheduler::reinit_pool`] once the cluster is back.
    pub fn requeue_all(&mut self) {
        // The re-formed ranks hold none of the steps in flight (nor the
        // prompts a re-warm would start from).
        self.in_flight.clear();
        self.rewarm.clear();
        if let Some(d) = self.disk.as_mut() {
            d.forget_pending();
        }
        while !self.running.is_empty() {
            self.preempt_youngest();
        }
        self.blocks = BlockManager::new(self.cfg.n_blocks, self.cfg.block, self.cfg.prefix_cache);
        if self.disk.is_some() {
            self.blocks.just_cached = Some(Vec::new());
        }
        // The state snapshots went with the ranks' pools too.
        if self.states.is_some() {
            let snaps = if self.cfg.prefix_cache { self.cfg.max_batch } else { 0 };
            self.states = Some(StateSlots::new(self.cfg.max_batch, snaps, self.cfg.block));
        }
        if let Some(w) = &self.windows {
            let c = &self.cfg;
            self.windows = Some(WindowGroup::new(w.window, c.block, w.n_blocks(), c.step_tokens, c.prefix_cache));
        }
    }

    /// Allocates the pool again on every rank (a re-formed cluster).
    pub fn reinit_pool(&mut self, engine: &mut Engine) -> Result<(), EngineError> {
        let n_slots = self.states.as_ref().map_or(0, |s| s.idle_slots());
        let n_window_blocks = self.windows.as_ref().map_or(0, |w| w.n_blocks());
        engine.init_pool(PoolShape { block: self.cfg.block, n_blocks: self.cfg.n_blocks, n_window_blocks, n_slots })?;
        // The restarted ranks open their disk tier again; the index is what
        // every rank still holds.
        if let Some(old) = self.disk.take() {
            let mut d = DiskTier::open(engine, old.cfg, &mut self.blocks)?;
            d.stats = DiskTierStats { blocks: d.stats.blocks, capacity: d.stats.capacity, ..old.stats };
            self.disk = Some(d);
        }
        Ok(())
    }
}
