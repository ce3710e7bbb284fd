//! `shardlm quantize IN.gguf OUT.gguf --to TYPE`: a GGUF file re-encoded to
//! a ggml type (q8_0, q4_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl,
//! iq4_xs, mxfp4, nvfp4) or to one of llama.cpp's K-quant mixes (q3_k_m,
//! q4_k_m, q5_k_m: [`crate::quantize_mix`]). Metadata is copied as it is; linear weights
//! (2-D `*.weight` and stacked `*_exps.weight`, except `--keep` matches and the defaults of
//! [`crate::quantize::DEFAULT_KEEP`] plus `output.weight`) are dequantized and
//! quantized row by row. NVFP4 gets llama.cpp's per-tensor scale: the blocks
//! hold `x / s` with `s = amax/(6·448)` and `X.scale` (F32 [1]) holds `s`; a
//! stacked expert tensor gets one per expert (`X.scale`, F32 [n_expert]), as
//! llama.cpp's loader expects for `ffn_*_exps`.
//!
//! The output is streamed: the header (every tensor's type and size is known
//! from its shape) is written first, then one tensor at a time, so memory
//! holds one tensor's values, never the model. The K-quants and IQ4_XS need
//! rows of whole 256-value blocks; under a plain `--to` other rows stay in
//! their source type (a mix falls back to a 32-value type as llama-quantize).

use crate::quantize::{eligible, QuantizeArgs};
use crate::quantize_mix::{Mix, MixModel};
use anyhow::{bail, Context, Result};
use formats::gguf::GgufFile;
use formats::gguf_writer::{GgufWriter, TensorInfo};
use indicatif::{ProgressBar, ProgressStyle};
use kernels::quant::{self, nvfp4};
use kernels::DType;

pub fn quantize_gguf(a: &QuantizeArgs, to: &str) -> Result<()> {
    let mix = Mix::parse(to);
    let target = match to {
        _ if mix.is_some() => mix.expect("some").base(),
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "mxfp4" => DType::MXFP4,
        "nvfp4" => DType::NVFP4,
        "q2_k" => DType::Q2_K,
        "q3_k" => DType::Q3_K,
        "q4_k" => DType::Q4_K,
        "q5_k" => DType::Q5_K,
        "q6_k" => DType::Q6_K,
        "q5_0" => DType::Q5_0,
        "q5_1" => DType::Q5_1,
        "iq4_nl" => DType::IQ4_NL,
        "iq4_xs" => DType::IQ4_XS,
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => bail!("unknown GGUF target '{other}'"),
    };
    if a.output.extension().is_none_or(|e| e != "gguf") {
        bail!("{}: {to} output to a GGUF file needs a name ending in .gguf", a.output.display());
    }
    if a.input.is_dir() {
        return crate::quantize_hf_gguf::hf_to_gguf(a, target, mix);
    }
    if !target.is_quantized() {
        bail!(
            "{}: --to {to} converts an HF checkpoint directory; a GGUF input is re-encoded to a quantized type",
            a.input.display()
        );
    }
    if a.input.extension().is_none_or(|e| e != "gguf") {
        bail!("{}: GGUF output needs a GGUF file or an HF checkpoint directory as input", a.input.display());
    }
    let g = GgufFile::open(&a.input)?;
    if let Some(t) = g.tensors.iter().find(|t| t.name.ends_with(".scale")) {
        bail!(
            "{}: tensor '{}': re-quantizing a GGUF with per-tensor scales is not supported; start from a float or ggml-quantized GGUF",
            a.input.display(),
            t.name
        );
    }
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        if k == "general.alignment" || k == "general.file_type" {
            continue;
        }
        w.add(k, v.clone());
    }
    let ftype = mix.map_or(llama_ftype(target), Mix::ftype);
    w.add("general.file_type", formats::gguf::GgufValue::U32(ftype));
    let arch = g.get_str("general.architecture").unwrap_or("");
    let mix_model = MixModel::new(
        g.get_usize(&format!("{arch}.block_count")).unwrap_or(0),
        g.get_usize(&format!("{arch}.expert_count")).unwrap_or(0),
        g.tensors.iter().map(|t| t.name.as_str()),
    );
    // Pass 1: what each tensor becomes (no data read), for the header.
    let plans: Vec<Plan> = g
        .tensors
        .iter()
        .map(|t| {
            let shape = t.shape();
            // A stacked expert tensor `[n_expert, rows, cols]` (`ffn_*_exps`) is
            // quantized as `n_expert · rows` rows; NVFP4 gives it a scale per expert.
            let experts = if shape.len() == 3 && t.name.contains("_exps.") { shape[0] } else { 1 };
            let as_2d = if experts > 1 { vec![shape[0] * shape[1], shape[2]] } else { shape.clone() };
            let dtype = match mix {
                // A mix: every 2-D weight the defaults and --keep allow, the
                // head (`output.weight`) included, at the recipe's type.
                Some(m) => {
                    eligible(&t.name, &as_2d, 1, &a.keep).then(|| mix_model.tensor_type(m, &t.name, as_2d[1])).flatten()
                }
                None => (t.name != "output.weight" && eligible(&t.name, &as_2d, target.block_elems(), &a.keep))
                    .then_some(target),
            };
            let dtype = dtype.filter(|&d| t.dtype().is_some_and(|src| src != d));
            Plan { dtype, shape, experts, as_2d }
        })
        .collect();
    let mut infos = Vec::new();
    for (t, p) in g.tensors.iter().zip(&plans) {
        let Some(dtype) = p.dtype else {
            infos.push(TensorInfo {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
                n_bytes: t.n_bytes,
            });
            continue;
        };
        infos.push(TensorInfo::new(&t.name, &p.shape, dtype).expect("eligible: whole blocks"));
        if target == DType::NVFP4 {
            let base = t.name.trim_end_matches(".weight");
            infos.push(TensorInfo::new(&format!("{base}.scale"), &[p.experts], DType::F32).expect("f32"));
        }
    }
    let mut out_file =
        w.stream_to(&a.output, infos).with_context(|| format!("{}: cannot write", a.output.display()))?;
    let write_err = || format!("{}: cannot write", a.output.display());
    // Pass 2: one tensor at a time.
    let bar = ProgressBar::new(g.tensors.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"));
    let mut n_quantized = 0;
    for (t, p) in g.tensors.iter().zip(&plans) {
        bar.set_message(t.name.clone());
        let off = g.tensor_file_offset(t);
        let raw = &g.map()[off..off + t.n_bytes];
        let Some(dtype) = p.dtype else {
            out_file.write_tensor(raw).with_context(write_err)?;
            bar.inc(1);
            continue;
        };
        let src = t.dtype().expect("checked");
        let (rows, cols) = (p.as_2d[0], p.as_2d[1]);
        let mut x = vec![0f32; rows * cols];
        quant::dequantize_row(src, raw, &mut x);
        let rb = dtype.bytes_for(cols).expect("eligible: whole blocks");
        let mut out = vec![0u8; rows * rb];
        if target == DType::NVFP4 {
            let per = x.len() / p.experts;
            let mut scales = Vec::with_capacity(p.experts);
            let out_per = out.len() / p.experts;
            for (xe, oe) in x.chunks_exact(per).zip(out.chunks_exact_mut(out_per)) {
                let amax = xe.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = if amax > 0.0 { amax / (6.0 * 448.0) } else { 1.0 };
                nvfp4::quantize(xe, s, bytemuck::cast_slice_mut(oe));
                scales.push(s);
            }
            out_file.write_tensor(&out).with_context(write_err)?;
            let scales: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
            out_file.write_tensor(&scales).with_context(write_err)?;
        } else {
            for (xr, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
                quant::quantize_row(dtype, xr, o).with_context(|| format!("tensor '{}'", t.name))?;
            }
            out_file.write_tensor(&out).with_context(write_err)?;
        }
        n_quantized += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    out_file.finish().with_context(write_err)?;
    eprintln!("wrote {} ({n_quantized} of {} tensors quantized to {to})", a.output.display(), g.tensors.len());
    Ok(())
}

/// llama.cpp's `llama_ftype` for a file of mostly `target` weights (what its
/// tools print).
pub fn llama_ftype(target: DType) -> u32 {
    match target {
        DType::Q4_0 => 2,
        DType::Q8_0 => 7,
        DType::Q2_K => 10,
        DType::Q3_K => 11,
        DType::Q4_K => 15,
        DType::Q5_K => 16,
        DType::Q6_K => 18,
        DType::Q5_0 => 8,
        DType::Q5_1 => 9,
        DType::IQ4_NL => 25,
        DType::IQ4_XS => 30,
        DType::MXFP4 => 38,
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 32,
        _ => 39, // NVFP4
    }
}

/// What pass 1 decided for one input tensor.
struct Plan {
    /// The type to write it in; `None`: copied as it is.
    dtype: Option<DType>,
    /// PyTorch-order shape, and the 2-D view it is quantized as.
    shape: Vec<usize>,
    as_2d: Vec<usize>,
    /// Experts stacked in it (1: a plain tensor).
    experts: usize,
}
