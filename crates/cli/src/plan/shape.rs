//! What the planner needs to know about a model: sizes by role (embedding,
//! head, attention, dense MLP, experts), bytes per token read at decode, KV
//! bytes per token, and FLOPs. From a GGUF file or HF directory (exact tensor
//! bytes), an HF `config.json` alone, or parameters given on the command line.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// Bits per weight of each storage format, scales included, from the kernels'
/// block table ([`kernels::DType::bits_per_weight`]: e.g. Q4_0 is 18 bytes per
/// 32 weights = 4.5 bits, NVFP4 one E4M3 scale per 16 E2M1 values = 4.5, MXFP4
/// one E8M0 per 32 = 4.25, IQ4_XS 4.25, Q2_K 2.625); publishers' FP8 (no block
/// scale in the count) is 8.
pub fn bits_per_weight(quant: &str) -> Option<f64> {
    match quant.to_ascii_lowercase().as_str() {
        "fp8" | "f8_e4m3" => Some(8.0),
        q => kernels::DType::parse(q).map(|d| d.bits_per_weight()),
    }
}

/// Whether `quant` is a float format (the engine keeps a float checkpoint's
/// KV cache in f32).
pub fn is_float(quant: &str) -> bool {
    matches!(quant.to_ascii_lowercase().as_str(), "f32" | "f16" | "bf16")
}

/// Routed experts per MoE layer in an HF config (0: dense).
pub fn n_experts(config: &Value) -> usize {
    get(config, &["num_local_experts", "num_experts", "n_routed_experts"]).unwrap_or(0) as usize
}

/// Model sizes the cost model works from. Bytes are as stored (or as they will
/// be stored at `--quant`).
#[derive(Debug, Clone)]
pub struct Shape {
    pub name: String,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// Elements cached per token per layer (K and V; MLA: latent + rope key).
    pub kv_elems_per_layer: usize,
    /// Every tensor rank caches the whole row (MLA: the latent is shared by
    /// all heads, so it is replicated, not split by heads like GQA's K/V).
    pub kv_replicated: bool,
    /// Bytes of the token embedding table (read one row a token).
    pub embed_bytes: f64,
    /// Bytes of the output head (read whole every decoded token; 0 if tied and
    /// counted in `embed_bytes`... see `head_reads_embed`).
    pub head_bytes: f64,
    /// The head is the embedding table (tied): stored once, read whole.
    pub head_reads_embed: bool,
    /// Per layer: attention projections, dense/shared MLP, and all routed experts.
    pub attn_bytes: f64,
    /// Of `attn_bytes`, what every tensor rank holds whole: MLA's q_a and
    /// kv_a down-projections and their norms (model::mla replicates them so
    /// each rank computes the latent itself). 0 for GQA.
    pub attn_replicated_bytes: f64,
    pub dense_bytes: f64,
    pub expert_bytes: f64,
    /// Routed experts per MoE layer and how many each token uses.
    pub experts: usize,
    pub active_experts: usize,
    /// The quantization the bytes are for, and its block size (never split).
    pub quant: String,
    /// The model's files, when it was read from them (not a config or parameters).
    pub path: Option<std::path::PathBuf>,
    /// The model's context length (`max_position_embeddings`), when known: the
    /// engine balances pipeline stages by their bytes at this context.
    pub max_context: Option<usize>,
    /// Sliding-window layers, which keep only a ring of `ring` positions
    /// (`model::ring_positions` of their window) in a contiguous cache.
    pub ring_layers: usize,
    pub ring: usize,
    /// Linear-attention state (f32 recurrent and convolution state) one
    /// sequence holds, averaged over all layers: fixed, whatever the context
    /// (`model::layer_memory`). 0 without linear attention.
    pub state_bytes_per_layer: f64,
    /// Per layer: whether it is windowed (empty when unknown: a config
    /// without a spec, or parameters; the windowed layers are then spread
    /// evenly, [`Shape::kv_positions`]).
    pub windowed: Vec<bool>,
}

impl Shape {
    /// All weight bytes.
    pub fn total_bytes(&self) -> f64 {
        let head = if self.head_reads_embed { 0.0 } else { self.head_bytes };
        self.embed_bytes + head + self.layers as f64 * self.layer_bytes()
    }

    pub fn layer_bytes(&self) -> f64 {
        self.attn_bytes + self.dense_bytes + self.expert_bytes
    }

    /// Weight bytes one decoded token reads in one layer: attention, the dense
    /// part and only the active experts.
    pub fn layer_active_bytes(&self) -> f64 {
        let frac = if self.experts > 0 { self.active_experts as f64 / self.experts as f64 } else { 0.0 };
        self.attn_bytes + self.dense_bytes + self.expert_bytes * frac
    }

    /// The head as read per token.
    pub fn head_read_bytes(&self) -> f64 {
        if self.head_reads_embed {
            self.embed_bytes
        } else {
            self.head_bytes
        }
    }

    /// Weight bytes read per decoded token (the whole model for dense models).
    pub fn active_bytes(&self) -> f64 {
        self.layers as f64 * self.layer_active_bytes() + self.head_read_bytes()
    }

    /// Parameters per token (multiply-adds) in the layers and head, from bytes.
    pub fn active_params(&self) -> f64 {
        self.active_bytes() * 8.0 / bits_per_weight(&self.quant).unwrap_or(16.0)
    }

    /// The share of the KV cache a tensor rank holds, given its share of the
    /// attention heads: all of it when the cache is replicated (MLA).
    pub fn kv_share(&self, attn_share: f64) -> f64 {
        if self.kv_replicated {
            1.0
        } else {
            attn_share
        }
    }

    /// KV bytes per token of context over all layers, `elem` bytes per value
    /// (windowed layers counted whole: the rate before their rings fill).
    pub fn kv_bytes_per_token(&self, elem: f64) -> f64 {
        (self.layers * self.kv_elems_per_layer) as f64 * elem
    }

    /// Cached positions per layer, on average, at `depth` positions of
    /// context: every one for full layers, at most `ring` for windowed ones.
    pub fn kv_positions_per_layer(&self, depth: f64) -> f64 {
        let full = self.layers.saturating_sub(self.ring_layers) as f64 * depth;
        let rings = self.ring_layers as f64 * depth.min(self.ring as f64);
        (full + rings) / self.layers.max(1) as f64
    }

    /// Cached positions of the layers `layers` together at `depth` positions
    /// of context (a pipeline stage's): per layer as the model's windows say,
    /// or the average ([`Shape::kv_positions_per_layer`]) when not known.
    pub fn kv_positions(&self, layers: std::ops::Range<usize>, depth: f64) -> f64 {
        if self.windowed.len() != self.layers {
            return layers.len() as f64 * self.kv_positions_per_layer(depth);
        }
        let ring = depth.min(self.ring as f64);
        self.windowed[layers].iter().map(|&w| if w { ring } else { depth }).sum()
    }

    /// FLOPs to prefill `c` tokens: 2 per weight per token in the layers, the
    /// head for the last token, and causal attention (QKᵀ and PV: 2·c²·d per head).
    pub fn prefill_flops(&self, c: f64) -> f64 {
        let layer_params = (self.active_params() - self.head_read_bytes() * 8.0 / self.bits()).max(0.0);
        let head_params = (self.vocab * self.hidden) as f64;
        let attn = 2.0 * c * c * (self.heads * self.head_dim * self.layers) as f64;
        2.0 * layer_params * c + 2.0 * head_params + attn
    }

    /// FLOPs of attention for one new token at depth `p`.
    pub fn decode_attn_flops(&self, p: f64) -> f64 {
        4.0 * p * (self.heads * self.head_dim * self.layers) as f64
    }

    pub fn bits(&self) -> f64 {
        bits_per_weight(&self.quant).unwrap_or(16.0)
    }
}

/// `--model`: a GGUF file or HF directory (tensor bytes as stored, or as
/// `quant` would store them), a `config.json`, or `params:k=v,…`.
pub fn load(model: &str, quant: Option<&str>) -> Result<Shape> {
    if let Some(spec) = model.strip_prefix("params:") {
        return from_params(spec, quant);
    }
    let path = crate::model_source::resolve(Some(model))?;
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("{}: not JSON", path.display()))?;
        return from_config(&v, &path.display().to_string(), quant);
    }
    from_files(&path, quant)
}

fn from_files(path: &Path, quant: Option<&str>) -> Result<Shape> {
    let files = formats::open_model(path)?;
    let c = &files.config;
    let (mut embed, mut head, mut attn, mut dense, mut expert) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut attn_replicated = 0.0;
    let mut main_dtype = std::collections::BTreeMap::<String, f64>::new();
    let target_bits = quant.and_then(bits_per_weight);
    for (name, t) in &files.tensors.tensors {
        let stored = t.bytes().len() as f64;
        // Re-quantizing: matrices take the target size, vectors (norms) stay.
        let bytes = match target_bits {
            Some(b) if t.shape.len() == 2 => t.numel() as f64 * b / 8.0,
            _ => stored,
        };
        if t.shape.len() == 2 {
            *main_dtype.entry(format!("{:?}", t.dtype).to_ascii_lowercase()).or_default() += stored;
        }
        if name == "model.embed_tokens.weight" {
            embed += bytes;
        } else if name == "lm_head.weight" {
            head += bytes;
        } else if let Some(rest) = name.strip_prefix("model.layers.") {
            let in_layer = rest.split_once('.').map_or("", |(_, r)| r);
            if in_layer.contains("experts.") && !in_layer.contains("shared") {
                expert += bytes;
            } else if in_layer.starts_with("self_attn") || in_layer.contains("attention") {
                attn += bytes;
                if ["q_a_proj", "q_a_layernorm", "kv_a_proj", "kv_a_layernorm"].iter().any(|p| in_layer.contains(p)) {
                    attn_replicated += bytes;
                }
            } else {
                dense += bytes;
            }
        }
    }
    let n = c.n_layers.max(1) as f64;
    let tied = head == 0.0;
    let quant = quant
        .map(str::to_string)
        .or_else(|| main_dtype.iter().max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, _)| k.clone()))
        .unwrap_or_else(|| "f16".into());
    let experts = n_experts(&c.raw);
    let raw = |k: &str| c.raw.get(k).and_then(Value::as_u64);
    // Windowed layers as the model builds them (the architecture's spec).
    let spec = model::Arch::from_name(&c.arch).and_then(|a| a.spec(c).ok());
    // The runtime's own formula when the architecture is known
    // (model::layer_memory); a model given by its parameters: K and V rows,
    // or MLA's one latent ‖ rope-key row.
    let kv_elems_per_layer = match (&spec, raw("kv_lora_rank"), raw("qk_rope_head_dim")) {
        (Some(s), _, _) => model::layer_memory::kv_values_per_position(s, c.n_kv_heads, c.head_dim),
        (None, Some(r), Some(p)) if r > 0 => (r + p) as usize,
        _ => 2 * c.n_kv_heads * c.head_dim,
    };
    // Hybrid linear attention (Qwen3-Next, Qwen3.5): only the full-attention
    // layers cache K/V, so the per-layer average is their share (the
    // linear layers' fixed per-sequence state is not per token).
    let kv_elems_per_layer = match c.raw.get("layer_types").and_then(Value::as_array) {
        Some(t) if t.iter().any(|v| v.as_str() == Some("linear_attention")) => {
            let full = t.iter().filter(|v| v.as_str() != Some("linear_attention")).count();
            (kv_elems_per_layer * full).div_ceil(t.len().max(1))
        }
        _ => kv_elems_per_layer,
    };
    let active = c.raw.get("num_experts_per_tok").and_then(Value::as_u64).unwrap_or(0);
    let per_layer: Vec<Option<usize>> = match (&spec, c.raw.get("kv_lora_rank").and_then(Value::as_u64)) {
        (Some(s), None | Some(0)) => (0..c.n_layers).map(|l| s.attention(l).window).collect(),
        _ => Vec::new(),
    };
    let windows: Vec<usize> = per_layer.iter().flatten().copied().collect();
    let (ring_layers, ring) = (windows.len(), windows.first().map_or(0, |&w| model::ring_positions(w)));
    let state_bytes_per_layer = match spec.as_ref().and_then(|s| s.linear_attn.as_ref()) {
        Some(la) => {
            let linear = (0..c.n_layers).filter(|&l| la.is_linear(l)).count();
            (linear * la.state_shape(la.k_heads).len() * 4) as f64 / n
        }
        None => 0.0,
    };
    Ok(Shape {
        name: path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned()),
        layers: c.n_layers,
        hidden: c.hidden_size,
        heads: c.n_heads,
        kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        vocab: c.vocab_size,
        kv_elems_per_layer,
        kv_replicated: matches!(raw("kv_lora_rank"), Some(r) if r > 0),
        embed_bytes: embed,
        head_bytes: head,
        head_reads_embed: tied,
        attn_bytes: attn / n,
        attn_replicated_bytes: attn_replicated / n,
        dense_bytes: dense / n,
        expert_bytes: expert / n,
        experts,
        active_experts: active as usize,
        quant,
        path: Some(path.to_path_buf()),
        max_context: Some(c.max_position_embeddings),
        ring_layers,
        ring,
        state_bytes_per_layer,
        windowed: per_layer.iter().map(Option::is_some).collect(),
    })
}

fn get(v: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64))
}

/// From an HF `config.json`: parameter counts from the shapes, bytes at `quant`
/// (default bf16), norms ignored (well under 0.1%).
pub fn from_config(v: &Value, name: &str, quant: Option<&str>) -> Result<Shape> {
    let need = |keys: &[&str]| get(v, keys).ok_or_else(|| anyhow!("{name}: config has no {}", keys[0]));
    let hidden = need(&["hidden_size", "n_embd", "dim"])? as usize;
    let layers = need(&["num_hidden_layers", "n_layer", "n_layers"])? as usize;
    let heads = need(&["num_attention_heads", "n_head", "n_heads"])? as usize;
    let kv_heads = get(v, &["num_key_value_heads", "n_kv_heads"]).unwrap_or(heads as u64) as usize;
    let head_dim = get(v, &["head_dim"]).unwrap_or((hidden / heads.max(1)) as u64) as usize;
    let vocab = need(&["vocab_size"])? as usize;
    let ffn = get(v, &["intermediate_size", "ffn_dim"]).unwrap_or(4 * hidden as u64) as usize;
    let experts = get(v, &["num_local_experts", "num_experts", "n_routed_experts"]).unwrap_or(0) as usize;
    let active = get(v, &["num_experts_per_tok", "moe_topk"]).unwrap_or(0) as usize;
    let moe_ffn = get(v, &["moe_intermediate_size", "expert_intermediate_size"]).unwrap_or(ffn as u64) as usize;
    let shared = get(v, &["n_shared_experts"]).unwrap_or(0) as usize;
    let shared_ffn = get(v, &["shared_expert_intermediate_size"]).unwrap_or((shared * moe_ffn) as u64) as usize;
    let dense_first = get(v, &["first_k_dense_replace"]).unwrap_or(0) as usize;
    let kv_lora = get(v, &["kv_lora_rank"]).unwrap_or(0) as usize;
    let q_lora = get(v, &["q_lora_rank"]).unwrap_or(0) as usize;
    let rope_dim = get(v, &["qk_rope_head_dim"]).unwrap_or(0) as usize;
    let nope_dim = get(v, &["qk_nope_head_dim"]).unwrap_or(0) as usize;
    let v_dim = get(v, &["v_head_dim"]).unwrap_or(head_dim as u64) as usize;
    let tied = v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false);
    let (attn_params, kv_elems, replicated_params) = if kv_lora > 0 {
        // MLA: q (through q_lora if any), the joint kv down-projection with the
        // rope key, the up-projections to k_nope and v, and o.
        let qk = nope_dim + rope_dim;
        let q = if q_lora > 0 { hidden * q_lora + q_lora * heads * qk } else { hidden * heads * qk };
        let kv = hidden * (kv_lora + rope_dim) + kv_lora * heads * (nope_dim + v_dim);
        (q + kv + heads * v_dim * hidden, kv_lora + rope_dim, hidden * (q_lora + kv_lora + rope_dim))
    } else {
        (hidden * head_dim * (2 * heads + 2 * kv_heads), 2 * kv_heads * head_dim, 0)
    };
    let moe_layers = if experts > 0 { layers - dense_first.min(layers) } else { 0 };
    let per_layer = |params: f64| params / layers.max(1) as f64;
    let dense_params = if experts > 0 {
        (dense_first * 3 * hidden * ffn + moe_layers * (3 * hidden * shared_ffn + hidden * experts)) as f64
    } else {
        (layers * 3 * hidden * ffn) as f64
    };
    let expert_params = (moe_layers * experts * 3 * hidden * moe_ffn) as f64;
    let quant = quant.unwrap_or("bf16").to_string();
    let b = bits_per_weight(&quant).ok_or_else(|| anyhow!("unknown --quant {quant}"))? / 8.0;
    let embed = (vocab * hidden) as f64 * b;
    Ok(Shape {
        name: v.get("_name_or_path").and_then(Value::as_str).unwrap_or(name).to_string(),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        vocab,
        kv_elems_per_layer: kv_elems,
        kv_replicated: kv_lora > 0,
        embed_bytes: embed,
        head_bytes: if tied { 0.0 } else { embed },
        head_reads_embed: tied,
        attn_bytes: attn_params as f64 * b,
        attn_replicated_bytes: replicated_params as f64 * b,
        dense_bytes: per_layer(dense_params) * b,
        expert_bytes: per_layer(expert_params) * b,
        experts,
        active_experts: active,
        quant,
        path: None,
        max_context: get(v, &["max_position_embeddings", "n_positions"]).map(|c| c as usize),
        ring_layers: 0,
        ring: 0,
        state_bytes_per_layer: 0.0,
        windowed: Vec::new(),
    })
}

/// `params:total=816e9,active=42e9,layers=61,hidden=7168,heads=128,kv-heads=128,
/// head-dim=128,vocab=163840,experts=384,active-experts=8,kv-lora=512,rope-dim=64,
/// bytes=493e9`:
/// for models that exist only on paper (or are too big to download first).
/// Total and active parameters fix the expert and non-expert sizes.
fn from_params(spec: &str, quant: Option<&str>) -> Result<Shape> {
    let mut kv = std::collections::BTreeMap::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| anyhow!("params: '{part}' is not key=value"))?;
        let x: f64 = v.trim().parse().map_err(|_| anyhow!("params: {k}={v} is not a number"))?;
        kv.insert(k.trim().replace('_', "-"), x);
    }
    let need = |k: &str| kv.get(k).copied().ok_or_else(|| anyhow!("params: missing {k}="));
    let total = need("total")?;
    let active = kv.get("active").copied().unwrap_or(total);
    let layers = need("layers")? as usize;
    let hidden = need("hidden")? as usize;
    let heads = need("heads")? as usize;
    let kv_heads = kv.get("kv-heads").copied().unwrap_or(heads as f64) as usize;
    let head_dim = kv.get("head-dim").copied().unwrap_or((hidden / heads.max(1)) as f64) as usize;
    let vocab = kv.get("vocab").copied().unwrap_or(128_000.0) as usize;
    let experts = kv.get("experts").copied().unwrap_or(0.0) as usize;
    let active_experts = kv.get("active-experts").copied().unwrap_or(0.0) as usize;
    let kv_lora = kv.get("kv-lora").copied().unwrap_or(0.0) as usize;
    let rope_dim = kv.get("rope-dim").copied().unwrap_or(0.0) as usize;
    let quant = quant.unwrap_or("bf16").to_string();
    let mut b = bits_per_weight(&quant).ok_or_else(|| anyhow!("unknown --quant {quant}"))? / 8.0;
    // `bytes=` states the published checkpoint size (some tensors kept at
    // higher precision): every byte figure scales to it.
    if let Some(&bytes) = kv.get("bytes") {
        b = bytes / total;
    }
    if active > total || layers == 0 {
        bail!("params: need active ≤ total and layers > 0");
    }
    let embed_params = (vocab * hidden) as f64;
    // Untied head: embedding + head = 2·vocab·hidden of the total.
    let body = (total - 2.0 * embed_params).max(0.0);
    let body_active = (active - 2.0 * embed_params).max(0.0).min(body);
    // Routed experts E with k active: body = shared + E·e, active = shared + k·e.
    let (shared, per_expert) = if experts > 0 && active_experts > 0 && experts > active_experts {
        let e = (body - body_active) / (experts - active_experts) as f64;
        (body - experts as f64 * e, e)
    } else {
        (body, 0.0)
    };
    let attn = (hidden * head_dim * (2 * heads + 2 * kv_heads)) as f64;
    let per_layer = |p: f64| p / layers as f64;
    Ok(Shape {
        name: "params".into(),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        vocab,
        kv_elems_per_layer: if kv_lora > 0 { kv_lora + rope_dim } else { 2 * kv_heads * head_dim },
        kv_replicated: kv_lora > 0,
        embed_bytes: embed_params * b,
        head_bytes: embed_params * b,
        head_reads_embed: false,
        attn_bytes: per_layer(shared).min(attn) * b,
        // The kv_a down-projection (q_lora is not among the parameters).
        attn_replicated_bytes: (hidden * (kv_lora + rope_dim)) as f64 * b,
        dense_bytes: (per_layer(shared) - attn).max(0.0) * b,
        expert_bytes: per_layer(experts as f64 * per_expert) * b,
        experts,
        active_experts,
        quant,
        path: None,
        max_context: None,
        ring_layers: 0,
        ring: 0,
        state_bytes_per_layer: 0.0,
        windowed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A windowed model at 32K context: the KV the planner counts is what the
    /// model's contiguous cache allocates (rings on the windowed layers),
    /// within 10% (it is exact), and far below every position of every layer.
    #[test]
    fn windowed_kv_at_32k_matches_the_cache() {
        for name in ["gemma3", "gpt_oss"] {
            let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
            let shape = from_files(&dir, None).unwrap();
            assert!(shape.ring_layers > 0 && shape.ring > 0, "{name}: windowed layers seen");
            let files = formats::open_model(&dir).unwrap();
            let m = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &Default::default())
                .unwrap();
            let ctx = 32768;
            let elem = m.kv_type.bytes_for(1) as f64;
            let planned =
                (shape.layers * shape.kv_elems_per_layer) as f64 * elem * shape.kv_positions_per_layer(ctx as f64);
            let held = m.new_cache(ctx).bytes() as f64;
            assert!((planned - held).abs() <= 0.1 * held, "{name}: planned {planned} vs cache {held}");
            assert!(held < 0.8 * shape.kv_bytes_per_token(elem) * ctx as f64, "{name}: rings save memory");
        }
    }

    /// The serving pool at 32K context: one sequence's full blocks plus the
    /// window group `serve` sizes for one batch row (blocks of 32, steps of
    /// 512) hold within 10% of what the planner counts, and far below every
    /// position of every layer.
    #[test]
    fn windowed_paged_pool_at_32k_matches_the_planner() {
        for name in ["gemma3", "gpt_oss"] {
            let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
            let shape = from_files(&dir, None).unwrap();
            let files = formats::open_model(&dir).unwrap();
            let m = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &Default::default())
                .unwrap();
            let (ctx, block) = (32768, 32);
            let n_window = engine::serving::windows::window_blocks_for(m.max_window(), ctx, block, 1, 512, false);
            assert!(n_window > 0, "{name}: a window group");
            let held = m.new_pool_windowed(block, ctx / block, n_window).bytes() as f64;
            let elem = m.kv_type.bytes_for(1) as f64;
            let planned =
                (shape.layers * shape.kv_elems_per_layer) as f64 * elem * shape.kv_positions_per_layer(ctx as f64);
            assert!((planned - held).abs() <= 0.1 * held, "{name}: planned {planned} vs pool {held}");
            let unbounded = m.new_pool(block, ctx / block).bytes() as f64;
            assert!(held < 0.8 * unbounded, "{name}: the window group saves memory ({held} vs {unbounded})");
        }
    }

    /// A pipeline stage's KV counts its own layers' windows: gemma3's fixture
    /// has three windowed layers then a full one.
    #[test]
    fn stage_kv_positions_follow_the_layers_windows() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gemma3");
        let shape = from_files(&dir, None).unwrap();
        assert_eq!(shape.windowed, vec![true, true, true, false]);
        let (depth, ring) = (32768.0, shape.ring as f64);
        assert_eq!(shape.kv_positions(0..3, depth), 3.0 * ring);
        assert_eq!(shape.kv_positions(3..4, depth), depth);
        let whole = shape.kv_positions(0..4, depth);
        assert!((whole - 4.0 * shape.kv_positions_per_layer(depth)).abs() < 1e-6);
    }

    #[test]
    fn params_split_total_and_active() {
        let s = from_params(
            "total=816e9,active=42e9,layers=61,hidden=7168,heads=64,kv-heads=8,experts=384,active-experts=8,vocab=160000",
            Some("nvfp4"),
        )
        .unwrap();
        let gb = s.total_bytes() / 1e9;
        assert!((gb - 816.0 * 4.5 / 8.0).abs() < 1.0, "{gb}");
        let act = s.active_bytes() / 1e9;
        // Active parameters less the embedding row, at 4.5 bits.
        assert!((act - (42e9 - 160000.0 * 7168.0) * 4.5 / 8.0 / 1e9).abs() < 0.5, "{act}");
    }

    #[test]
    fn config_json_counts_llama_parameters() {
        // Llama-3-8B: 8.03e9 parameters.
        let v = serde_json::json!({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336});
        let s = from_config(&v, "llama3", Some("bf16")).unwrap();
        let params = s.total_bytes() / 2.0;
        assert!((params / 8.03e9 - 1.0).abs() < 0.01, "{params}");
    }
}
