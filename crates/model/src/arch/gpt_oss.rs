//! gpt-oss (HF `model_type` gpt_oss): GQA with q/k/v/o biases, attention sinks
//! (one learned logit per query head in the softmax denominator) and a sliding
//! window on the layers `layer_types` calls `sliding_attention` (the others see
//! every position); yarn rope, rotate-half. Every layer is a mixture of
//! `num_local_experts` experts of width `intermediate_size`: a router with a
//! bias, top-k on its logits then a softmax over the k chosen (the same weights
//! as softmax-all, top-k, renormalize: `norm_topk`), experts with biases and
//! the clamped SwiGLU of [`ExpertAct::ClampedSwiglu`]. Expert tensors are fused
//! and stacked ([`crate::moe_fused`]).

use super::{ArchSpec, AttnExtras};
use crate::moe::{config_usize, text_config, validate, ExpertAct, MoeNames, MoeSpec, Routing, QWEN_NAMES};
use crate::ModelError;
use formats::{ModelConfig, SourceFormat};
use kernels::ops::RopeStyle;
use serde_json::Value;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let c = text_config(cfg);
    let float = |k: &str, default: f32| c.get(k).and_then(Value::as_f64).map_or(default, |v| v as f32);
    let moe = MoeSpec {
        n_experts: config_usize(cfg, &["num_local_experts", "num_experts"])?,
        top_k: config_usize(cfg, &["num_experts_per_tok"])?,
        expert_ffn: cfg.intermediate_size,
        norm_topk: true,
        shared_ffn: None,
        sparse: vec![true; cfg.n_layers],
        // A GGUF (llama.cpp's `gpt-oss`) has the router at `ffn_gate_inp`, which
        // formats maps to `mlp.gate`, and separate stacked `ffn_{gate,up,down}_exps`.
        names: MoeNames {
            block: "mlp",
            router: if cfg.source == SourceFormat::Gguf { "gate" } else { "router" },
            gate: "gate_up_proj",
            up: "gate_up_proj",
            down: "down_proj",
            ..QWEN_NAMES
        },
        act: ExpertAct::ClampedSwiglu { alpha: float("swiglu_alpha", 1.702), limit: float("swiglu_limit", 7.0) },
        bias: true,
        routing: Routing::Softmax,
    };
    // transformers' default when `layer_types` is absent: sliding on even layers.
    let windowed = match c.get("layer_types").and_then(Value::as_array) {
        None => (0..cfg.n_layers).map(|l| l % 2 == 0).collect(),
        Some(types) => {
            if types.len() != cfg.n_layers {
                return Err(ModelError::Config(format!(
                    "gpt_oss: 'layer_types' lists {} layers, the model has {}",
                    types.len(),
                    cfg.n_layers
                )));
            }
            types
                .iter()
                .enumerate()
                .map(|(l, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => {
                        Err(ModelError::Config(format!("gpt_oss: layer_types[{l}] is {t}, not sliding/full_attention")))
                    }
                })
                .collect::<Result<_, _>>()?
        }
    };
    Ok(ArchSpec {
        qkv_bias: true,
        qk_norm: false,
        rope_style: RopeStyle::Neox,
        sliding_window: cfg.sliding_window,
        moe: Some(validate(moe, &cfg.arch)?),
        mla: None,
        extras: Some(AttnExtras { windowed, sinks: true, o_bias: true }),
        linear_attn: None,
    })
}
