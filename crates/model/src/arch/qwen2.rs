//! Qwen2: llama layout with q/k/v biases, rotate-half rope (in HF and GGUF alike),
//! usually tied embeddings.

use super::ArchSpec;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec { qkv_bias: true, sliding_window: cfg.sliding_window, ..ArchSpec::default() }
}
