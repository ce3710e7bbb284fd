//! `shardlm quantize HF_DIR OUT.gguf --to TYPE` (any GGUF target of
//! [`crate::quantize_gguf`], the mixes of [`crate::quantize_mix`] too): an HF
//! checkpoint (bf16, f16 or f32) written as a GGUF file the way llama.cpp's
//! `convert_hf_to_gguf.py` lays it out, for the dense architectures llama,
//! mistral (GGUF arch `llama`), qwen2 and qwen3, and the MoE ones qwen2_moe,
//! qwen3_moe and mixtral ([`crate::quantize_hf_gguf_moe`]: stacked experts).
//!
//! * Metadata: `general.architecture`, `<arch>.block_count`, `context_length`,
//!   `embedding_length`, `feed_forward_length`, `attention.head_count(_kv)`,
//!   `attention.key_length`/`value_length`, `rope.dimension_count`,
//!   `rope.freq_base`, `attention.layer_norm_rms_epsilon`, `vocab_size`,
//!   linear/yarn rope scaling and mistral's sliding window; Llama 3's rope
//!   scaling as the `rope_freqs.weight` divisors, as llama.cpp's converter does.
//! * Tensors: llama.cpp's names (`blk.N.attn_q`, `ffn_down`, ...). For the
//!   `llama` arch the q and k rows are permuted from HF's rotate-half order to
//!   llama.cpp's adjacent pairs (its converter's `permute`), since llama.cpp
//!   ropes `llama` GGUFs pairwise. Linear weights of whole blocks are
//!   quantized (`--keep` and the publishers' defaults as for every target),
//!   other matrices are written as F16, vectors (norms, biases) as F32. A
//!   mix picks each weight's type by its llama.cpp name, the head included.
//! * Tokenizer: a BPE `tokenizer.json` becomes `tokenizer.ggml.model = gpt2`
//!   with its tokens (ids in order, added tokens included; special ones typed
//!   3 = control), merges, bos/eos ids and the chat template.
//!
//! Streamed like the GGUF → GGUF path: one tensor in memory at a time.

use crate::quantize::{eligible, glob, QuantizeArgs};
use crate::quantize_hf_gguf_hybrid as hybrid;
use crate::quantize_hf_gguf_moe as moe;
use crate::quantize_mix::{Mix, MixModel};
use anyhow::{bail, Context, Result};
use formats::gguf::GgufValue;
use formats::gguf_writer::{GgufWriter, TensorInfo};
use formats::{ModelConfig, RopeScaling, TokenizerSource};
use indicatif::{ProgressBar, ProgressStyle};
use kernels::quant::{self, nvfp4};
use kernels::DType;
use serde_json::Value;

pub fn hf_to_gguf(a: &QuantizeArgs, target: DType, mix: Option<Mix>) -> Result<()> {
    let files = formats::open_model(&a.input)?;
    let cfg = &files.config;
    let arch = match cfg.arch.as_str() {
        "llama" | "mistral" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "gemma3_text" => "gemma3",
        other => match moe::moe_arch(other).or_else(|| hybrid::hybrid_arch(other)) {
            Some(arch) => arch,
            None => bail!(
                "{}: HF → GGUF supports llama, mistral, qwen2, qwen3, gemma3_text, qwen2_moe, qwen3_moe, mixtral, glm4_moe, minimax_m2, qwen3_next, qwen3_5 and qwen3_5_moe, not '{other}' (use llama.cpp's convert_hf_to_gguf.py)",
                a.input.display()
            ),
        },
    };
    let mut w = GgufWriter::new();
    let ftype = mix.map_or(crate::quantize_gguf::llama_ftype(target), Mix::ftype);
    metadata(&mut w, cfg, arch, ftype).with_context(|| format!("{}", a.input.display()))?;
    moe::metadata(&mut w, cfg, arch);
    if arch == "gemma3" {
        gemma3_metadata(&mut w, cfg)?;
    }
    if hybrid::hybrid_arch(&cfg.arch).is_some() {
        hybrid::metadata(&mut w, cfg, arch).with_context(|| format!("{}", a.input.display()))?;
    }
    if let TokenizerSource::HfJson(path) = &files.tokenizer {
        tokenizer(&mut w, path, cfg).with_context(|| format!("{}", path.display()))?;
    }
    if let Some(t) = &files.chat_template {
        w.add_str("tokenizer.chat_template", t);
    }
    let plans = plan(&files, a, target, mix)?;
    let nvfp4 = target == DType::NVFP4;
    let rope_freqs = llama3_rope_divisors(cfg);
    let mut infos = Vec::new();
    if let Some(f) = &rope_freqs {
        infos.push(TensorInfo::new("rope_freqs.weight", &[f.len()], DType::F32).expect("f32"));
    }
    for p in &plans {
        infos.push(p.info.clone());
        if nvfp4 && p.dtype == DType::NVFP4 {
            // One second-level scale per expert for a stack (llama.cpp's `[n_expert]`).
            let base = p.info.name.trim_end_matches(".weight");
            let n = if p.stacked { p.sources.len() } else { 1 };
            infos.push(TensorInfo::new(&format!("{base}.scale"), &[n], DType::F32).expect("f32"));
        }
    }
    let write_err = || format!("{}: cannot write", a.output.display());
    let mut out = w.stream_to(&a.output, infos).with_context(write_err)?;
    if let Some(f) = &rope_freqs {
        out.write_tensor(&f.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).with_context(write_err)?;
    }
    // Pass 2: convert one tensor (a stack: one expert) at a time.
    let bar = ProgressBar::new(plans.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"));
    let mut n_quantized = 0;
    for p in &plans {
        bar.set_message(p.info.name.clone());
        let mut bytes = Vec::with_capacity(p.info.n_bytes);
        let mut scales = Vec::new();
        for name in &p.sources {
            let t = &files.tensors.tensors[name];
            let mut x = t.to_f32();
            if let Some(xf) = &p.xform {
                x = xf.apply(x);
            }
            // Gemma stores RMSNorm weights as `w − 1`; llama.cpp's converter adds the one.
            if arch == "gemma3" && name.ends_with("norm.weight") {
                x.iter_mut().for_each(|v| *v += 1.0);
            }
            if arch == "llama"
                && (name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.k_proj.weight"))
            {
                let heads = if name.contains("q_proj") { cfg.n_heads } else { cfg.n_kv_heads };
                x = pair_rope_rows(&x, heads, t.shape[0] / heads, t.shape[1]);
            }
            let cols = p.cols.unwrap_or(*t.shape.last().unwrap_or(&1));
            let start = bytes.len();
            bytes.resize(start + p.dtype.bytes_for(x.len()).expect("planned"), 0);
            let part = &mut bytes[start..];
            if p.dtype == DType::NVFP4 {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = if amax > 0.0 { amax / (6.0 * 448.0) } else { 1.0 };
                nvfp4::quantize(&x, s, bytemuck::cast_slice_mut(part));
                scales.push(s);
            } else {
                let rb = p.dtype.bytes_for(cols).expect("planned");
                for (xr, o) in x.chunks_exact(cols).zip(part.chunks_exact_mut(rb)) {
                    quant::quantize_row(p.dtype, xr, o).with_context(|| format!("tensor '{name}'"))?;
                }
            }
        }
        debug_assert_eq!(bytes.len(), p.info.n_bytes);
        out.write_tensor(&bytes).with_context(write_err)?;
        if !scales.is_empty() {
            out.write_tensor(&scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>())
                .with_context(write_err)?;
        }
        n_quantized += usize::from(p.dtype == target || (mix.is_some() && p.dtype.is_quantized()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    out.finish().with_context(write_err)?;
    let to = mix.map_or(target.to_string(), |m| format!("{m:?}"));
    eprintln!("wrote {} ({n_quantized} of {} tensors quantized to {to})", a.output.display(), plans.len());
    Ok(())
}

/// The type of a matrix left out of the target (embeddings, lm_head,
/// `--keep`, rows not whole blocks): F16, as llama.cpp's converter, or F32
/// when the target is F32 (an exact copy).
fn fallback(target: DType) -> DType {
    if target == DType::F32 {
        DType::F32
    } else {
        DType::F16
    }
}

/// The type of a 2-D weight (`hf` its checkpoint name, `gguf` llama.cpp's):
/// `target` where its rows are whole blocks and neither `--keep` nor the
/// defaults keep it; under a mix the recipe's type ([`MixModel::tensor_type`];
/// the head is quantized too, unless `--keep` names it); else [`fallback`].
fn choose_type(
    a: &QuantizeArgs,
    target: DType,
    mix: Option<Mix>,
    mix_model: &MixModel,
    hf: &str,
    gguf: &str,
    shape: &[usize],
) -> DType {
    let cols = *shape.last().unwrap_or(&1);
    let chosen = match mix {
        Some(m) => {
            let head = gguf == "output.weight" && !a.keep.iter().any(|p| glob(p, hf) || glob(p, gguf));
            (head || eligible(hf, shape, 1, &a.keep)).then(|| mix_model.tensor_type(m, gguf, cols)).flatten()
        }
        None => eligible(hf, shape, target.block_elems(), &a.keep).then_some(target),
    };
    chosen.unwrap_or(fallback(target))
}

/// One GGUF tensor to write: its HF sources (one, or a stack's experts in
/// index order), its header entry and storage type.
struct Plan {
    sources: Vec<String>,
    stacked: bool,
    info: TensorInfo,
    dtype: DType,
    /// The hybrids' reshaping of the source ([`hybrid::Xform`]).
    xform: Option<hybrid::Xform>,
    /// Row width when it differs from the source's last dimension.
    cols: Option<usize>,
}

/// Pass 1: names, output types and sizes, in the store's (sorted) order, each
/// expert stack where its first expert comes.
fn plan(files: &formats::ModelFiles, a: &QuantizeArgs, target: DType, mix: Option<Mix>) -> Result<Vec<Plan>> {
    /// A tensor as it is, or a layer's stack of one projection's experts.
    enum Slot {
        Plain(Plan),
        Stack(usize, &'static str, Vec<(usize, String)>),
    }
    let experts = ["num_local_experts", "num_experts"].iter().find_map(|k| files.config.raw[*k].as_u64());
    let mix_model = MixModel::new(
        files.config.n_layers,
        experts.unwrap_or(0) as usize,
        files.tensors.tensors.keys().filter_map(|n| gguf_name(n)).collect::<Vec<_>>().iter().map(String::as_str),
    );
    let choose = |hf: &str, gguf: &str, shape: &[usize]| choose_type(a, target, mix, &mix_model, hf, gguf, shape);
    let mut slots: Vec<Slot> = Vec::new();
    let mut stack_at: std::collections::HashMap<(usize, &str), usize> = Default::default();
    for (name, t) in &files.tensors.tensors {
        if let Some((layer, stack, expert)) = moe::expert_part(name) {
            let i = *stack_at.entry((layer, stack)).or_insert_with(|| {
                slots.push(Slot::Stack(layer, stack, Vec::new()));
                slots.len() - 1
            });
            if let Slot::Stack(_, _, experts) = &mut slots[i] {
                experts.push((expert, name.clone()));
            }
            continue;
        }
        let arch = hybrid::hybrid_arch(&files.config.arch);
        if let Some(outs) = arch.map(|h| hybrid::outputs(&files.config, h, name, &t.shape)).transpose()?.flatten() {
            for o in outs {
                let dtype = if o.f32 || o.shape.len() != 2 { DType::F32 } else { choose(name, &o.name, &o.shape) };
                let info = TensorInfo::new(&o.name, &o.shape, dtype)
                    .with_context(|| format!("tensor '{name}': {:?} is not whole blocks of {dtype}", o.shape))?;
                let cols = Some(*o.shape.last().unwrap_or(&1));
                let plan =
                    Plan { sources: vec![name.clone()], stacked: false, info, dtype, xform: Some(o.xform), cols };
                slots.push(Slot::Plain(plan));
            }
            continue;
        }
        let gemma = match files.config.arch.as_str() {
            "gemma3_text" => gemma3_name(name),
            // GLM-4.5's pre-MLP norm is llama.cpp's `post_attention_norm`.
            "glm4_moe" => name
                .strip_prefix("model.layers.")
                .and_then(|r| r.strip_suffix(".post_attention_layernorm.weight"))
                .map(|layer| format!("blk.{layer}.post_attention_norm.weight")),
            _ => None,
        };
        let Some(gguf) = gemma.or_else(|| gguf_name(name)).or_else(|| moe::other_name(name)) else {
            bail!("{}: tensor '{name}' has no llama.cpp name", a.input.display());
        };
        // Routers stay F32 (llama.cpp's converter); qwen2_moe's shared-expert
        // gate `[1, hidden]` is a `[hidden]` vector there.
        let shape: Vec<usize> =
            if gguf.contains("ffn_gate_inp_shexp") { vec![t.shape.iter().product()] } else { t.shape.clone() };
        let dtype =
            if gguf.contains("ffn_gate_inp") || shape.len() != 2 { DType::F32 } else { choose(name, &gguf, &shape) };
        let info = TensorInfo::new(&gguf, &shape, dtype)
            .with_context(|| format!("tensor '{name}': {shape:?} is not whole blocks of {dtype}"))?;
        slots.push(Slot::Plain(Plan {
            sources: vec![name.clone()],
            stacked: false,
            info,
            dtype,
            xform: None,
            cols: None,
        }));
    }
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Plain(p) => Ok(p),
            Slot::Stack(layer, stack, experts) => {
                let gguf = format!("blk.{layer}.{stack}.weight");
                let first = &files.tensors.tensors[&experts[0].1];
                let dtype =
                    if first.shape.len() == 2 { choose(&experts[0].1, &gguf, &first.shape) } else { fallback(target) };
                stack_plan(files, a, dtype, layer, stack, experts)
            }
        })
        .collect()
}

/// The GGUF tensor of one layer's `stack` (`[n_expert, out, in]`): experts in
/// index order, 0..n without gaps, all of one shape.
fn stack_plan(
    files: &formats::ModelFiles,
    a: &QuantizeArgs,
    dtype: DType,
    layer: usize,
    stack: &str,
    mut experts: Vec<(usize, String)>,
) -> Result<Plan> {
    experts.sort_by_key(|e| e.0);
    if experts.iter().enumerate().any(|(i, e)| e.0 != i) {
        bail!("{}: layer {layer} {stack}: experts are not 0..{} without gaps", a.input.display(), experts.len());
    }
    let first = &files.tensors.tensors[&experts[0].1];
    if let Some((_, odd)) = experts.iter().find(|(_, n)| files.tensors.tensors[n].shape != first.shape) {
        bail!("{}: expert tensor '{odd}' differs in shape from '{}'", a.input.display(), experts[0].1);
    }
    let shape = [experts.len(), first.shape[0], *first.shape.last().unwrap_or(&1)];
    let name = format!("blk.{layer}.{stack}.weight");
    let info = TensorInfo::new(&name, &shape, dtype)
        .with_context(|| format!("tensor '{name}': {shape:?} is not whole blocks of {dtype}"))?;
    Ok(Plan {
        sources: experts.into_iter().map(|e| e.1).collect(),
        stacked: true,
        info,
        dtype,
        xform: None,
        cols: None,
    })
}

/// Gemma 3's four layer norms under llama.cpp's names (`post_attention_layernorm`
/// is the attention *output* norm there, not the pre-MLP one).
fn gemma3_name(hf: &str) -> Option<String> {
    let (layer, part) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let g = match part {
        "post_attention_layernorm.weight" => "post_attention_norm",
        "pre_feedforward_layernorm.weight" => "ffn_norm",
        "post_feedforward_layernorm.weight" => "post_ffw_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.weight"))
}

/// Gemma 3's keys as llama.cpp reads them: the windowed layers (a per-layer
/// bool array) and their rope base.
fn gemma3_metadata(w: &mut GgufWriter, c: &ModelConfig) -> Result<()> {
    let spec = model::Arch::Gemma3.spec(c)?;
    let windowed = (0..c.n_layers).map(|l| GgufValue::Bool(spec.attention(l).window.is_some())).collect();
    w.add("gemma3.attention.sliding_window_pattern", GgufValue::Array(formats::gguf::GgufValueType::Bool, windowed));
    if let Some(l) = &spec.local_rope {
        w.add("gemma3.rope.freq_base_swa", GgufValue::F32(l.theta));
    }
    Ok(())
}

/// llama.cpp's name for an HF tensor of the dense architectures.
fn gguf_name(hf: &str) -> Option<String> {
    formats::names::hf_to_gguf(hf).or_else(|| {
        // HF's one post-attention norm is llama.cpp's `ffn_norm` in these
        // architectures (gpt-oss's `attn_post_norm` makes the name ambiguous).
        let layer = hf.strip_prefix("model.layers.")?.strip_suffix(".post_attention_layernorm.weight")?;
        Some(format!("blk.{layer}.ffn_norm.weight"))
    })
}

/// Rows of a q or k projection (`[heads · d, cols]`) from HF's rotate-half
/// order (row `i` and `i + d/2` of a head form a rope pair) to adjacent pairs
/// (rows `2i`, `2i + 1`): llama.cpp's converter `permute`.
fn pair_rope_rows(x: &[f32], heads: usize, d: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for (half, dst) in [(0, 2 * i), (1, 2 * i + 1)] {
                let src = h * d + half * d / 2 + i;
                out[(h * d + dst) * cols..][..cols].copy_from_slice(&x[src * cols..][..cols]);
            }
        }
    }
    out
}

fn metadata(w: &mut GgufWriter, c: &ModelConfig, arch: &str, ftype: u32) -> Result<()> {
    let k = |key: &str| format!("{arch}.{key}");
    let u = |v: usize| GgufValue::U32(v as u32);
    w.add_str("general.architecture", arch);
    w.add_str("general.name", c.raw.get("_name_or_path").and_then(Value::as_str).unwrap_or("shardlm-converted"));
    w.add("general.file_type", GgufValue::U32(ftype));
    w.add(&k("block_count"), u(c.n_layers));
    w.add(&k("context_length"), u(c.max_position_embeddings));
    w.add(&k("embedding_length"), u(c.hidden_size));
    w.add(&k("feed_forward_length"), u(c.intermediate_size));
    w.add(&k("attention.head_count"), u(c.n_heads));
    w.add(&k("attention.head_count_kv"), u(c.n_kv_heads));
    w.add(&k("attention.key_length"), u(c.head_dim));
    w.add(&k("attention.value_length"), u(c.head_dim));
    w.add(&k("rope.dimension_count"), u(c.rope_dim));
    w.add(&k("rope.freq_base"), GgufValue::F32(c.rope_theta));
    w.add(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(c.rms_norm_eps));
    w.add(&k("vocab_size"), u(c.vocab_size));
    if let Some(win) = c.sliding_window {
        w.add(&k("attention.sliding_window"), u(win));
    }
    match &c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            w.add_str(&k("rope.scaling.type"), "linear");
            w.add(&k("rope.scaling.factor"), GgufValue::F32(*factor));
        }
        RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, .. } => {
            w.add_str(&k("rope.scaling.type"), "yarn");
            w.add(&k("rope.scaling.factor"), GgufValue::F32(*factor));
            w.add(&k("rope.scaling.original_context_length"), u(*original_max_position_embeddings));
            w.add(&k("rope.scaling.yarn_beta_fast"), GgufValue::F32(*beta_fast));
            w.add(&k("rope.scaling.yarn_beta_slow"), GgufValue::F32(*beta_slow));
        }
        // llama3: no scaling keys; the `rope_freqs.weight` tensor instead.
        RopeScaling::Llama3 { .. } => {}
    }
    Ok(())
}

/// Llama 3's rope scaling as llama.cpp's converter stores it: one divisor per
/// rope frequency (`rope_freqs.weight`, F32 `[rope_dim/2]`): 1 for short
/// wavelengths, `factor` for long ones, blended in between.
fn llama3_rope_divisors(c: &ModelConfig) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { factor, low_freq_factor: lo, high_freq_factor: hi, original_max_position_embeddings } =
        c.rope_scaling
    else {
        return None;
    };
    let old = original_max_position_embeddings as f64;
    let (lo, hi, factor) = (lo as f64, hi as f64, factor as f64);
    let dim = c.rope_dim;
    Some(
        (0..dim / 2)
            .map(|i| {
                let freq = (c.rope_theta as f64).powf(-((2 * i) as f64) / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let d = if wavelen < old / hi {
                    1.0
                } else if wavelen > old / lo {
                    factor
                } else {
                    let smooth = (old / wavelen - lo) / (hi - lo);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                d as f32
            })
            .collect(),
    )
}

/// A BPE `tokenizer.json` as `tokenizer.ggml.*` (llama.cpp's `gpt2` model).
fn tokenizer(w: &mut GgufWriter, path: &std::path::Path, c: &ModelConfig) -> Result<()> {
    let j: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let model = &j["model"];
    if model["type"].as_str() != Some("BPE") {
        bail!("only BPE tokenizers are written to GGUF (this one is {})", model["type"]);
    }
    let vocab = model["vocab"].as_object().context("model.vocab is not an object")?;
    let mut tokens: Vec<(u64, String, i32)> =
        vocab.iter().filter_map(|(t, id)| Some((id.as_u64()?, t.clone(), 1))).collect();
    for added in j["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else { continue };
        let ty = if added["special"].as_bool() == Some(true) { 3 } else { 4 };
        match tokens.iter_mut().find(|t| t.0 == id) {
            Some(t) => t.2 = ty,
            None => tokens.push((id, text.to_string(), ty)),
        }
    }
    tokens.sort_by_key(|t| t.0);
    if tokens.iter().enumerate().any(|(i, t)| t.0 != i as u64) {
        bail!("token ids are not 0..{} without gaps", tokens.len());
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Array(p) => Some(format!("{} {}", p.first()?.as_str()?, p.get(1)?.as_str()?)),
            _ => None,
        })
        .collect();
    w.add_str("tokenizer.ggml.model", "gpt2");
    w.add_str_array("tokenizer.ggml.tokens", &tokens.iter().map(|t| t.1.as_str()).collect::<Vec<_>>());
    w.add_i32_array("tokenizer.ggml.token_type", &tokens.iter().map(|t| t.2).collect::<Vec<_>>());
    w.add_str_array("tokenizer.ggml.merges", &merges);
    if let Some(b) = c.bos_token_id {
        w.add_u32("tokenizer.ggml.bos_token_id", b);
    }
    if let Some(&e) = c.eos_token_ids.first() {
        w.add_u32("tokenizer.ggml.eos_token_id", e);
    }
    Ok(())
}
