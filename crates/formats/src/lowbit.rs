//! Low-bit safetensors checkpoints as their publishers ship them, assembled into
//! shardlm weights (FORMATS.md §1(a)–(c); byte conversions in [`crate::lowbit_repack`]).
//!
//! | layout | tensors of layer `X` | becomes |
//! |---|---|---|
//! | ModelOpt NVFP4 | `X.weight` U8 [N,K/2], `X.weight_scale` F8_E4M3 [N,K/16], `X.weight_scale_2` F32 [] | NVFP4, `out_scale = weight_scale_2` |
//! | compressed-tensors NVFP4 | `X.weight_packed` U8 [N,K/2], `X.weight_scale` F8_E4M3 [N,K/16], `X.weight_global_scale` F32 [1] | NVFP4, `out_scale = 1/weight_global_scale` |
//! | compressed-tensors MXFP4 | `X.weight_packed` U8 [N,K/2], `X.weight_scale` U8 (E8M0) [N,K/32] | MXFP4 |
//! | gpt-oss MXFP4 | `X_blocks` U8 [..,R,K/32,16], `X_scales` U8 [..,R,K/32] | MXFP4 `X` [..,R,K] |
//! | DeepSeek/Qwen FP8 | `X.weight` F8_E4M3 [N,K], `X.weight_scale_inv` F32 [⌈N/bn⌉,⌈K/bk⌉] | FP8 |
//! | compressed-tensors / ModelOpt FP8 | `X.weight` F8_E4M3 [N,K], `X.weight_scale` F32 [1], [N,1] or [⌈N/bn⌉,⌈K/bk⌉] | FP8 |
//!
//! The two NVFP4 global scales are reciprocal: ModelOpt stores
//! `weight_scale_2 = amax/(6·448)` and dequantizes `E2M1·scale·weight_scale_2`
//! (`NVFP4QTensor.dequantize`); compressed-tensors stores
//! `weight_global_scale = 6·448/amax` and dequantizes `E2M1·scale/global_scale`
//! (`forward_helpers._quantize_dequantize`, `fp4_quantized.py`). DeepSeek's
//! `weight_scale_inv` multiplies despite its name (`weight_dequant_kernel`).
//! Activation scales (`input_scale`, `input_global_scale`) and KV-cache scales
//! are not needed by our kernels (dynamic 8-bit activations) and are dropped.

use crate::lowbit_repack as repack;
use crate::{FormatError, TensorData, WeightTensor};
use kernels::DType;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// One tensor of a safetensors file before assembly: `dtype` is the
/// safetensors name (`BF16`, `U8`, `F8_E4M3`, ...).
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// What `config.json → quantization_config` tells the readers: the FP8 block
/// shape (`weight_block_size` for DeepSeek/Qwen, `block_structure` for compressed-tensors).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantHints {
    pub method: Option<String>,
    pub fp8_block: [usize; 2],
}

impl Default for QuantHints {
    fn default() -> Self {
        QuantHints { method: None, fp8_block: [128, 128] }
    }
}

impl QuantHints {
    /// Reads `quantization_config` from a parsed `config.json` (defaults if absent).
    pub fn from_config(cfg: &Value) -> QuantHints {
        let mut h = QuantHints::default();
        let Some(q) = cfg.get("quantization_config") else { return h };
        h.method = q.get("quant_method").and_then(Value::as_str).map(str::to_string);
        let pair = |v: &Value| -> Option<[usize; 2]> {
            let a = v.as_array()?;
            let b = [a.first()?.as_u64()? as usize, a.get(1)?.as_u64()? as usize];
            // A zero block size would divide by zero later: ignore it (keep 128×128).
            (b[0] > 0 && b[1] > 0).then_some(b)
        };
        if let Some(b) = q.get("weight_block_size").and_then(pair) {
            h.fp8_block = b;
        }
        if let Some(groups) = q.get("config_groups").and_then(Value::as_object) {
            for g in groups.values() {
                if let Some(b) = g.get("weights").and_then(|w| w.get("block_structure")).and_then(pair) {
                    h.fp8_block = b;
                }
            }
        }
        h
    }
}

/// Suffixes of tensors that only serve another tensor.
const COMPANIONS: [&str; 5] =
    [".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".weight_global_scale", "_scales"];
/// Activation and KV-cache scales: read by GPU W4A4/W8A8 kernels, not by ours.
const DROPPED: [&str; 4] = [".input_scale", ".input_global_scale", ".k_scale", ".v_scale"];

/// Turns the raw tensors of a checkpoint (all shards) into weights, assembling
/// each low-bit layer from its companions. Errors name the tensor.
pub fn assemble(path: &Path, raw: Vec<RawTensor>, hints: &QuantHints) -> Result<Vec<WeightTensor>, FormatError> {
    let mut pool: BTreeMap<String, RawTensor> = raw.into_iter().map(|t| (t.name.clone(), t)).collect();
    let bad = |tensor: &str, what: String| FormatError::BadTensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        what,
    };
    let mut out = Vec::new();
    let mut consumed: Vec<RawTensor> = Vec::new();
    let names: Vec<String> = pool.keys().cloned().collect();
    for name in &names {
        let Some(t) = pool.get(name) else { continue };
        let w = if let Some(base) = name.strip_suffix("_blocks") {
            let scales = take(&mut pool, &format!("{base}_scales"), name, path)?;
            let t = pool.remove(name).expect("present");
            let w = repack::gpt_oss_mxfp4(base, &t, &scales).map_err(|e| bad(name, e))?;
            consumed.extend([t, scales]);
            Some(w)
        } else if let Some(base) = name.strip_suffix(".weight_packed") {
            let scale = take(&mut pool, &format!("{base}.weight_scale"), name, path)?;
            let t = pool.remove(name).expect("present");
            let wname = format!("{base}.weight");
            if scale.dtype == "F8_E4M3" {
                let g = take(&mut pool, &format!("{base}.weight_global_scale"), name, path)?;
                let g = scalar(&g).map_err(|e| bad(&g.name, e))?;
                let mut w = repack::nvfp4(&wname, &t, &scale).map_err(|e| bad(name, e))?;
                w.out_scale = 1.0 / g;
                consumed.extend([t, scale]);
                Some(w)
            } else {
                let w = repack::mxfp4(&wname, &t, &scale).map_err(|e| bad(name, e))?;
                consumed.extend([t, scale]);
                Some(w)
            }
        } else if let (Some(_), "U8") = (name.strip_suffix(".weight"), t.dtype.as_str()) {
            let base = &name[..name.len() - ".weight".len()];
            let scale = take(&mut pool, &format!("{base}.weight_scale"), name, path)?;
            let g = take(&mut pool, &format!("{base}.weight_scale_2"), name, path)?;
            let g = scalar(&g).map_err(|e| bad(&g.name, e))?;
            let t = pool.remove(name).expect("present");
            let mut w = repack::nvfp4(name, &t, &scale).map_err(|e| bad(name, e))?;
            w.out_scale = g;
            consumed.extend([t, scale]);
            Some(w)
        } else if let (Some(base), "F8_E4M3") = (name.strip_suffix(".weight"), t.dtype.as_str()) {
            let inv = format!("{base}.weight_scale_inv");
            let scale_name = if pool.contains_key(&inv) { inv } else { format!("{base}.weight_scale") };
            let scale = take(&mut pool, &scale_name, name, path)?;
            let t = pool.remove(name).expect("present");
            let w = repack::fp8(name, &t, &scale, hints.fp8_block).map_err(|e| bad(name, e))?;
            consumed.extend([t, scale]);
            Some(w)
        } else {
            None
        };
        if let Some(w) = w {
            // The repacked copy replaces the file's pages (resident memory stays one copy).
            for part in consumed.drain(..) {
                part.data.release_pages();
            }
            kernels::quant::validate(w.dtype, w.bytes()).map_err(|e| bad(&w.name, e.to_string()))?;
            if !w.out_scale.is_finite() || w.out_scale <= 0.0 {
                return Err(bad(&w.name, format!("per-tensor scale {} is not a positive finite number", w.out_scale)));
            }
            out.push(w);
        }
    }
    for (name, t) in pool {
        if DROPPED.iter().any(|s| name.ends_with(s)) {
            continue;
        }
        if COMPANIONS.iter().any(|s| name.ends_with(s)) {
            return Err(bad(&name, "scale tensor without its weight (nothing uses it)".to_string()));
        }
        let dtype = float_dtype(&t.dtype).ok_or_else(|| {
            bad(
                &name,
                format!("{} {:?} is not part of a known low-bit layout (missing its scale tensor?)", t.dtype, t.shape),
            )
        })?;
        out.push(WeightTensor::new(name, dtype, t.shape, t.data));
    }
    Ok(out)
}

/// Removes companion `name` of `owner`, or says it is missing.
fn take(
    pool: &mut BTreeMap<String, RawTensor>,
    name: &str,
    owner: &str,
    path: &Path,
) -> Result<RawTensor, FormatError> {
    pool.remove(name).ok_or_else(|| FormatError::BadTensor {
        path: path.to_path_buf(),
        tensor: owner.to_string(),
        what: format!("missing companion tensor '{name}'"),
    })
}

/// The one F32 value of a scalar scale tensor (shape [] or [1]).
fn scalar(t: &RawTensor) -> Result<f32, String> {
    if t.dtype != "F32" || t.shape.iter().product::<usize>() != 1 {
        return Err(format!("expected one F32 value, got {} {:?}", t.dtype, t.shape));
    }
    let v = repack::f32s(t.data.bytes())[0];
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("global scale {v} is not a positive finite number"));
    }
    Ok(v)
}

/// Float tensors that load as they are.
pub fn float_dtype(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

/// Bytes per element of the raw (not directly loadable) safetensors types we assemble.
pub fn raw_elem_bytes(s: &str) -> Option<usize> {
    match s {
        "U8" | "I8" | "F8_E4M3" | "F8_E8M0" => Some(1),
        _ => float_dtype(s).map(|d| d.block_bytes()),
    }
}

/// Owned bytes as tensor data.
pub(crate) fn owned(v: Vec<u8>) -> TensorData {
    TensorData::Owned(Arc::new(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_from_config() {
        let h = |v: Value| QuantHints::from_config(&v);
        assert_eq!(h(serde_json::json!({})), QuantHints::default());
        let ds = h(serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 128]}}));
        assert_eq!((ds.method.as_deref(), ds.fp8_block), (Some("fp8"), [64, 128]));
        let ct = h(serde_json::json!({"quantization_config": {"quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"block_structure": [128, 64]}}}}}));
        assert_eq!(ct.fp8_block, [128, 64]);
        let zero = h(serde_json::json!({"quantization_config": {"weight_block_size": [0, 128]}}));
        assert_eq!(zero.fp8_block, [128, 128]);
    }
}
