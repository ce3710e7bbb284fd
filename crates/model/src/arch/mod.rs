//! One file per architecture. Each says how its decoder layer differs from the
//! common one ([`crate::decoder`]): biases, q/k norms, rope pairing, which
//! attention block each layer has (GQA or multi-head latent attention,
//! [`crate::mla`]) and which feed-forward block (the dense MLP or a mixture of
//! experts, [`crate::moe`]). Adding an architecture: a file here plus one arm in
//! [`crate::registry`].

pub mod deepseek_v3;
pub mod gemma3;
pub mod glm4_moe;
pub mod gpt_oss;
pub mod llama;
pub mod minimax_m2;
pub mod mistral;
pub mod mixtral;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;

use crate::linear_attn::LinearAttnSpec;
use crate::mla::MlaSpec;
use crate::moe::{ExpertAct, MoeSpec};
use kernels::ops::RopeStyle;

/// The knobs that distinguish the decoder architectures. [`Default`] is the
/// llama layer (no biases, no q/k norm, rotate-half rope, pre-norms with plain
/// RMSNorm weights, SwiGLU, unscaled embeddings, `1/√head_dim` attention): an
/// architecture file names only what differs (`..ArchSpec::default()`), so a
/// new knob edits no other file.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before rope (qwen3).
    pub qk_norm: bool,
    pub rope_style: RopeStyle,
    /// Attention only sees this many most recent positions.
    pub sliding_window: Option<usize>,
    /// The mixture of experts, for the layers [`MoeSpec::sparse`] names; every
    /// other layer (all of them when `None`) has the dense MLP.
    pub moe: Option<MoeSpec>,
    /// Multi-head latent attention in every layer (DeepSeek); `None`: GQA.
    pub mla: Option<MlaSpec>,
    /// Attention details beyond GQA with one global window (gpt-oss, Gemma 3).
    pub extras: Option<AttnExtras>,
    /// Where the layer's RMSNorms sit, and how their weights apply.
    pub norm: NormSpec,
    /// The dense MLP's activation (`act(gate) · up`).
    pub mlp_act: ExpertAct,
    /// The embedding rows are multiplied by this (Gemma: `√hidden`).
    pub embed_scale: f32,
    /// Attention logits scale; `None`: `1/√head_dim` (Gemma:
    /// `query_pre_attn_scalar^-½`).
    pub attn_scale: Option<f32>,
    /// The rope of the windowed layers when it differs from the global one
    /// (Gemma 3: base 10 000 on sliding layers, 1 000 000 on full ones).
    pub local_rope: Option<LocalRope>,
    /// The q/k RMSNorm spans the whole projection (all heads together, weight
    /// `[heads · head_dim]`) rather than each head (MiniMax-M2). Needs
    /// [`ArchSpec::qk_norm`]. Under tensor parallelism its sum of squares is
    /// all-reduced across the group, so it stays exact.
    pub qk_norm_whole: bool,
    /// Hybrid linear attention (Qwen3-Next, Qwen3.5): which layers are Gated
    /// DeltaNet, their shapes, and the family's gated attention and
    /// zero-centered norms ([`crate::linear_attn`]).
    pub linear_attn: Option<LinearAttnSpec>,
}

impl Default for ArchSpec {
    fn default() -> ArchSpec {
        ArchSpec {
            qkv_bias: false,
            qk_norm: false,
            rope_style: RopeStyle::Neox,
            sliding_window: None,
            moe: None,
            mla: None,
            extras: None,
            norm: NormSpec::default(),
            mlp_act: ExpertAct::Silu,
            embed_scale: 1.0,
            attn_scale: None,
            local_rope: None,
            qk_norm_whole: false,
            linear_attn: None,
        }
    }
}

/// The RMSNorms of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NormSpec {
    /// Stored weights are `w − 1`: every norm (layer, q/k and final) scales by
    /// `1 + w` (Gemma's HF checkpoints; llama.cpp's converter already added
    /// the one, so a GGUF leaves this false). Applied once, at load.
    pub plus_one: bool,
    pub placement: NormPlacement,
}

/// Where a layer normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum NormPlacement {
    /// `x + attn(norm(x))`, then `x + mlp(norm(x))` with `input_layernorm`
    /// and `post_attention_layernorm` (llama and most others).
    #[default]
    Pre,
    /// Gemma 2/3: `x + norm(attn(norm(x)))`, then `x + norm(mlp(norm(x)))`:
    /// `input_layernorm`, `post_attention_layernorm` (on the attention
    /// output), `pre_feedforward_layernorm`, `post_feedforward_layernorm`.
    Sandwich,
}

/// A rope with its own base and scaling (per layer type).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalRope {
    pub theta: f32,
    pub scaling: formats::RopeScaling,
}

/// gpt-oss's attention additions: a window on some layers only, per-head
/// sinks, and an output-projection bias.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnExtras {
    /// `windowed[l]`: layer `l` uses [`ArchSpec::sliding_window`] (the others
    /// attend to every position). From `layer_types` (`sliding_attention`).
    pub windowed: Vec<bool>,
    /// Every layer has `self_attn.sinks`, one logit per query head.
    pub sinks: bool,
    /// `self_attn.o_proj` carries a bias.
    pub o_bias: bool,
}

/// The attention of one layer, as [`ArchSpec::attention`] answers it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerAttention {
    /// Keys a position sees: `p + 1 − w ..= p`, or all of `0..=p`.
    pub window: Option<usize>,
    /// The layer has attention sinks (`self_attn.sinks`).
    pub sinks: bool,
    pub o_bias: bool,
}

/// The attention block of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttnKind<'a> {
    /// Grouped-query attention over per-head K/V caches.
    Gqa,
    /// Multi-head latent attention over a cache of latents.
    Mla(&'a MlaSpec),
    /// Gated DeltaNet: a fixed-size recurrent state per sequence, no KV rows.
    Linear(&'a LinearAttnSpec),
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FfnKind<'a> {
    /// `down(silu(gate(x)) · up(x))` of width `intermediate_size`.
    Dense,
    Moe(&'a MoeSpec),
}

impl ArchSpec {
    /// Layer `layer`'s attention: its window (per layer with
    /// [`AttnExtras::windowed`], else the global one), sinks and o bias.
    pub fn attention(&self, layer: usize) -> LayerAttention {
        match &self.extras {
            None => LayerAttention { window: self.sliding_window, sinks: false, o_bias: false },
            Some(x) => LayerAttention {
                window: self.sliding_window.filter(|_| x.windowed.get(layer).copied().unwrap_or(false)),
                sinks: x.sinks,
                o_bias: x.o_bias,
            },
        }
    }

    /// Layer `layer`'s attention block: GQA, or latent attention.
    pub fn attn_kind(&self, layer: usize) -> AttnKind<'_> {
        if let Some(la) = self.linear_attn.as_ref().filter(|la| la.is_linear(layer)) {
            return AttnKind::Linear(la);
        }
        match &self.mla {
            Some(m) => AttnKind::Mla(m),
            None => AttnKind::Gqa,
        }
    }

    pub fn ffn(&self, layer: usize) -> FfnKind<'_> {
        match &self.moe {
            Some(m) if m.sparse.get(layer).copied().unwrap_or(false) => FfnKind::Moe(m),
            _ => FfnKind::Dense,
        }
    }
}
