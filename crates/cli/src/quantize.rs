//! `shardlm quantize IN OUT --to TYPE [--keep PATTERN]...`
//!
//! * `nvfp4`, `mxfp4`, `fp8` into a directory: a safetensors checkpoint in a
//!   publisher's layout, readable by vLLM/SGLang-style loaders and by us:
//!   ModelOpt NVFP4 (`weight` U8, `weight_scale` E4M3, `weight_scale_2`),
//!   compressed-tensors MXFP4 (`weight_packed`, `weight_scale` E8M0) and
//!   DeepSeek-style block FP8 (`weight` E4M3, `weight_scale_inv` per 128×128),
//!   with `quantization_config` in `config.json` and the tokenizer files copied.
//!   gpt-oss's stacked experts (`mlp.experts.{gate_up_proj,down_proj}`, bf16
//!   `[E, in, out]`) become OpenAI's MXFP4 layout under `mxfp4`
//!   (`X_blocks` `[E, out, in/32, 16]`, `X_scales` `[E, out, in/32]`, as the
//!   published checkpoints); under nvfp4 and fp8 they stay in 16 bits (no
//!   publisher layout for stacked experts in those formats).
//! * A ggml type into `OUT.gguf` (from a GGUF input): see [`crate::quantize_gguf`].
//!
//! Streaming: the header is computed from the shapes first, then one tensor at a
//! time is read (memory-mapped), quantized and written, so memory holds at most
//! one tensor in f32. Linear weights (2-D `*.weight`) are quantized unless they
//! match `--keep` or the publishers' defaults (embeddings, lm_head, norms, MoE
//! routers); everything else is copied as it is.

use anyhow::{bail, Context, Result};
use clap::Args;
use formats::WeightTensor;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::quant::minifloat::{e4m3_to_f32, f32_to_e2m1, f32_to_e4m3, E4M3_MAX};
use kernels::quant::mxfp4;
use serde_json::{json, Value};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct QuantizeArgs {
    /// HF checkpoint directory (bf16, f16 or f32 safetensors) or GGUF file.
    pub input: PathBuf,
    /// A directory (nvfp4, mxfp4, fp8) or a `.gguf` file (every other target; mxfp4 and nvfp4 too).
    pub output: PathBuf,
    /// Target format: nvfp4, mxfp4, fp8, q8_0, q4_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k,
    /// iq4_nl or iq4_xs; llama.cpp's mixes q3_k_m, q4_k_m, q5_k_m; from an HF directory to a
    /// `.gguf` file also f32, f16 or bf16 (a plain conversion).
    #[arg(long = "to")]
    pub to: String,
    /// Leave tensors whose name matches this pattern (`*` matches anything) unquantized; repeatable.
    #[arg(long = "keep", value_name = "NAME_PATTERN")]
    pub keep: Vec<String>,
}

/// Names kept by default (the publishers keep these in 16 bits): embeddings,
/// head, norms, and the MoE routers and shared-expert gates, whose choices
/// must not move with the format.
pub const DEFAULT_KEEP: [&str; 9] = [
    "*embed_tokens*",
    "lm_head*",
    "*norm*",
    "*.mlp.gate.weight",
    "*.block_sparse_moe.gate.weight",
    "*shared_expert_gate*",
    "*router*",
    "*ffn_gate_inp*",
    "token_embd*",
];

/// `*`-only glob: whether `name` matches `pat`.
pub fn glob(pat: &str, name: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether tensor `name` of `shape` is quantized: a 2-D linear weight whose
/// row length is a whole number of `block` values, not kept.
pub fn eligible(name: &str, shape: &[usize], block: usize, keep: &[String]) -> bool {
    shape.len() == 2
        && name.ends_with(".weight")
        && shape[1].is_multiple_of(block)
        && !DEFAULT_KEEP.iter().any(|p| glob(p, name))
        && !keep.iter().any(|p| glob(p, name))
}

/// Whether `name` is a gpt-oss stacked expert projection (`[E, in, out]`, in
/// a whole number of 32-value blocks) to write in OpenAI's MXFP4 layout.
fn stacked_expert(name: &str, shape: &[usize], keep: &[String]) -> bool {
    (name.ends_with(".experts.gate_up_proj") || name.ends_with(".experts.down_proj"))
        && shape.len() == 3
        && shape[1].is_multiple_of(32)
        && !keep.iter().any(|p| glob(p, name))
}

/// A stacked `[E, in, out]` float tensor as gpt-oss MXFP4: every expert
/// transposed to `[out, in]` and quantized in blocks of 32 along `in`; returns
/// the `_blocks` bytes (`[E, out, in/32, 16]`) then the `_scales` (`[E, out, in/32]`).
fn encode_stacked(x: &[f32], shape: &[usize]) -> Vec<Vec<u8>> {
    let (e, k, n) = (shape[0], shape[1], shape[2]);
    let (mut blocks, mut scales) = (Vec::with_capacity(e * n * k / 2), Vec::with_capacity(e * n * k / 32));
    let mut t = vec![0f32; n * k];
    for one in x.chunks_exact(k * n) {
        for (i, row) in one.chunks_exact(n).enumerate() {
            for (o, &v) in row.iter().enumerate() {
                t[o * k + i] = v;
            }
        }
        let mut parts = encode(Target::Mxfp4, &t, &[n, k]).into_iter();
        blocks.extend(parts.next().expect("packed codes"));
        scales.extend(parts.next().expect("scales"));
    }
    vec![blocks, scales]
}

/// One output tensor: name, safetensors dtype, shape, bytes.
type OutTensor = (String, &'static str, Vec<usize>, usize);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Target {
    Nvfp4,
    Mxfp4,
    Fp8,
}

impl Target {
    /// K must be a multiple of this (our readers' block; the GGUF NVFP4 block is 64).
    fn block(self) -> usize {
        match self {
            Target::Nvfp4 | Target::Fp8 => 64,
            Target::Mxfp4 => 32,
        }
    }
}

pub fn quantize(a: QuantizeArgs) -> Result<()> {
    let to = a.to.to_ascii_lowercase();
    let gguf_out = a.output.extension().is_some_and(|e| e == "gguf");
    let target = match to.as_str() {
        "nvfp4" if !gguf_out => Target::Nvfp4,
        "mxfp4" if !gguf_out => Target::Mxfp4,
        "fp8" if !gguf_out => Target::Fp8,
        "fp8" => bail!("fp8 has no GGUF type (llama.cpp has none): give an output directory"),
        "q8_0" | "q4_0" | "q4_k" | "nvfp4" | "mxfp4" => return crate::quantize_gguf::quantize_gguf(&a, &to),
        "q5_0" | "q5_1" | "iq4_nl" | "iq4_xs" => return crate::quantize_gguf::quantize_gguf(&a, &to),
        "q2_k" | "q3_k" | "q5_k" | "q6_k" | "q3_k_m" | "q4_k_m" | "q5_k_m" => {
            return crate::quantize_gguf::quantize_gguf(&a, &to)
        }
        "f32" | "f16" | "bf16" if gguf_out => return crate::quantize_gguf::quantize_gguf(&a, &to),
        other => bail!(
            "unknown target '{other}' (expected nvfp4, mxfp4, fp8, q8_0, q4_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, q3_k_m, q4_k_m or q5_k_m; f32, f16 or bf16 for HF → GGUF)"
        ),
    };
    if !a.input.is_dir() {
        bail!(
            "{}: {to} output is a safetensors checkpoint and needs an HF checkpoint directory as input",
            a.input.display()
        );
    }
    let files = formats::open_model(&a.input)?;
    std::fs::create_dir_all(&a.output).with_context(|| format!("{}: cannot create directory", a.output.display()))?;
    // Plan: (output name, dtype, shape, bytes) per output tensor, grouped by source tensor.
    let mut plan: Vec<(&WeightTensor, bool, Vec<OutTensor>)> = Vec::new();
    let mut quantized_any = Vec::new();
    let mut kept = Vec::new();
    for t in files.tensors.tensors.values() {
        if t.dtype.is_quantized() {
            bail!(
                "{}: tensor '{}' is already {}; quantize from a bf16/f16/f32 checkpoint",
                a.input.display(),
                t.name,
                t.dtype
            );
        }
        let stacked = target == Target::Mxfp4 && stacked_expert(&t.name, &t.shape, &a.keep);
        let q = stacked || eligible(&t.name, &t.shape, target.block(), &a.keep);
        let outs = if stacked {
            quantized_any.push(t.name.clone());
            let (e, k, n) = (t.shape[0], t.shape[1], t.shape[2]);
            vec![
                (format!("{}_blocks", t.name), "U8", vec![e, n, k / 32, 16], e * n * k / 2),
                (format!("{}_scales", t.name), "U8", vec![e, n, k / 32], e * n * k / 32),
            ]
        } else if q {
            quantized_any.push(t.name.clone());
            outputs(target, &t.name, &t.shape)
        } else {
            if t.shape.len() == 2 && t.name.ends_with(".weight") {
                kept.push(t.name.trim_end_matches(".weight").to_string());
            }
            let st = match t.dtype {
                kernels::DType::F32 => "F32",
                kernels::DType::F16 => "F16",
                _ => "BF16",
            };
            vec![(t.name.clone(), st, t.shape.clone(), t.bytes().len())]
        };
        plan.push((t, q, outs));
    }
    if quantized_any.is_empty() {
        bail!(
            "no tensor to quantize (every linear weight is kept or has rows that are not whole {}-value blocks)",
            target.block()
        );
    }
    // Header from the shapes, then the data in the same order.
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt", "quantized_by": "shardlm"}));
    let mut offset = 0usize;
    for (_, _, outs) in &plan {
        for (name, dtype, shape, n) in outs {
            header.insert(name.clone(), json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}));
            offset += n;
        }
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    h.resize(h.len().next_multiple_of(8), b' ');
    let st_path = a.output.join("model.safetensors");
    let file = std::fs::File::create(&st_path).with_context(|| format!("{}: cannot create", st_path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    out.write_all(&(h.len() as u64).to_le_bytes())?;
    out.write_all(&h)?;
    let bar = ProgressBar::new(plan.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"));
    for (t, q, _) in &plan {
        bar.set_message(t.name.clone());
        if !q {
            out.write_all(t.bytes())?;
        } else if t.shape.len() == 3 {
            for part in encode_stacked(&t.to_f32(), &t.shape) {
                out.write_all(&part)?;
            }
        } else {
            for part in encode(target, &t.to_f32(), &t.shape) {
                out.write_all(&part)?;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    out.flush()?;
    write_configs(&a.input, &a.output, target, &kept)?;
    eprintln!("wrote {} ({} of {} tensors quantized to {to})", a.output.display(), quantized_any.len(), plan.len());
    Ok(())
}

/// The tensors a quantized `X.weight` `[n, k]` becomes, in write order.
fn outputs(target: Target, name: &str, shape: &[usize]) -> Vec<OutTensor> {
    let base = name.trim_end_matches(".weight");
    let (n, k) = (shape[0], shape[1]);
    match target {
        Target::Nvfp4 => vec![
            (format!("{base}.weight"), "U8", vec![n, k / 2], n * k / 2),
            (format!("{base}.weight_scale"), "F8_E4M3", vec![n, k / 16], n * k / 16),
            (format!("{base}.weight_scale_2"), "F32", vec![], 4),
        ],
        Target::Mxfp4 => vec![
            (format!("{base}.weight_packed"), "U8", vec![n, k / 2], n * k / 2),
            (format!("{base}.weight_scale"), "U8", vec![n, k / 32], n * k / 32),
        ],
        Target::Fp8 => {
            let g = [n.div_ceil(128), k.div_ceil(128)];
            vec![
                (format!("{base}.weight"), "F8_E4M3", vec![n, k], n * k),
                (format!("{base}.weight_scale_inv"), "F32", g.to_vec(), g[0] * g[1] * 4),
            ]
        }
    }
}

/// Publisher packing of E2M1 codes along K: `byte i = code(2i) | code(2i+1) << 4`.
fn pack_pairs(codes: &[u8]) -> Vec<u8> {
    codes.chunks_exact(2).map(|p| p[0] | p[1] << 4).collect()
}

/// Quantizes `x` (`[n, k]` row-major) into the byte parts [`outputs`] lists.
fn encode(target: Target, x: &[f32], shape: &[usize]) -> Vec<Vec<u8>> {
    let (n, k) = (shape[0], shape[1]);
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    match target {
        Target::Nvfp4 => {
            // ModelOpt: weight_scale_2 = amax/(6·448); block scale E4M3(amax_16/(6·g)).
            let g = if amax > 0.0 { amax / (6.0 * E4M3_MAX) } else { 1.0 };
            let mut codes = vec![0u8; n * k];
            let mut scales = vec![0u8; n * k / 16];
            for (i, (xs, cs)) in x.chunks_exact(16).zip(codes.chunks_exact_mut(16)).enumerate() {
                let s = f32_to_e4m3(xs.iter().fold(0f32, |m, v| m.max(v.abs())) / (6.0 * g)) & 0x7F;
                scales[i] = s;
                let d = e4m3_to_f32(s) * g;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                for (c, &v) in cs.iter_mut().zip(xs) {
                    *c = f32_to_e2m1(v * inv);
                }
            }
            vec![pack_pairs(&codes), scales, g.to_le_bytes().to_vec()]
        }
        Target::Mxfp4 => {
            let mut blocks = vec![mxfp4::BlockMxfp4 { e: 0, qs: [0; 16] }; n * k / 32];
            mxfp4::quantize(x, &mut blocks);
            let mut codes = Vec::with_capacity(n * k);
            for b in &blocks {
                codes.extend(b.qs.iter().map(|q| q & 15));
                codes.extend(b.qs.iter().map(|q| q >> 4));
            }
            vec![pack_pairs(&codes), blocks.iter().map(|b| b.e).collect()]
        }
        Target::Fp8 => {
            // DeepSeek: one scale per 128×128 block, amax/448; weight = E4M3(x / scale).
            let g = [n.div_ceil(128), k.div_ceil(128)];
            let mut s = vec![0f32; g[0] * g[1]];
            for r in 0..n {
                for c in 0..k {
                    let i = (r / 128) * g[1] + c / 128;
                    s[i] = s[i].max(x[r * k + c].abs());
                }
            }
            s.iter_mut().for_each(|v| *v = if *v > 0.0 { *v / E4M3_MAX } else { 1.0 });
            let q: Vec<u8> = (0..n * k).map(|i| f32_to_e4m3(x[i] / s[(i / k / 128) * g[1] + (i % k) / 128])).collect();
            vec![q, s.iter().flat_map(|v| v.to_le_bytes()).collect()]
        }
    }
}

/// `config.json` with `quantization_config`, plus the tokenizer and generation files.
fn write_configs(input: &Path, output: &Path, target: Target, kept: &[String]) -> Result<()> {
    let cfg_path = input.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path)?)
        .with_context(|| format!("{}: invalid JSON", cfg_path.display()))?;
    cfg["quantization_config"] = match target {
        Target::Nvfp4 => json!({
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "kv_cache_quant_algo": null, "exclude_modules": kept,
        }),
        Target::Mxfp4 => json!({
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": true}}},
            "ignore": kept,
        }),
        Target::Fp8 => json!({
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": kept,
        }),
    };
    std::fs::write(output.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
    ] {
        let src = input.join(f);
        if src.is_file() {
            std::fs::copy(&src, output.join(f)).with_context(|| format!("{}: cannot copy", src.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*norm*", "model.layers.0.input_layernorm.weight"));
        assert!(glob("lm_head*", "lm_head.weight"));
        assert!(!glob("lm_head*", "model.lm_head.weight"));
        assert!(glob("model.layers.1.*", "model.layers.1.mlp.up_proj.weight"));
        assert!(glob("*.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"));
        assert!(!glob("*.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"));
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxcyyb"));
        assert!(eligible("model.layers.0.mlp.up_proj.weight", &[8, 64], 64, &[]));
        assert!(!eligible("model.embed_tokens.weight", &[8, 64], 64, &[]));
        assert!(!eligible("model.layers.0.mlp.up_proj.weight", &[8, 64], 64, &["*up_proj*".into()]));
        assert!(!eligible("model.layers.0.mlp.up_proj.weight", &[8, 48], 64, &[]));
    }
}
