//! One file per architecture. Each says how its decoder layer differs from the
//! common one ([`crate::decoder`]): biases, q/k norms, rope pairing. Adding an
//! architecture: a file here plus one arm in [`crate::registry`].

pub mod llama;
pub mod mistral;
pub mod qwen2;
pub mod qwen3;

use kernels::ops::RopeStyle;

/// The knobs that distinguish the dense decoder architectures.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before rope (qwen3).
    pub qk_norm: bool,
    pub rope_style: RopeStyle,
    /// Attention only sees this many most recent positions.
    pub sliding_window: Option<usize>,
}
