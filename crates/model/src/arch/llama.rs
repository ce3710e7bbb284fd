//! Llama (and SmolLM2, Llama 3 with its rope scaling): pre-norm decoder, GQA,
//! SwiGLU MLP, no biases unless `attention_bias`.

use super::ArchSpec;
use formats::{ModelConfig, SourceFormat};
use kernels::ops::RopeStyle;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec {
        qkv_bias: cfg.attention_bias,
        qk_norm: false,
        // llama.cpp's converter permutes llama q/k rows so adjacent pairs rotate
        // together; HF checkpoints rotate halves.
        rope_style: if cfg.source == SourceFormat::Gguf { RopeStyle::Interleaved } else { RopeStyle::Neox },
        sliding_window: None,
        moe: None,
        extras: None,
        linear_attn: None,
        mla: None,
    }
}
