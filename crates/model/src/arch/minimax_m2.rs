//! MiniMax-M2 (HF `minimax_m2`, llama.cpp `minimax-m2`): GQA without biases
//! whose q/k RMSNorm spans the whole projection, all heads together
//! (weights `[heads · head_dim]`, [`ArchSpec::qk_norm_whole`]; exact under
//! tensor parallelism, where its sum of squares is all-reduced); rope on the
//! first `partial_rotary_factor` (or `rotary_dim`) of each head, rotate-half.
//! Every layer is a mixture of `num_local_experts` SwiGLU experts of width
//! `intermediate_size`, no shared expert, routed by sigmoid scores: the top
//! `num_experts_per_tok` by score plus `e_score_correction_bias`, weighted
//! by their unbiased scores renormalized ([`Routing::SigmoidGrouped`] with
//! one group and scale 1). HF names: `block_sparse_moe.{gate,
//! e_score_correction_bias, experts.E.{w1,w2,w3}}`; a GGUF's as formats maps
//! llama.cpp's (`ffn_*_exps`, `exp_probs_b`).

use super::ArchSpec;
use crate::moe::{config_usize, text_config, validate, ExpertAct, MoeNames, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::{ModelConfig, SourceFormat};
use serde_json::Value;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let c = text_config(cfg);
    let arch = &cfg.arch;
    if let Some(f) = c.get("scoring_func").and_then(Value::as_str).filter(|f| *f != "sigmoid") {
        return Err(ModelError::Unsupported(format!("{arch}: scoring_func '{f}' (only sigmoid routing)")));
    }
    let gguf = cfg.source == SourceFormat::Gguf;
    let moe = MoeSpec {
        n_experts: config_usize(cfg, &["num_local_experts", "num_experts"])?,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: config_usize(cfg, &["moe_intermediate_size"]).unwrap_or(cfg.intermediate_size),
        norm_topk: true,
        shared_ffn: None,
        sparse: vec![true; cfg.n_layers],
        names: match gguf {
            true => QWEN_NAMES,
            false => MoeNames {
                block: "block_sparse_moe",
                gate: "w1",
                up: "w3",
                down: "w2",
                score_bias: "e_score_correction_bias",
                ..QWEN_NAMES
            },
        },
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::SigmoidGrouped { n_group: 1, topk_group: 1, scale: 1.0 },
    };
    Ok(ArchSpec { qk_norm: true, qk_norm_whole: true, moe: Some(validate(moe, arch)?), ..ArchSpec::default() })
}
