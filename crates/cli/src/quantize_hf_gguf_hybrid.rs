//! The hybrid linear-attention part of HF → GGUF ([`crate::quantize_hf_gguf`]):
//! qwen3_next (GGUF arch `qwen3next`), qwen3_5_text (`qwen35`) and
//! qwen3_5_moe_text (`qwen35moe`), laid out as llama.cpp b11434's converter
//! writes them (`conversion/qwen.py`; the reader's side, with the full name
//! table, is `formats::gguf_qwen3next`):
//!
//! * Gated DeltaNet tensors under llama.cpp's names: `attn_qkv`, `attn_gate`,
//!   `ssm_ba` (qwen3next) or `ssm_beta`/`ssm_alpha` (qwen35), `ssm_conv1d`
//!   `[C, K]` (F32, as the converter keeps it), `ssm_a` = −exp(A_log),
//!   `ssm_dt.bias`, `ssm_norm`, `ssm_out`.
//! * Qwen3-Next's `in_proj_qkvz` (per key head `[q | k | v | z]`) split into
//!   `attn_qkv` (all q, all k, all v) and `attn_gate`.
//! * Qwen3.5: every value-head axis reordered from HF's grouped order (head
//!   `k·r + j`) to llama.cpp's tiled one (position `j·nk + k`).
//! * Every RMSNorm but the gated one written as `1 + w` (HF stores them
//!   zero-centered); the pre-MLP norm is `post_attention_norm`.
//! * Checkpoints' multi-token-prediction weights (`mtp.*`) are left out.
//! * Metadata: `ssm.conv_kernel`, `ssm.state_size`, `ssm.group_count`,
//!   `ssm.time_step_rank`, `ssm.inner_size`, `attention.recurrent_layers`,
//!   `full_attention_interval`, and for qwen35 `rope.dimension_sections`
//!   (HF's `mrope_section`, default `[11, 11, 10, 0]`); the generic writer
//!   gives `rope.dimension_count` (the partial rotary width) and the MoE
//!   writer the expert keys.

use anyhow::{bail, Result};
use formats::gguf::{GgufValue, GgufValueType};
use formats::gguf_writer::GgufWriter;
use formats::ModelConfig;
use model::linear_attn::LinearAttnSpec;
use serde_json::Value;

/// GGUF architecture of a hybrid `model_type`.
pub fn hybrid_arch(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "qwen3_next" => "qwen3next",
        "qwen3_5_text" | "qwen3_5" => "qwen35",
        "qwen3_5_moe_text" | "qwen3_5_moe" => "qwen35moe",
        _ => return None,
    })
}

fn spec(c: &ModelConfig) -> Result<LinearAttnSpec> {
    let arch = model::Arch::from_name(&c.arch).ok_or_else(|| anyhow::anyhow!("unknown arch '{}'", c.arch))?;
    match arch.spec(c)?.linear_attn {
        Some(s) => Ok(s),
        None => bail!("'{}' has no linear-attention layers", c.arch),
    }
}

/// The `ssm.*` and layer-pattern keys under `arch`.
pub fn metadata(w: &mut GgufWriter, c: &ModelConfig, arch: &str) -> Result<()> {
    let s = spec(c)?;
    if s.k_dim != s.v_dim {
        // llama.cpp's graphs take both head widths from `ssm.state_size`.
        bail!("llama.cpp's {arch} needs equal key and value head widths, not {} and {}", s.k_dim, s.v_dim);
    }
    let k = |key: &str| format!("{arch}.{key}");
    let u = |v: usize| GgufValue::U32(v as u32);
    w.add(&k("ssm.conv_kernel"), u(s.conv_kernel));
    w.add(&k("ssm.state_size"), u(s.k_dim));
    w.add(&k("ssm.group_count"), u(s.k_heads));
    w.add(&k("ssm.time_step_rank"), u(s.v_heads));
    w.add(&k("ssm.inner_size"), u(s.v_heads * s.v_dim));
    let layers = s.linear.iter().map(|&l| GgufValue::Bool(l)).collect();
    w.add(&k("attention.recurrent_layers"), GgufValue::Array(GgufValueType::Bool, layers));
    let interval = model::moe::text_config(c).get("full_attention_interval").and_then(Value::as_u64).unwrap_or(4);
    w.add(&k("full_attention_interval"), GgufValue::U32(interval as u32));
    if arch != "qwen3next" {
        let t = model::moe::text_config(c);
        let rope = t.get("rope_parameters").or_else(|| t.get("rope_scaling"));
        let mut sections: Vec<i32> = rope
            .and_then(|r| r.get("mrope_section"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_i64).map(|v| v as i32).collect())
            .unwrap_or_else(|| vec![11, 11, 10]);
        sections.resize(4, 0);
        w.add(
            &k("rope.dimension_sections"),
            GgufValue::Array(GgufValueType::I32, sections.into_iter().map(GgufValue::I32).collect()),
        );
    }
    Ok(())
}

/// How one GGUF tensor is made from its HF source (values in f32).
#[derive(Debug, Clone, Default)]
pub struct Xform {
    /// Output row `i` is source row `rows[i]` (rows `width` wide).
    rows: Option<Vec<usize>>,
    /// Output column `j` is source column `cols[j]`.
    cols: Option<Vec<usize>>,
    /// The source's row width (its last dimension; 1 for vectors).
    width: usize,
    /// `−exp(x)` (A_log → ssm_a).
    neg_exp: bool,
    /// `1 + x` (a zero-centered norm).
    plus_one: bool,
}

impl Xform {
    pub fn apply(&self, x: Vec<f32>) -> Vec<f32> {
        let w = self.width.max(1);
        let mut x = match &self.rows {
            Some(rows) => rows.iter().flat_map(|&r| x[r * w..(r + 1) * w].to_vec()).collect(),
            None => x,
        };
        if let Some(cols) = &self.cols {
            x = x.chunks_exact(w).flat_map(|row| cols.iter().map(|&c| row[c]).collect::<Vec<_>>()).collect();
        }
        if self.neg_exp {
            x.iter_mut().for_each(|v| *v = -v.exp());
        }
        if self.plus_one {
            x.iter_mut().for_each(|v| *v += 1.0);
        }
        x
    }
}

/// One GGUF tensor from an HF tensor: name, HF-ordered shape, transform,
/// and whether it must stay F32.
pub struct Output {
    pub name: String,
    pub shape: Vec<usize>,
    pub xform: Xform,
    pub f32: bool,
}

/// The GGUF tensors HF tensor `hf` (of shape `shape`) becomes, or `None` when
/// the generic names apply unchanged (attention, MLP, experts, routers). The
/// multi-token-prediction head (`mtp.*`) is not written (none: the file
/// says no `nextn_predict_layers`).
pub fn outputs(c: &ModelConfig, arch: &str, hf: &str, shape: &[usize]) -> Result<Option<Vec<Output>>> {
    if hf.starts_with("mtp.") || hf.starts_with("model.mtp.") {
        return Ok(Some(Vec::new()));
    }
    let Some((layer, part)) = hf.strip_prefix("model.layers.").and_then(|r| r.split_once('.')) else {
        // The final norm, zero-centered like the others.
        if hf == "model.norm.weight" {
            let xform = Xform { plus_one: true, width: 1, ..Default::default() };
            return Ok(Some(vec![Output {
                name: "output_norm.weight".into(),
                shape: shape.to_vec(),
                xform,
                f32: true,
            }]));
        }
        return Ok(None);
    };
    let s = spec(c)?;
    let (nk, nv, dk, dv, r) = (s.k_heads, s.v_heads, s.k_dim, s.v_dim, s.group());
    let tiled = arch != "qwen3next" && nk != nv;
    let width = *shape.last().unwrap_or(&1);
    // Value heads grouped → tiled, each `w` wide: output row p·w + i is
    // source row (old head of p)·w + i; `off` rows kept before them.
    let tile = |off: usize, w: usize| -> Vec<usize> {
        let heads = (0..nv).map(|p| if tiled { (p % nk) * r + p / nk } else { p });
        (0..off).chain(heads.flat_map(|h| (0..w).map(move |i| off + h * w + i))).collect()
    };
    let one = |name: &str, shape: Vec<usize>, xform: Xform, f32: bool| {
        Ok(Some(vec![Output { name: format!("blk.{layer}.{name}"), shape, xform, f32 }]))
    };
    let x = |rows: Option<Vec<usize>>| Xform { rows, width, ..Default::default() };
    match part {
        "linear_attn.in_proj_qkvz.weight" => {
            // Per key head [q dk | k dk | v r·dv | z r·dv] → all q, all k, all v; z.
            let g = 2 * dk + 2 * r * dv;
            let part = |off: usize, len: usize| (0..nk).flat_map(move |k| k * g + off..k * g + off + len);
            let qkv: Vec<usize> = part(0, dk).chain(part(dk, dk)).chain(part(2 * dk, r * dv)).collect();
            let z: Vec<usize> = part(2 * dk + r * dv, r * dv).collect();
            let out = |name: &str, rows: Vec<usize>| Output {
                name: format!("blk.{layer}.{name}"),
                shape: vec![rows.len(), width],
                xform: x(Some(rows)),
                f32: false,
            };
            Ok(Some(vec![out("attn_qkv.weight", qkv), out("attn_gate.weight", z)]))
        }
        "linear_attn.in_proj_ba.weight" => one("ssm_ba.weight", shape.to_vec(), x(None), false),
        "linear_attn.in_proj_qkv.weight" => {
            one("attn_qkv.weight", shape.to_vec(), x(Some(tile(2 * nk * dk, dv))), false)
        }
        "linear_attn.in_proj_z.weight" => one("attn_gate.weight", shape.to_vec(), x(Some(tile(0, dv))), false),
        "linear_attn.in_proj_b.weight" => one("ssm_beta.weight", shape.to_vec(), x(Some(tile(0, 1))), false),
        "linear_attn.in_proj_a.weight" => one("ssm_alpha.weight", shape.to_vec(), x(Some(tile(0, 1))), false),
        "linear_attn.A_log" => {
            let xform = Xform { rows: Some(tile(0, 1)), width: 1, neg_exp: true, ..Default::default() };
            one("ssm_a", vec![nv], xform, true)
        }
        "linear_attn.dt_bias" => {
            one("ssm_dt.bias", vec![nv], Xform { rows: Some(tile(0, 1)), width: 1, ..Default::default() }, true)
        }
        "linear_attn.conv1d.weight" => {
            // HF `[C, 1, K]` → `[C, K]`, the v channels tiled.
            one("ssm_conv1d.weight", vec![shape[0], width], x(Some(tile(2 * nk * dk, dv))), true)
        }
        "linear_attn.out_proj.weight" => {
            let xform = Xform { cols: Some(tile(0, dv)), width, ..Default::default() };
            one("ssm_out.weight", shape.to_vec(), xform, false)
        }
        "linear_attn.norm.weight" => one("ssm_norm.weight", shape.to_vec(), x(None), true),
        _ if part.ends_with("norm.weight") => {
            let name = match part {
                "input_layernorm.weight" => "attn_norm.weight",
                "post_attention_layernorm.weight" => "post_attention_norm.weight",
                "self_attn.q_norm.weight" => "attn_q_norm.weight",
                "self_attn.k_norm.weight" => "attn_k_norm.weight",
                other => bail!("tensor '{hf}': no llama.cpp name for norm '{other}'"),
            };
            one(name, shape.to_vec(), Xform { plus_one: true, width: 1, ..Default::default() }, true)
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::Xform;

    #[test]
    fn xform_gathers_rows_and_columns() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect(); // [[0 1] [2 3] [4 5]]
        let rows = Xform { rows: Some(vec![2, 0]), width: 2, ..Default::default() };
        assert_eq!(rows.apply(x.clone()), [4.0, 5.0, 0.0, 1.0]);
        let cols = Xform { cols: Some(vec![1, 0]), width: 2, plus_one: true, ..Default::default() };
        assert_eq!(cols.apply(x), [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]);
    }
}
