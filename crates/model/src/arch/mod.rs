//! One file per architecture. Each says how its decoder layer differs from the
//! common one ([`crate::decoder`]): biases, q/k norms, rope pairing, which
//! attention block each layer has (GQA or multi-head latent attention,
//! [`crate::mla`]) and which feed-forward block (the dense MLP or a mixture of
//! experts, [`crate::moe`]). Adding an architecture: a file here plus one arm in
//! [`crate::registry`].

pub mod deepseek_v3;
pub mod gpt_oss;
pub mod llama;
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
use crate::moe::MoeSpec;
use kernels::ops::RopeStyle;

/// The knobs that distinguish the decoder architectures.
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
    /// Attention details beyond GQA with one global window (gpt-oss).
    pub extras: Option<AttnExtras>,
    /// Hybrid linear attention (Qwen3-Next, Qwen3.5): which layers are Gated
    /// DeltaNet, their shapes, and the family's gated attention and
    /// zero-centered norms ([`crate::linear_attn`]).
    pub linear_attn: Option<LinearAttnSpec>,
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
