//! Gated DeltaNet, the linear-attention layer of the Qwen3-Next / Qwen3.5
//! hybrids (transformers' `Qwen3NextGatedDeltaNet`), and the spec of the
//! family ([`LinearAttnSpec`]).
//!
//! ```text
//! x ─ in_proj ─┬ q,k,v ─ causal depthwise conv1d (kernel K, state: last K−1 inputs) ─ SiLU
//!              │          ─ q,k: L2 norm (q · 1/√dk), key heads shared by r = nv/nk value heads
//!              ├ b ─ β = sigmoid(b)
//!              ├ a ─ g = −exp(A_log) · softplus(a + dt_bias)
//!              │     ─ gated delta rule per value head (kernels::delta_rule, state dk × dv)
//!              └ z ─ RMSNorm(o)·w · SiLU(z) per value head ─ out_proj ─ all-reduce
//! ```
//!
//! Projection packing: Qwen3-Next fuses `in_proj_qkvz` grouped per key head
//! (`[q dk | k dk | v r·dv | z r·dv]` for each key head) and `in_proj_ba`
//! (`[b r | a r]` per key head); Qwen3.5 has `in_proj_qkv` (all q, all k, all
//! v), `in_proj_z`, `in_proj_b`, `in_proj_a`. Both load into the same three
//! local projections: `qkv` in conv-channel order (q of the local key heads,
//! their k, the v of their value heads), `z`, and `ba` (`[b | a]`).
//!
//! The family's other differences (loaded by [`crate::decoder`]): the full
//! attention layers' q projection also yields a per-head output gate
//! (`attn · sigmoid(gate)` before `o_proj`), rotary on `partial_rotary_factor`
//! of each head, and every RMSNorm but the gated one is zero-centered
//! (`(1 + w)`; llama.cpp's GGUF conversion stores `1 + w` already).
//!
//! llama.cpp's GGUFs (`formats::gguf_qwen3next`) load through the `Split`
//! names for all three archs; `qwen35`/`qwen35moe` files store the value
//! heads tiled (`j·nk + k`, [`LinearAttnSpec::tiled_v`]), kept as stored:
//! value head `p` then reads key head `p mod nk`, and a tensor rank's value
//! heads are `r` strided runs ([`LinearAttnSpec::value_heads`]).

use crate::kv_cache::{KvPool, SeqKv};
use crate::linear::Linear;
use crate::model::{AttendRows, SeqStep};
use crate::plan::TpSlice;
use crate::state_cache::{LayerUndo, StatePool, StateShape};
use crate::workspace::grow;
use crate::{slice, LoadOptions, ModelError};
use formats::{ModelConfig, SourceFormat, TensorData, WeightTensor};
use kernels::delta_rule::{self, ChunkScratch, HeadInputs, CHUNK};
use kernels::matmul::MatmulScratch;
use kernels::{DType, ThreadPool};
use serde_json::Value;
use std::ops::Range;
use std::sync::Arc;

/// How the input projections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProj {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Grouped,
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split,
}

/// The hybrid family's knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttnSpec {
    /// `linear[l]`: layer `l` is Gated DeltaNet (else gated full attention).
    pub linear: Vec<bool>,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    pub in_proj: InProj,
    /// Zero-centered `(1 + w)` RMSNorms (HF weights; GGUF stores `1 + w`).
    pub zero_centered_norms: bool,
    /// Value heads stored in llama.cpp's tiled order (qwen35 GGUFs): position
    /// `j·nk + k` holds the j-th value head of key head k (HF: `k·r + j`).
    pub tiled_v: bool,
}

impl LinearAttnSpec {
    /// From `layer_types` (`linear_attention` / `full_attention`), else
    /// `full_attention_interval` (every n-th layer full, default 4), and the
    /// `linear_*` shape keys.
    pub fn from_config(cfg: &ModelConfig, in_proj: InProj) -> Result<LinearAttnSpec, ModelError> {
        let c = crate::moe::text_config(cfg);
        let need = |k: &str| {
            c.get(k)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Config(format!("{}: '{k}' is missing", cfg.arch)))
        };
        let linear: Vec<bool> = match c.get("layer_types").and_then(Value::as_array) {
            Some(t) => t.iter().map(|v| v.as_str() == Some("linear_attention")).collect(),
            None => {
                let every = c.get("full_attention_interval").and_then(Value::as_u64).unwrap_or(4).max(1) as usize;
                (0..cfg.n_layers).map(|l| (l + 1) % every != 0).collect()
            }
        };
        if linear.len() != cfg.n_layers {
            return Err(ModelError::Config(format!(
                "{}: layer_types has {} entries for {} layers",
                cfg.arch,
                linear.len(),
                cfg.n_layers
            )));
        }
        let spec = LinearAttnSpec {
            linear,
            k_heads: need("linear_num_key_heads")?,
            v_heads: need("linear_num_value_heads")?,
            k_dim: need("linear_key_head_dim")?,
            v_dim: need("linear_value_head_dim")?,
            conv_kernel: need("linear_conv_kernel_dim")?,
            in_proj,
            zero_centered_norms: cfg.source != SourceFormat::Gguf,
            tiled_v: c.get("linear_value_heads_tiled").and_then(Value::as_bool).unwrap_or(false),
        };
        if spec.k_heads == 0 || !spec.v_heads.is_multiple_of(spec.k_heads) || spec.conv_kernel == 0 {
            return Err(ModelError::Config(format!(
                "{}: {} value heads cannot share {} key heads (conv kernel {})",
                cfg.arch, spec.v_heads, spec.k_heads, spec.conv_kernel
            )));
        }
        Ok(spec)
    }

    pub fn is_linear(&self, layer: usize) -> bool {
        self.linear.get(layer).copied().unwrap_or(false)
    }

    /// Value heads per key head.
    pub fn group(&self) -> usize {
        self.v_heads / self.k_heads
    }

    /// The key heads rank `tp` owns (all without tensor parallelism): an
    /// equal share, each with its value heads.
    pub fn local_key_heads(&self, tp: Option<&TpSlice>) -> Result<Range<usize>, ModelError> {
        let Some(tp) = tp else { return Ok(0..self.k_heads) };
        let ranks = tp.weights.len().max(1);
        if !self.k_heads.is_multiple_of(ranks) {
            return Err(ModelError::Unsupported(format!(
                "cannot split {} linear-attention key heads over {ranks} tensor-parallel ranks",
                self.k_heads
            )));
        }
        let per = self.k_heads / ranks;
        Ok(tp.rank * per..(tp.rank + 1) * per)
    }

    /// The stored positions of the value heads of key heads `kh`, as ranges in
    /// the order the rank keeps them: grouped, `kh.start·r..kh.end·r`; tiled,
    /// for each j < r the positions `j·nk + k` of those key heads (one range
    /// when `kh` is every key head). Local value head p then belongs to local
    /// key head `p / r` (grouped) or `p mod kh.len()` (tiled).
    pub fn value_heads(&self, kh: &Range<usize>) -> Vec<Range<usize>> {
        let (nk, r) = (self.k_heads, self.group());
        if !self.tiled_v || kh.len() == nk {
            let all = if self.tiled_v { 0..self.v_heads } else { kh.start * r..kh.end * r };
            return std::iter::once(all).collect();
        }
        (0..r).map(|j| j * nk + kh.start..j * nk + kh.end).collect()
    }

    /// The state shape of a linear layer holding `key_heads` key heads.
    pub fn state_shape(&self, key_heads: usize) -> StateShape {
        let v_heads = key_heads * self.group();
        StateShape {
            conv_channels: 2 * key_heads * self.k_dim + v_heads * self.v_dim,
            conv_kernel: self.conv_kernel,
            v_heads,
            dk: self.k_dim,
            dv: self.v_dim,
        }
    }
}

/// Adds 1 to a zero-centered norm's weights (`(1 + w)` RMSNorm) when the spec says so.
pub fn center_norm(spec: Option<&LinearAttnSpec>, mut w: Vec<f32>) -> Vec<f32> {
    if spec.is_some_and(|s| s.zero_centered_norms) {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
    w
}

/// Rows `ranges` of a 2-D weight, concatenated, owned.
pub(crate) fn gather_rows(w: &WeightTensor, ranges: &[Range<usize>]) -> WeightTensor {
    if let [r] = ranges {
        return slice::rows(w, r.clone());
    }
    let row_bytes = w.dtype.bytes_for(w.shape[1..].iter().product()).expect("rows are whole blocks");
    let src = w.row_major();
    let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum::<usize>() * row_bytes);
    for r in ranges {
        out.extend_from_slice(&src[r.start * row_bytes..r.end * row_bytes]);
    }
    let mut shape = w.shape.clone();
    shape[0] = ranges.iter().map(|r| r.len()).sum();
    WeightTensor {
        name: w.name.clone(),
        dtype: w.dtype,
        shape,
        data: TensorData::Owned(Arc::new(out)),
        out_scale: w.out_scale,
    }
}

/// Columns `ranges` of a 2-D weight, concatenated, owned (a rank's tiled
/// value heads of `out_proj`): whole blocks copied when every range is
/// block-aligned, else widened to f32.
pub(crate) fn gather_cols(w: &WeightTensor, ranges: &[Range<usize>]) -> WeightTensor {
    let (n_rows, n_cols) = (w.shape[0], w.shape[1]);
    let block = w.dtype.block_elems();
    let aligned = ranges.iter().all(|r| r.start.is_multiple_of(block) && r.end.is_multiple_of(block));
    let width: usize = ranges.iter().map(|r| r.len()).sum();
    let src = w.row_major();
    let (dtype, out) = if aligned {
        let (rb, bb) = (w.dtype.bytes_for(n_cols).expect("rows are whole blocks"), w.dtype.block_bytes());
        let mut out = Vec::with_capacity(n_rows * width / block * bb);
        for row in src.chunks_exact(rb) {
            for r in ranges {
                out.extend_from_slice(&row[r.start / block * bb..r.end / block * bb]);
            }
        }
        (w.dtype, out)
    } else {
        let all = w.to_f32();
        let mut out = Vec::with_capacity(n_rows * width * 4);
        for row in all.chunks_exact(n_cols) {
            for r in ranges {
                out.extend(row[r.clone()].iter().flat_map(|v| v.to_le_bytes()));
            }
        }
        (DType::F32, out)
    };
    WeightTensor {
        name: w.name.clone(),
        dtype,
        shape: vec![n_rows, width],
        data: TensorData::Owned(Arc::new(out)),
        out_scale: w.out_scale,
    }
}

/// The weights of one Gated DeltaNet layer (this rank's key heads).
#[derive(Debug)]
pub struct GatedDeltaNet {
    /// `[C, hidden]`, C = conv channels in conv order (q, k, v).
    pub qkv: Linear,
    /// `[v_heads·dv, hidden]`.
    pub z: Linear,
    /// `[2·v_heads, hidden]`: b then a.
    pub ba: Linear,
    /// Depthwise conv taps, tap-major `[K × C]` (contiguous over channels).
    pub conv: Vec<f32>,
    /// `−exp(A_log)` per local value head.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight, `[dv]` (plain `w`, not zero-centered).
    pub norm: Vec<f32>,
    /// `[hidden, v_heads·dv]`, row-parallel.
    pub out: Linear,
    pub shape: StateShape,
    pub key_heads: usize,
    /// Value heads in the tiled order ([`LinearAttnSpec::tiled_v`]).
    pub tiled: bool,
    pub eps: f32,
}

impl GatedDeltaNet {
    /// Loads layer `ld`'s `linear_attn.*` for the key heads `kh` (and their value heads).
    pub(crate) fn load(
        ld: &crate::decoder::LayerLoader<'_>,
        spec: &LinearAttnSpec,
        kh: Range<usize>,
        cfg: &ModelConfig,
        opts: &LoadOptions,
    ) -> Result<GatedDeltaNet, ModelError> {
        let h = ld.hidden();
        let (nk, nv, dk, dv, r) = (spec.k_heads, spec.v_heads, spec.k_dim, spec.v_dim, spec.group());
        // This rank's value heads (stored positions; several ranges only for
        // tiled heads split over ranks) and their channels / rows / columns.
        let vh = spec.value_heads(&kh);
        let (key, val) = (nk * dk, nv * dv);
        let span = |r: &Range<usize>, w: usize| r.start * w..r.end * w;
        let spans = |off: usize, w: usize| vh.iter().map(|r| off + r.start * w..off + r.end * w).collect::<Vec<_>>();
        let q_ch = span(&kh, dk);
        let k_ch = key + q_ch.start..key + q_ch.end;
        let v_ch = spans(2 * key, dv);
        let lin = |w: WeightTensor| -> Result<Linear, ModelError> {
            Ok(Linear::new(crate::decoder::quantized(w, opts)?, None))
        };
        let (qkv, z, ba) = match spec.in_proj {
            InProj::Split => {
                let w = ld.weight("linear_attn.in_proj_qkv.weight", &[2 * key + val, h])?;
                let zw = ld.weight("linear_attn.in_proj_z.weight", &[val, h])?;
                let b = ld.weight("linear_attn.in_proj_b.weight", &[nv, h])?;
                let a = ld.weight("linear_attn.in_proj_a.weight", &[nv, h])?;
                let ba = gather_rows(
                    &WeightTensor {
                        shape: vec![2 * nv, h],
                        data: TensorData::Owned(Arc::new([b.row_major(), a.row_major()].concat())),
                        ..b.clone()
                    },
                    &[spans(0, 1), spans(nv, 1)].concat(),
                );
                let qkv = gather_rows(w, &[vec![q_ch.clone(), k_ch.clone()], v_ch.clone()].concat());
                (qkv, gather_rows(zw, &spans(0, dv)), ba)
            }
            InProj::Grouped => {
                let g = 2 * dk + 2 * r * dv;
                let w = ld.weight("linear_attn.in_proj_qkvz.weight", &[nk * g, h])?;
                let bw = ld.weight("linear_attn.in_proj_ba.weight", &[2 * nv, h])?;
                let part =
                    |off: usize, len: usize| kh.clone().map(|k| k * g + off..k * g + off + len).collect::<Vec<_>>();
                let ranges = [part(0, dk), part(dk, dk), part(2 * dk, r * dv)].concat();
                let b_rows = kh.clone().map(|k| 2 * r * k..2 * r * k + r);
                let a_rows = kh.clone().map(|k| 2 * r * k + r..2 * r * (k + 1));
                let ba_ranges: Vec<_> = b_rows.chain(a_rows).collect();
                (gather_rows(w, &ranges), gather_rows(w, &part(2 * dk + r * dv, r * dv)), gather_rows(bw, &ba_ranges))
            }
        };
        let k = spec.conv_kernel;
        let conv_all = ld.weight("linear_attn.conv1d.weight", &[2 * key + val, 1, k])?.to_f32();
        let by_channel: Vec<f32> = [vec![q_ch, k_ch], v_ch.clone()]
            .concat()
            .iter()
            .flat_map(|c| conv_all[c.start * k..c.end * k].to_vec())
            .collect();
        let n_ch = by_channel.len() / k;
        let conv = (0..k * n_ch).map(|i| by_channel[(i % n_ch) * k + i / n_ch]).collect();
        // HF keeps A_log; llama.cpp's GGUFs `ssm_a` = −exp(A_log) itself.
        let neg_a_all: Vec<f32> = match ld.has("linear_attn.ssm_a") {
            true => ld.vector("linear_attn.ssm_a", nv)?,
            false => ld.vector("linear_attn.A_log", nv)?.iter().map(|v| -v.exp()).collect(),
        };
        let dt_all = ld.vector("linear_attn.dt_bias", nv)?;
        let pick = |v: &[f32]| vh.iter().flat_map(|r| v[r.clone()].to_vec()).collect::<Vec<f32>>();
        let out_w = ld.weight("linear_attn.out_proj.weight", &[h, val])?;
        let out = match &v_ch[..] {
            [_] => ld.row_par_of(out_w, &spans(0, dv)[0])?,
            _ => Linear::new(crate::decoder::quantized(gather_cols(out_w, &spans(0, dv)), opts)?, None),
        };
        Ok(GatedDeltaNet {
            qkv: lin(qkv)?,
            z: lin(z)?,
            ba: Linear::new(ba, None),
            conv,
            neg_a: pick(&neg_a_all),
            dt_bias: pick(&dt_all),
            norm: ld.vector("linear_attn.norm.weight", dv)?,
            out,
            shape: spec.state_shape(kh.len()),
            key_heads: kh.len(),
            tiled: spec.tiled_v,
            eps: cfg.rms_norm_eps,
        })
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.qkv, &self.z, &self.ba, &self.out].iter().map(|l| l.weight_bytes()).sum()
    }

    pub fn is_quantized(&self) -> bool {
        self.qkv.weight.dtype.is_quantized()
    }

    /// The fused input projections of `xn`: each row's q‖k‖v (`ws.qkv`),
    /// output gate `z` and β/decay inputs `b, a`.
    pub fn project_rows(
        &self,
        pool: &ThreadPool,
        xn: &[f32],
        n: usize,
        ws: &mut LinearAttnScratch,
        mm: &mut MatmulScratch,
    ) {
        let s = self.shape;
        let (c, vw, nv) = (s.conv_channels, s.v_heads * s.dv, s.v_heads);
        grow(&mut ws.qkv, n * c);
        grow(&mut ws.z, n * vw);
        grow(&mut ws.ba, n * 2 * nv);
        Linear::forward_many(
            pool,
            &[&self.qkv, &self.z, &self.ba],
            xn,
            n,
            &mut [&mut ws.qkv, &mut ws.z, &mut ws.ba],
            mm,
        );
    }

    /// The recurrence over the projected rows: per sequence, the way back
    /// of a speculative step if asked, the causal conv with SiLU, the delta
    /// rule on the slot's state (advancing it), then the gated RMSNorm, into
    /// `ws.core` (`n × v_heads·dv`).
    pub fn recur_rows(
        &self,
        pool: &ThreadPool,
        n: usize,
        seqs: &mut [SeqStep<'_>],
        mut paged: Option<&mut KvPool>,
        li: usize,
        ws: &mut LinearAttnScratch,
    ) -> Result<(), ModelError> {
        let s = self.shape;
        let (c, vw) = (s.conv_channels, s.v_heads * s.dv);
        grow(&mut ws.conv, n * c);
        grow(&mut ws.core, n * vw);
        ws.tasks.clear();
        let mut row = 0;
        for sq in seqs.iter_mut() {
            let len = sq.tokens.len();
            let start = sq.cache.start();
            let verify = sq.attend_rows() == AttendRows::Verify && len > 1;
            let states = seq_states(&mut sq.cache, paged.as_deref_mut())?;
            let (conv_state, rec, undo) = states.0.layer_slot_undo(li, states.1).ok_or_else(|| {
                ModelError::Unsupported(format!("owned layer {li} has no recurrent state in this cache"))
            })?;
            let x = &ws.qkv[row * c..(row + len) * c];
            let replay = self.take_back_conv(conv_state, undo);
            if verify {
                self.keep_way_back(conv_state, x, start, undo);
            } else {
                undo.rows = 0;
            }
            self.conv_silu(x, conv_state, &mut ws.conv[row * c..(row + len) * c]);
            ws.tasks.push(SeqTask {
                row,
                len,
                start,
                rec: rec.as_mut_ptr() as usize,
                replay,
                verify,
                before: undo.before.as_mut_ptr().wrapping_add(s.conv_len()) as usize,
                heads: undo.heads.as_mut_ptr() as usize,
            });
            row += len;
        }
        self.heads(pool, ws);
        // Gated RMSNorm per (token, value head): RMSNorm(o)·w · SiLU(z).
        let dv = s.dv;
        for (o, z) in ws.core[..n * vw].chunks_exact_mut(dv).zip(ws.z[..n * vw].chunks_exact(dv)) {
            let inv = 1.0 / (o.iter().map(|v| v * v).sum::<f32>() / dv as f32 + self.eps).sqrt();
            for j in 0..dv {
                o[j] = o[j] * inv * self.norm[j] * (z[j] / (1.0 + (-z[j]).exp()));
            }
        }
        Ok(())
    }

    /// The output projection of `ws.core` into `out` (`n × hidden`, to be all-reduced).
    pub fn out_rows(
        &self,
        pool: &ThreadPool,
        n: usize,
        out: &mut [f32],
        ws: &mut LinearAttnScratch,
        mm: &mut MatmulScratch,
    ) {
        self.out.forward(pool, &ws.core, n, out, mm);
    }

    /// Causal depthwise conv1d + SiLU of one sequence's rows `x` (`len × C`)
    /// into `y`, continuing from `state` (the previous `K − 1` inputs, oldest
    /// first; zeros at position 0), which it then advances.
    fn conv_silu(&self, x: &[f32], state: &mut [f32], y: &mut [f32]) {
        let (c, k) = (self.shape.conv_channels, self.shape.conv_kernel);
        let len = x.len() / c.max(1);
        let hist = k - 1;
        // Input u of the concatenation [state rows ‖ x rows].
        let input =
            |u: usize| if u < hist { &state[u * c..(u + 1) * c] } else { &x[(u - hist) * c..(u - hist + 1) * c] };
        for t in 0..len {
            let yr = &mut y[t * c..(t + 1) * c];
            yr.fill(0.0);
            for j in 0..k {
                let (xr, w) = (input(t + j), &self.conv[j * c..(j + 1) * c]);
                for ch in 0..c {
                    yr[ch] += w[ch] * xr[ch];
                }
            }
            yr.iter_mut().for_each(|v| *v /= 1.0 + (-*v).exp());
        }
        advance_conv_state(state, x, c, hist);
    }

    /// Takes back the rejected rows of this layer's last verify step of the
    /// slot, if [`StatePool::begin_step`] asked for it: the conv state here
    /// (the saved state advanced over the accepted rows' inputs); returns how
    /// many rows the heads replay into the recurrent state ([`Self::heads`]).
    fn take_back_conv(&self, conv_state: &mut [f32], undo: &mut LayerUndo) -> usize {
        let m = std::mem::take(&mut undo.replay);
        if m == 0 {
            return 0;
        }
        let (c, hist) = (self.shape.conv_channels, self.shape.conv_kernel - 1);
        conv_state.copy_from_slice(&undo.before[..conv_state.len()]);
        advance_conv_state(conv_state, &undo.conv_in[..m * c], c, hist);
        m
    }

    /// Before a verify step of `x` (`rows × C`) from `start`: sizes the
    /// slot's way back and keeps the conv state and inputs (the heads keep
    /// the recurrent state and their inputs, [`Self::heads`]). The heads'
    /// buffer keeps the rows already in it: a replay still reads them.
    fn keep_way_back(&self, conv_state: &[f32], x: &[f32], start: usize, undo: &mut LayerUndo) {
        let s = self.shape;
        let rows = x.len() / s.conv_channels.max(1);
        undo.before.resize(s.len(), 0.0);
        undo.before[..s.conv_len()].copy_from_slice(conv_state);
        undo.conv_in.clear();
        undo.conv_in.extend_from_slice(x);
        let need = rows * s.v_heads * LayerUndo::stride(&s);
        if undo.heads.len() < need {
            undo.heads.resize(need, 0.0);
        }
        (undo.start, undo.rows) = (start, rows);
    }

    /// The delta rule of every (sequence, value head), split over the pool's
    /// threads: gathers the head's q, k (L2-normalized, q scaled), v, g and β,
    /// runs the kernel (one token: the recurrent step; more: the chunked form,
    /// chunks aligned to absolute positions so any split of a prompt at
    /// multiples of [`CHUNK`] gives the same bits), and writes `ws.core`.
    fn heads(&self, pool: &ThreadPool, ws: &mut LinearAttnScratch) {
        let s = self.shape;
        let (c, dk, dv, nv) = (s.conv_channels, s.dk, s.dv, s.v_heads);
        let r = nv / self.key_heads.max(1);
        let nkl = self.key_heads.max(1);
        let tiled = self.tiled;
        let (kq, vw) = (self.key_heads * dk, nv * dv);
        let nt = pool.n_threads();
        while ws.threads.len() < nt {
            ws.threads.push(HeadScratch::default());
        }
        let n_tasks = ws.tasks.len() * nv;
        let threads = Shared(ws.threads.as_mut_ptr());
        let core = Shared(ws.core.as_mut_ptr());
        let (conv, ba, tasks) = (&ws.conv, &ws.ba, &ws.tasks);
        let scale = 1.0 / (dk as f32).sqrt();
        pool.run(|t, nt| {
            // SAFETY: thread t alone uses ws.threads[t] (len ≥ nt, checked above).
            let hs = unsafe { &mut *threads.at(t) };
            for task in (t..n_tasks).step_by(nt) {
                let (sq, h) = (&tasks[task / nv], task % nv);
                // The value head's key head: grouped `h / r`, tiled `h mod nk`.
                let (len, kh) = (sq.len, if tiled { h % nkl } else { h / r });
                hs.rows.size(len, dk, dv);
                for i in 0..len {
                    let x = &conv[(sq.row + i) * c..(sq.row + i + 1) * c];
                    hs.rows.q[i * dk..(i + 1) * dk].copy_from_slice(&x[kh * dk..(kh + 1) * dk]);
                    hs.rows.k[i * dk..(i + 1) * dk].copy_from_slice(&x[kq + kh * dk..kq + (kh + 1) * dk]);
                    hs.rows.v[i * dv..(i + 1) * dv].copy_from_slice(&x[2 * kq + h * dv..2 * kq + (h + 1) * dv]);
                    let bar = &ba[(sq.row + i) * 2 * nv..(sq.row + i + 1) * 2 * nv];
                    hs.rows.beta[i] = 1.0 / (1.0 + (-bar[h]).exp());
                    hs.rows.g[i] = self.neg_a[h] * softplus(bar[nv + h] + self.dt_bias[h]);
                }
                delta_rule::l2norm_rows(&mut hs.rows.q[..len * dk], dk, 1e-6);
                delta_rule::l2norm_rows(&mut hs.rows.k[..len * dk], dk, 1e-6);
                hs.rows.q[..len * dk].iter_mut().for_each(|v| *v *= scale);
                // SAFETY: each (sequence, head) state is a disjoint dk × dv
                // block of its slot, and each task is run by one thread.
                let st = unsafe { std::slice::from_raw_parts_mut((sq.rec as *mut f32).add(h * dk * dv), dk * dv) };
                // The slot's way back from its last verify step (this head's
                // saved state; every row's inputs at `[row][head]`).
                let stride = 2 * dk + dv + 2;
                // SAFETY: as `st`, head h's dk × dv block of the saved state.
                let before =
                    || unsafe { std::slice::from_raw_parts_mut((sq.before as *mut f32).add(h * dk * dv), dk * dv) };
                // SAFETY: row i's head-h inputs are written and read by this task only.
                let saved = |i: usize| unsafe {
                    std::slice::from_raw_parts_mut((sq.heads as *mut f32).add((i * nv + h) * stride), stride)
                };
                if sq.replay > 0 {
                    st.copy_from_slice(before());
                    replay_rows(st, sq.replay, &saved, (dk, dv), &mut hs.replay, &mut hs.chunk);
                }
                if sq.verify {
                    before().copy_from_slice(st);
                    (0..len).for_each(|i| hs.rows.save_row(i, dk, dv, saved(i)));
                }
                let (x, o) = hs.rows.split(len, dk, dv);
                // A verify step's rows each run as the decode step of their
                // position would (the token loop), so accepted rows match
                // plain decoding bit for bit and a replay recomputes them.
                if len == 1 || sq.verify {
                    delta_rule::recurrent(st, &x, dk, dv, o, &mut hs.chunk);
                } else {
                    // The first piece up to the next multiple of CHUNK, then whole chunks.
                    let first = ((CHUNK - sq.start % CHUNK) % CHUNK).min(len);
                    for (a, b) in [(0, first), (first, len)] {
                        if a == b {
                            continue;
                        }
                        let part = HeadInputs {
                            q: &x.q[a * dk..b * dk],
                            k: &x.k[a * dk..b * dk],
                            v: &x.v[a * dv..b * dv],
                            g: &x.g[a..b],
                            beta: &x.beta[a..b],
                        };
                        delta_rule::chunked(st, &part, dk, dv, &mut o[a * dv..b * dv], &mut hs.chunk);
                    }
                }
                for i in 0..len {
                    // SAFETY: row sq.row + i, columns of head h: written by this task only.
                    let dst = unsafe { std::slice::from_raw_parts_mut(core.at((sq.row + i) * vw + h * dv), dv) };
                    dst.copy_from_slice(&hs.rows.o[i * dv..(i + 1) * dv]);
                }
            }
        });
    }
}

/// The last `K − 1` inputs of `[state ‖ x]` (`x`: rows of `c` channels) into
/// `state` (`hist = K − 1` rows, oldest first).
fn advance_conv_state(state: &mut [f32], x: &[f32], c: usize, hist: usize) {
    let len = x.len() / c.max(1);
    if len >= hist {
        state.copy_from_slice(&x[(len - hist) * c..len * c]);
    } else if hist > 0 {
        state.copy_within(len * c.., 0);
        state[(hist - len) * c..].copy_from_slice(x);
    }
}

/// Runs the first `m` saved rows of a verify step (`saved(i)`: row i's q, k,
/// v, g, β of this head) through the recurrent kernel into `st`, which holds
/// the state before that step.
fn replay_rows<'a>(
    st: &mut [f32],
    m: usize,
    saved: &impl Fn(usize) -> &'a mut [f32],
    (dk, dv): (usize, usize),
    buf: &mut HeadRows,
    chunk: &mut ChunkScratch,
) {
    buf.size(m, dk, dv);
    (0..m).for_each(|i| buf.load_row(i, dk, dv, saved(i)));
    let (x, o) = buf.split(m, dk, dv);
    delta_rule::recurrent(st, &x, dk, dv, o, chunk);
}

/// torch's `softplus` (threshold 20: linear above).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The state pool and slot a sequence's states live in.
fn seq_states<'a>(
    cache: &'a mut SeqKv<'_>,
    paged: Option<&'a mut KvPool>,
) -> Result<(&'a mut StatePool, usize), ModelError> {
    let missing = || ModelError::Unsupported("a linear-attention model needs a recurrent-state cache".into());
    match cache {
        SeqKv::Own(c) => Ok((c.states.as_mut().ok_or_else(missing)?, 0)),
        SeqKv::Paged { state, .. } => {
            let slot = state.ok_or_else(missing)? as usize;
            Ok((paged.and_then(|p| p.states.as_mut()).ok_or_else(missing)?, slot))
        }
    }
}

/// Before a step's layers: every sequence's state slot is checked to continue
/// where it stopped (or cleared, at position 0) and moved to the step's end.
pub fn begin_states(seqs: &mut [SeqStep<'_>], mut paged: Option<&mut KvPool>) -> Result<(), ModelError> {
    for s in seqs.iter_mut() {
        let (start, len) = (s.cache.start(), s.tokens.len());
        let (pool, slot) = seq_states(&mut s.cache, paged.as_deref_mut())?;
        pool.begin_step(slot, start, len)?;
    }
    Ok(())
}

/// A raw pointer shared by the pool's threads; the users keep their
/// accesses disjoint (see the SAFETY notes at the uses).
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: only used for disjoint per-thread / per-task regions.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The element `i` places on (a method, so closures capture the whole
    /// wrapper rather than its raw-pointer field).
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

/// One sequence's share of a step: its rows, first position, and its slot's
/// recurrent state (as an address, to cross into the pool's threads), with
/// the slot's way back from verify steps ([`LayerUndo`]: rows to replay
/// first, whether this step is one to keep a way back from, and the
/// addresses of the saved recurrent state and rows' inputs).
#[derive(Debug, Clone, Copy)]
struct SeqTask {
    row: usize,
    len: usize,
    start: usize,
    rec: usize,
    replay: usize,
    verify: bool,
    before: usize,
    heads: usize,
}

/// A thread's gather buffers for one head.
#[derive(Debug, Default)]
struct HeadScratch {
    rows: HeadRows,
    chunk: ChunkScratch,
    /// A verify step's accepted rows, replayed ([`replay_rows`]).
    replay: HeadRows,
}

/// One head's delta-rule inputs for `len` rows (`q`, `k` `[len × dk]`, `v`
/// `[len × dv]`, `g`, `β` `[len]`) and its output `o` `[len × dv]`.
#[derive(Debug, Default)]
struct HeadRows {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    o: Vec<f32>,
}

impl HeadRows {
    fn size(&mut self, len: usize, dk: usize, dv: usize) {
        grow(&mut self.q, len * dk);
        grow(&mut self.k, len * dk);
        grow(&mut self.v, len * dv);
        grow(&mut self.o, len * dv);
        grow(&mut self.g, len);
        grow(&mut self.beta, len);
    }

    /// The first `len` rows' inputs, and the output buffer.
    fn split(&mut self, len: usize, dk: usize, dv: usize) -> (HeadInputs<'_>, &mut [f32]) {
        let HeadRows { q, k, v, g, beta, o } = self;
        let x =
            HeadInputs { q: &q[..len * dk], k: &k[..len * dk], v: &v[..len * dv], g: &g[..len], beta: &beta[..len] };
        (x, o)
    }

    /// Row `i` into a saved row of [`LayerUndo::heads`] (`q | k | v | g | β`).
    fn save_row(&self, i: usize, dk: usize, dv: usize, row: &mut [f32]) {
        row[..dk].copy_from_slice(&self.q[i * dk..(i + 1) * dk]);
        row[dk..2 * dk].copy_from_slice(&self.k[i * dk..(i + 1) * dk]);
        row[2 * dk..2 * dk + dv].copy_from_slice(&self.v[i * dv..(i + 1) * dv]);
        row[2 * dk + dv] = self.g[i];
        row[2 * dk + dv + 1] = self.beta[i];
    }

    /// [`HeadRows::save_row`] back.
    fn load_row(&mut self, i: usize, dk: usize, dv: usize, row: &[f32]) {
        self.q[i * dk..(i + 1) * dk].copy_from_slice(&row[..dk]);
        self.k[i * dk..(i + 1) * dk].copy_from_slice(&row[dk..2 * dk]);
        self.v[i * dv..(i + 1) * dv].copy_from_slice(&row[2 * dk..2 * dk + dv]);
        self.g[i] = row[2 * dk + dv];
        self.beta[i] = row[2 * dk + dv + 1];
    }
}

/// Buffers of linear-attention layers (and the gated attention's gate).
#[derive(Debug, Default)]
pub struct LinearAttnScratch {
    qkv: Vec<f32>,
    conv: Vec<f32>,
    z: Vec<f32>,
    ba: Vec<f32>,
    core: Vec<f32>,
    tasks: Vec<SeqTask>,
    threads: Vec<HeadScratch>,
    /// The full-attention layers' output gate, `T × heads·head_dim`.
    pub(crate) attn_gate: Vec<f32>,
}

/// `attn · sigmoid(gate)`, elementwise (the gated attention's output gate).
pub(crate) fn apply_output_gate(attn: &mut [f32], gate: &[f32]) {
    for (a, g) in attn.iter_mut().zip(gate) {
        *a /= 1.0 + (-*g).exp();
    }
}
