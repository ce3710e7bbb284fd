//! Taking a rank's part of a weight. Row slices (output features) of a row-major
//! weight are a contiguous byte range: still memory-mapped, so a rank reads only
//! its part. Column slices (input features) are gathered into owned bytes block by
//! block; if the range is not block-aligned the slice is widened to f32.

use formats::{TensorData, WeightTensor};
use kernels::DType;
use std::ops::Range;
use std::sync::Arc;

/// Rows per group of a packed weight (`kernels::packed::group_rows`).
fn group(w: &WeightTensor) -> usize {
    kernels::packed::group_rows(w.dtype)
}

/// Rows `r` of a 2-D (or 1-D, as one row per element) weight.
pub fn rows(w: &WeightTensor, r: Range<usize>) -> WeightTensor {
    if r.start == 0 && r.end == w.shape[0] {
        return w.clone();
    }
    let row_elems: usize = w.shape[1..].iter().product();
    let row_bytes = w.dtype.bytes_for(row_elems).expect("rows are whole blocks");
    let data = match &w.data {
        TensorData::Mapped { map, offset, .. } => {
            TensorData::Mapped { map: map.clone(), offset: offset + r.start * row_bytes, len: r.len() * row_bytes }
        }
        TensorData::Owned(v) => TensorData::Owned(Arc::new(v[r.start * row_bytes..r.end * row_bytes].to_vec())),
        // Whole groups: the same bytes (a packed group holds exactly its rows'),
        // copied, so that the whole tensor's memory can go once it is sliced.
        TensorData::Packed(v) if r.start.is_multiple_of(group(w)) && r.end.is_multiple_of(group(w)) => {
            let mut out = kernels::hugepages::alloc(r.len() * row_bytes);
            out.copy_from_slice(&v[r.start * row_bytes..r.end * row_bytes]);
            TensorData::Packed(out.freeze())
        }
        TensorData::Resident(v) => {
            let mut out = kernels::hugepages::alloc(r.len() * row_bytes);
            out.copy_from_slice(&v[r.start * row_bytes..r.end * row_bytes]);
            TensorData::Resident(out.freeze())
        }
        TensorData::Packed(_) => {
            TensorData::Owned(Arc::new(w.row_major()[r.start * row_bytes..r.end * row_bytes].to_vec()))
        }
    };
    let mut shape = w.shape.clone();
    shape[0] = r.len();
    WeightTensor { name: w.name.clone(), dtype: w.dtype, shape, data, out_scale: w.out_scale }
}

/// Columns `c` of a 2-D weight.
pub fn cols(w: &WeightTensor, c: Range<usize>) -> WeightTensor {
    let (n_rows, n_cols) = (w.shape[0], w.shape[1]);
    if c.start == 0 && c.end == n_cols {
        return w.clone();
    }
    let block = w.dtype.block_elems();
    let src_row = w.dtype.bytes_for(n_cols).expect("rows are whole blocks");
    let bytes = w.row_major();
    let (dtype, out) = if c.start.is_multiple_of(block) && c.end.is_multiple_of(block) {
        let (b0, b1) = (c.start / block * w.dtype.block_bytes(), c.end / block * w.dtype.block_bytes());
        let mut out = Vec::with_capacity(n_rows * (b1 - b0));
        for r in 0..n_rows {
            out.extend_from_slice(&bytes[r * src_row + b0..r * src_row + b1]);
        }
        (w.dtype, out)
    } else {
        let mut row = vec![0f32; n_cols];
        let mut out = Vec::with_capacity(n_rows * c.len() * 4);
        for r in 0..n_rows {
            kernels::quant::dequantize_row(w.dtype, &bytes[r * src_row..(r + 1) * src_row], &mut row);
            out.extend(row[c.clone()].iter().flat_map(|v| v.to_le_bytes()));
        }
        (DType::F32, out)
    };
    // Gathering the columns read every row, so every page of the whole
    // matrix became resident; the copy is all this rank keeps, so the file
    // pages go back (re-read from the file if anything touches them again).
    // Without this a tensor rank's resident memory held its slices plus the
    // whole o/down matrices' pages (~1B model at tensor 2: +195 MB a rank).
    w.data.release_pages();
    WeightTensor {
        name: w.name.clone(),
        dtype,
        shape: vec![n_rows, c.len()],
        data: TensorData::Owned(Arc::new(out)),
        out_scale: w.out_scale,
    }
}

/// Elements `r` of a 1-D f32 vector.
pub fn range_of(v: &[f32], r: Range<usize>) -> Vec<f32> {
    v[r].to_vec()
}

/// The transpose of a 2-D float weight (F32/F16/BF16: one value per element),
/// in the same type, owned. gpt-oss's bf16 experts are stored `[in, out]`;
/// the kernels read `[out, in]`. `None` for block-quantized types.
pub fn transpose(w: &WeightTensor) -> Option<WeightTensor> {
    if w.shape.len() != 2 || w.dtype.block_elems() != 1 || w.is_packed() {
        return None;
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let size = w.dtype.block_bytes();
    let src = w.bytes();
    let mut out = vec![0u8; src.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            out[to..to + size].copy_from_slice(&src[from..from + size]);
        }
    }
    Some(WeightTensor {
        name: w.name.clone(),
        dtype: w.dtype,
        shape: vec![cols, rows],
        data: TensorData::Owned(Arc::new(out)),
        out_scale: w.out_scale,
    })
}

/// Rows `first, first + step, first + 2·step, …` of a 2-D weight (any type:
/// rows are whole blocks), owned: de-interleaves gpt-oss's fused gate/up
/// projection (gate on even rows, up on odd ones).
pub fn strided_rows(w: &WeightTensor, first: usize, step: usize) -> WeightTensor {
    let (n_rows, n_cols) = (w.shape[0], w.shape[1]);
    let row_bytes = w.dtype.bytes_for(n_cols).expect("rows are whole blocks");
    let src = w.row_major();
    let picked: Vec<usize> = (first..n_rows).step_by(step.max(1)).collect();
    let mut out = Vec::with_capacity(picked.len() * row_bytes);
    for &r in &picked {
        out.extend_from_slice(&src[r * row_bytes..(r + 1) * row_bytes]);
    }
    WeightTensor {
        name: w.name.clone(),
        dtype: w.dtype,
        shape: vec![picked.len(), n_cols],
        data: TensorData::Owned(Arc::new(out)),
        out_scale: w.out_scale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows × cols` tensor of `dtype` with random codes and sane f16 scales at `d_at`.
    fn tensor(dtype: DType, rows: usize, cols: usize, d_at: &[usize]) -> WeightTensor {
        let mut bytes: Vec<u8> =
            (0..dtype.bytes_for(rows * cols).unwrap()).map(|i| ((i * 2654435761) >> 7) as u8).collect();
        for blk in bytes.chunks_exact_mut(dtype.block_bytes()) {
            for &o in d_at {
                blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
        WeightTensor::new("w".into(), dtype, vec![rows, cols], TensorData::Owned(Arc::new(bytes)))
    }

    /// Tensor-parallel column slices of the 256-value super-block types cut
    /// whole super-blocks (same type, the same bytes); a cut inside a
    /// super-block falls back to exact f32 values of the slice.
    #[test]
    fn column_slices_cut_whole_super_blocks() {
        for (dtype, d_at) in
            [(DType::Q2_K, &[80usize, 82][..]), (DType::Q3_K, &[108]), (DType::IQ4_XS, &[0]), (DType::IQ2_XXS, &[0])]
        {
            let (rows, cols) = (3, 1024);
            let w = tensor(dtype, rows, cols, d_at);
            let full = w.to_f32();
            for c in [0..512, 512..1024, 256..768] {
                let s = super::cols(&w, c.clone());
                assert_eq!(s.dtype, dtype, "{dtype} {c:?} keeps its type");
                let got = s.to_f32();
                for r in 0..rows {
                    assert_eq!(
                        &got[r * c.len()..(r + 1) * c.len()],
                        &full[r * cols + c.start..r * cols + c.end],
                        "{dtype} {c:?}"
                    );
                }
            }
            let c = 100..612;
            let s = super::cols(&w, c.clone());
            assert_eq!(s.dtype, DType::F32, "{dtype}: a cut inside a super-block is f32");
            assert_eq!(&s.to_f32()[..c.len()], &full[c.clone()]);
        }
    }
}
