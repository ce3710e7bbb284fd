//! Qwen2-MoE: the qwen2 layer (q/k/v biases) with, in the sparse layers, routed
//! experts of width `moe_intermediate_size` plus one shared expert of width
//! `shared_expert_intermediate_size` scaled by `sigmoid(shared_expert_gate(x))`.
//! `norm_topk_prob` defaults to false: the top-k softmax weights are used as
//! they are. Dense layers (`mlp_only_layers`, `decoder_sparse_step`) have the
//! plain MLP of width `intermediate_size`.

use super::ArchSpec;
use crate::moe::{config_usize, qwen_sparse_layers, text_config, validate, ExpertAct, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let n_experts = config_usize(cfg, &["num_experts", "num_local_experts"])?;
    let shared = config_usize(cfg, &["shared_expert_intermediate_size"]).unwrap_or(0);
    let moe = MoeSpec {
        n_experts,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: config_usize(cfg, &["moe_intermediate_size"])?,
        norm_topk: text_config(cfg).get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(false),
        shared_ffn: (shared > 0).then_some(shared),
        sparse: qwen_sparse_layers(cfg, n_experts),
        names: QWEN_NAMES,
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::Softmax,
    };
    Ok(ArchSpec { moe: Some(validate(moe, &cfg.arch)?), ..super::qwen2::spec(cfg) })
}
