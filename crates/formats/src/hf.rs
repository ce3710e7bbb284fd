//! Hugging Face model directories.
//!
//! * `config.json` → [`ModelConfig`] (parsed from a `serde_json::Value`, tolerant of
//!   old `rope_theta`/`rope_scaling` and new `rope_parameters` layouts).
//! * `generation_config.json` → eos/bos ids (preferred over `config.json`).
//! * `model.safetensors` or `model.safetensors.index.json` + shards: headers parsed
//!   here, data memory-mapped and never copied.
//! * `tokenizer.json`, `tokenizer_config.json` (chat template, bos/eos strings),
//!   falling back to `chat_template.jinja` / `chat_template.json`.

use crate::gguf::map_file;
use crate::lowbit::{raw_elem_bytes, RawTensor};
use crate::{
    FormatError, ModelConfig, ModelFiles, RopeScaling, SourceFormat, TensorData, TensorStore, TokenizerSource,
    WeightTensor,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// Opens an HF directory (`config.json` + safetensors + tokenizer files).
pub fn open_dir(path: &Path) -> Result<ModelFiles, FormatError> {
    let config_path = path.join("config.json");
    let cfg = read_json(&config_path)?.ok_or_else(|| FormatError::NotFound { path: config_path.clone() })?;
    let gen = read_json(&path.join("generation_config.json"))?;
    let config = parse_config(&config_path, &cfg, gen.as_ref())?;
    let tensors = load_weights(path, &crate::lowbit::QuantHints::from_config(&cfg))?;

    let tokenizer_json = path.join("tokenizer.json");
    let tokenizer =
        if tokenizer_json.is_file() { TokenizerSource::HfJson(tokenizer_json) } else { TokenizerSource::None };
    let tok_cfg = read_json(&path.join("tokenizer_config.json"))?;
    let special = |k: &str| tok_cfg.as_ref().and_then(|t| token_string(t.get(k)?));
    let mut chat_template = tok_cfg.as_ref().and_then(|t| template_from(t.get("chat_template")?));
    if chat_template.is_none() {
        chat_template = read_text(&path.join("chat_template.jinja"))?;
    }
    if chat_template.is_none() {
        chat_template =
            read_json(&path.join("chat_template.json"))?.and_then(|t| template_from(t.get("chat_template")?));
    }
    Ok(ModelFiles {
        path: path.to_path_buf(),
        config,
        tensors,
        tokenizer,
        chat_template,
        bos_token: special("bos_token"),
        eos_token: special("eos_token"),
    })
}

/// Reads and parses a JSON file; `Ok(None)` if it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, FormatError> {
    let Some(text) = read_text(path)? else { return Ok(None) };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| FormatError::BadConfig { path: path.to_path_buf(), what: format!("invalid JSON: {e}") })
}

fn read_text(path: &Path) -> Result<Option<String>, FormatError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FormatError::Io { path: path.to_path_buf(), source: e }),
    }
}

/// `"<s>"` or `{"content": "<s>", ...}`.
fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// A template string, or the list form `[{"name": "default", "template": ...}, ...]`.
fn template_from(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |n: &str| list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n));
            let pick = named("default").or_else(|| list.first())?;
            pick.get("template")?.as_str().map(str::to_string)
        }
        _ => None,
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    match v.as_u64() {
        Some(n) => usize::try_from(n).ok(),
        None => v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as usize),
    }
}

fn as_f32(v: &Value) -> Option<f32> {
    v.as_f64().map(|f| f as f32)
}

/// An int or a list of ints.
fn id_list(v: &Value) -> Vec<u32> {
    match v {
        Value::Array(a) => a.iter().filter_map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect(),
        other => other.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
    }
}

/// Builds a [`ModelConfig`] from a parsed `config.json` (and `generation_config.json`).
/// `path` is only used in error messages.
pub fn parse_config(path: &Path, cfg: &Value, gen: Option<&Value>) -> Result<ModelConfig, FormatError> {
    let bad = |what: String| FormatError::BadConfig { path: path.to_path_buf(), what };
    if !cfg.is_object() {
        return Err(bad("config is not a JSON object".to_string()));
    }
    // Multimodal configs nest the language model under `text_config`.
    let c = match cfg.get("text_config") {
        Some(t) if t.is_object() && cfg.get("hidden_size").is_none() => t,
        _ => cfg,
    };
    let get = |k: &str| c.get(k).filter(|v| !v.is_null());
    let req = |k: &str| get(k).and_then(as_usize).ok_or_else(|| bad(format!("missing or invalid '{k}'")));

    let arch = get("model_type")
        .or_else(|| cfg.get("model_type"))
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing 'model_type'".to_string()))?
        .to_string();
    let hidden_size = req("hidden_size")?;
    let n_layers = req("num_hidden_layers")?;
    let n_heads = req("num_attention_heads")?;
    if n_heads == 0 {
        return Err(bad("'num_attention_heads' is 0".to_string()));
    }
    let n_kv_heads = get("num_key_value_heads").and_then(as_usize).unwrap_or(n_heads);
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(bad(format!("{n_heads} attention heads cannot be shared by {n_kv_heads} key/value heads")));
    }
    let head_dim = get("head_dim").and_then(as_usize).unwrap_or(hidden_size / n_heads);
    // MoE-only configs (qwen3_5_moe_text) have no dense width: the experts'.
    let intermediate_size = match get("intermediate_size").and_then(as_usize) {
        Some(n) => n,
        None => get("moe_intermediate_size").and_then(as_usize).map_or_else(|| req("intermediate_size"), Ok)?,
    };
    let vocab_size = req("vocab_size")?;
    let max_position_embeddings = get("max_position_embeddings").and_then(as_usize).unwrap_or(2048);
    let rms_norm_eps = get("rms_norm_eps").or_else(|| get("layer_norm_epsilon")).and_then(as_f32).unwrap_or(1e-6);
    // Partial rotary: `partial_rotary_factor` at the top or in
    // `rope_parameters` (GLM-4.5, MiniMax-M2), or MiniMax's `rotary_dim`.
    let partial = get("partial_rotary_factor")
        .or_else(|| get("rope_parameters").and_then(|p| p.get("partial_rotary_factor")))
        .and_then(Value::as_f64);
    let rope_dim = match (partial, get("rotary_dim").and_then(as_usize)) {
        (Some(f), _) => ((head_dim as f64) * f).round() as usize,
        (None, Some(d)) if d <= head_dim => d,
        _ => head_dim,
    };
    let (rope_theta, rope_scaling) = rope(c, max_position_embeddings).map_err(bad)?;

    let attention_bias = matches!(arch.as_str(), "qwen2" | "qwen2_moe")
        || get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
    let sliding_window = if get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
        None
    } else {
        get("sliding_window").and_then(as_usize)
    };

    let from = |k: &str| gen.and_then(|g| g.get(k)).filter(|v| !v.is_null()).or_else(|| get(k)).or_else(|| cfg.get(k));
    let bos_token_id = from("bos_token_id").and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
    let eos_token_ids = from("eos_token_id").map(id_list).unwrap_or_default();

    Ok(ModelConfig {
        arch,
        source: SourceFormat::Safetensors,
        hidden_size,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        intermediate_size,
        vocab_size,
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        rope_dim,
        max_position_embeddings,
        tie_word_embeddings: get("tie_word_embeddings")
            .or_else(|| cfg.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        attention_bias,
        sliding_window,
        bos_token_id,
        eos_token_ids,
        raw: cfg.clone(),
    })
}

/// Rope theta and scaling from `rope_theta` + `rope_scaling` or `rope_parameters`.
fn rope(c: &Value, max_pos: usize) -> Result<(f32, RopeScaling), String> {
    let mut params = c.get("rope_parameters").filter(|v| v.is_object());
    // Per-layer-type form: {"full_attention": {...}, "sliding_attention": {...}}.
    if let Some(full) = params.and_then(|p| p.get("full_attention")).filter(|v| v.is_object()) {
        params = Some(full);
    }
    let theta = c
        .get("rope_theta")
        .and_then(as_f32)
        .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(as_f32))
        .unwrap_or(10000.0);
    let Some(s) = c.get("rope_scaling").filter(|v| v.is_object()).or(params) else {
        return Ok((theta, RopeScaling::None));
    };
    let ty = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    let f = |k: &str| s.get(k).and_then(as_f32);
    let factor = f("factor").unwrap_or(1.0);
    let orig = s.get("original_max_position_embeddings").and_then(as_usize);
    let scaling = match ty {
        "default" | "none" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor },
        "llama3" => RopeScaling::Llama3 {
            factor,
            low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: orig.unwrap_or(8192),
        },
        "yarn" => RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: orig.unwrap_or(max_pos),
            beta_fast: f("beta_fast").unwrap_or(32.0),
            beta_slow: f("beta_slow").unwrap_or(1.0),
            attention_factor: f("attention_factor"),
            mscale: f("mscale"),
            mscale_all_dim: f("mscale_all_dim"),
            truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => return Err(format!("unsupported rope type '{other}' (supported: default, linear, llama3, yarn)")),
    };
    Ok((theta, scaling))
}

/// `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
/// Low-bit layers are assembled from their companion tensors across all shards.
fn load_weights(dir: &Path, hints: &crate::lowbit::QuantHints) -> Result<TensorStore, FormatError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        let raw = read_safetensors_raw(&single)?;
        let tensors = crate::lowbit::assemble(&single, raw, hints)?.into_iter().map(|t| (t.name.clone(), t)).collect();
        return Ok(TensorStore { path: single, tensors });
    }
    let index_path = dir.join("model.safetensors.index.json");
    let Some(index) = read_json(&index_path)? else {
        return Err(FormatError::NotFound { path: single });
    };
    let bad = |what: String| FormatError::BadConfig { path: index_path.clone(), what };
    let weight_map =
        index.get("weight_map").and_then(Value::as_object).ok_or_else(|| bad("missing 'weight_map' object".into()))?;
    let mut files = BTreeSet::new();
    for (name, file) in weight_map {
        files.insert(file.as_str().ok_or_else(|| bad(format!("weight_map['{name}'] is not a file name")))?);
    }
    let mut raw = BTreeMap::new();
    for file in files {
        let shard = dir.join(file);
        for t in read_safetensors_raw(&shard)? {
            if raw.contains_key(&t.name) {
                return Err(FormatError::Corrupt {
                    path: shard,
                    what: format!("tensor '{}' also appears in another shard", t.name),
                });
            }
            raw.insert(t.name.clone(), t);
        }
    }
    if let Some((name, file)) = weight_map.iter().find(|(name, _)| !raw.contains_key(*name)) {
        return Err(bad(format!("weight_map lists tensor '{name}' in {file}, but that file does not contain it")));
    }
    let tensors = crate::lowbit::assemble(dir, raw.into_values().collect(), hints)?
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    Ok(TensorStore { path: dir.to_path_buf(), tensors })
}

/// One safetensors file as loadable weights (low-bit layers assembled; see
/// [`crate::lowbit`]; the FP8 block shape defaults to 128×128).
pub fn read_safetensors(path: &Path) -> Result<Vec<WeightTensor>, FormatError> {
    let raw = read_safetensors_raw(path)?;
    crate::lowbit::assemble(path, raw, &crate::lowbit::QuantHints::default())
}

/// Parses one safetensors file's header and maps its data: every tensor is a
/// [`TensorData::Mapped`] view, validated to lie inside the file and to hold exactly
/// `numel × element size` bytes.
pub fn read_safetensors_raw(path: &Path) -> Result<Vec<RawTensor>, FormatError> {
    let corrupt = |what: String| FormatError::Corrupt { path: path.to_path_buf(), what };
    let map = Arc::new(map_file(path)?);
    let len = map.len();
    if len < 8 {
        return Err(corrupt(format!("safetensors header length: file is only {len} bytes")));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&map[..8]);
    let n = u64::from_le_bytes(n);
    if n > (len - 8) as u64 {
        return Err(corrupt(format!("safetensors header: length {n} exceeds the {} bytes after it", len - 8)));
    }
    let data_start = 8 + n as usize;
    let header: Value = serde_json::from_slice(&map[8..data_start])
        .map_err(|e| corrupt(format!("safetensors header: invalid JSON: {e}")))?;
    let obj = header.as_object().ok_or_else(|| corrupt("safetensors header: not a JSON object".into()))?;
    let data_len = len - data_start;

    let mut out = Vec::with_capacity(obj.len());
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let field = |what: &str| corrupt(format!("safetensors header: tensor '{name}': missing or invalid '{what}'"));
        let dtype_name = info.get("dtype").and_then(Value::as_str).ok_or_else(|| field("dtype"))?;
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(as_usize).collect::<Option<Vec<_>>>())
            .ok_or_else(|| field("shape"))?;
        let offsets = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(as_usize).collect::<Option<Vec<_>>>())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| field("data_offsets"))?;
        let (start, end) = (offsets[0], offsets[1]);
        if start > end || end > data_len {
            return Err(corrupt(format!(
                "tensor '{name}' data bytes [{start}, {end}) lie outside the data section ({data_len} bytes)"
            )));
        }
        let elem = raw_elem_bytes(dtype_name).ok_or_else(|| FormatError::UnsupportedTensorType {
            path: path.to_path_buf(),
            tensor: name.clone(),
            type_name: dtype_name.to_string(),
        })?;
        let expected = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(elem));
        if expected != Some(end - start) {
            return Err(corrupt(format!(
                "tensor '{name}' has {} bytes of data, but shape {shape:?} of {dtype_name} needs {}",
                end - start,
                expected.map_or_else(|| "more than fit in memory".to_string(), |b| b.to_string())
            )));
        }
        let data = TensorData::Mapped { map: map.clone(), offset: data_start + start, len: end - start };
        out.push(RawTensor { name: name.clone(), dtype: dtype_name.to_string(), shape, data });
    }
    Ok(out)
}
