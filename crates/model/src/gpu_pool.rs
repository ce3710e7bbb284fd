//! The device KV pool of a [`GpuShard`]: made to mirror the host pool's
//! geometry, checked against the device's memory, and read or written one
//! block at a time for the prefix cache's disk tier.

use super::super::gpu_deltanet::GpuStates;
use super::{Attn, GpuLayer, GpuShard, Kv, State};
use crate::kv_cache::KvPool;
use crate::ModelError;
use std::sync::Arc;

/// Which way [`GpuShard::block_io`] moves a block.
pub(crate) enum BlockData<'a> {
    /// Append the block's bytes here.
    Out(&'a mut Vec<u8>),
    /// Write these bytes (one block's) into it.
    In(&'a [u8]),
}

impl GpuShard {
    /// A new host pool: checks its device mirror fits, and drops the old one
    /// (the next step or block load makes a fresh, zeroed one).
    pub(crate) fn new_pool(&self, pool: &KvPool, hkv: usize) -> Result<(), ModelError> {
        self.check_pool(pool, hkv)?;
        self.state.lock().unwrap_or_else(|p| p.into_inner()).kv = None;
        Ok(())
    }

    /// Moves a host pool's linear-attention states into device slots (once
    /// per pool: a new pool's states are attached at its first step).
    pub(super) fn attach_states(&self, st: &mut State, pool: &mut KvPool, hkv: usize) -> Result<(), ModelError> {
        let Some(states) = pool.states.as_ref() else { return Ok(()) };
        let ours = st.states.as_ref().map(|s| Arc::as_ptr(s) as *const ());
        if ours.is_some() && ours == states.device().map(|d| Arc::as_ptr(d) as *const ()) {
            return Ok(());
        }
        st.states = None;
        // The KV pool was checked when it was made, before it had states.
        self.check_pool(pool, hkv)?;
        let states = pool.states.as_mut().expect("checked above");
        let dev = Arc::new(GpuStates::new(self.gpu.clone(), states)?);
        states.attach(dev.clone())?;
        st.states = Some(dev);
        Ok(())
    }

    /// Makes the device pool that mirrors `pool` (once per geometry).
    pub(super) fn ensure_kv(&self, st: &mut State, pool: &KvPool, hkv: usize) -> Result<(), ModelError> {
        let geometry = (pool.n_blocks, pool.n_window_blocks, pool.block);
        if st.kv.as_ref().is_some_and(|k| (k.n_blocks, k.n_window_blocks, k.block) == geometry) {
            return Ok(());
        }
        st.kv = None;
        self.check_pool(pool, hkv)?;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (li, l) in self.layers.iter().enumerate() {
            let window = pool.n_window_blocks > 0 && pool.is_window_layer(li);
            let blocks = if window { pool.n_window_blocks } else { pool.n_blocks };
            let (kw, vw) = Self::kv_widths(l, hkv);
            // Rows start on a word (checked at load).
            let words = |w: usize| blocks * pool.block * self.kv.bytes_for(w) / 4;
            k.push(self.gpu.buffer("kv.k", words(kw))?);
            v.push(self.gpu.buffer("kv.v", words(vw).max(1))?);
        }
        st.kv = Some(Kv { n_blocks: pool.n_blocks, n_window_blocks: pool.n_window_blocks, block: pool.block, k, v });
        Ok(())
    }

    /// A layer's K and V row widths in the pool: a latent layer keeps one
    /// row (its key and value) a position.
    pub(super) fn kv_widths(l: &GpuLayer, hkv: usize) -> (usize, usize) {
        match &l.attn {
            Attn::Gqa(_) => (hkv, hkv),
            Attn::Mla(m) => (m.width(), 0),
            Attn::DeltaNet(_) => (0, 0),
        }
    }

    /// Block `b`'s rows on the device, for the disk tier: each full-group
    /// layer's K rows, then its V rows, in the pool's element type, exactly
    /// as [`KvPool::copy_block_out`] lays out the host's: appended to an
    /// [`BlockData::Out`] buffer, or written from [`BlockData::In`] (one
    /// block's bytes).
    pub(crate) fn block_io(
        &self,
        pool: &KvPool,
        hkv: usize,
        b: usize,
        mut data: BlockData<'_>,
    ) -> Result<(), ModelError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.ensure_kv(&mut st, pool, hkv)?;
        let kv = st.kv.as_ref().expect("made above");
        let mut at = 0;
        for (li, l) in self.layers.iter().enumerate() {
            if pool.window_layers.get(li).copied().unwrap_or(false) {
                continue;
            }
            let (kw, vw) = Self::kv_widths(l, hkv);
            for (buf, w) in [(&kv.k[li], kw), (&kv.v[li], vw)] {
                let words = pool.block * self.kv.bytes_for(w) / 4;
                if words == 0 {
                    continue;
                }
                match &mut data {
                    BlockData::In(src) => {
                        let src = &src[at..at + 4 * words];
                        let v: Vec<u32> =
                            src.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                        self.gpu.write_u32(buf, b * words, &v);
                        at += 4 * words;
                    }
                    BlockData::Out(out) => {
                        let v = self.gpu.read_f32(buf, b * words, words)?;
                        out.extend_from_slice(bytemuck::cast_slice(&v));
                    }
                }
            }
        }
        Ok(self.gpu.check()?)
    }

    /// Refuses a KV pool that, beside the weights (and the pool's recurrent
    /// state slots, once it has them), does not fit the device (`hkv`: a GQA
    /// layer's K (and V) row width on this rank).
    pub(crate) fn check_pool(&self, pool: &KvPool, hkv: usize) -> Result<(), ModelError> {
        let bytes: usize = self
            .layers
            .iter()
            .enumerate()
            .map(|(li, l)| {
                let window = pool.n_window_blocks > 0 && pool.is_window_layer(li);
                let blocks = if window { pool.n_window_blocks } else { pool.n_blocks };
                let (kw, vw) = Self::kv_widths(l, hkv);
                blocks * pool.block * (self.kv.bytes_for(kw) + self.kv.bytes_for(vw))
            })
            .sum();
        let ty = self.kv.name();
        let mut what = format!("the KV pool ({} blocks of {} positions, {ty})", pool.n_blocks, pool.block);
        let states = pool.states.as_ref().map_or(0, |s| {
            what += &format!(", the recurrent states ({} slots of {} KiB)", s.n_slots, s.slot_bytes().div_ceil(1024));
            s.bytes()
        });
        what += " and the weights";
        Ok(self.gpu.check_fits(&what, (bytes + states + self.weight_bytes()) as u64, 0)?)
    }
}
