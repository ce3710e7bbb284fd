//! The per-sequence memory of a shard ([`Model`]'s second `impl` block): the
//! contiguous KV cache of one sequence (sliding-window layers hold a ring of
//! [`ring_positions`]), the linear-attention state slots of hybrid models, and
//! the bytes both take, for the planner and the serving pool.

use super::gpu_shard::BlockData;
use super::Model;
use crate::decoder::{Attention, DecoderLayer};
use crate::kv_cache::{KvCache, KvPool};

impl Model {
    /// Bytes of weights read per decoded token by this shard.
    pub fn weight_bytes_per_token(&self) -> usize {
        let layers: usize = self.layers.iter().map(|l| l.weight_bytes()).sum();
        layers + self.lm_head.as_ref().map_or(0, |l| l.weight_bytes())
    }

    /// On a GPU shard, for a new `pool`: refuses it when its device mirror
    /// (KV rows, and the recurrent state slots once `pool.states` is set)
    /// and the weights do not fit the device's memory, with the numbers, and
    /// otherwise drops the old device pool (the new one starts empty, as the
    /// host's does). Nothing to do on the CPU.
    pub fn check_device_pool(&self, pool: &KvPool) -> Result<(), crate::ModelError> {
        match &self.gpu {
            Some(g) => g.new_pool(pool, self.local.n_kv_heads * self.config.head_dim),
            None => Ok(()),
        }
    }

    /// Appends block `b` of `pool` as bytes ([`KvPool::copy_block_out`]),
    /// from the device on a GPU shard (where the rows live).
    pub fn copy_block_out(&self, pool: &KvPool, b: usize, out: &mut Vec<u8>) -> Result<(), crate::ModelError> {
        match &self.gpu {
            Some(g) => g.block_io(pool, self.local.n_kv_heads * self.config.head_dim, b, BlockData::Out(out)),
            None => {
                pool.copy_block_out(b, out);
                Ok(())
            }
        }
    }

    /// Writes `data` into block `b` ([`KvPool::copy_block_in`]), on the
    /// device on a GPU shard. False, with nothing written, when `data` is not
    /// one block's bytes or `b` is out of range.
    pub fn copy_block_in(&self, pool: &mut KvPool, b: usize, data: &[u8]) -> Result<bool, crate::ModelError> {
        match &self.gpu {
            Some(g) => {
                if b >= pool.n_blocks || data.len() != pool.block_bytes() {
                    return Ok(false);
                }
                g.block_io(pool, self.local.n_kv_heads * self.config.head_dim, b, BlockData::In(data))?;
                Ok(true)
            }
            None => Ok(pool.copy_block_in(b, data)),
        }
    }

    /// A pool of `n_blocks` KV blocks of `block` positions for this shard's
    /// layers. A hybrid model's pool keeps K/V only for its attention layers;
    /// give it state slots with [`Model::state_pool`] (`pool.states`).
    pub fn new_pool(&self, block: usize, n_blocks: usize) -> KvPool {
        let mut p = self.new_kv_pool(block, n_blocks);
        if self.spec.linear_attn.is_some() {
            p.drop_layers(&self.kv_layer_mask());
        }
        p
    }

    /// [`Model::new_pool`] with a sliding-window block group: the windowed
    /// layers ([`Model::window_layer_mask`]) keep `n_window_blocks` blocks of
    /// their own (none: `n_window_blocks == 0`, they keep every position in
    /// the full group, as the other layers).
    pub fn new_pool_windowed(&self, block: usize, n_blocks: usize, n_window_blocks: usize) -> KvPool {
        let mut p = self.new_pool(block, n_blocks);
        if n_window_blocks > 0 {
            p.set_window_layers(&self.window_layer_mask(), n_window_blocks);
        }
        p
    }

    /// Per owned layer: whether it is a sliding-window attention layer.
    pub fn window_layer_mask(&self) -> Vec<bool> {
        self.layers.iter().map(|l| self.layer_window(l).is_some()).collect()
    }

    /// The widest sliding window of the whole model (every layer, not only
    /// this shard's, so every rank sizes its window group alike); `None`
    /// without windowed layers.
    pub fn max_window(&self) -> Option<usize> {
        let spec = &self.spec;
        if spec.mla.is_some() {
            return None;
        }
        (0..self.config.n_layers).filter_map(|l| spec.attention(l).window).max()
    }

    /// KV bytes one position takes in this shard's sliding-window layers
    /// (the window group's share of [`Model::kv_bytes_per_token`]).
    pub fn window_kv_bytes_per_token(&self) -> usize {
        let n = self.window_layer_mask().iter().filter(|&&w| w).count();
        let kv_layers = self.kv_layer_mask().iter().filter(|&&k| k).count().max(1);
        self.kv_bytes_per_token() / kv_layers * n
    }

    fn new_kv_pool(&self, block: usize, n_blocks: usize) -> KvPool {
        match &self.spec.mla {
            Some(m) => KvPool::keys_only(self.layers.len(), m.cache_width(), block, n_blocks, self.kv_type),
            None => KvPool::new(
                self.layers.len(),
                self.local.n_kv_heads * self.config.head_dim,
                block,
                n_blocks,
                self.kv_type,
            ),
        }
    }

    /// KV bytes one position takes in this shard (K and V rows of every owned
    /// layer, in whole quantized blocks for the Q8_0/Q4_0 types; latent
    /// attention: one latent ‖ rope-key row per layer, the same on every
    /// tensor-parallel rank).
    pub fn kv_bytes_per_token(&self) -> usize {
        let kv_layers = self.kv_layer_mask().iter().filter(|&&k| k).count();
        let row = crate::layer_memory::kv_bytes_per_position(
            &self.spec,
            self.local.n_kv_heads,
            self.config.head_dim,
            self.kv_type,
        );
        kv_layers * row
    }

    /// A KV cache for one sequence of up to `capacity` positions (with one
    /// slot of linear-attention state for a hybrid model). A sliding-window
    /// layer holds only a ring of [`ring_positions`] of its window (when that
    /// is below `capacity`).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let mut c = self.new_kv_cache(capacity);
        if let Some(states) = self.state_pool(1) {
            c.pool.drop_layers(&self.kv_layer_mask());
            c.states = Some(states);
        }
        c
    }

    /// Per owned layer: whether it keeps K/V rows (all but linear attention).
    pub fn kv_layer_mask(&self) -> Vec<bool> {
        self.layers.iter().map(|l| !matches!(l.attn, Attention::Linear(_))).collect()
    }

    /// `n_slots` slots of linear-attention state for this shard's layers;
    /// `None` for a model without linear attention.
    pub fn state_pool(&self, n_slots: usize) -> Option<crate::StatePool> {
        self.spec.linear_attn.as_ref()?;
        let shapes = self
            .layers
            .iter()
            .map(|l| match &l.attn {
                Attention::Linear(d) => Some(d.shape),
                _ => None,
            })
            .collect();
        Some(crate::StatePool::new(shapes, n_slots))
    }

    /// Bytes of one sequence's linear-attention state in this shard (0 for
    /// models without it): conv and recurrent states of every owned linear layer.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.attn {
                Attention::Linear(d) => d.shape.len() * 4,
                _ => 0,
            })
            .sum()
    }

    fn new_kv_cache(&self, capacity: usize) -> KvCache {
        match &self.spec.mla {
            Some(m) => KvCache::keys_only(self.layers.len(), m.cache_width(), capacity, self.kv_type),
            None => {
                KvCache::with_rings(self.local.n_kv_heads * self.config.head_dim, capacity, self.kv_type, &self.rings())
            }
        }
    }

    /// Each owned layer's ring size for a contiguous cache (0: holds every
    /// position): [`ring_positions`] of a windowed GQA layer's window.
    pub fn rings(&self) -> Vec<usize> {
        self.layers.iter().map(|l| self.layer_window(l).map_or(0, ring_positions)).collect()
    }

    /// Checks a paged sequence's window blocks before a step of positions
    /// `start..needed`: ids inside the window group, and every position the
    /// step's queries attend to or write (from `start + 1 − w` on) held.
    pub(super) fn check_window_blocks(
        &self,
        pool: &KvPool,
        window: &crate::WindowBlocks<'_>,
        start: usize,
        needed: usize,
    ) -> Result<(), crate::ModelError> {
        let b = pool.block.max(1);
        if let Some(&id) = window.blocks.iter().find(|&&id| id as usize >= pool.n_window_blocks) {
            return Err(crate::ModelError::Unsupported(format!(
                "window block {id} is outside the window group of {} blocks",
                pool.n_window_blocks
            )));
        }
        let w = self.max_window().unwrap_or(usize::MAX);
        let lo = (start + 1).saturating_sub(w) / b;
        let end = window.first + window.blocks.len();
        if window.first > lo || end * b < needed {
            return Err(crate::ModelError::Unsupported(format!(
                "the window blocks hold positions {}..{} but a step at {start}..{needed} needs {}..{needed}",
                window.first * b,
                end * b,
                lo * b
            )));
        }
        Ok(())
    }

    pub(super) fn layer_window(&self, layer: &DecoderLayer) -> Option<usize> {
        match &layer.attn {
            Attention::Gqa(g) => g.window,
            Attention::Mla(_) | Attention::Linear(_) => None,
        }
    }

    /// KV bytes this shard's contiguous cache of `context` positions holds:
    /// every position for full layers, `min(context, ring)` for windowed ones
    /// (what [`Model::new_cache`] allocates; the planner's model of it).
    pub fn kv_bytes_at(&self, context: usize) -> usize {
        let per_layer = self.kv_bytes_per_token() / self.layers.len().max(1);
        self.rings().iter().map(|&r| per_layer * if r > 0 { r.min(context) } else { context }).sum()
    }
}

/// Blocks of `block` positions a sequence holds at most in a paged pool's
/// sliding-window group, for a window of `w` and steps of up to `step`
/// tokens: its queries' keys and the new positions span `w − 1 + step`
/// positions, which touch at most one partial block at each end.
pub fn window_blocks_per_seq(w: usize, block: usize, step: usize) -> usize {
    (w.max(1) - 1 + step.max(1)).div_ceil(block.max(1)) + 1
}

/// Positions a sliding-window layer of window `w` keeps in a contiguous
/// cache: twice its window, so new tokens are stored and attended in runs of
/// `w + 1` (a run's keys and the `w − 1` before its first fit the ring).
pub fn ring_positions(w: usize) -> usize {
    2 * w.max(1)
}
