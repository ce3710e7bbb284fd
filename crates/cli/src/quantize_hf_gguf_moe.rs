//! The mixture-of-experts part of HF → GGUF ([`crate::quantize_hf_gguf`]):
//! qwen3_moe (GGUF arch `qwen3moe`), qwen2_moe (`qwen2moe`) and mixtral
//! (`llama` with experts), laid out as llama.cpp's `convert_hf_to_gguf.py`
//! writes them (and as `scripts/hf_moe_to_gguf.py` does with llama.cpp's own
//! `gguf` package):
//!
//! * HF keeps one tensor per expert (`mlp.experts.E.gate_proj`, Mixtral's
//!   `block_sparse_moe.experts.E.w1|w3|w2`); GGUF stacks each layer's experts
//!   into `blk.N.ffn_{gate,up,down}_exps.weight`, `[n_expert, out, in]`,
//!   experts in index order. A stack is written expert by expert, so only one
//!   expert is ever held in f32.
//! * The router (`ffn_gate_inp`) stays F32, as the converter keeps it; the
//!   shared expert's gate (qwen2_moe) becomes a `[hidden]` F32 vector.
//! * Metadata: `expert_count`, `expert_used_count`,
//!   `expert_feed_forward_length`, `expert_shared_feed_forward_length`, and
//!   `expert_weights_norm` from `norm_topk_prob`.
//!
//! glm4_moe (`glm4moe`) and minimax_m2 (`minimax-m2`) add sigmoid routing
//! (`expert_gating_func` 2) with the router's selection bias as
//! `exp_probs_b`; GLM also its shared expert (`ffn_*_shexp`), first dense
//! layers (`leading_dense_block_count`), routed scaling and groups, and no
//! multi-token-prediction layers (`nextn_predict_layers` 0: they are not
//! written).
//!
//! gpt_oss and deepseek_v3 are not written (their experts and attention need
//! the converter's own transforms); `scripts/hf_moe_to_gguf.py` covers
//! deepseek_v3.

use formats::gguf::GgufValue;
use formats::gguf_writer::GgufWriter;
use formats::ModelConfig;
use serde_json::Value;

/// GGUF architecture of a MoE `model_type` this writer handles.
pub fn moe_arch(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "qwen3_moe" => "qwen3moe",
        "qwen2_moe" => "qwen2moe",
        "mixtral" => "llama",
        "glm4_moe" => "glm4moe",
        "minimax_m2" => "minimax-m2",
        _ => return None,
    })
}

/// The MoE metadata keys under `arch`.
pub fn metadata(w: &mut GgufWriter, c: &ModelConfig, arch: &str) {
    let raw = |k: &str| c.raw.get(k).and_then(Value::as_u64);
    let mut put = |key: &str, v: Option<u64>| {
        if let Some(v) = v.filter(|&v| v > 0) {
            w.add(&format!("{arch}.{key}"), GgufValue::U32(v as u32));
        }
    };
    put("expert_count", raw("num_experts").or_else(|| raw("num_local_experts")).or_else(|| raw("n_routed_experts")));
    put("expert_used_count", raw("num_experts_per_tok"));
    // MiniMax-M2's experts are `intermediate_size` wide.
    let minimax = arch == "minimax-m2";
    put("expert_feed_forward_length", raw("moe_intermediate_size").or(minimax.then_some(c.intermediate_size as u64)));
    put("expert_shared_feed_forward_length", raw("shared_expert_intermediate_size"));
    if arch == "glm4moe" {
        put("expert_shared_count", raw("n_shared_experts"));
        put("leading_dense_block_count", raw("first_k_dense_replace"));
        put("expert_group_count", raw("n_group"));
        put("expert_group_used_count", raw("topk_group"));
        let scale = c.raw.get("routed_scaling_factor").and_then(Value::as_f64).unwrap_or(1.0);
        w.add(&format!("{arch}.expert_weights_scale"), GgufValue::F32(scale as f32));
        w.add(&format!("{arch}.nextn_predict_layers"), GgufValue::U32(0));
    }
    if arch == "glm4moe" || minimax {
        w.add(&format!("{arch}.expert_gating_func"), GgufValue::U32(2));
    }
    if let Some(norm) = c.raw.get("norm_topk_prob").and_then(Value::as_bool) {
        w.add(&format!("{arch}.expert_weights_norm"), GgufValue::Bool(norm));
    }
}

/// One expert's projection: (layer, GGUF stack name, expert index), from
/// `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight` or Mixtral's
/// `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight`.
pub fn expert_part(hf: &str) -> Option<(usize, &'static str, usize)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("mlp.experts.").or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (expert, proj) = rest.split_once('.')?;
    let stack = match proj {
        "gate_proj.weight" | "w1.weight" => "ffn_gate_exps",
        "up_proj.weight" | "w3.weight" => "ffn_up_exps",
        "down_proj.weight" | "w2.weight" => "ffn_down_exps",
        _ => return None,
    };
    Some((layer.parse().ok()?, stack, expert.parse().ok()?))
}

/// llama.cpp's name for the MoE tensors that are not experts: Mixtral's
/// router (the qwen routers and shared experts are in `formats::names`).
pub fn other_name(hf: &str) -> Option<String> {
    let (layer, part) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let g = match part {
        "block_sparse_moe.gate.weight" => "ffn_gate_inp.weight",
        // MiniMax-M2 keeps its selection bias on the block.
        "block_sparse_moe.e_score_correction_bias" => "exp_probs_b.bias",
        // GLM's (DeepSeek's) shared experts, fused into one MLP.
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(expert_part("model.layers.3.mlp.experts.12.down_proj.weight"), Some((3, "ffn_down_exps", 12)));
        assert_eq!(expert_part("model.layers.0.block_sparse_moe.experts.1.w3.weight"), Some((0, "ffn_up_exps", 1)));
        assert_eq!(expert_part("model.layers.0.mlp.shared_expert.up_proj.weight"), None);
        assert_eq!(expert_part("model.layers.0.mlp.experts.1.up_proj.bias"), None);
        assert_eq!(other_name("model.layers.7.block_sparse_moe.gate.weight").unwrap(), "blk.7.ffn_gate_inp.weight");
    }
}
