//! Qwen3: per-head RMSNorm on q and k before rope, no q/k/v biases by default,
//! explicit `head_dim` (often ≠ hidden / heads).

use super::ArchSpec;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec { qkv_bias: cfg.attention_bias, qk_norm: true, sliding_window: cfg.sliding_window, ..ArchSpec::default() }
}
