//! The CPU's implementation of the layer ops ([`crate::layer_ops::LayerOps`]):
//! host rows in the [`Workspace`], the kernels crate's threaded kernels, the
//! host KV (a paged pool or a sequence's own cache with its sliding-window
//! rings), the collectives on host slices.
//!
//! Its fusions, which the ops' boundaries keep: q, k and v (and gate, up)
//! share one quantization of the normalized rows (`Linear::forward_many`);
//! attention on a quantized cache scores int8 keys against an int8 query;
//! exact tensor parallelism gathers columns inside the output projections.

use super::tp::{gather_columns, Dest};
use super::{AttendRows, Model, SeqStep};
use crate::decoder::{DecoderLayer, Gqa};
use crate::kv_cache::{KvLayers, KvPool, SeqKv};
use crate::layer_ops::{LayerOps, Norm};
use crate::linear::Linear;
use crate::linear_attn::GatedDeltaNet;
use crate::mla::{Mla, RopeRows};
use crate::moe::{Mlp, Moe};
use crate::shard::AllReduce;
use crate::workspace::{grow, Workspace};
use crate::ModelError;
use kernels::attention::{attention_paged, AttnShape, KvElem, KvView};
use kernels::{ops, ThreadPool};

/// One step's CPU layers: `n` rows of `ws.x` over the sequences `seqs`.
pub(super) struct CpuLayers<'a, 's> {
    pub m: &'a Model,
    pub pool: &'a ThreadPool,
    pub ws: &'a mut Workspace,
    pub seqs: &'a mut [SeqStep<'s>],
    pub paged: Option<&'a mut KvPool>,
    pub comm: &'a dyn AllReduce,
    pub n: usize,
}

impl<'a> CpuLayers<'a, '_> {
    fn h(&self) -> usize {
        self.m.config.hidden_size
    }

    fn eps(&self) -> f32 {
        self.m.config.rms_norm_eps
    }

    fn norm_weight(&self, li: usize, which: Norm) -> &'a [f32] {
        let l = &self.m.layers[li];
        match which {
            Norm::Attn => &l.attn_norm,
            Norm::Mlp => &l.mlp_norm,
            Norm::PostAttn => l.post_attn_norm.as_deref().expect("asked for by the loop"),
            Norm::PostFfn => l.post_ffn_norm.as_deref().expect("asked for by the loop"),
        }
    }

    /// The block's output projection `w` of `ws.attn` (`from_attn`) or
    /// `ws.gate` into `ws.o`, all-reduced; under exact tensor parallelism the
    /// input's columns are gathered first and the output's after.
    fn row_parallel(&mut self, w: &Linear, from_attn: bool) -> R {
        let (m, n, h) = (self.m, self.n, self.h());
        let (ws, pool, comm) = (&mut *self.ws, self.pool, self.comm);
        let Some(tp) = m.shard.tp.as_ref().filter(|t| t.exact) else {
            let input = if from_attn { &ws.attn } else { &ws.gate };
            w.forward(pool, input, n, &mut ws.o, &mut ws.scratch);
            return comm.all_reduce_sum(&mut ws.o[..n * h]);
        };
        let hd = m.config.head_dim;
        // (full width, this rank's width, every rank's columns, column unit)
        let (full, mine, all, unit) = match from_attn {
            true => (m.config.n_heads * hd, m.local.n_heads * hd, &tp.q_heads_all, hd),
            false => (m.config.intermediate_size, m.local.ffn, &tp.ffn_all, 1),
        };
        grow(&mut ws.full_in, n * full);
        let local = std::mem::take(if from_attn { &mut ws.attn } else { &mut ws.gate });
        let gathered = gather_columns(comm, &local[..n * mine], n, all, unit, ws, Dest::FullIn);
        *(if from_attn { &mut ws.attn } else { &mut ws.gate }) = local;
        gathered?;
        let hl = tp.hidden.len();
        grow(&mut ws.part, n * hl);
        w.forward(pool, &ws.full_in, n, &mut ws.part, &mut ws.scratch);
        let part = std::mem::take(&mut ws.part);
        let gathered = gather_columns(comm, &part[..n * hl], n, &tp.hidden_all, 1, ws, Dest::O);
        ws.part = part;
        gathered
    }
}

type R = Result<(), ModelError>;

impl LayerOps for CpuLayers<'_, '_> {
    fn fuses_residual(&self, _layer: &DecoderLayer) -> bool {
        false
    }

    fn input_norm(&mut self, li: usize, which: Norm) -> R {
        let (n, h, eps) = (self.n, self.h(), self.eps());
        let w = self.norm_weight(li, which);
        ops::rms_norm(&self.ws.x[..n * h], w, eps, h, &mut self.ws.xn[..n * h]);
        Ok(())
    }

    fn qkv(&mut self, _li: usize, g: &Gqa) -> R {
        let ws = &mut *self.ws;
        let (x, n) = (&ws.xn, self.n);
        Linear::forward_many(
            self.pool,
            &[&g.q, &g.k, &g.v],
            x,
            n,
            &mut [&mut ws.q, &mut ws.k, &mut ws.v],
            &mut ws.scratch,
        );
        Ok(())
    }

    fn qk_norm(&mut self, _li: usize, g: &Gqa) -> R {
        let (n, hd, eps) = (self.n, self.m.config.head_dim, self.eps());
        let (hq, hkv) = (self.m.local.n_heads * hd, self.m.local.n_kv_heads * hd);
        let (Some(qn), Some(kn)) = (&g.q_norm, &g.k_norm) else { return Ok(()) };
        match g.qk_norm_whole {
            false => {
                ops::rms_norm_inplace(&mut self.ws.q[..n * hq], qn, eps, hd);
                ops::rms_norm_inplace(&mut self.ws.k[..n * hkv], kn, eps, hd);
                Ok(())
            }
            true => self.m.whole_qk_norm(self.ws, g, n, self.comm),
        }
    }

    fn rope_qk(&mut self, _li: usize, g: &Gqa) -> R {
        let m = self.m;
        let hd = m.config.head_dim;
        let (hq, hkv, half) = (m.local.n_heads * hd, m.local.n_kv_heads * hd, m.config.rope_dim / 2);
        let ws = &mut *self.ws;
        let local_rope = g.window.is_some() && m.rope_local.is_some();
        let (cos, sin) = if local_rope { (&ws.cos_local, &ws.sin_local) } else { (&ws.cos, &ws.sin) };
        for t in 0..self.n {
            let (c, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            ops::rope(&mut ws.q[t * hq..(t + 1) * hq], hd, c, sn, m.rope.style);
            ops::rope(&mut ws.k[t * hkv..(t + 1) * hkv], hd, c, sn, m.rope.style);
        }
        Ok(())
    }

    fn attend(&mut self, li: usize, gqa: &Gqa) -> R {
        let m = self.m;
        let hd = m.config.head_dim;
        let (hq, hkv) = (m.local.n_heads * hd, m.local.n_kv_heads * hd);
        let (ws, pool) = (&mut *self.ws, self.pool);
        let mut row = 0;
        for s in self.seqs.iter_mut() {
            let len = s.tokens.len();
            let start = s.cache.start();
            let rows = s.attend_rows();
            let (k, v) = (&ws.k[row * hkv..(row + len) * hkv], &ws.v[row * hkv..(row + len) * hkv]);
            let (q, out) = (&ws.q[row * hq..(row + len) * hq], &mut ws.attn[row * hq..]);
            let (kv, table): (&mut KvPool, &[u32]) = match &mut s.cache {
                SeqKv::Own(c) => (&mut c.pool, &[0]),
                SeqKv::Paged { table, window, .. } => {
                    let kv = self.paged.as_deref_mut().expect("checked by run_layers");
                    if kv.is_window_layer(li) {
                        // The window group: the sequence's window blocks, as a
                        // table over every position (those out of the window unread).
                        window.logical_table(start + len, kv.block, &mut ws.ring_table);
                        (kv, &ws.ring_table)
                    } else {
                        (kv, table)
                    }
                }
            };
            let ring = kv.ring_of(li);
            if ring == 0 {
                let at = (gqa, kv.block, table, start, rows);
                match &mut kv.layers {
                    KvLayers::F16(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                    KvLayers::F32(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                    KvLayers::Q8_0(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                    KvLayers::Q4_0(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                }
            } else {
                // A ring of `ring` positions (one block of that size, position p
                // at p % ring): the block table names that one block for every
                // `ring` positions. New tokens go in runs short enough that a
                // run's keys and the `window − 1` before them all fit.
                let w = gqa.window.unwrap_or(ring);
                let run = (ring + 1).saturating_sub(w).max(1);
                ws.ring_table.clear();
                ws.ring_table.resize((start + len).div_ceil(ring), 0);
                let mut done = 0;
                while done < len {
                    let n = run.min(len - done);
                    let at = (gqa, ring, &ws.ring_table[..], start + done, rows);
                    let (k, v) = (&k[done * hkv..(done + n) * hkv], &v[done * hkv..(done + n) * hkv]);
                    let (q, out) = (&q[done * hq..(done + n) * hq], &mut out[done * hq..]);
                    match &mut kv.layers {
                        KvLayers::F16(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                        KvLayers::F32(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                        KvLayers::Q8_0(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                        KvLayers::Q4_0(l) => m.store_and_attend(pool, &mut l[li], at, k, v, q, out),
                    }
                    done += n;
                }
            }
            row += len;
        }
        Ok(())
    }

    fn output_gate(&mut self, _li: usize, g: &Gqa) -> R {
        let Some(gate_w) = &g.gate else { return Ok(()) };
        let (n, hq) = (self.n, self.m.local.n_heads * self.m.config.head_dim);
        let ws = &mut *self.ws;
        let gate = &mut ws.linear.attn_gate;
        grow(gate, n * hq);
        gate_w.forward(self.pool, &ws.xn, n, gate, &mut ws.scratch);
        crate::linear_attn::apply_output_gate(&mut ws.attn[..n * hq], &gate[..n * hq]);
        Ok(())
    }

    fn attn_out(&mut self, _li: usize, g: &Gqa, _fused: bool) -> R {
        self.row_parallel(&g.o, true)
    }

    fn latent_project(&mut self, _li: usize, mla: &Mla) -> R {
        let (n, ws) = (self.n, &mut *self.ws);
        let rope = RopeRows { cos: &ws.cos, sin: &ws.sin, style: self.m.rope.style };
        mla.project_rows(self.pool, &ws.xn, n, &rope, &mut ws.mla);
        Ok(())
    }

    fn latent_attend(&mut self, li: usize, mla: &Mla) -> R {
        let paged = self.paged.as_deref_mut();
        mla.attend_rows(self.pool, self.n, self.seqs, paged, li, &mut self.ws.mla);
        Ok(())
    }

    fn latent_out(&mut self, _li: usize, mla: &Mla, _fused: bool) -> R {
        let (n, h, ws) = (self.n, self.h(), &mut *self.ws);
        mla.out_rows(self.pool, n, &mut ws.o[..n * h], &mut ws.mla);
        self.comm.all_reduce_sum(&mut ws.o[..n * h])
    }

    fn delta_project(&mut self, _li: usize, dn: &GatedDeltaNet) -> R {
        let ws = &mut *self.ws;
        dn.project_rows(self.pool, &ws.xn, self.n, &mut ws.linear, &mut ws.scratch);
        Ok(())
    }

    fn delta_recur(&mut self, li: usize, dn: &GatedDeltaNet) -> R {
        let paged = self.paged.as_deref_mut();
        dn.recur_rows(self.pool, self.n, self.seqs, paged, li, &mut self.ws.linear)
    }

    fn delta_out(&mut self, _li: usize, dn: &GatedDeltaNet, _fused: bool) -> R {
        let (n, h, ws) = (self.n, self.h(), &mut *self.ws);
        dn.out_rows(self.pool, n, &mut ws.o[..n * h], &mut ws.linear, &mut ws.scratch);
        self.comm.all_reduce_sum(&mut ws.o[..n * h])
    }

    fn gate_up_act(&mut self, _li: usize, mlp: &Mlp) -> R {
        let (n, ffn, ws) = (self.n, self.m.local.ffn, &mut *self.ws);
        Linear::forward_many(
            self.pool,
            &[&mlp.gate, &mlp.up],
            &ws.xn,
            n,
            &mut [&mut ws.gate, &mut ws.up],
            &mut ws.scratch,
        );
        mlp.act.apply(&mut ws.gate[..n * ffn], &ws.up[..n * ffn]);
        Ok(())
    }

    fn down(&mut self, _li: usize, mlp: &Mlp, _fused: bool) -> R {
        self.row_parallel(&mlp.down, false)
    }

    fn moe_route(&mut self, _li: usize, moe: &Moe) -> R {
        let (n, h, ws) = (self.n, self.h(), &mut *self.ws);
        moe.route_rows(self.pool, &ws.xn[..n * h], n, &mut ws.moe);
        Ok(())
    }

    fn moe_experts(&mut self, _li: usize, moe: &Moe, _fused: bool) -> R {
        let (n, h, ws) = (self.n, self.h(), &mut *self.ws);
        moe.experts_rows(self.pool, &ws.xn[..n * h], n, &mut ws.o[..n * h], &mut ws.moe);
        self.comm.all_reduce_sum(&mut ws.o[..n * h])
    }

    fn residual(&mut self, li: usize, post_norm: Option<Norm>) -> R {
        let (n, h, eps) = (self.n, self.h(), self.eps());
        if let Some(which) = post_norm {
            let w = self.norm_weight(li, which);
            ops::rms_norm_inplace(&mut self.ws.o[..n * h], w, eps, h);
        }
        ops::add_inplace(&mut self.ws.x[..n * h], &self.ws.o[..n * h]);
        Ok(())
    }

    fn end_layer(&mut self, _li: usize) -> R {
        Ok(())
    }
}

impl Model {
    /// Stores the new tokens' keys and values (`k`, `v`: `len × kv_heads ×
    /// head_dim`) at positions `start..` of one layer's cache (blocks of
    /// `block × kv_heads × head_dim` each, in `table` order), then runs causal
    /// attention of their queries `q` (`len × heads × head_dim`) against it into
    /// `out`, honoring the layer's sliding window and sinks. `at`: the layer,
    /// block size, block table, first new position, and how the new rows
    /// attend ([`AttendRows`]).
    #[allow(clippy::too_many_arguments)]
    fn store_and_attend<T: KvElem>(
        &self,
        pool: &ThreadPool,
        cache: &mut (Vec<T>, Vec<T>),
        (layer, block, table, start, rows): (&Gqa, usize, &[u32], usize, AttendRows),
        k: &[f32],
        v: &[f32],
        q: &[f32],
        out: &mut [f32],
    ) {
        let hd = self.config.head_dim;
        let hkv = self.local.n_kv_heads * hd;
        // Cache elements per row (quantized: blocks of 32; head_dim checked at load).
        let row = hkv / T::VALUES;
        let len = k.len() / hkv.max(1);
        let (kc, vc) = cache;
        // Runs of new positions that stay inside one block.
        let mut p = start;
        while p < start + len {
            let n = (block - p % block).min(start + len - p);
            let at = (table[p / block] as usize * block + p % block) * row;
            let src = (p - start) * hkv..(p - start + n) * hkv;
            T::store(&k[src.clone()], &mut kc[at..at + n * row]);
            T::store(&v[src], &mut vc[at..at + n * row]);
            p += n;
        }
        let view = KvView { k: kc, v: vc, table, block };
        let hq = self.local.n_heads * hd;
        let shape = AttnShape {
            n_new: len,
            start_pos: start,
            n_heads: self.local.n_heads,
            n_kv_heads: self.local.n_kv_heads,
            head_dim: hd,
            window: layer.window,
            scale: self.spec.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt()),
            sinks: layer.sinks.as_deref(),
            prefill: rows == AttendRows::Prompt,
        };
        if rows == AttendRows::Verify && len > 1 {
            // Row i sees positions 0..=start + i, all stored above.
            for i in 0..len {
                let one = AttnShape { n_new: 1, start_pos: start + i, ..shape };
                attention_paged(pool, &q[i * hq..(i + 1) * hq], &view, &one, &mut out[i * hq..(i + 1) * hq]);
            }
            return;
        }
        attention_paged(pool, q, &view, &shape, &mut out[..len * hq]);
    }
}
