//! Qwen3: per-head RMSNorm on q and k before rope, no q/k/v biases by default,
//! explicit `head_dim` (often ≠ hidden / heads).

use super::ArchSpec;
use formats::ModelConfig;
use kernels::ops::RopeStyle;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec {
        qkv_bias: cfg.attention_bias,
        qk_norm: true,
        rope_style: RopeStyle::Neox,
        sliding_window: cfg.sliding_window,
        moe: None,
        extras: None,
        linear_attn: None,
        mla: None,
    }
}
