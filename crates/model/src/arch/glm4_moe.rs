//! GLM-4.5 / 4.6 / 4.7 (HF `glm4_moe`, llama.cpp `glm4moe`): GQA with q/k/v
//! biases (`attention_bias`), an optional per-head q/k RMSNorm
//! (`use_qk_norm`), rope on the first `partial_rotary_factor` of each head
//! (rotate-half); the feed-forward block is DeepSeek V3's mixture of experts
//! ([`super::deepseek_v3::sigmoid_moe`]: sigmoid routing in groups with a
//! correction bias and routed scaling, one shared expert, the first
//! `first_k_dense_replace` layers dense). The checkpoint's extra
//! multi-token-prediction layers (`num_nextn_predict_layers`, numbered after
//! the last decoder layer) are never loaded: the forward pass stops at
//! `num_hidden_layers` (a GGUF counts them in `block_count`; formats takes
//! them off).

use super::ArchSpec;
use crate::moe::text_config;
use crate::ModelError;
use formats::ModelConfig;
use serde_json::Value;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let c = text_config(cfg);
    Ok(ArchSpec {
        qkv_bias: cfg.attention_bias,
        qk_norm: c.get("use_qk_norm").and_then(Value::as_bool).unwrap_or(false),
        moe: Some(super::deepseek_v3::sigmoid_moe(cfg)?),
        ..ArchSpec::default()
    })
}
