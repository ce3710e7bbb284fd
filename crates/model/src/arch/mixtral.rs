//! Mixtral: the mistral layer with a mixture of experts in every layer: top-k
//! (2) of `num_local_experts` by softmax routing, renormalized over the chosen.
//! Experts at `block_sparse_moe.experts.E.{w1 (gate), w3 (up), w2 (down)}`; in
//! a GGUF (arch `llama` with experts) stacked at `mlp.experts.*_exps`, router
//! `mlp.gate` (as formats maps llama.cpp's names).

use super::ArchSpec;
use crate::moe::{config_usize, validate, ExpertAct, MoeNames, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::{ModelConfig, SourceFormat};

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let moe = MoeSpec {
        n_experts: config_usize(cfg, &["num_local_experts", "num_experts"])?,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: cfg.intermediate_size,
        norm_topk: true,
        shared_ffn: None,
        sparse: vec![true; cfg.n_layers],
        names: match cfg.source {
            SourceFormat::Gguf => QWEN_NAMES,
            _ => MoeNames { block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2", ..QWEN_NAMES },
        },
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::Softmax,
    };
    Ok(ArchSpec { moe: Some(validate(moe, &cfg.arch)?), ..super::mistral::spec(cfg) })
}
