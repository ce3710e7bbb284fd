//! llama.cpp's `gemma3` GGUF in the HF names and keys the model code reads.
//!
//! Keys: the windowed layers as HF `layer_types` (llama.cpp: the per-layer
//! bool array `attention.sliding_window_pattern`, or its period, 6 when
//! absent: layer `l` windowed when `l % n < n − 1`), the windowed layers'
//! rope base as `rope_local_base_freq` (`rope.freq_base_swa`, 10 000 when
//! absent) and `query_pre_attn_scalar`: llama.cpp scales queries by
//! `1/√key_length`, except for the 27B (62 layers), `1/√(hidden/heads)`.
//!
//! Tensors: Gemma's four norms. llama.cpp's `ffn_norm` (which the common map
//! makes `post_attention_layernorm`) is the pre-MLP norm here, and its
//! `post_attention_norm` / `post_ffw_norm` are the norms on the attention
//! and MLP outputs. The weights already hold `1 + w`.
//!
//! Chat template: llama.cpp's converter writes none into Gemma 3 GGUFs taken
//! from a base checkpoint's tokenizer.model (the published 270M has none,
//! and llama.cpp then falls back to ChatML, which Gemma never saw). Such a
//! file gets Gemma 3's own template ([`GEMMA3_CHAT_TEMPLATE`], the one its
//! HF `tokenizer_config.json` ships).

use crate::gguf::{GgufFile, GgufValue};
use crate::{TensorStore, WeightTensor};
use serde_json::{Map, Value};

pub(crate) fn gemma3_keys(g: &GgufFile, n_layers: usize, head_dim: usize, raw: &mut Map<String, Value>) {
    let key = |k: &str| format!("gemma3.{k}");
    let windowed: Vec<bool> = match g.get(&key("attention.sliding_window_pattern")) {
        Some(GgufValue::Array(_, items)) => {
            items.iter().map(|v| matches!(v, GgufValue::Bool(true)) || v.as_usize().is_some_and(|x| x != 0)).collect()
        }
        other => {
            let n = other.and_then(GgufValue::as_usize).unwrap_or(6).max(1);
            (0..n_layers).map(|l| l % n < n - 1).collect()
        }
    };
    let types = windowed.iter().map(|&w| Value::from(if w { "sliding_attention" } else { "full_attention" }));
    raw.insert("layer_types".into(), Value::Array(types.collect()));
    let local = g.get_f32(&key("rope.freq_base_swa")).unwrap_or(10_000.0);
    raw.insert("rope_local_base_freq".into(), Value::from(local as f64));
    let hidden = g.get(&key("embedding_length")).and_then(GgufValue::as_usize).unwrap_or(0);
    let heads = g.get(&key("attention.head_count")).and_then(GgufValue::as_usize).unwrap_or(1).max(1);
    let scalar = if n_layers == 62 { hidden / heads } else { head_dim };
    raw.insert("query_pre_attn_scalar".into(), Value::from(scalar));
    if let Some(cap) = g.get_f32(&key("final_logit_softcapping")).filter(|&c| c != 0.0) {
        raw.insert("final_logit_softcapping".into(), Value::from(cap as f64));
    }
}

/// Renames the norms of every layer to Gemma's HF names (see the module
/// comment).
pub(crate) fn gemma3_norm_names(store: &mut TensorStore) {
    let old = std::mem::take(&mut store.tensors);
    for (name, w) in old {
        let renamed = rename(&name).unwrap_or(name);
        store.tensors.insert(renamed.clone(), WeightTensor { name: renamed, ..w });
    }
}

fn rename(name: &str) -> Option<String> {
    if let Some(layer) =
        name.strip_prefix("model.layers.").and_then(|r| r.strip_suffix(".post_attention_layernorm.weight"))
    {
        return Some(format!("model.layers.{layer}.pre_feedforward_layernorm.weight"));
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let hf = match part {
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Gemma 3's chat template (`<start_of_turn>user … <end_of_turn>`, the system
/// message folded into the first user turn), for GGUFs that carry none.
pub const GEMMA3_CHAT_TEMPLATE: &str = include_str!("gemma3_chat_template.jinja");
