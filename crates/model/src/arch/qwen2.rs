//! Qwen2: llama layout with q/k/v biases, rotate-half rope (in HF and GGUF alike),
//! usually tied embeddings.

use super::ArchSpec;
use formats::ModelConfig;
use kernels::ops::RopeStyle;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec {
        qkv_bias: true,
        qk_norm: false,
        rope_style: RopeStyle::Neox,
        sliding_window: cfg.sliding_window,
        moe: None,
        extras: None,
        linear_attn: None,
        mla: None,
    }
}
