//! gpt-oss's expert tensors: every expert of a layer stacked in two tensors,
//! gate and up fused and interleaved (gate on even rows, up on odd rows of the
//! output dimension), with biases:
//!
//! | tensor (under `mlp.experts.`) | HF float (bf16)      | publisher MXFP4 (`*_blocks`/`*_scales`) |
//! |-------------------------------|----------------------|-----------------------------------------|
//! | `gate_up_proj`                | `[E, hidden, 2·ffn]` | `[E, 2·ffn, hidden]`                    |
//! | `gate_up_proj_bias`           | `[E, 2·ffn]`         | same                                    |
//! | `down_proj`                   | `[E, ffn, hidden]`   | `[E, hidden, ffn]`                      |
//! | `down_proj_bias`              | `[E, hidden]`        | same                                    |
//!
//! The float tensors are `[in, out]` (transformers multiplies `x @ W`), the
//! MXFP4 ones `[out, in]` (blocks of 32 run along the input). The orientation
//! is told by the type: a block-quantized tensor is output-major, a float one
//! input-major (the shapes alone cannot tell when `hidden = ffn`). Each expert
//! becomes an ordinary [`Mlp`] (`[out, in]` gate, up and down), so execution,
//! tensor and expert parallelism are those of every other MoE; the float
//! weights are transposed into owned memory at load, the MXFP4 rows copied.

use crate::decoder::LayerLoader;
use crate::linear::Linear;
use crate::moe::{Mlp, MoeSpec};
use crate::{slice, ModelError};
use formats::WeightTensor;
use std::ops::Range;

/// Expert `e` of a stacked tensor `name`, as `[out, in]` (`out`, `inp`: the
/// projection's widths).
fn expert_matrix(
    ld: &LayerLoader<'_>,
    name: &str,
    n: usize,
    out: usize,
    inp: usize,
    e: usize,
) -> Result<WeightTensor, ModelError> {
    let all = ld.tensor(name)?;
    let quantized = all.dtype.is_quantized();
    let want = if quantized { [n, out, inp] } else { [n, inp, out] };
    if all.shape != want {
        return Err(ModelError::Config(format!(
            "{name}: shape {:?}, expected {want:?} ({} layout)",
            all.shape,
            if quantized { "MXFP4 [experts, out, in]" } else { "float [experts, in, out]" }
        )));
    }
    let one = slice::rows(all, e..e + 1);
    let one = WeightTensor { shape: vec![want[1], want[2]], ..one };
    if quantized {
        return Ok(one);
    }
    slice::transpose(&one).ok_or_else(|| ModelError::Unsupported(format!("{name}: cannot transpose {}", all.dtype)))
}

/// Expert `e` of a gpt-oss MoE block, keeping intermediate columns `cols`
/// (all of them when `whole`: expert parallelism).
pub(crate) fn expert(
    ld: &LayerLoader<'_>,
    spec: &MoeSpec,
    e: usize,
    cols: &Range<usize>,
    whole: bool,
) -> Result<Mlp, ModelError> {
    let (h, f, n) = (ld.hidden(), spec.expert_ffn, spec.n_experts);
    let b = format!("{}.experts", spec.names.block);
    let gate_up = expert_matrix(ld, &format!("{b}.gate_up_proj"), n, 2 * f, h, e)?;
    let gu_bias = ld.row_values(&format!("{b}.gate_up_proj_bias"), [n, 2 * f], e)?;
    // De-interleave: gate = even rows, up = odd rows (and so their biases).
    let half_bias = |parity: usize| -> Vec<f32> { cols.clone().map(|c| gu_bias[2 * c + parity]).collect::<Vec<f32>>() };
    let gate = ld.col_par_of(&slice::strided_rows(&gate_up, 0, 2), cols, Some(half_bias(0)))?;
    let up = ld.col_par_of(&slice::strided_rows(&gate_up, 1, 2), cols, Some(half_bias(1)))?;
    let down_w = expert_matrix(ld, &format!("{b}.down_proj"), n, h, f, e)?;
    let down_bias = ld.row_values(&format!("{b}.down_proj_bias"), [n, h], e)?;
    let down = Linear { bias: ld.row_bias(down_bias, whole), ..ld.row_par_of(&down_w, cols)? };
    Ok(Mlp { gate, up, down, act: spec.act })
}
