//! llama.cpp's `deepseek2` GGUF (DeepSeek V2/V3; the model shardlm runs as HF
//! `deepseek_v3`) → the HF config keys `model::arch::deepseek_v3` and
//! `model::mla` read. The reference is llama.cpp b11434: its converter
//! (`conversion/deepseek.py`, `DeepseekV2Model`, on top of `TextModel`'s
//! generic keys), the loader (`src/models/deepseek2.cpp`) and the graph.
//!
//! Metadata (`deepseek2.` prefix) → HF key:
//!
//! | GGUF key                                   | HF key / meaning |
//! |--------------------------------------------|------------------|
//! | `attention.q_lora_rank`                    | `q_lora_rank`; absent: `null` (one `attn_q`), an error if `attn_q_a` exists |
//! | `attention.kv_lora_rank` (required)        | `kv_lora_rank` |
//! | `rope.dimension_count` (required)          | `qk_rope_head_dim` (and `head_dim`, as transformers sets it) |
//! | `attention.key_length_mla`                 | `qk_nope_head_dim + qk_rope_head_dim` |
//! | `attention.value_length_mla`               | `v_head_dim` |
//! | `attention.key_length`, `value_length`     | with the `_mla` keys: the MQA view of the cache (`kv_lora + rope`, `kv_lora`), not read; without them (files from before the split): `nope + rope` and `v` |
//! | `attention.head_count_kv`                  | 1 (the MQA view); shardlm uses `num_attention_heads`, as the HF config does |
//! | `feed_forward_length`                      | `intermediate_size` (the leading dense layers) |
//! | `leading_dense_block_count`                | `first_k_dense_replace` (absent: 0) |
//! | `expert_count` (required)                  | `n_routed_experts` |
//! | `expert_used_count` (required)             | `num_experts_per_tok` |
//! | `expert_feed_forward_length` (required)    | `moe_intermediate_size` |
//! | `expert_shared_count` (required)           | `n_shared_experts` (fused into one MLP of `n · moe_intermediate_size`) |
//! | `expert_weights_scale`                     | `routed_scaling_factor` (absent: 1, llama.cpp's "no scaling") |
//! | `expert_weights_norm`                      | `norm_topk_prob` (absent: false; the converter writes it only when true) |
//! | `expert_gating_func`                       | `scoring_func`: 1 softmax, 2 sigmoid, 4 sqrtsoftplus; absent: softmax (llama.cpp's rule for old V2/V2.5 files) |
//! | `expert_group_count`, `expert_group_used_count` | `n_group`, `topk_group` (absent: 1, no grouping) |
//! | `rope.scaling.type/factor/original_context_length/yarn_beta_fast/yarn_beta_slow` | `rope_scaling` (yarn) |
//! | `rope.scaling.yarn_log_multiplier`         | `0.1 · mscale_all_dim` (the converter's factor; llama.cpp divides it out again), and llama.cpp takes `mscale = mscale_all_dim` |
//!
//! **Scales.** Nothing is folded into the weights: the softmax scale stays
//! `(nope + rope)^-½ · mscale(factor, mscale_all_dim)²` (llama.cpp's
//! `kq_scale`), and rope's magnitude `mscale / mscale_all_dim` is 1 (llama.cpp
//! cancels its yarn attention factor for deepseek2 the same way).
//!
//! **Rope.** llama.cpp runs deepseek2 with `LLAMA_ROPE_TYPE_NORM` (rotating
//! adjacent pairs) and its converter does not permute any q/k rows: that is
//! HF's `rope_interleave: true` (transformers de-interleaves, then rotates
//! halves: the same scores). So `rope_interleave` is set true.
//!
//! Tensors (`blk.N.` prefix; shapes in HF order, `[rows, cols]`; names mapped
//! in [`crate::names`]): `attn_q_a` `[q_lora, hidden]`, `attn_q_a_norm`
//! `[q_lora]`, `attn_q_b` `[heads·(nope + rope), q_lora]` (or `attn_q`
//! `[heads·(nope + rope), hidden]`), `attn_kv_a_mqa` `[kv_lora + rope, hidden]`,
//! `attn_kv_a_norm` `[kv_lora]`, `attn_output` `[hidden, heads·v]`; HF's
//! `kv_b_proj` is split per head by the b11434 converter into `attn_k_b`
//! `[heads, kv_lora, nope]` (each head's `W_UK` transposed) and `attn_v_b`
//! `[heads, v, kv_lora]` (older files: one `attn_kv_b`); the dense layers'
//! `ffn_{gate,up,down}`; MoE layers' `ffn_gate_inp` `[experts, hidden]`,
//! `exp_probs_b.bias` `[experts]` (`e_score_correction_bias`),
//! `ffn_{gate,up,down}_exps` `[experts, out, in]` and the shared experts'
//! `ffn_{gate,up,down}_shexp`.

use crate::gguf::{GgufFile, GgufValue};
use crate::{FormatError, RopeScaling};
use serde_json::{Map, Value};

/// The `ModelConfig` fields a deepseek2 file sets differently from the
/// generic GGUF reading.
pub(crate) struct Deepseek2Dims {
    /// transformers' `head_dim` for deepseek_v3: `qk_rope_head_dim`.
    pub head_dim: usize,
    /// `num_key_value_heads` = the query heads (the file says 1: the MQA view).
    pub n_kv_heads: usize,
}

/// Writes the HF keys of the table above into `raw` and adjusts yarn's
/// `mscale`s; `n_heads` is `attention.head_count`.
pub(crate) fn deepseek2_keys(
    g: &GgufFile,
    n_heads: usize,
    raw: &mut Map<String, Value>,
    rope_scaling: &mut RopeScaling,
) -> Result<Deepseek2Dims, FormatError> {
    let key = |k: &str| format!("deepseek2.{k}");
    let int = |k: &str| g.get(&key(k)).and_then(GgufValue::as_usize);
    let missing = |k: &str, why: &str| FormatError::BadConfig {
        path: g.path.clone(),
        what: format!("missing or invalid metadata key '{}' ({why})", key(k)),
    };
    let req = |k: &str, why: &str| int(k).ok_or_else(|| missing(k, why));

    let kv_lora = req("attention.kv_lora_rank", "the latent width")?;
    let rope = req("rope.dimension_count", "qk_rope_head_dim")?;
    // The `_mla` keys (b11434's converter) give the per-head widths; files
    // without them (unsplit `attn_kv_b`) give them in key/value_length.
    let (qk, v_dim) = match (int("attention.key_length_mla"), int("attention.value_length_mla")) {
        (Some(k), Some(v)) => (k, v),
        _ => (
            req("attention.key_length", "without attention.key_length_mla: nope + rope")?,
            req("attention.value_length", "without attention.value_length_mla: v_head_dim")?,
        ),
    };
    if qk <= rope {
        return Err(FormatError::BadConfig {
            path: g.path.clone(),
            what: format!(
                "a key width of {qk} leaves no room beside {rope} rope dims ('{}')",
                key("rope.dimension_count")
            ),
        });
    }
    let q_lora = match int("attention.q_lora_rank").filter(|&r| r > 0) {
        Some(r) => Value::from(r),
        None if g.tensor("blk.0.attn_q_a.weight").is_some() => {
            return Err(missing("attention.q_lora_rank", "the file has attn_q_a"))
        }
        None => Value::Null,
    };
    let gating = match int("expert_gating_func") {
        None | Some(1) => "softmax",
        Some(2) => "sigmoid",
        Some(4) => "sqrtsoftplus",
        Some(other) => {
            return Err(FormatError::BadConfig {
                path: g.path.clone(),
                what: format!("unknown '{}' {other} (1 softmax, 2 sigmoid, 4 sqrtsoftplus)", key("expert_gating_func")),
            })
        }
    };
    let mut set = |k: &str, v: Value| {
        raw.insert(k.to_string(), v);
    };
    set("q_lora_rank", q_lora);
    set("kv_lora_rank", kv_lora.into());
    set("qk_rope_head_dim", rope.into());
    set("qk_nope_head_dim", (qk - rope).into());
    set("v_head_dim", v_dim.into());
    set("rope_interleave", true.into());
    set("first_k_dense_replace", int("leading_dense_block_count").unwrap_or(0).into());
    set("moe_intermediate_size", req("expert_feed_forward_length", "the routed experts' width")?.into());
    set("n_shared_experts", req("expert_shared_count", "the shared experts")?.into());
    set("n_routed_experts", req("expert_count", "the routed experts")?.into());
    set("num_experts_per_tok", req("expert_used_count", "experts per token")?.into());
    let scale = g.get_f32(&key("expert_weights_scale")).filter(|s| *s != 0.0).unwrap_or(1.0);
    set("routed_scaling_factor", f64::from(scale).into());
    set("norm_topk_prob", g.get_bool(&key("expert_weights_norm")).unwrap_or(false).into());
    set("scoring_func", gating.into());
    set("n_group", int("expert_group_count").unwrap_or(1).max(1).into());
    set("topk_group", int("expert_group_used_count").unwrap_or(1).max(1).into());

    if let (RopeScaling::Yarn { mscale, mscale_all_dim, .. }, Some(log_mul)) =
        (rope_scaling, g.get_f32(&key("rope.scaling.yarn_log_multiplier")))
    {
        // llama.cpp (llama-context.cpp) assumes `mscale == mscale_all_dim` for deepseek2.
        let all = log_mul / 0.1;
        *mscale_all_dim = Some(all);
        *mscale = Some(all);
    }
    Ok(Deepseek2Dims { head_dim: rope, n_kv_heads: n_heads })
}
