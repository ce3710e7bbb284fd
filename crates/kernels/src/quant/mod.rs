//! Block formats. One file per format: the block struct (with a size assert),
//! reference dequantize, reference quantize where we produce it, and the scalar
//! dot product against its activation type. Layouts: FORMATS.md §1(d).

use crate::{DType, KernelError};

/// Dequantizes `dst.len()` elements (a whole number of blocks) from `src`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let _ = (dtype, src, dst);
    todo!("kernels helper")
}

/// Quantizes `src` (a whole number of blocks) into `dst`. Supports the load-time
/// targets Q8_0 and Q4_0, plus the float types F32/F16/BF16.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let _ = (dtype, src, dst);
    todo!("kernels helper")
}
