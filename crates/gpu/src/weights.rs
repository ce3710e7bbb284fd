//! A weight matrix on the device in its stored format (see the crate docs:
//! block formats are split into codes and scales, never widened).

use crate::{DeviceBuf, Gpu, GpuError};
use kernels::DType;

/// `rows × cols` weights (`y = x · Wᵀ`), with an optional bias and the
/// per-tensor output scale ([`formats::WeightTensor::out_scale`]). A matrix
/// larger than one binding allows (a 262k-row embedding) is held in parts
/// of whole rows.
#[derive(Debug)]
pub struct DeviceWeight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub(crate) parts: Vec<Part>,
    pub out_scale: f32,
    /// Rows of one expert when the matrix stacks a MoE layer's experts
    /// ([`DeviceWeight::upload_experts`]; parts then hold whole experts), else 0.
    pub expert_rows: usize,
}

/// Rows `row0 .. row0 + rows` of a [`DeviceWeight`].
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) row0: usize,
    pub(crate) rows: usize,
    /// Values (float types) or codes (block types), as 4-byte words.
    pub(crate) w0: DeviceBuf,
    /// Block scales (block types only).
    pub(crate) w1: Option<DeviceBuf>,
    pub(crate) bias: Option<DeviceBuf>,
}

/// One projection for [`DeviceWeight::upload_stacked`]: its type, `(rows,
/// cols)`, file-layout bytes, bias and output scale.
pub type StackPart<'a> = (DType, (usize, usize), &'a [u8], Option<&'a [f32]>, f32);

/// Copies bytes into little-endian words, zero-padding the last.
fn words(bytes: &[u8]) -> Vec<u32> {
    let mut w = vec![0u32; bytes.len().div_ceil(4)];
    bytemuck::cast_slice_mut::<u32, u8>(&mut w)[..bytes.len()].copy_from_slice(bytes);
    w
}

/// Splits blocks of `block_bytes` into their scale bytes (the range
/// `scales`, zero-padded to `stride` bytes a block) and their code bytes
/// (the rest, in order).
fn split_blocks(bytes: &[u8], block_bytes: usize, scales: std::ops::Range<usize>, stride: usize) -> (Vec<u8>, Vec<u8>) {
    let n = bytes.len() / block_bytes;
    let (mut sc, mut codes) = (Vec::with_capacity(n * stride), Vec::with_capacity(n * (block_bytes - scales.len())));
    for b in bytes.chunks_exact(block_bytes) {
        sc.extend_from_slice(&b[scales.clone()]);
        sc.resize(sc.len() + stride - scales.len(), 0);
        codes.extend_from_slice(&b[..scales.start]);
        codes.extend_from_slice(&b[scales.end..]);
    }
    (sc, codes)
}

impl DeviceWeight {
    /// Uploads `bytes`, the row-major file layout of a `rows × cols` matrix of
    /// `dtype`. `name` is for messages.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        dtype: DType,
        (rows, cols): (usize, usize),
        bytes: &[u8],
        bias: Option<&[f32]>,
        out_scale: f32,
    ) -> Result<DeviceWeight, GpuError> {
        Self::upload_aligned(gpu, name, dtype, (rows, cols), bytes, bias, out_scale, 1)
    }

    /// [`DeviceWeight::upload`] with parts of a multiple of `align` rows.
    #[allow(clippy::too_many_arguments)]
    fn upload_aligned(
        gpu: &Gpu,
        name: &str,
        dtype: DType,
        (rows, cols): (usize, usize),
        bytes: &[u8],
        bias: Option<&[f32]>,
        out_scale: f32,
        align: usize,
    ) -> Result<DeviceWeight, GpuError> {
        let unsupported = || GpuError::UnsupportedType {
            name: name.into(),
            dtype: format!("{dtype:?}"),
            supported: crate::WEIGHT_TYPES.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", "),
        };
        let expect = dtype.bytes_for(rows * cols).ok_or_else(unsupported)?;
        if bytes.len() != expect || (dtype.is_quantized() && cols % dtype.block_elems() != 0) {
            return Err(GpuError::Failed(format!(
                "tensor '{name}': {} bytes for {rows} × {cols} {dtype:?} (expected {expect})",
                bytes.len()
            )));
        }
        let row_bytes = expect / rows.max(1);
        // Rows per part: as many as one binding holds (codes are at most the row's bytes).
        let per_part = ((gpu.info.max_binding_bytes as usize / row_bytes.max(1)).max(1)).min(rows.max(1));
        let per_part = if align > 1 {
            if per_part < align {
                return Err(GpuError::Failed(format!(
                    "tensor '{name}': one expert ({align} rows of {row_bytes} bytes) is larger than a binding ({} bytes)",
                    gpu.info.max_binding_bytes
                )));
            }
            per_part / align * align
        } else {
            per_part
        };
        let mut parts = Vec::new();
        for row0 in (0..rows.max(1)).step_by(per_part) {
            let n = per_part.min(rows - row0);
            let bytes = &bytes[row0 * row_bytes..(row0 + n) * row_bytes];
            let (w0, w1) = match dtype {
                DType::F32 | DType::F16 | DType::BF16 => (gpu.buffer_with(name, &words(bytes))?, None),
                DType::Q8_0
                | DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q4_K
                | DType::Q6_K
                | DType::MXFP4
                | DType::NVFP4
                | DType::FP8 => {
                    // (block bytes, scale bytes, their stride in w1)
                    let (block, scales, stride) = match dtype {
                        DType::Q8_0 => (34, 0..2, 2),
                        DType::Q4_0 => (18, 0..2, 2),
                        DType::Q4_1 => (20, 0..4, 4),
                        // d | 4 bytes of high bits, 16 nibble bytes
                        DType::Q5_0 => (22, 0..2, 2),
                        DType::Q5_1 => (24, 0..4, 4),
                        // d, dmin, 12 scale bytes | 128 code bytes
                        DType::Q4_K => (144, 0..16, 16),
                        // 128 ql + 64 qh | 16 scales, d
                        DType::Q6_K => (210, 192..210, 20),
                        // E8M0 exponent | 16 nibble bytes: exponents packed four a word
                        DType::MXFP4 => (17, 0..1, 1),
                        // four UE4M3 sub-block scales | 32 nibble bytes
                        DType::NVFP4 => (36, 0..4, 4),
                        // f32 scale | 64 E4M3 bytes
                        _ => (68, 0..4, 4),
                    };
                    let (scales, codes) = split_blocks(bytes, block, scales, stride);
                    (gpu.buffer_with(name, &words(&codes))?, Some(gpu.buffer_with(name, &words(&scales))?))
                }
                _ => return Err(unsupported()),
            };
            let bias = match bias {
                Some(b) => Some(gpu.buffer_with(name, bytemuck::cast_slice(&b[row0..row0 + n]))?),
                None => None,
            };
            parts.push(Part { row0, rows: n, w0, w1, bias });
        }
        Ok(DeviceWeight { dtype, rows, cols, parts, out_scale, expert_rows: 0 })
    }

    /// Uploads a MoE layer's experts as one matrix for [`crate::Pass::matmul_id`]:
    /// expert `e`'s rows are `experts[e]`'s projections one after another
    /// (gate‖up, or down alone). `None` when the projections do not share a
    /// type, a width, an output scale and biases (upload them one by one).
    pub fn upload_experts(
        gpu: &Gpu,
        name: &str,
        experts: &[Vec<StackPart<'_>>],
    ) -> Result<Option<DeviceWeight>, GpuError> {
        let Some(first) = experts.first().and_then(|e| e.first()) else {
            return Ok(None);
        };
        let (dtype, (_, cols), _, bias0, scale) = *first;
        let per_expert: usize = experts[0].iter().map(|p| p.1 .0).sum();
        let all = || experts.iter().flatten();
        let same = all()
            .all(|&(d, (_, c), _, b, s)| d == dtype && c == cols && s == scale && b.is_some() == bias0.is_some())
            && experts.iter().all(|e| e.iter().map(|p| p.1 .0).sum::<usize>() == per_expert);
        if !same {
            return Ok(None);
        }
        let rows = per_expert * experts.len();
        let bytes: Vec<u8> = all().flat_map(|p| p.2.iter().copied()).collect();
        let bias: Option<Vec<f32>> = bias0.map(|_| all().flat_map(|p| p.3.unwrap().iter().copied()).collect());
        let mut w = Self::upload_aligned(gpu, name, dtype, (rows, cols), &bytes, bias.as_deref(), scale, per_expert)?;
        w.expert_rows = per_expert;
        Ok(Some(w))
    }

    /// Uploads several projections of the same input as one matrix, their
    /// rows one after another (q‖k‖v, gate‖up): one dispatch instead of
    /// several. `None` when they cannot share one (types, widths, output
    /// scales or biases differ); upload them one by one then.
    pub fn upload_stacked(gpu: &Gpu, name: &str, parts: &[StackPart<'_>]) -> Result<Option<DeviceWeight>, GpuError> {
        let (dtype, (_, cols), _, bias0, scale) = parts[0];
        let same = parts
            .iter()
            .all(|&(d, (_, c), _, b, s)| d == dtype && c == cols && s == scale && b.is_some() == bias0.is_some());
        if !same {
            return Ok(None);
        }
        let rows: usize = parts.iter().map(|p| p.1 .0).sum();
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.2.iter().copied()).collect();
        let bias: Option<Vec<f32>> = bias0.map(|_| parts.iter().flat_map(|p| p.3.unwrap().iter().copied()).collect());
        Ok(Some(DeviceWeight::upload(gpu, name, dtype, (rows, cols), &bytes, bias.as_deref(), scale)?))
    }

    /// Device bytes this weight holds.
    pub fn bytes(&self) -> usize {
        let words =
            |p: &Part| p.w0.words + p.w1.as_ref().map_or(0, |b| b.words) + p.bias.as_ref().map_or(0, |b| b.words);
        4 * self.parts.iter().map(words).sum::<usize>()
    }
}
