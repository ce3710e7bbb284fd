//! A parsed [`GgufFile`] → [`ModelFiles`]: config from `<arch>.*` keys, tensors under
//! HF names, tokenizer from `tokenizer.ggml.*`.

use crate::gguf::{GgufFile, GgufValue};
use crate::gguf_deepseek2::deepseek2_keys;
use crate::gguf_gemma3::{gemma3_keys, gemma3_norm_names};
use crate::gguf_qwen3next::{hybrid_keys, hybrid_tensors, is_hybrid};
use crate::names::gguf_to_hf;
use crate::{
    FormatError, GgufTokenizer, ModelConfig, ModelFiles, RopeScaling, SourceFormat, TensorData, TensorStore,
    TokenizerSource, WeightTensor,
};
use kernels::DType;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Arrays longer than this are left out of `ModelConfig::raw` (tokenizer vocabularies).
const RAW_ARRAY_LIMIT: usize = 64;

pub(crate) fn model_files(mut g: GgufFile) -> Result<ModelFiles, FormatError> {
    let mut tensors = tensor_store(&g)?;
    let config = model_config(&g)?;
    let gemma3 = g.architecture() == Some("gemma3");
    if gemma3 {
        gemma3_norm_names(&mut tensors);
    }
    if g.architecture() == Some("glm4moe") {
        glm4moe_norm_names(&mut tensors);
    }
    if g.architecture().is_some_and(is_hybrid) {
        hybrid_tensors(&mut tensors, &config)?;
    }
    let chat_template = g
        .get_str("tokenizer.chat_template")
        .map(str::to_string)
        .or_else(|| gemma3.then(|| crate::gguf_gemma3::GEMMA3_CHAT_TEMPLATE.to_string()));
    let tokenizer = tokenizer(&mut g)?;
    let token_str = |id: Option<u32>| match &tokenizer {
        TokenizerSource::Gguf(t) => id.and_then(|i| t.tokens.get(i as usize)).cloned(),
        _ => None,
    };
    let (bos_token, eos_token) = match &tokenizer {
        TokenizerSource::Gguf(t) => (token_str(t.bos_id), token_str(t.eos_id)),
        _ => (None, None),
    };
    Ok(ModelFiles { path: g.path.clone(), config, tensors, tokenizer, chat_template, bos_token, eos_token })
}

/// NVFP4's FP32 second-level scales, as llama.cpp writes them beside the
/// weight: `blk.N.ffn_gate.scale` (or `…weight.scale`), one F32 for a 2-D
/// weight, or one per expert (`blk.N.ffn_gate_exps.scale`, F32 `[n_expert]`)
/// for a stacked expert tensor; keyed by the weight's GGUF name.
/// `….input_scale` (activation scales) are not needed.
fn tensor_scales(g: &GgufFile) -> Result<BTreeMap<String, Vec<f32>>, FormatError> {
    let mut out = BTreeMap::new();
    for t in &g.tensors {
        let Some(base) = t.name.strip_suffix(".scale") else { continue };
        let bad = |what: String| FormatError::BadTensor { path: g.path.clone(), tensor: t.name.clone(), what };
        if t.ggml_type != 0 || t.n_bytes == 0 || t.n_bytes % 4 != 0 || t.shape().len() != 1 {
            return Err(bad(format!(
                "a second-level scale must be an F32 vector (one value, or one per expert), got {} {:?}",
                t.type_name(),
                t.shape()
            )));
        }
        let off = g.tensor_file_offset(t);
        let v: Vec<f32> = g.map()[off..off + t.n_bytes]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(x) = v.iter().find(|x| !x.is_finite() || **x <= 0.0) {
            return Err(bad(format!("per-tensor scale {x} is not a positive finite number")));
        }
        let weight = if base.ends_with(".weight") { base.to_string() } else { format!("{base}.weight") };
        out.insert(weight, v);
    }
    Ok(out)
}

fn tensor_store(g: &GgufFile) -> Result<TensorStore, FormatError> {
    let mut tensors = BTreeMap::new();
    let mut scales = tensor_scales(g)?;
    for t in &g.tensors {
        if t.name.ends_with(".scale") || t.name.ends_with(".input_scale") {
            continue;
        }
        let dtype = t.dtype().ok_or_else(|| FormatError::UnsupportedTensorType {
            path: g.path.clone(),
            tensor: t.name.clone(),
            type_name: t.type_name(),
        })?;
        let name = gguf_to_hf(&t.name);
        let data = TensorData::Mapped { map: g.map().clone(), offset: g.tensor_file_offset(t), len: t.n_bytes };
        let mut w = WeightTensor::new(name.clone(), dtype, t.shape(), data);
        kernels::quant::validate(dtype, w.bytes()).map_err(|e| FormatError::BadTensor {
            path: g.path.clone(),
            tensor: t.name.clone(),
            what: e.to_string(),
        })?;
        match scales.remove(&t.name) {
            Some(s) if s.len() == 1 => w.out_scale = s[0],
            // One per expert: kept beside the stack as `<name>_scales` (F32
            // `[n_expert]`), which the model applies to each expert it slices.
            Some(s) if t.shape().len() == 3 && s.len() == t.shape()[0] => {
                let bytes: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
                let scales_name = format!("{}_scales", name.trim_end_matches(".weight"));
                let sw = WeightTensor::new(
                    scales_name.clone(),
                    DType::F32,
                    vec![s.len()],
                    TensorData::Owned(std::sync::Arc::new(bytes)),
                );
                tensors.insert(scales_name, sw);
            }
            Some(s) => {
                return Err(FormatError::BadTensor {
                    path: g.path.clone(),
                    tensor: format!("{}.scale", t.name.trim_end_matches(".weight")),
                    what: format!("{} scale values for a weight of shape {:?}", s.len(), t.shape()),
                })
            }
            None => {}
        }
        if tensors.insert(name.clone(), w).is_some() {
            return Err(FormatError::Corrupt {
                path: g.path.clone(),
                what: format!("two tensors map to the same name '{name}'"),
            });
        }
    }
    if let Some(name) = scales.keys().next() {
        return Err(FormatError::BadTensor {
            path: g.path.clone(),
            tensor: name.clone(),
            what: "has a '.scale' tensor but no such weight".to_string(),
        });
    }
    Ok(TensorStore { path: g.path.clone(), tensors })
}

/// GGUF `general.architecture` → HF `model_type`.
pub fn hf_arch_name(gguf_arch: &str) -> String {
    match gguf_arch {
        "qwen2moe" => "qwen2_moe".to_string(),
        "qwen3moe" => "qwen3_moe".to_string(),
        "gpt-oss" => "gpt_oss".to_string(),
        "deepseek2" => "deepseek_v3".to_string(),
        "gemma3" => "gemma3_text".to_string(),
        "glm4moe" => "glm4_moe".to_string(),
        "minimax-m2" => "minimax_m2".to_string(),
        "qwen3next" => "qwen3_next".to_string(),
        "qwen35" => "qwen3_5_text".to_string(),
        "qwen35moe" => "qwen3_5_moe_text".to_string(),
        other => other.to_string(),
    }
}

fn model_config(g: &GgufFile) -> Result<ModelConfig, FormatError> {
    let bad = |what: String| FormatError::BadConfig { path: g.path.clone(), what };
    let arch = g
        .architecture()
        .ok_or_else(|| bad("missing metadata key 'general.architecture' (string)".to_string()))?
        .to_string();
    let key = |k: &str| format!("{arch}.{k}");
    // Integer keys; some converters store per-layer arrays (take the first entry).
    let int = |k: &str| -> Option<usize> {
        match g.get(&key(k))? {
            GgufValue::Array(_, items) => items.first()?.as_usize(),
            v => v.as_usize(),
        }
    };
    let req = |k: &str| int(k).ok_or_else(|| bad(format!("missing or invalid metadata key '{}'", key(k))));
    let float = |k: &str| g.get_f32(&key(k));

    // GLM-4.5 counts its multi-token-prediction layers in block_count; the
    // forward pass stops before them.
    let n_layers = req("block_count")?.saturating_sub(int("nextn_predict_layers").unwrap_or(0));
    let hidden_size = req("embedding_length")?;
    let n_heads = req("attention.head_count")?;
    if n_heads == 0 {
        return Err(bad(format!("'{}' is 0", key("attention.head_count"))));
    }
    let n_kv_heads = int("attention.head_count_kv").unwrap_or(n_heads);
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(bad(format!("{n_heads} attention heads cannot be shared by {n_kv_heads} key/value heads")));
    }
    let intermediate_size = int("feed_forward_length")
        .or_else(|| int("expert_feed_forward_length"))
        .ok_or_else(|| bad(format!("missing or invalid metadata key '{}'", key("feed_forward_length"))))?;
    let mut head_dim = int("attention.key_length").unwrap_or(hidden_size / n_heads);
    let mut n_kv_heads = n_kv_heads;
    let rope_dim = int("rope.dimension_count").unwrap_or(head_dim);
    let max_position_embeddings = int("context_length").unwrap_or(2048);
    let vocab_size = int("vocab_size")
        .or_else(|| g.get_array("tokenizer.ggml.tokens").map(<[_]>::len))
        .or_else(|| g.tensor("token_embd.weight").and_then(|t| t.dims.get(1)).map(|&d| d as usize))
        .ok_or_else(|| {
            bad(format!("cannot tell the vocabulary size: no '{}' or tokenizer.ggml.tokens", key("vocab_size")))
        })?;

    let rope_scaling = match g.get_str(&key("rope.scaling.type")).unwrap_or("none") {
        "none" | "" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: float("rope.scaling.factor").unwrap_or(1.0) },
        "yarn" => RopeScaling::Yarn {
            factor: float("rope.scaling.factor").unwrap_or(1.0),
            original_max_position_embeddings: int("rope.scaling.original_context_length")
                .unwrap_or(max_position_embeddings),
            beta_fast: float("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
            beta_slow: float("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
            attention_factor: float("rope.scaling.attn_factor"),
            mscale: None,
            mscale_all_dim: None,
            truncate: true,
        },
        other => return Err(bad(format!("unsupported rope scaling type '{other}' in '{}'", key("rope.scaling.type")))),
    };

    let bos_token_id = g.get_u64("tokenizer.ggml.bos_token_id").and_then(|v| u32::try_from(v).ok());
    let mut eos_token_ids = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = g.get_u64(k).and_then(|v| u32::try_from(v).ok()) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }

    let mut raw = Map::new();
    for (k, v) in &g.metadata {
        if v.as_array().is_some_and(|a| a.len() > RAW_ARRAY_LIMIT) {
            continue;
        }
        raw.insert(k.clone(), v.to_json());
    }
    moe_keys(g, &arch, n_layers, &mut raw);
    let mut rope_scaling = rope_scaling;
    if arch == "gpt-oss" {
        gpt_oss_keys(g, n_layers, &mut raw);
        // gpt-oss defines its yarn without rounding the correction range
        // (transformers' `truncate: false`); llama.cpp rounds it.
        if let RopeScaling::Yarn { truncate, .. } = &mut rope_scaling {
            *truncate = false;
        }
    }
    if arch == "gemma3" {
        gemma3_keys(g, n_layers, head_dim, &mut raw);
    }
    if arch == "glm4moe" {
        glm4moe_keys(g, &mut raw);
    }
    if is_hybrid(&arch) {
        hybrid_keys(g, &arch, n_layers, &mut raw)?;
    }
    if arch == "deepseek2" {
        let dims = deepseek2_keys(g, n_heads, &mut raw, &mut rope_scaling)?;
        (head_dim, n_kv_heads) = (dims.head_dim, dims.n_kv_heads);
    }

    Ok(ModelConfig {
        // llama.cpp writes Mixtral as `llama` with experts.
        arch: if arch == "llama" && int("expert_count").is_some_and(|n| n > 0) {
            "mixtral".to_string()
        } else {
            hf_arch_name(&arch)
        },
        source: SourceFormat::Gguf,
        hidden_size,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        intermediate_size,
        vocab_size,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        rope_theta: float("rope.freq_base").unwrap_or(10000.0),
        rope_scaling,
        rope_dim,
        max_position_embeddings,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        attention_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        sliding_window: int("attention.sliding_window").filter(|&w| w > 0),
        bos_token_id,
        eos_token_ids,
        raw: Value::Object(raw),
    })
}

/// The mixture-of-experts metadata under the HF config names the model code
/// reads (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
/// `shared_expert_intermediate_size`, `norm_topk_prob`, `mlp_only_layers`).
/// llama.cpp renormalizes the top-k weights for qwen3moe and llama (Mixtral),
/// not for qwen2moe, unless `expert_weights_norm` says otherwise; a layer with a dense
/// `ffn_gate` and no router `ffn_gate_inp` is a dense (`mlp_only`) layer.
fn moe_keys(g: &GgufFile, arch: &str, n_layers: usize, raw: &mut Map<String, Value>) {
    let int = |k: &str| g.get(&format!("{arch}.{k}")).and_then(GgufValue::as_usize);
    let Some(experts) = int("expert_count").filter(|&n| n > 0) else { return };
    raw.insert("num_experts".into(), experts.into());
    for (gguf, hf) in [
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
        ("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
    ] {
        if let Some(v) = int(gguf) {
            raw.insert(hf.into(), v.into());
        }
    }
    let norm = g.get_bool(&format!("{arch}.expert_weights_norm")).unwrap_or(matches!(arch, "qwen3moe" | "llama"));
    raw.insert("norm_topk_prob".into(), norm.into());
    let dense: Vec<Value> = (0..n_layers)
        .filter(|l| {
            g.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none()
                && g.tensor(&format!("blk.{l}.ffn_gate.weight")).is_some()
        })
        .map(Value::from)
        .collect();
    raw.insert("mlp_only_layers".into(), Value::Array(dense));
}

/// gpt-oss's windowed layers as HF `layer_types`: llama.cpp's
/// `attention.sliding_window_pattern` is a per-layer bool array, or a period
/// `n` (layer `l` windowed when `l % n < n − 1`; absent: 2, even layers).
fn gpt_oss_keys(g: &GgufFile, n_layers: usize, raw: &mut Map<String, Value>) {
    let windowed: Vec<bool> = match g.get("gpt-oss.attention.sliding_window_pattern") {
        Some(GgufValue::Array(_, items)) => {
            items.iter().map(|v| matches!(v, GgufValue::Bool(true)) || v.as_usize().is_some_and(|x| x != 0)).collect()
        }
        other => {
            let n = other.and_then(GgufValue::as_usize).unwrap_or(2).max(1);
            (0..n_layers).map(|l| l % n < n - 1).collect()
        }
    };
    let types = windowed.iter().map(|&w| Value::from(if w { "sliding_attention" } else { "full_attention" }));
    raw.insert("layer_types".into(), Value::Array(types.collect()));
}

/// GLM-4.5's pre-MLP norm is llama.cpp's `post_attention_norm` (HF's
/// `post_attention_layernorm`; the common map knows it as `ffn_norm`).
fn glm4moe_norm_names(store: &mut TensorStore) {
    let old = std::mem::take(&mut store.tensors);
    for (name, w) in old {
        let renamed = name
            .strip_prefix("blk.")
            .and_then(|r| r.strip_suffix(".post_attention_norm.weight"))
            .map(|layer| format!("model.layers.{layer}.post_attention_layernorm.weight"))
            .unwrap_or(name);
        store.tensors.insert(renamed.clone(), WeightTensor { name: renamed, ..w });
    }
}

/// GLM-4.5's routing under the HF names `arch::deepseek_v3::sigmoid_moe`
/// reads (llama.cpp's deepseek2 keys, without its attention).
fn glm4moe_keys(g: &GgufFile, raw: &mut Map<String, Value>) {
    let int = |k: &str| g.get(&format!("glm4moe.{k}")).and_then(GgufValue::as_usize);
    for (gguf, hf, default) in [
        ("expert_count", "n_routed_experts", 0),
        ("expert_shared_count", "n_shared_experts", 0),
        ("leading_dense_block_count", "first_k_dense_replace", 0),
        ("expert_group_count", "n_group", 1),
        ("expert_group_used_count", "topk_group", 1),
    ] {
        raw.insert(hf.into(), int(gguf).unwrap_or(default).into());
    }
    let scale = g.get_f32("glm4moe.expert_weights_scale").filter(|s| *s != 0.0).unwrap_or(1.0);
    raw.insert("routed_scaling_factor".into(), f64::from(scale).into());
    raw.insert("norm_topk_prob".into(), g.get_bool("glm4moe.expert_weights_norm").unwrap_or(false).into());
    raw.insert("use_qk_norm".into(), g.tensor("blk.0.attn_q_norm.weight").is_some().into());
}

/// Moves the `tokenizer.ggml.*` arrays out of the metadata (they can be large).
fn tokenizer(g: &mut GgufFile) -> Result<TokenizerSource, FormatError> {
    let Some(model) = g.get_str("tokenizer.ggml.model").map(str::to_string) else {
        return Ok(TokenizerSource::None);
    };
    let path = g.path.clone();
    let bad = |key: &str, want: &str| FormatError::BadConfig { path: path.clone(), what: format!("'{key}' {want}") };
    let mut take_array = |key: &str| match g.metadata.remove(key) {
        None => Ok(Vec::new()),
        Some(GgufValue::Array(_, items)) => Ok(items),
        Some(_) => Err(bad(key, "must be an array")),
    };
    let tokens = take_array("tokenizer.ggml.tokens")?
        .into_iter()
        .map(|v| match v {
            GgufValue::String(s) => Ok(s),
            _ => Err(bad("tokenizer.ggml.tokens", "must hold strings")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let merges = take_array("tokenizer.ggml.merges")?
        .into_iter()
        .map(|v| match v {
            GgufValue::String(s) => Ok(s),
            _ => Err(bad("tokenizer.ggml.merges", "must hold strings")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let token_types = take_array("tokenizer.ggml.token_type")?
        .iter()
        .map(|v| {
            v.as_i64()
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(|| bad("tokenizer.ggml.token_type", "must hold integers"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let scores = take_array("tokenizer.ggml.scores")?
        .iter()
        .map(|v| v.as_f64().map(|f| f as f32).ok_or_else(|| bad("tokenizer.ggml.scores", "must hold numbers")))
        .collect::<Result<Vec<_>, _>>()?;
    let id = |k: &str| g.get_u64(k).and_then(|v| u32::try_from(v).ok());
    Ok(TokenizerSource::Gguf(GgufTokenizer {
        model,
        pre: g.get_str("tokenizer.ggml.pre").map(str::to_string),
        tokens,
        token_types,
        scores,
        merges,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: g.get_bool("tokenizer.ggml.add_bos_token"),
        add_eos: g.get_bool("tokenizer.ggml.add_eos_token"),
        add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix"),
    }))
}
