//! The GPU's implementation of the layer ops ([`crate::layer_ops::LayerOps`]):
//! each op records dispatches into the step's one [`Pass`] over the step's
//! device buffers ([`Bufs`]) and the device KV pool ([`Kv`]).
//!
//! Its fusions, which the ops' boundaries keep: one stacked matmul writes
//! each token's `q‖k‖v(‖gate)` row and one rope runs over q's and k's heads
//! side by side; without a sandwich norm or a tensor split the block's last
//! matmul adds into the residual stream ([`LayerOps::fuses_residual`]).
//! Under a tensor split the pass is submitted at each block's end and the
//! partial sums go through the host's all-reduce: the only host staging.

use super::super::gpu_deltanet::{DeltaBufs, DeltaSeq, GpuDeltaNet, GpuStates};
use super::super::gpu_mla::{GpuMla, MlaBufs, StepRows};
use super::super::gpu_moe::GpuMoe;
use super::{Attn, Bufs, Ffn, GpuGqa, GpuLayer, GpuShard, Kv};
use crate::decoder::{DecoderLayer, Gqa};
use crate::layer_ops::{LayerOps, Norm};
use crate::linear_attn::GatedDeltaNet;
use crate::mla::Mla;
use crate::moe::{Mlp, Moe};
use crate::{AllReduce, Model, ModelError};
use shardlm_gpu::{AttnArgs, DeviceBuf, Gpu, Pass};
use std::sync::Arc;

type R = Result<(), ModelError>;

/// One step's device layers over `n` rows.
pub(super) struct GpuLayers<'a> {
    pub shard: &'a GpuShard,
    pub m: &'a Model,
    pub gpu: &'a Gpu,
    pub pass: Pass<'a>,
    pub b: &'a Bufs,
    pub kv: &'a Kv,
    /// The step's block tables: full group, window group.
    pub tables: [&'a DeviceBuf; 2],
    /// Per layer: whether it reads the sliding-window block group.
    pub window_group: Vec<bool>,
    pub block: usize,
    pub states: Option<&'a Arc<GpuStates>>,
    pub delta_plan: &'a [DeltaSeq],
    pub comm: &'a dyn AllReduce,
    pub n: usize,
}

impl<'a> GpuLayers<'a> {
    fn layer(&self, li: usize) -> &'a GpuLayer {
        &self.shard.layers[li]
    }

    fn gqa(&self, li: usize) -> Result<&'a GpuGqa, ModelError> {
        match &self.layer(li).attn {
            Attn::Gqa(a) => Ok(a),
            _ => Err(ModelError::Unsupported(format!("layer {li} has no GQA weights on the device"))),
        }
    }

    fn experts(&self, li: usize) -> Result<&'a GpuMoe, ModelError> {
        match &self.layer(li).ffn {
            Ffn::Moe(m) => Ok(m),
            Ffn::Dense { .. } => Err(ModelError::Unsupported(format!("layer {li} has no experts on the device"))),
        }
    }

    /// Layer `li`'s latent attention on the device, its step buffers and
    /// the step's rows in the block group it reads.
    fn latent(&self, li: usize) -> Result<(&'a GpuMla, &'a MlaBufs, StepRows<'a>), ModelError> {
        let Attn::Mla(a) = &self.layer(li).attn else {
            return Err(ModelError::Unsupported(format!("layer {li} has no latent attention on the device")));
        };
        let (b, g) = (self.b, self.group(li));
        let mb = b.mla.as_ref().expect("made with the MLA layers");
        let rows = StepRows {
            cos: &b.cos,
            sin: &b.sin,
            interleaved: self.m.rope.style == kernels::ops::RopeStyle::Interleaved,
            slots: &b.slots[g],
            tok: &b.tok[g],
            tables: self.tables[g],
            block: self.block,
            kv: self.shard.kv,
        };
        Ok((a, mb, rows))
    }

    /// Layer `li`'s Gated DeltaNet on the device and its step buffers.
    fn delta(&self, li: usize) -> Result<(&'a GpuDeltaNet, &'a DeltaBufs), ModelError> {
        let Attn::DeltaNet(d) = &self.layer(li).attn else {
            return Err(ModelError::Unsupported(format!("layer {li} has no linear attention on the device")));
        };
        Ok((d, self.b.delta.as_ref().expect("made with the linear layers")))
    }

    fn tp(&self) -> bool {
        self.m.shard.tp.is_some()
    }

    /// (hidden, rows, eps): an RMSNorm's shape over the residual stream.
    fn norm_shape(&self) -> (usize, usize, f32) {
        (self.m.config.hidden_size, self.n, self.m.config.rms_norm_eps)
    }

    /// A block's end: under a tensor split its partial sums in `o` are
    /// completed by the host's all-reduce (the pass is submitted first).
    fn complete(&mut self, fused: bool) -> R {
        if fused || !self.tp() {
            return Ok(());
        }
        std::mem::replace(&mut self.pass, Pass::new(self.gpu)).submit()?;
        let len = self.n * self.m.config.hidden_size;
        let mut v = self.gpu.read_f32(&self.b.o, 0, len)?;
        self.comm.all_reduce_sum(&mut v)?;
        self.gpu.write_f32(&self.b.o, 0, &v);
        Ok(())
    }

    /// Where a block writes: into `x` when fused (its last matmul adds), else `o`.
    fn dst(&self, fused: bool) -> &'a DeviceBuf {
        if fused {
            &self.b.x
        } else {
            &self.b.o
        }
    }

    /// The step rows of the block group layer `li` reads.
    fn group(&self, li: usize) -> usize {
        usize::from(self.window_group[li])
    }

    /// (q‖k‖v(‖gate) row width, hq, hkv, head_dim, local heads, local KV heads)
    fn widths(&self, a: &GpuGqa) -> (usize, usize, usize, usize, usize, usize) {
        let hd = self.m.config.head_dim;
        let (nh, nkv) = (self.m.local.n_heads, self.m.local.n_kv_heads);
        let (hq, hkv) = (nh * hd, nkv * hd);
        (hq + 2 * hkv + if a.gated { hq } else { 0 }, hq, hkv, hd, nh, nkv)
    }
}

impl LayerOps for GpuLayers<'_> {
    fn fuses_residual(&self, layer: &DecoderLayer) -> bool {
        !self.tp() && layer.post_attn_norm.is_none() && layer.post_ffn_norm.is_none()
    }

    fn input_norm(&mut self, li: usize, which: Norm) -> R {
        let l = self.layer(li);
        let w = if which == Norm::Mlp { &l.mlp_norm } else { &l.attn_norm };
        let shape = self.norm_shape();
        self.pass.rms_norm(&self.b.x, 0, w, shape, &self.b.xn, 0);
        Ok(())
    }

    fn qkv(&mut self, li: usize, _g: &Gqa) -> R {
        let a = self.gqa(li)?;
        a.qkv.record(&mut self.pass, &self.b.xn, self.n, &self.b.qkv);
        Ok(())
    }

    fn qk_norm(&mut self, li: usize, _g: &Gqa) -> R {
        let a = self.gqa(li)?;
        let (w, hq, hkv, hd, nh, nkv) = self.widths(a);
        let (n, eps, qkv) = (self.n, self.m.config.rms_norm_eps, &self.b.qkv);
        match (&a.qk_norm, a.qk_norm_whole) {
            (Some((qn, kn)), false) => {
                self.pass.rms_norm_heads(qkv, 0, qn, (hd, nh, n, eps), w);
                self.pass.rms_norm_heads(qkv, hq, kn, (hd, nkv, n, eps), w);
            }
            // One norm over all of q, one over all of k.
            (Some((qn, kn)), true) => {
                self.pass.rms_norm_heads(qkv, 0, qn, (hq, 1, n, eps), w);
                self.pass.rms_norm_heads(qkv, hq, kn, (hkv, 1, n, eps), w);
            }
            (None, _) => {}
        }
        Ok(())
    }

    fn rope_qk(&mut self, li: usize, _g: &Gqa) -> R {
        let a = self.gqa(li)?;
        let (w, _, _, hd, nh, nkv) = self.widths(a);
        let b = self.b;
        let (cos, sin) = match a.window.is_some() && self.m.rope_local.is_some() {
            true => (&b.cos_local, &b.sin_local),
            false => (&b.cos, &b.sin),
        };
        let interleaved = self.m.rope.style == kernels::ops::RopeStyle::Interleaved;
        let half = self.m.config.rope_dim / 2;
        // q's and k's heads sit side by side: one rope for both.
        self.pass.rope_rows(&b.qkv, (0, w), (self.n, nh + nkv, hd, half), cos, sin, interleaved);
        Ok(())
    }

    fn attend(&mut self, li: usize, _g: &Gqa) -> R {
        let a = self.gqa(li)?;
        let (w, hq, hkv, hd, nh, nkv) = self.widths(a);
        let (b, kv, g, n) = (self.b, self.kv, self.group(li), self.n);
        let elem = self.shard.kv;
        self.pass.kv_store(&b.qkv, hq, (n, hkv, w), &b.slots[g], &kv.k[li], elem);
        self.pass.kv_store(&b.qkv, hq + hkv, (n, hkv, w), &b.slots[g], &kv.v[li], elem);
        let scale = self.m.spec.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let (block, window) = (self.block, a.window);
        let args = AttnArgs { heads: nh, kv_heads: nkv, head_dim: hd, block, scale, window, kv: elem };
        let (pools, rows) = ((&kv.k[li], &kv.v[li]), (&b.tok[g], self.tables[g]));
        self.pass.attention(&b.qkv, (0, w), n, &args, pools, rows, a.sinks.as_ref(), &b.attn);
        Ok(())
    }

    fn output_gate(&mut self, li: usize, _g: &Gqa) -> R {
        let a = self.gqa(li)?;
        let (w, hq, hkv, ..) = self.widths(a);
        self.pass.sigmoid_mul(&self.b.attn, (self.n, hq), &self.b.qkv, (hq + 2 * hkv, w));
        Ok(())
    }

    fn attn_out(&mut self, li: usize, _g: &Gqa, fused: bool) -> R {
        let a = self.gqa(li)?;
        let (b, n) = (self.b, self.n);
        match fused {
            true => self.pass.matmul_add(&a.o, &b.attn, 0, n, &b.x, 0),
            false => self.pass.matmul(&a.o, &b.attn, 0, n, &b.o, 0),
        }
        self.complete(fused)
    }

    fn latent_project(&mut self, li: usize, _m: &Mla) -> R {
        let (a, mb, rows) = self.latent(li)?;
        a.record_project(&mut self.pass, mb, (&self.b.xn, self.n), &rows);
        Ok(())
    }

    fn latent_attend(&mut self, li: usize, _m: &Mla) -> R {
        let (a, mb, rows) = self.latent(li)?;
        a.record_attend(&mut self.pass, mb, self.n, &rows, &self.kv.k[li]);
        Ok(())
    }

    fn latent_out(&mut self, li: usize, _m: &Mla, fused: bool) -> R {
        let (a, mb, _) = self.latent(li)?;
        let dst = self.dst(fused);
        a.record_out(&mut self.pass, mb, self.n, (dst, fused));
        self.complete(fused)
    }

    fn delta_project(&mut self, li: usize, _d: &GatedDeltaNet) -> R {
        let (d, db) = self.delta(li)?;
        d.record_project(&mut self.pass, db, (&self.b.xn, self.n));
        Ok(())
    }

    fn delta_recur(&mut self, li: usize, _d: &GatedDeltaNet) -> R {
        let (d, db) = self.delta(li)?;
        let no_cache = || ModelError::Unsupported(format!("linear layer {li} has no recurrent-state cache"));
        let dev = self.states.ok_or_else(no_cache)?;
        let slots = dev.layers[li].as_ref().ok_or_else(no_cache)?;
        let undo = dev.undo_for(li, self.delta_plan, d.undo_shape())?;
        d.record_recur(&mut self.pass, db, (self.n, self.delta_plan.len()), slots, &undo);
        Ok(())
    }

    fn delta_out(&mut self, li: usize, _d: &GatedDeltaNet, fused: bool) -> R {
        let (d, db) = self.delta(li)?;
        let dst = self.dst(fused);
        d.record_out(&mut self.pass, db, self.n, (dst, fused));
        self.complete(fused)
    }

    fn gate_up_act(&mut self, li: usize, _m: &Mlp) -> R {
        let Ffn::Dense { gate_up, act, .. } = &self.layer(li).ffn else {
            return Err(ModelError::Unsupported(format!("layer {li} has no dense MLP on the device")));
        };
        let (b, n) = (self.b, self.n);
        gate_up.record(&mut self.pass, &b.xn, n, &b.gu);
        self.pass.act_mul(&b.gu, &b.gate, (n, self.m.local.ffn), *act);
        Ok(())
    }

    fn down(&mut self, li: usize, _m: &Mlp, fused: bool) -> R {
        let Ffn::Dense { down, .. } = &self.layer(li).ffn else {
            return Err(ModelError::Unsupported(format!("layer {li} has no dense MLP on the device")));
        };
        let (b, n) = (self.b, self.n);
        match fused {
            true => self.pass.matmul_add(down, &b.gate, 0, n, &b.x, 0),
            false => self.pass.matmul(down, &b.gate, 0, n, &b.o, 0),
        }
        self.complete(fused)
    }

    fn moe_route(&mut self, li: usize, _m: &Moe) -> R {
        let moe = self.experts(li)?;
        let mb = self.b.moe.as_ref().expect("made with the MoE layers");
        moe.record_route(&mut self.pass, mb, (&self.b.xn, self.n));
        Ok(())
    }

    fn moe_experts(&mut self, li: usize, _m: &Moe, fused: bool) -> R {
        let moe = self.experts(li)?;
        let mb = self.b.moe.as_ref().expect("made with the MoE layers");
        let h = self.m.config.hidden_size;
        let dst = self.dst(fused);
        moe.record_experts(&mut self.pass, mb, (&self.b.xn, self.n, h), (dst, fused));
        self.complete(fused)
    }

    fn residual(&mut self, li: usize, post_norm: Option<Norm>) -> R {
        let shape = self.norm_shape();
        if let (Some(which), Some((post_attn, post_ffn))) = (post_norm, &self.layer(li).post_norms) {
            let w = if which == Norm::PostFfn { post_ffn } else { post_attn };
            self.pass.rms_norm_inplace(&self.b.o, 0, w, shape);
        }
        self.pass.add(&self.b.x, &self.b.o, shape.0 * shape.1);
        Ok(())
    }

    fn end_layer(&mut self, _li: usize) -> R {
        // The device starts on this layer while the host records the next.
        self.pass.flush();
        Ok(())
    }
}
