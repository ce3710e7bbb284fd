//! AVX-512 (F/BW/VL + VNNI) kernels.

use crate::quant::DotFn;
use crate::DType;

pub fn dot_fn(dtype: DType) -> Option<DotFn> {
    let _ = dtype;
    None
}
