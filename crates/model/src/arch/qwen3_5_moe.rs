//! Qwen3.5 MoE (HF `qwen3_5_moe_text`): the Qwen3.5 hybrid layers
//! ([`super::qwen3_5`]) with a mixture of experts in every layer: routed
//! experts of width `moe_intermediate_size` (softmax top-k, renormalized with
//! `norm_topk_prob`) plus a shared expert of width
//! `shared_expert_intermediate_size` scaled by `sigmoid(shared_expert_gate(x))`.

use super::ArchSpec;
use crate::linear_attn::InProj;
use crate::ModelError;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    Ok(ArchSpec { moe: super::qwen3_next::hybrid_moe(cfg)?, ..super::qwen3_5::hybrid(cfg, InProj::Split)? })
}
