//! Qwen3.5 dense (HF `qwen3_5_text`): the hybrid layer stack of
//! [`crate::linear_attn`] — Gated DeltaNet in the `linear_attention` layers
//! (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), gated full
//! attention (q/k norms, partial rotary, output gate) in the others — with
//! the dense SwiGLU MLP of width `intermediate_size`, zero-centered norms.

use super::ArchSpec;
use crate::linear_attn::{InProj, LinearAttnSpec};
use crate::ModelError;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    hybrid(cfg, InProj::Split)
}

/// The hybrid family's layer knobs with input projections stored as `in_proj`.
pub fn hybrid(cfg: &ModelConfig, in_proj: InProj) -> Result<ArchSpec, ModelError> {
    Ok(ArchSpec {
        qkv_bias: cfg.attention_bias,
        qk_norm: true,
        linear_attn: Some(LinearAttnSpec::from_config(cfg, in_proj)?),
        ..ArchSpec::default()
    })
}
