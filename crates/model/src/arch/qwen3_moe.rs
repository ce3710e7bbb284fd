//! Qwen3-MoE: the qwen3 layer (q/k norms) with, in the sparse layers, routed
//! experts of width `moe_intermediate_size` and no shared expert;
//! `norm_topk_prob` (renormalize the top-k weights) is read from the config.
//! Dense layers (`mlp_only_layers`, `decoder_sparse_step`) have the plain MLP
//! of width `intermediate_size`.

use super::ArchSpec;
use crate::moe::{config_usize, qwen_sparse_layers, text_config, validate, ExpertAct, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let n_experts = config_usize(cfg, &["num_experts", "num_local_experts"])?;
    let moe = MoeSpec {
        n_experts,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: config_usize(cfg, &["moe_intermediate_size"])?,
        norm_topk: text_config(cfg).get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(false),
        shared_ffn: None,
        sparse: qwen_sparse_layers(cfg, n_experts),
        names: QWEN_NAMES,
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::Softmax,
    };
    Ok(ArchSpec { moe: Some(validate(moe, &cfg.arch)?), ..super::qwen3::spec(cfg) })
}
