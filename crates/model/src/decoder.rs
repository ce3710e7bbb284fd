//! The common pre-norm decoder layer: the attention block the architecture
//! chose for this layer ([`Attention`]), then its feed-forward block
//! ([`FeedForward`]):
//!
//! ```text
//! x ─ RMSNorm ─ q,k,v ─(q/k norm)─ rope ─ attention ─ o ─ all-reduce ─(+x)
//!             │ or latent attention (crate::mla) ───────┘
//!   ─ RMSNorm ─ dense MLP: gate,up ─ silu·mul ─ down  ─ all-reduce ─(+x)
//!             │ or MoE: router ─ top-k experts (+ shared) ─┘
//! ```
//!
//! Shapes (local to the shard): `T` tokens in the step, `hq = heads·head_dim`,
//! `hkv = kv_heads·head_dim`, `ffn` = intermediate size.

use crate::arch::{ArchSpec, AttnKind, FfnKind, NormPlacement};
use crate::linear::{make_resident, pack_for_decode, quantize_weight, Linear};
use crate::linear_attn::{center_norm, gather_rows, GatedDeltaNet};
use crate::mla::Mla;
use crate::moe::{Mlp, Moe};
use crate::plan::TpSlice;
use crate::slice;
use crate::{LoadOptions, ModelError};
use formats::{ModelConfig, TensorStore, WeightTensor};
use std::ops::Range;

#[derive(Debug)]
pub struct DecoderLayer {
    pub attn_norm: Vec<f32>,
    pub attn: Attention,
    pub mlp_norm: Vec<f32>,
    pub ffn: FeedForward,
    /// Sandwich norms ([`crate::arch::NormPlacement::Sandwich`]): on the
    /// attention output and on the MLP output, before each residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// The attention block of a layer.
#[derive(Debug)]
pub enum Attention {
    /// Grouped-query attention: per-head K and V rows in the cache.
    Gqa(Box<Gqa>),
    /// Multi-head latent attention: one latent row per position in the cache.
    Mla(Box<Mla>),
    /// Gated DeltaNet: a fixed-size state per sequence ([`crate::linear_attn`]).
    Linear(Box<GatedDeltaNet>),
}

/// The projections of a GQA block (this rank's heads).
#[derive(Debug)]
pub struct Gqa {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// Per head (`[head_dim]`), or this rank's part of a whole-projection
    /// norm (`[local heads · head_dim]`, [`Gqa::qk_norm_whole`]).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// The q/k norms span every head of the projection (MiniMax-M2).
    pub qk_norm_whole: bool,
    /// This layer's sliding window ([`ArchSpec::attention`]).
    pub window: Option<usize>,
    /// Attention sinks of this rank's query heads (gpt-oss).
    pub sinks: Option<Vec<f32>>,
    /// The output gate (Qwen3-Next's gated attention): `attn · sigmoid(gate(x))`
    /// before `o`, this rank's heads' rows of the doubled q projection.
    pub gate: Option<Linear>,
}

impl Attention {
    /// Weight bytes one decoded token reads.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Attention::Gqa(g) => [&g.q, &g.k, &g.v, &g.o].iter().map(|l| l.weight_bytes()).sum(),
            Attention::Mla(m) => m.weight_bytes(),
            Attention::Linear(l) => l.weight_bytes(),
        }
    }

    /// Whether the weights are stored quantized (picks the default cache type).
    pub fn is_quantized(&self) -> bool {
        match self {
            Attention::Gqa(g) => g.q.weight.dtype.is_quantized(),
            Attention::Mla(m) => m.is_quantized(),
            Attention::Linear(l) => l.is_quantized(),
        }
    }
}

/// The feed-forward block of a layer.
#[derive(Debug)]
pub enum FeedForward {
    /// The dense SwiGLU MLP of width `intermediate_size`.
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

impl FeedForward {
    /// Weight bytes one decoded token reads (for a MoE: the active experts').
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            FeedForward::Dense(m) => m.bytes(),
            FeedForward::Moe(m) => m.weight_bytes_per_token(),
        }
    }
}

/// The weight as the kernels will read it: quantized at load if asked, then
/// packed for the decode kernels where the type has a packed layout, or
/// copied onto huge pages as it is.
pub(crate) fn quantized(w: WeightTensor, opts: &LoadOptions) -> Result<WeightTensor, ModelError> {
    let w = match opts.quantize {
        Some(target) => quantize_weight(w, target)?,
        None => w,
    };
    // Packed where the type has a packed layout, else copied onto huge pages.
    Ok(if opts.keep_file_layout { w } else { make_resident(pack_for_decode(w)) })
}

fn vector(store: &TensorStore, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    Ok(store.get_shaped(name, &[len])?.to_f32())
}

/// An RMSNorm weight as the forward pass multiplies by it: `1 + w` when the
/// architecture stores `w − 1` ([`crate::arch::NormSpec::plus_one`]).
pub(crate) fn norm_weight(
    store: &TensorStore,
    name: &str,
    len: usize,
    spec: &ArchSpec,
) -> Result<Vec<f32>, ModelError> {
    let mut w = vector(store, name, len)?;
    if spec.norm.plus_one {
        w.iter_mut().for_each(|v| *v += 1.0);
    }
    Ok(w)
}

/// Loads the projections of one layer (`model.layers.N.` + name), sliced for a
/// tensor-parallel rank when there is one.
pub(crate) struct LayerLoader<'a> {
    store: &'a TensorStore,
    prefix: String,
    hidden: usize,
    tp: Option<&'a TpSlice>,
    opts: &'a LoadOptions,
}

impl LayerLoader<'_> {
    /// "All-to-sharded" (`[out, hidden]`): keeps output rows `rows`.
    pub fn col_par(&self, name: &str, out: usize, rows: &Range<usize>, bias: bool) -> Result<Linear, ModelError> {
        let p = &self.prefix;
        let w = self.store.get_shaped(&format!("{p}{name}.weight"), &[out, self.hidden])?;
        let b =
            if bias { Some(vector(self.store, &format!("{p}{name}.bias"), out)?[rows.clone()].to_vec()) } else { None };
        self.col_par_of(w, rows, b)
    }

    /// [`Self::col_par`] of a weight already in hand.
    pub fn col_par_of(&self, w: &WeightTensor, rows: &Range<usize>, b: Option<Vec<f32>>) -> Result<Linear, ModelError> {
        Ok(Linear::new(quantized(slice::rows(w, rows.clone()), self.opts)?, b))
    }

    /// "Sharded-to-all" (`[hidden, inp]`): keeps input columns `cols`.
    pub fn row_par(&self, name: &str, inp: usize, cols: &Range<usize>) -> Result<Linear, ModelError> {
        self.row_par_of(self.store.get_shaped(&format!("{}{name}.weight", self.prefix), &[self.hidden, inp])?, cols)
    }

    /// [`Self::row_par`] of a weight already in hand.
    pub fn row_par_of(&self, full: &WeightTensor, cols: &Range<usize>) -> Result<Linear, ModelError> {
        // Exact mode keeps whole input rows and splits the output instead.
        let w = match self.tp {
            Some(tp) if tp.exact => slice::rows(full, tp.hidden.clone()),
            _ => slice::cols(full, cols.clone()),
        };
        Ok(Linear::new(quantized(w, self.opts)?, None))
    }

    /// A small `[out, hidden]` weight every rank holds whole and keeps in the
    /// file's type (routers: their choices must not move with `--quantize`).
    /// A one-row weight may also be stored as a `[hidden]` vector (GGUF).
    pub fn replicated(&self, name: &str, out: usize, bias: bool) -> Result<Linear, ModelError> {
        let b = if bias { Some(vector(self.store, &format!("{}{name}.bias", self.prefix), out)?) } else { None };
        let name = format!("{}{name}.weight", self.prefix);
        let w = match self.store.get(&name)? {
            w if out == 1 && w.shape == [self.hidden] => WeightTensor { shape: vec![1, self.hidden], ..w.clone() },
            _ => self.store.get_shaped(&name, &[out, self.hidden])?.clone(),
        };
        Ok(Linear::new(w, b))
    }

    /// Tensor `name` of the layer as stored (no `.weight` appended).
    pub fn tensor(&self, name: &str) -> Result<&WeightTensor, ModelError> {
        Ok(self.store.get(&format!("{}{name}", self.prefix))?)
    }

    /// Row `row` of a stacked `[n, len]` tensor as f32 values (one expert's
    /// bias), converting only that row.
    pub fn row_values(&self, name: &str, [n, len]: [usize; 2], row: usize) -> Result<Vec<f32>, ModelError> {
        let all = self.store.get_shaped(&format!("{}{name}", self.prefix), &[n, len])?;
        Ok(slice::rows(all, row..row + 1).to_f32())
    }

    /// The part of a row-parallel projection's output bias (`[hidden]`) this
    /// rank adds: partial outputs are summed across the group, so the bias is
    /// added once, on rank 0, or whole by the rank holding a whole expert
    /// (`whole`); exact mode splits outputs, so each rank adds its rows' bias.
    pub fn row_bias(&self, full: Vec<f32>, whole: bool) -> Option<Vec<f32>> {
        match self.tp {
            None => Some(full),
            Some(_) if whole => Some(full),
            Some(tp) if tp.exact => Some(full[tp.hidden.clone()].to_vec()),
            Some(tp) => (tp.rank == 0).then_some(full),
        }
    }

    /// Whether the layer has tensor `name` (`.weight` included).
    pub fn contains(&self, name: &str) -> bool {
        self.store.contains(&format!("{}{name}", self.prefix))
    }

    /// Expert `e` of a stacked `[n_experts, rows, cols]` weight (GGUF's
    /// `ffn_*_exps`) as a 2-D `[rows, cols]` weight: a byte range, still mapped.
    /// A per-expert second-level scale (NVFP4's `ffn_*_exps.scale`, read into
    /// `<name>_scales` by formats) becomes that expert's output scale.
    pub fn stacked(&self, name: &str, shape: [usize; 3], e: usize) -> Result<WeightTensor, ModelError> {
        let all = self.store.get_shaped(&format!("{}{name}.weight", self.prefix), &shape)?;
        let one = slice::rows(all, e..e + 1);
        let scales = format!("{}{name}_scales", self.prefix);
        let out_scale = if self.store.contains(&scales) {
            all.out_scale * self.store.get_shaped(&scales, &[shape[0]])?.to_f32()[e]
        } else {
            all.out_scale
        };
        Ok(WeightTensor { shape: vec![shape[1], shape[2]], out_scale, ..one })
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Whether the layer has tensor `name` (`.weight` included).
    pub fn has(&self, name: &str) -> bool {
        self.store.contains(&format!("{}{name}", self.prefix))
    }

    /// Tensor `name` (`.weight` included) of the layer, checked to be `shape`.
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<&WeightTensor, ModelError> {
        Ok(self.store.get_shaped(&format!("{}{name}", self.prefix), shape)?)
    }

    /// A 1-D tensor of the layer (norm weights, biases) widened to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        vector(self.store, &format!("{}{name}", self.prefix), len)
    }

    /// The routed experts this rank holds of `n`, and whether whole (expert
    /// parallelism) rather than a slice of each.
    pub fn held_experts(&self, n: usize) -> (Range<usize>, bool) {
        match self.tp.and_then(|t| t.experts.clone()) {
            Some(r) => (r, true),
            None => (0..n, false),
        }
    }

    /// This rank's part of an intermediate width (all of it in one process).
    pub fn part_of(&self, width: usize) -> Result<Range<usize>, ModelError> {
        Ok(match self.tp {
            Some(tp) => tp.part_of(width)?,
            None => 0..width,
        })
    }
}

impl DecoderLayer {
    /// Loads layer `layer`, keeping only the tensor-parallel slice `tp` (query heads
    /// and their KV heads, MLP columns, expert columns) when given.
    pub fn load(
        store: &TensorStore,
        cfg: &ModelConfig,
        spec: &ArchSpec,
        layer: usize,
        tp: Option<&TpSlice>,
        opts: &LoadOptions,
    ) -> Result<DecoderLayer, ModelError> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (hq, hkv, ffn) = (cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.intermediate_size);
        let ld = LayerLoader { store, prefix: format!("model.layers.{layer}."), hidden: h, tp, opts };
        let heads = |r: &Range<usize>| r.start * hd..r.end * hd;
        let (q_rows, kv_rows, ffn_cols) = match tp {
            Some(tp) => (heads(&tp.q_heads), heads(&tp.kv_heads), tp.ffn.clone()),
            None => (0..hq, 0..hkv, 0..ffn),
        };
        let p = &ld.prefix;
        let la = spec.linear_attn.as_ref();
        let linear_layer = matches!(spec.attn_kind(layer), AttnKind::Linear(_));
        // (1 + w) either way: Gemma's norm spec, or the hybrids' zero-centered norms.
        let norm = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            Ok(center_norm(la, norm_weight(store, &format!("{p}{name}"), len, spec)?))
        };
        let (q_norm, k_norm) = match (spec.qk_norm && !linear_layer, spec.qk_norm_whole) {
            (false, _) => (None, None),
            (true, false) => (Some(norm("self_attn.q_norm.weight", hd)?), Some(norm("self_attn.k_norm.weight", hd)?)),
            // Whole-projection norms: this rank's heads' part of the weight.
            (true, true) => (
                Some(norm("self_attn.q_norm.weight", hq)?[q_rows.clone()].to_vec()),
                Some(norm("self_attn.k_norm.weight", hkv)?[kv_rows.clone()].to_vec()),
            ),
        };
        let ffn = match spec.ffn(layer) {
            FfnKind::Dense => FeedForward::Dense(Box::new(Mlp {
                gate: ld.col_par("mlp.gate_proj", ffn, &ffn_cols, false)?,
                up: ld.col_par("mlp.up_proj", ffn, &ffn_cols, false)?,
                down: ld.row_par("mlp.down_proj", ffn, &ffn_cols)?,
                act: spec.mlp_act,
            })),
            FfnKind::Moe(_) if tp.is_some_and(|t| t.exact) => {
                return Err(ModelError::Unsupported(format!(
                    "layer {layer}: exact tensor parallelism does not split MoE blocks yet"
                )))
            }
            FfnKind::Moe(m) => FeedForward::Moe(Box::new(Moe::load(&ld, m)?)),
        };
        let attn = match spec.attn_kind(layer) {
            AttnKind::Gqa => {
                let extras = spec.attention(layer);
                let sinks = match extras.sinks {
                    true => Some(
                        vector(store, &format!("{p}self_attn.sinks"), cfg.n_heads)?[q_rows.start / hd..q_rows.end / hd]
                            .to_vec(),
                    ),
                    false => None,
                };
                let mut o = ld.row_par("self_attn.o_proj", hq, &q_rows)?;
                if extras.o_bias {
                    o.bias = ld.row_bias(vector(store, &format!("{p}self_attn.o_proj.bias"), h)?, false);
                }
                // Gated attention: q_proj is [heads × (q ‖ gate) × head_dim].
                let (q, gate) = match la {
                    Some(_) => {
                        let w = ld.weight("self_attn.q_proj.weight", &[2 * hq, h])?;
                        let part = |off: usize| {
                            let heads = q_rows.start / hd..q_rows.end / hd;
                            heads.map(|i| 2 * i * hd + off..2 * i * hd + off + hd).collect::<Vec<_>>()
                        };
                        let q = Linear::new(quantized(gather_rows(w, &part(0)), opts)?, None);
                        (q, Some(Linear::new(quantized(gather_rows(w, &part(hd)), opts)?, None)))
                    }
                    None => (ld.col_par("self_attn.q_proj", hq, &q_rows, spec.qkv_bias)?, None),
                };
                Attention::Gqa(Box::new(Gqa {
                    q,
                    k: ld.col_par("self_attn.k_proj", hkv, &kv_rows, spec.qkv_bias)?,
                    v: ld.col_par("self_attn.v_proj", hkv, &kv_rows, spec.qkv_bias)?,
                    o,
                    q_norm,
                    k_norm,
                    qk_norm_whole: spec.qk_norm_whole,
                    window: extras.window,
                    sinks,
                    gate,
                }))
            }
            AttnKind::Mla(_) if tp.is_some_and(|t| t.exact) => {
                return Err(ModelError::Unsupported(format!(
                    "layer {layer}: exact tensor parallelism does not split latent attention yet"
                )))
            }
            AttnKind::Mla(m) => {
                let heads = tp.map_or(0..cfg.n_heads, |t| t.q_heads.clone());
                Attention::Mla(Box::new(Mla::load(&ld, m, cfg.n_heads, heads, cfg.rms_norm_eps, opts.mla)?))
            }
            AttnKind::Linear(_) if tp.is_some_and(|t| t.exact) => {
                return Err(ModelError::Unsupported(format!(
                    "layer {layer}: exact tensor parallelism does not split linear attention yet"
                )))
            }
            AttnKind::Linear(l) => {
                let kh = l.local_key_heads(tp)?;
                Attention::Linear(Box::new(GatedDeltaNet::load(&ld, l, kh, cfg, opts)?))
            }
        };
        let sandwich = spec.norm.placement == NormPlacement::Sandwich;
        let (mlp_norm, post_attn_norm, post_ffn_norm) = match sandwich {
            false => (norm("post_attention_layernorm.weight", h)?, None, None),
            true => (
                norm("pre_feedforward_layernorm.weight", h)?,
                Some(norm("post_attention_layernorm.weight", h)?),
                Some(norm("post_feedforward_layernorm.weight", h)?),
            ),
        };
        Ok(DecoderLayer {
            attn_norm: norm("input_layernorm.weight", h)?,
            attn,
            mlp_norm,
            ffn,
            post_attn_norm,
            post_ffn_norm,
        })
    }

    /// Weight bytes this layer reads per decoded token (a MoE layer: only the
    /// router, the active experts and the shared expert).
    pub fn weight_bytes(&self) -> usize {
        self.attn.weight_bytes() + self.ffn.weight_bytes_per_token()
    }
}
