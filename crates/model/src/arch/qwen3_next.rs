//! Qwen3-Next (HF `qwen3_next`): the hybrid layer stack of
//! [`crate::linear_attn`] — Gated DeltaNet (fused `in_proj_qkvz` and
//! `in_proj_ba`, grouped per key head) in three of four layers, gated full
//! attention in the fourth — with a mixture of experts in the sparse layers
//! (`mlp_only_layers`, `decoder_sparse_step`): softmax top-k routed experts
//! plus a gated shared expert, as Qwen2-MoE's.

use super::ArchSpec;
use crate::linear_attn::InProj;
use crate::moe::{config_usize, qwen_sparse_layers, text_config, validate, ExpertAct, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::{ModelConfig, SourceFormat};

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    // llama.cpp's `qwen3next` GGUFs hold the projections split (`attn_qkv`,
    // `attn_gate`, `ssm_ba` as b and a), read as Qwen3.5's names.
    let in_proj = if cfg.source == SourceFormat::Gguf { InProj::Split } else { InProj::Grouped };
    Ok(ArchSpec { moe: hybrid_moe(cfg)?, ..super::qwen3_5::hybrid(cfg, in_proj)? })
}

/// The family's MoE: routed experts plus the sigmoid-gated shared expert.
pub fn hybrid_moe(cfg: &ModelConfig) -> Result<Option<MoeSpec>, ModelError> {
    let n_experts = config_usize(cfg, &["num_experts", "num_local_experts"])?;
    let shared = config_usize(cfg, &["shared_expert_intermediate_size"]).unwrap_or(0);
    let moe = MoeSpec {
        n_experts,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: config_usize(cfg, &["moe_intermediate_size"])?,
        norm_topk: text_config(cfg).get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(true),
        shared_ffn: (shared > 0).then_some(shared),
        sparse: qwen_sparse_layers(cfg, n_experts),
        names: QWEN_NAMES,
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::Softmax,
    };
    Ok(Some(validate(moe, &cfg.arch)?))
}
