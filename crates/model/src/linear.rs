//! A linear layer over a weight stored in any dtype (as mapped from the file, or
//! quantized at load). One type for float and quantized weights: the kernel reads
//! the storage directly.

use formats::{TensorData, WeightTensor};
use kernels::matmul::MatmulScratch;
use kernels::{DType, ThreadPool};

#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: WeightTensor,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn new(weight: WeightTensor, bias: Option<Vec<f32>>) -> Linear {
        Linear { weight, bias }
    }

    pub fn out_features(&self) -> usize {
        self.weight.shape[0]
    }

    pub fn in_features(&self) -> usize {
        self.weight.shape[1]
    }

    /// `y = x · Wᵀ + b` for `m` rows of `x` (`m × in`) into `y` (`m × out`).
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], m: usize, y: &mut [f32], scratch: &mut MatmulScratch) {
        let (i, o) = (self.in_features(), self.out_features());
        kernels::matmul(pool, self.weight.mat(), &x[..m * i], m, &mut y[..m * o], scratch);
        finish_outputs(&mut y[..m * o], self);
    }

    /// Several layers over the same input (q/k/v, gate/up): the input is quantized
    /// once and one pool run covers every output row. `ys[k]` gets `m × out_k`.
    pub fn forward_many(
        pool: &ThreadPool,
        layers: &[&Linear],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
        scratch: &mut MatmulScratch,
    ) {
        let in_f = layers[0].in_features();
        let mats: Vec<kernels::MatRef<'_>> = layers.iter().map(|l| l.weight.mat()).collect();
        let mut outs: Vec<&mut [f32]> =
            ys.iter_mut().zip(layers).map(|(y, l)| &mut y[..m * l.out_features()]).collect();
        kernels::matmul::matmul_many(pool, &mats, &x[..m * in_f], m, &mut outs, scratch);
        for (y, l) in outs.iter_mut().zip(layers) {
            finish_outputs(y, l);
        }
    }

    /// Each layer over its own input (the chosen experts' down projections at
    /// MoE decode): one pool run covers every output row, each input is
    /// quantized once. `xs[k]`: `m × in_k`; `ys[k]` gets `m × out_k`, equal to
    /// `layers[k].forward(xs[k])`.
    pub fn forward_each(
        pool: &ThreadPool,
        layers: &[&Linear],
        xs: &[&[f32]],
        m: usize,
        ys: &mut [&mut [f32]],
        scratch: &mut MatmulScratch,
    ) {
        let mats: Vec<kernels::MatRef<'_>> = layers.iter().map(|l| l.weight.mat()).collect();
        let ins: Vec<&[f32]> = xs.iter().zip(layers).map(|(x, l)| &x[..m * l.in_features()]).collect();
        let mut outs: Vec<&mut [f32]> =
            ys.iter_mut().zip(layers).map(|(y, l)| &mut y[..m * l.out_features()]).collect();
        kernels::matmul::matmul_each(pool, &mats, &ins, m, &mut outs, scratch);
        for (y, l) in outs.iter_mut().zip(layers) {
            finish_outputs(y, l);
        }
    }

    /// Bytes read per forward call (for cost accounting): the weight and its
    /// f32 bias.
    pub fn weight_bytes(&self) -> usize {
        self.weight.bytes().len() + self.bias.as_ref().map_or(0, |b| 4 * b.len())
    }

    /// FLOPs of one forward call over `m` rows (a multiply-add per weight and
    /// row, plus the bias additions).
    pub fn flops(&self, m: usize) -> usize {
        2 * m * self.in_features() * self.out_features() + self.bias.as_ref().map_or(0, |b| m * b.len())
    }
}

/// Applies `l`'s per-tensor scale (NVFP4) and bias to its matmul outputs `y`
/// (`m × out`).
fn finish_outputs(y: &mut [f32], l: &Linear) {
    scale_outputs(y, l.weight.out_scale);
    if let Some(b) = &l.bias {
        for row in y.chunks_exact_mut(l.out_features()) {
            kernels::ops::add_inplace(row, b);
        }
    }
}

/// Applies a weight's per-tensor scale (NVFP4) to its matmul outputs.
fn scale_outputs(y: &mut [f32], s: f32) {
    if s != 1.0 {
        y.iter_mut().for_each(|v| *v *= s);
    }
}

/// Repacks a Q4_0/Q4_1/Q8_0/MXFP4/NVFP4/FP8 weight into the interleaved
/// four-row layout of the decode kernels (`kernels::packed`) and releases the
/// file pages it came from, so resident memory stays one copy of the weights.
/// Weights without a packed form (other types, row counts not a multiple of 4,
/// odd block counts), or whose packed form has no SIMD kernels on this CPU
/// (`kernels::packed::worth_packing`), are returned as they are.
pub fn pack_for_decode(w: WeightTensor) -> WeightTensor {
    if w.is_packed()
        || w.shape.len() != 2
        || !kernels::packed::packable(w.dtype, w.shape[0], w.shape[1])
        || !kernels::packed::worth_packing(w.dtype, kernels::isa::active())
    {
        return w;
    }
    // A few MiB at a time, releasing each source run once copied, so loading
    // never holds two copies of a large tensor (an lm_head can be 1 GiB).
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let rb = w.bytes().len() / rows;
    let step = ((4 << 20) / rb.max(1)).max(1).next_multiple_of(kernels::packed::group_rows(w.dtype));
    let mut packed = kernels::hugepages::alloc(w.bytes().len());
    for r0 in (0..rows).step_by(step) {
        let r1 = (r0 + step).min(rows);
        let (a, b) = (r0 * rb, r1 * rb);
        kernels::packed::pack_into(w.dtype, r1 - r0, cols, &w.bytes()[a..b], &mut packed[a..b]);
        w.data.release_range(a, b - a);
    }
    WeightTensor {
        name: w.name,
        dtype: w.dtype,
        shape: w.shape,
        data: TensorData::Packed(packed.freeze()),
        out_scale: w.out_scale,
    }
}

/// Copies a weight the kernels read in the file's own layout out of the file
/// mapping into the loader's huge-page arena (`kernels::hugepages`), a few
/// MiB at a time, releasing the file pages as it goes: file pages are 4 KiB,
/// and decode streams every weight once per token. Left as it is: tensors
/// under 2 MiB, anything not mapped from the file, and every weight when huge
/// pages are off (`SHARDLM_THP=0`, or a system without them), where a copy
/// would buy nothing. Only tensors of 2 MiB or more move: the huge pages of
/// the arena's last span round a small model's memory up by up to 2 MiB
/// (+14% on a 12 MB test model), and measured, the small tensors gained
/// nothing in decode (SmolLM2: 0.99×; a 1.1B Q8_0, whose tensors are 4–12 MB:
/// 1.10×).
pub fn make_resident(w: WeightTensor) -> WeightTensor {
    let TensorData::Mapped { .. } = &w.data else { return w };
    let len = w.bytes().len();
    if len < (2 << 20) || !kernels::hugepages::enabled() {
        return w;
    }
    let mut out = kernels::hugepages::alloc(len);
    for a in (0..len).step_by(4 << 20) {
        let b = (a + (4 << 20)).min(len);
        out[a..b].copy_from_slice(&w.bytes()[a..b]);
        w.data.release_range(a, b - a);
    }
    WeightTensor {
        name: w.name,
        dtype: w.dtype,
        shape: w.shape,
        data: TensorData::Resident(out.freeze()),
        out_scale: w.out_scale,
    }
}

/// Re-encodes a float weight as `target` (Q8_0 or Q4_0) at load time. Weights that
/// are already quantized, or whose rows are not whole blocks, are left as they are.
pub fn quantize_weight(w: WeightTensor, target: DType) -> Result<WeightTensor, kernels::KernelError> {
    if w.dtype.is_quantized() || w.is_packed() || w.shape.len() != 2 || !w.shape[1].is_multiple_of(target.block_elems())
    {
        return Ok(w);
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let row_bytes = target.bytes_for(cols).expect("checked block multiple");
    let mut out = vec![0u8; rows * row_bytes];
    let mut tmp = vec![0f32; cols];
    let src_row = w.dtype.bytes_for(cols).expect("float types have block 1");
    for r in 0..rows {
        kernels::quant::dequantize_row(w.dtype, &w.bytes()[r * src_row..(r + 1) * src_row], &mut tmp);
        kernels::quant::quantize_row(target, &tmp, &mut out[r * row_bytes..(r + 1) * row_bytes])?;
    }
    Ok(WeightTensor {
        name: w.name,
        dtype: target,
        shape: w.shape,
        data: TensorData::Owned(std::sync::Arc::new(out)),
        out_scale: w.out_scale,
    })
}
