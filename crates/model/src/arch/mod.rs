//! One file per architecture. Each says how its decoder layer differs from the
//! common one ([`crate::decoder`]): biases, q/k norms, rope pairing, which
//! attention block each layer has (GQA or multi-head latent attention,
//! [`crate::mla`]) and which feed-forward block (the dense MLP or a mixture of
//! experts, [`crate::moe`]). Adding an architecture: a file here plus one arm in
//! [`crate::registry`].

pub mod deepseek_v3;
pub mod llama;
pub mod mistral;
pub mod mixtral;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;

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
}

/// The attention block of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttnKind<'a> {
    /// Grouped-query attention over per-head K/V caches.
    Gqa,
    /// Multi-head latent attention over a cache of latents.
    Mla(&'a MlaSpec),
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FfnKind<'a> {
    /// `down(silu(gate(x)) · up(x))` of width `intermediate_size`.
    Dense,
    Moe(&'a MoeSpec),
}

impl ArchSpec {
    pub fn attention(&self, _layer: usize) -> AttnKind<'_> {
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
