//! Block formats. One file per format: the block struct (with a size assert),
//! reference dequantize, reference quantize where we produce it, and the scalar
//! dot product against its activation type. Layouts: FORMATS.md §1(d).
//!
//! Weight formats: [`q4_0`], [`q4_1`], [`q5_0`], [`q5_1`], [`q8_0`], [`q4_k`],
//! [`q5_k`], [`q6_k`], [`q2_k`], [`q3_k`], the I-quants ([`iq2_xxs`], [`iq2_xs`],
//! [`iq2_s`], [`iq3_xxs`], [`iq3_s`], [`iq1_s`], [`iq1_m`]; grids in [`iq_grids`]),
//! [`iq4_nl`], [`iq4_xs`] and [`float`] (F32/F16/BF16). Activation formats (what the
//! f32 activations are quantized to before an integer dot product, exactly as
//! llama.cpp's CPU backend does): [`q8_0`] (for Q4_0/Q5_0/Q8_0), [`q8_1`] (for
//! Q4_1/Q5_1) and [`q8_k`] (for the K-quants).
//!
//! Every block struct has alignment 1 except [`q8_k::BlockQ8K`] (alignment 4, it
//! only ever lives in our own scratch buffers), so weight bytes straight from a
//! memory map can be viewed as blocks with [`bytemuck::cast_slice`].

pub mod float;
pub mod fp8;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq1s_grid;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod iq_grids;
pub(crate) mod kq_fit;
pub mod minifloat;
pub mod mxfp4;
pub mod nvfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;

use crate::isa::Isa;
use crate::{DType, KernelError};
use bytemuck::{Pod, Zeroable};
use half::f16;

/// An IEEE half stored as two little-endian bytes (alignment 1, so blocks that
/// contain it can be read from any byte offset).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }

    /// Round-to-nearest-even conversion (what `_mm_cvtps_ph(.., 0)` and ggml do).
    #[inline(always)]
    pub fn from_f32(v: f32) -> Self {
        F16Le(f16::from_f32(v).to_bits().to_le_bytes())
    }

    #[inline(always)]
    pub fn bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }
}

/// The activation encoding a weight type's dot product consumes.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VecDotType {
    /// Plain f32 activations (float weights).
    F32,
    Q8_0,
    Q8_1,
    Q8_K,
}

impl VecDotType {
    /// The activation type llama.cpp pairs with `dtype` (`type_traits_cpu[..].vec_dot_type`),
    /// except that float weights keep f32 activations. From the dispatch table.
    pub fn of(dtype: DType) -> VecDotType {
        crate::dispatch::row(dtype).act
    }

    pub const fn block_elems(self) -> usize {
        match self {
            VecDotType::F32 => 1,
            VecDotType::Q8_0 | VecDotType::Q8_1 => 32,
            VecDotType::Q8_K => 256,
        }
    }

    pub const fn block_bytes(self) -> usize {
        match self {
            VecDotType::F32 => 4,
            VecDotType::Q8_0 => std::mem::size_of::<q8_0::BlockQ8_0>(),
            VecDotType::Q8_1 => std::mem::size_of::<q8_1::BlockQ8_1>(),
            VecDotType::Q8_K => std::mem::size_of::<q8_k::BlockQ8K>(),
        }
    }

    /// Bytes of one activation row of `cols` elements (`cols` must be a whole
    /// number of blocks).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }
}

/// Signature of an activation quantizer: one row of f32 into activation blocks.
/// `dst` is `VecDotType::row_bytes(src.len())` bytes; for Q8_K it must be 4-aligned.
pub type QuantizeActFn = fn(src: &[f32], dst: &mut [u8]);

/// The activation quantizer for `vdt` at ISA level `isa` ([`crate::dispatch::quantize_act`]).
/// All levels produce bit-identical output. `VecDotType::F32` copies the floats.
pub fn quantize_act_fn(vdt: VecDotType, isa: Isa) -> QuantizeActFn {
    crate::dispatch::quantize_act(vdt, isa)
}

/// Dot product of one weight row with one activation row.
///
/// `n` is the number of elements (a whole number of blocks of both the weight type
/// and its [`VecDotType`]); `w` points at the row's weight bytes (any alignment);
/// `a` at its activation row (f32 for float weights, 4-aligned for Q8_K).
///
/// # Safety
/// Both pointers must be valid for the bytes implied by `n`, and the function
/// must only be used on a CPU that supports the ISA it was selected for.
pub type DotFn = unsafe fn(n: usize, w: *const u8, a: *const u8) -> f32;

/// Four weight rows (at `w`, `w + stride`, `w + 2·stride`, `w + 3·stride`) against
/// one activation row; writes the four dots to `out[0..4]`.
///
/// # Safety
/// As for [`DotFn`], for each of the four rows; `out` valid for 4 writes.
pub type Dot4Fn = unsafe fn(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32);

/// The four-row kernel for `dtype` at `isa` (file layout), where the dispatch
/// table lists one (callers fall back to [`dot_fn`] row by row).
pub fn dot4_fn(dtype: DType, isa: Isa) -> Option<Dot4Fn> {
    crate::dispatch::kernels(dtype, isa, false).dot4
}

/// A tile of 4 weight rows × 2 activation rows (for `m > 1`): weight rows at
/// `w + r·stride`, activation rows at `a + j·a_stride`; writes
/// `y[j·y_stride + r]` for `r < 4`, `j < 2`.
///
/// # Safety
/// As for [`DotFn`], for each row pair; `y` valid for those writes.
pub type TileFn =
    unsafe fn(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, y_stride: usize);

/// Packed weight rows (`rows`, a multiple of 4: that many consecutive
/// four-row groups of `row_bytes` per row at `w`, taken sixteen at a time)
/// against `m` activation rows `a_stride` bytes apart; writes
/// `y[j·y_stride + r]` for `r < rows`, `j < m`. One kernel for every `m`, each row's result
/// independent of `m` and of the other rows (batch invariance by
/// construction: [`crate::simd::avx512_rows16`]).
///
/// # Safety
/// As for [`DotFn`], for each (row, activation row); `y` valid for the writes.
pub type Rows16Fn = unsafe fn(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
);

/// The 4 × 2 tile kernel for `dtype` at `isa` (file layout), where one exists.
pub fn tile_fn(dtype: DType, isa: Isa) -> Option<TileFn> {
    crate::dispatch::kernels(dtype, isa, false).tile
}

macro_rules! scalar_dot {
    ($name:ident, $wblk:ty, $ablk:ty, $f:path) => {
        /// Scalar reference dot (see [`DotFn`]).
        ///
        /// # Safety
        /// As for [`DotFn`].
        pub unsafe fn $name(n: usize, w: *const u8, a: *const u8) -> f32 {
            let nb = n / <$wblk>::ELEMS;
            let w = std::slice::from_raw_parts(w as *const $wblk, nb);
            let a = std::slice::from_raw_parts(a as *const $ablk, n / <$ablk>::ELEMS);
            $f(w, a)
        }
    };
}

/// Scalar [`DotFn`]s, one per weight type.
pub mod scalar {
    use super::*;
    scalar_dot!(dot_q4_0, q4_0::BlockQ4_0, q8_0::BlockQ8_0, q4_0::vec_dot);
    scalar_dot!(dot_q4_1, q4_1::BlockQ4_1, q8_1::BlockQ8_1, q4_1::vec_dot);
    scalar_dot!(dot_q5_0, q5_0::BlockQ5_0, q8_0::BlockQ8_0, q5_0::vec_dot);
    scalar_dot!(dot_q5_1, q5_1::BlockQ5_1, q8_1::BlockQ8_1, q5_1::vec_dot);
    scalar_dot!(dot_q8_0, q8_0::BlockQ8_0, q8_0::BlockQ8_0, q8_0::vec_dot);
    scalar_dot!(dot_q4_k, q4_k::BlockQ4K, q8_k::BlockQ8K, q4_k::vec_dot);
    scalar_dot!(dot_q5_k, q5_k::BlockQ5K, q8_k::BlockQ8K, q5_k::vec_dot);
    scalar_dot!(dot_q6_k, q6_k::BlockQ6K, q8_k::BlockQ8K, q6_k::vec_dot);
    scalar_dot!(dot_mxfp4, mxfp4::BlockMxfp4, q8_0::BlockQ8_0, mxfp4::vec_dot);
    scalar_dot!(dot_nvfp4, nvfp4::BlockNvfp4, q8_0::BlockQ8_0, nvfp4::vec_dot);
    scalar_dot!(dot_q2_k, q2_k::BlockQ2K, q8_k::BlockQ8K, q2_k::vec_dot);
    scalar_dot!(dot_q3_k, q3_k::BlockQ3K, q8_k::BlockQ8K, q3_k::vec_dot);
    scalar_dot!(dot_iq2_xxs, iq2_xxs::BlockIq2Xxs, q8_k::BlockQ8K, iq2_xxs::vec_dot);
    scalar_dot!(dot_iq2_xs, iq2_xs::BlockIq2Xs, q8_k::BlockQ8K, iq2_xs::vec_dot);
    scalar_dot!(dot_iq2_s, iq2_s::BlockIq2S, q8_k::BlockQ8K, iq2_s::vec_dot);
    scalar_dot!(dot_iq3_xxs, iq3_xxs::BlockIq3Xxs, q8_k::BlockQ8K, iq3_xxs::vec_dot);
    scalar_dot!(dot_iq3_s, iq3_s::BlockIq3S, q8_k::BlockQ8K, iq3_s::vec_dot);
    scalar_dot!(dot_iq1_s, iq1_s::BlockIq1S, q8_k::BlockQ8K, iq1_s::vec_dot);
    scalar_dot!(dot_iq1_m, iq1_m::BlockIq1M, q8_k::BlockQ8K, iq1_m::vec_dot);
    scalar_dot!(dot_iq4_nl, iq4_nl::BlockIq4Nl, q8_0::BlockQ8_0, iq4_nl::vec_dot);
    scalar_dot!(dot_iq4_xs, iq4_xs::BlockIq4Xs, q8_k::BlockQ8K, iq4_xs::vec_dot);

    /// # Safety
    /// As for [`DotFn`].
    pub unsafe fn dot_fp8(n: usize, w: *const u8, a: *const u8) -> f32 {
        let w = std::slice::from_raw_parts(w as *const fp8::BlockFp8, n / 64);
        fp8::vec_dot(w, std::slice::from_raw_parts(a as *const f32, n))
    }

    /// # Safety
    /// As for [`DotFn`].
    pub unsafe fn dot_f32(n: usize, w: *const u8, a: *const u8) -> f32 {
        float::dot_f32(std::slice::from_raw_parts(w, n * 4), std::slice::from_raw_parts(a as *const f32, n))
    }

    /// # Safety
    /// As for [`DotFn`].
    pub unsafe fn dot_f16(n: usize, w: *const u8, a: *const u8) -> f32 {
        float::dot_f16(std::slice::from_raw_parts(w, n * 2), std::slice::from_raw_parts(a as *const f32, n))
    }

    /// # Safety
    /// As for [`DotFn`].
    pub unsafe fn dot_bf16(n: usize, w: *const u8, a: *const u8) -> f32 {
        float::dot_bf16(std::slice::from_raw_parts(w, n * 2), std::slice::from_raw_parts(a as *const f32, n))
    }

    /// The scalar dot for `dtype` (the table's reference column).
    pub fn dot_fn(dtype: DType) -> DotFn {
        crate::dispatch::row(dtype).scalar
    }
}

/// The dot kernel for `dtype` at ISA level `isa` (scalar where the dispatch
/// table lists none). `isa` must be supported by this CPU (see [`crate::isa`]).
pub fn dot_fn(dtype: DType, isa: Isa) -> DotFn {
    crate::dispatch::kernels(dtype, isa, false).dot
}

/// Dequantizes `dst.len()` elements (a whole number of blocks) from `src`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let need = dtype
        .bytes_for(dst.len())
        .unwrap_or_else(|| panic!("dequantize_row: {} elements is not a whole number of {dtype} blocks", dst.len()));
    assert!(src.len() >= need, "dequantize_row: {dtype} source has {} bytes, need {need}", src.len());
    let src = &src[..need];
    match dtype {
        DType::F32 => float::dequantize_f32(src, dst),
        DType::F16 => float::dequantize_f16(src, dst),
        DType::BF16 => float::dequantize_bf16(src, dst),
        DType::Q4_0 => q4_0::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q4_1 => q4_1::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q5_0 => q5_0::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q5_1 => q5_1::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q8_0 => q8_0::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q4_K => q4_k::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q5_K => q5_k::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q6_K => q6_k::dequantize(bytemuck::cast_slice(src), dst),
        DType::MXFP4 => mxfp4::dequantize(bytemuck::cast_slice(src), dst),
        DType::NVFP4 => nvfp4::dequantize(bytemuck::cast_slice(src), dst),
        DType::FP8 => fp8::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q2_K => q2_k::dequantize(bytemuck::cast_slice(src), dst),
        DType::Q3_K => q3_k::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ2_XXS => iq2_xxs::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ2_XS => iq2_xs::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ2_S => iq2_s::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ3_XXS => iq3_xxs::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ3_S => iq3_s::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ1_S => iq1_s::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ1_M => iq1_m::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ4_NL => iq4_nl::dequantize(bytemuck::cast_slice(src), dst),
        DType::IQ4_XS => iq4_xs::dequantize(bytemuck::cast_slice(src), dst),
    }
}

/// Quantizes `src` (a whole number of blocks) into `dst`. Supports the load-time
/// targets Q8_0 and Q4_0, the GGUF targets Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_0,
/// Q5_1, IQ4_NL and IQ4_XS (llama.cpp's reference schemes, no importance matrix), the low-bit formats MXFP4, NVFP4 (no tensor scale:
/// use [`nvfp4::quantize`] for one) and FP8 (a scale per 64-value block), plus
/// the float types F32/F16/BF16.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let need = dtype.bytes_for(src.len()).ok_or(KernelError::BadRowLength {
        dtype,
        elems: src.len(),
        block: dtype.block_elems(),
    })?;
    if dst.len() != need {
        return Err(KernelError::BadDataLength { expected: need, actual: dst.len() });
    }
    match dtype {
        DType::F32 => float::quantize_f32(src, dst),
        DType::F16 => float::quantize_f16(src, dst),
        DType::BF16 => float::quantize_bf16(src, dst),
        DType::Q4_0 => q4_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q8_0 => q8_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q4_K => q4_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q2_K => q2_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q3_K => q3_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q5_K => q5_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q6_K => q6_k::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q5_0 => q5_0::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::Q5_1 => q5_1::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::IQ4_NL => iq4_nl::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::IQ4_XS => iq4_xs::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::MXFP4 => mxfp4::quantize(src, bytemuck::cast_slice_mut(dst)),
        DType::NVFP4 => nvfp4::quantize(src, 1.0, bytemuck::cast_slice_mut(dst)),
        DType::FP8 => fp8::quantize(src, bytemuck::cast_slice_mut(dst)),
        other => return Err(KernelError::UnsupportedQuantizeTarget(other)),
    }
    Ok(())
}

/// Checks the scales of low-bit weights: refuses NaN scales (E8M0 0xFF, E4M3
/// 0x7F/0xFF), non-finite FP8 block scales and FP8 NaN codes. Loaders call it
/// once per tensor, so kernels never see them. Other types always pass.
pub fn validate(dtype: DType, src: &[u8]) -> Result<(), KernelError> {
    let bad = match dtype {
        DType::MXFP4 => mxfp4::first_bad_block(bytemuck::cast_slice(whole_blocks(dtype, src)?)),
        DType::NVFP4 => nvfp4::first_bad_block(bytemuck::cast_slice(whole_blocks(dtype, src)?)),
        DType::FP8 => fp8::first_bad_block(bytemuck::cast_slice(whole_blocks(dtype, src)?)),
        _ => None,
    };
    match bad {
        Some(block) => Err(KernelError::BadScale { dtype, block }),
        None => Ok(()),
    }
}

fn whole_blocks(dtype: DType, src: &[u8]) -> Result<&[u8], KernelError> {
    if !src.len().is_multiple_of(dtype.block_bytes()) {
        let expected = src.len() / dtype.block_bytes() * dtype.block_bytes();
        return Err(KernelError::BadDataLength { expected, actual: src.len() });
    }
    Ok(src)
}

/// Largest absolute value of `x` (0 for an empty slice).
#[inline]
pub(crate) fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}
