//! DeepSeek V3 (HF `deepseek_v3`): multi-head latent attention in every layer
//! ([`crate::mla`]), the first `first_k_dense_replace` layers with the dense
//! MLP of width `intermediate_size`, the others a mixture of experts:
//! `n_routed_experts` experts of width `moe_intermediate_size`, routed by
//! sigmoid scores in groups ([`Routing::SigmoidGrouped`]), plus
//! `n_shared_experts` always-on experts fused into one ungated MLP at
//! `mlp.shared_experts`. Rope rotates interleaved pairs unless
//! `rope_interleave` is false.
//!
//! llama.cpp's `deepseek2` GGUF reads as this architecture (formats maps its
//! keys and tensor names, `formats::gguf_deepseek2`): the shared experts are
//! then at `mlp.shared_expert.*` (`ffn_*_shexp`), the experts stacked
//! (`ffn_*_exps`), and the latent up-projection split per head
//! (`attn_k_b`/`attn_v_b`, read by [`crate::mla`]).

use super::ArchSpec;
use crate::mla::MlaSpec;
use crate::moe::{config_usize, text_config, validate, ExpertAct, MoeNames, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::{ModelConfig, SourceFormat};
use kernels::ops::RopeStyle;
use serde_json::Value;

/// Experts at `mlp.experts.E.{gate,up,down}_proj`, router `mlp.gate` (with
/// its `e_score_correction_bias`), shared experts at `mlp.shared_experts.*`.
pub const DEEPSEEK_NAMES: MoeNames = MoeNames { shared: "shared_experts", shared_gate: None, ..QWEN_NAMES };

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let c = text_config(cfg);
    let arch = &cfg.arch;
    let text = |k: &str| c.get(k).and_then(Value::as_str);
    let gguf = cfg.source == SourceFormat::Gguf;
    if let Some(f) = text("scoring_func").filter(|f| *f != "sigmoid") {
        let from = if gguf { ", from deepseek2.expert_gating_func (absent: softmax)" } else { "" };
        return Err(ModelError::Unsupported(format!("{arch}: scoring_func '{f}'{from} (only sigmoid routing)")));
    }
    if let Some(m) = text("topk_method").filter(|m| *m != "noaux_tc") {
        return Err(ModelError::Unsupported(format!("{arch}: topk_method '{m}' (only noaux_tc)")));
    }
    let n_experts = config_usize(cfg, &["n_routed_experts"])?;
    let expert_ffn = config_usize(cfg, &["moe_intermediate_size"])?;
    let n_shared = config_usize(cfg, &["n_shared_experts"]).unwrap_or(0);
    let first_dense = config_usize(cfg, &["first_k_dense_replace"]).unwrap_or(0);
    let freq = config_usize(cfg, &["moe_layer_freq"]).unwrap_or(1).max(1);
    let scale = c.get("routed_scaling_factor").and_then(Value::as_f64).unwrap_or(1.0) as f32;
    let moe = MoeSpec {
        n_experts,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn,
        norm_topk: c.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(true),
        shared_ffn: (n_shared > 0).then_some(n_shared * expert_ffn),
        sparse: (0..cfg.n_layers).map(|l| l >= first_dense && l % freq == 0).collect(),
        // GGUF: formats maps `ffn_*_shexp` to `mlp.shared_expert.*`.
        names: if gguf { MoeNames { shared: "shared_expert", ..DEEPSEEK_NAMES } } else { DEEPSEEK_NAMES },
        act: ExpertAct::Silu,
        bias: false,
        routing: Routing::SigmoidGrouped {
            n_group: config_usize(cfg, &["n_group"]).unwrap_or(1),
            topk_group: config_usize(cfg, &["topk_group"]).unwrap_or(1),
            scale,
        },
    };
    let interleave = c.get("rope_interleave").and_then(Value::as_bool).unwrap_or(true);
    Ok(ArchSpec {
        qkv_bias: false,
        qk_norm: false,
        rope_style: if interleave { RopeStyle::Interleaved } else { RopeStyle::Neox },
        sliding_window: None,
        moe: Some(validate(moe, arch)?),
        mla: Some(MlaSpec::from_config(cfg)?),
        extras: None,
        linear_attn: None,
    })
}
