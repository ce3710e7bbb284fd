//! The architecture-neutral model configuration, parsed from HF `config.json`
//! or from GGUF `<arch>.*` metadata.

use serde_json::Value;

/// Where the weights came from. Matters for rope pairing: GGUF llama weights have
/// their q/k rows permuted for interleaved rope; HF weights use rotate-half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    Gguf,
    Safetensors,
}

/// Rope frequency scaling, from either the old `rope_scaling` key or the newer
/// `rope_parameters` key (or GGUF `<arch>.rope.scaling.*`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Explicit `attention_factor` if given; else derived from `mscale`/`mscale_all_dim`.
        attention_factor: Option<f32>,
        mscale: Option<f32>,
        mscale_all_dim: Option<f32>,
        /// Round the correction range to whole dimensions (transformers' default;
        /// gpt-oss sets `truncate: false` and keeps the fractional bounds).
        truncate: bool,
    },
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Normalized HF `model_type` ("llama", "mistral", "qwen2", "qwen3", "mixtral", ...).
    /// GGUF `general.architecture` values are mapped to these names.
    pub arch: String,
    pub source: SourceFormat,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// Rotary dims per head (== head_dim unless partial rotary).
    pub rope_dim: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (qwen2, or `attention_bias: true`).
    pub attention_bias: bool,
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    /// From `generation_config.json` if present, else `config.json`, else GGUF.
    pub eos_token_ids: Vec<u32>,
    /// The raw HF config (or a JSON view of GGUF metadata) for arch-specific extras.
    pub raw: Value,
}
