//! Quantized KV cache elements: [`BlockQ8_0`] and [`BlockQ4_0`] as
//! [`KvElem`]s, with the GGUF block layouts (as llama.cpp's `--cache-type-k/v
//! q8_0|q4_0`).
//!
//! One cache element is one block of 32 consecutive values of a row: Q8_0 is an
//! f16 scale and 32 int8 codes (34 bytes, 8.5 bits a value), Q4_0 an f16 scale
//! and 16 bytes of nibbles (18 bytes, 4.5 bits a value). A row of `n_kv_heads ×
//! head_dim` values is `n_kv_heads · head_dim / 32` blocks; with `head_dim % 32
//! == 0` no block straddles two heads, so a head's keys are whole blocks and the
//! tile code indexes them like f16 rows with element strides.
//!
//! Storing quantizes a new row once (Q8_0: llama.cpp's x86 `quantize_row_q8_0`,
//! `q = round_half_even(x·127/amax)`, through the AVX2 quantizer when active;
//! Q4_0: `quantize_row_q4_0_ref`). Widening dequantizes `x = q·d` in f32, which
//! is exact up to one rounding of the product, and every ISA level computes the
//! same product: the SIMD widen is bit-identical to the scalar one. Keys are
//! not widened: attention scores them against the query quantized to int8
//! ([`KvElem::INT_SCORES`], [`crate::kv_int_dot`]). Values are widened to an
//! f32 block, except Q8_0 values in AVX-512 decode, which P·V dequantizes in
//! registers ([`KvElem::DIRECT_PV`]; the same bits as the widened block).

use crate::attention::KvElem;
use crate::isa::{self, Isa};
use crate::kv_int_dot::{self, QuantQuery};
use crate::quant::q4_0::{self, BlockQ4_0};
use crate::quant::q8_0::{self, BlockQ8_0};
use crate::quant::{quantize_act_fn, VecDotType};
#[cfg(target_arch = "x86_64")]
use crate::simd::kvq;

/// Values per quantized KV element.
pub const QK: usize = 32;

/// The ISA level a widen/prefetch runs at: `simd` (AVX2 or better, decided by the
/// attention caller) selects the active level, else scalar.
fn level(simd: bool) -> Isa {
    if simd {
        isa::active()
    } else {
        Isa::Scalar
    }
}

/// Asserts the shared widen contract: `n` rows of `d / QK` blocks at block
/// stride `stride` lie inside `src`, and `dst` holds `n_pad × d` floats.
fn check_widen(src_len: usize, stride: usize, n: usize, n_pad: usize, d: usize, dst_len: usize) {
    assert!(d.is_multiple_of(QK), "quantized KV widen: d = {d} is not a multiple of {QK}");
    assert!(n == 0 || src_len >= (n - 1) * stride + d / QK, "quantized KV widen: rows past the cache");
    assert!(n <= n_pad && dst_len >= n_pad * d, "quantized KV widen: destination too short");
}

impl KvElem for BlockQ8_0 {
    const VALUES: usize = QK;

    fn store(src: &[f32], dst: &mut [BlockQ8_0]) {
        assert_eq!(src.len(), dst.len() * QK, "Q8_0 KV store: length mismatch");
        quantize_act_fn(VecDotType::Q8_0, isa::active())(src, bytemuck::cast_slice_mut(dst));
    }

    fn widen(simd: bool, src: &[BlockQ8_0], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]) {
        check_widen(src.len(), stride, n, n_pad, d, dst.len());
        widen_q8_0(level(simd), src, stride, n, d, dst);
        dst[n * d..n_pad * d].fill(0.0);
    }

    fn prefetch(simd: bool, src: &[BlockQ8_0], stride: usize, n: usize, d: usize) {
        prefetch_blocks(simd, bytemuck::cast_slice(src), stride * 34, n, d / QK * 34);
    }

    const INT_SCORES: bool = true;

    fn int_scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
        kv_int_dot::q8_0_scores(isa, q, k, stride, n, s, s_stride)
    }

    const DIRECT_PV: bool = true;

    fn direct_pv(
        isa: Isa,
        p: &[f32],
        p_stride: usize,
        rows: usize,
        v: &[Self],
        stride: usize,
        n: usize,
        d: usize,
        o: &mut [f32],
    ) {
        crate::attention::direct::pv_q8_0(isa, p, p_stride, rows, v, stride, n, d, o)
    }
}

impl KvElem for BlockQ4_0 {
    const VALUES: usize = QK;

    fn store(src: &[f32], dst: &mut [BlockQ4_0]) {
        assert_eq!(src.len(), dst.len() * QK, "Q4_0 KV store: length mismatch");
        q4_0::quantize(src, dst);
    }

    fn widen(simd: bool, src: &[BlockQ4_0], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]) {
        check_widen(src.len(), stride, n, n_pad, d, dst.len());
        widen_q4_0(level(simd), src, stride, n, d, dst);
        dst[n * d..n_pad * d].fill(0.0);
    }

    fn prefetch(simd: bool, src: &[BlockQ4_0], stride: usize, n: usize, d: usize) {
        prefetch_blocks(simd, bytemuck::cast_slice(src), stride * 18, n, d / QK * 18);
    }

    const INT_SCORES: bool = true;

    fn int_scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
        kv_int_dot::q4_0_scores(isa, q, k, stride, n, s, s_stride)
    }
}

/// Dequantizes `n` rows of `d` values (row `j` = blocks `src[j·stride ..][.. d/32]`)
/// into `dst[j·d ..][.. d]` at ISA level `isa` (AVX-512, AVX2 or scalar; all
/// bit-identical). The caller checked the bounds ([`check_widen`]).
pub fn widen_q8_0(isa: Isa, src: &[BlockQ8_0], stride: usize, n: usize, d: usize, dst: &mut [f32]) {
    check_widen(src.len(), stride, n, n, d, dst.len());
    #[cfg(target_arch = "x86_64")]
    {
        let (s, o) = (src.as_ptr() as *const u8, dst.as_mut_ptr());
        match isa {
            // SAFETY: the level is supported (callers pass `isa::active()` or a
            // level from `isa::available()`); bounds checked above.
            Isa::Avx512 => return unsafe { kvq::widen_q8_0_avx512(s, stride * 34, n, d, o) },
            Isa::Avx2 => return unsafe { kvq::widen_q8_0_avx2(s, stride * 34, n, d, o) },
            _ => {}
        }
    }
    let _ = isa;
    for j in 0..n {
        q8_0::dequantize(&src[j * stride..][..d / QK], &mut dst[j * d..(j + 1) * d]);
    }
}

/// [`widen_q8_0`] for Q4_0 blocks.
pub fn widen_q4_0(isa: Isa, src: &[BlockQ4_0], stride: usize, n: usize, d: usize, dst: &mut [f32]) {
    check_widen(src.len(), stride, n, n, d, dst.len());
    #[cfg(target_arch = "x86_64")]
    {
        let (s, o) = (src.as_ptr() as *const u8, dst.as_mut_ptr());
        match isa {
            // SAFETY: as in `widen_q8_0`.
            Isa::Avx512 => return unsafe { kvq::widen_q4_0_avx512(s, stride * 18, n, d, o) },
            Isa::Avx2 => return unsafe { kvq::widen_q4_0_avx2(s, stride * 18, n, d, o) },
            _ => {}
        }
    }
    let _ = isa;
    for j in 0..n {
        q4_0::dequantize(&src[j * stride..][..d / QK], &mut dst[j * d..(j + 1) * d]);
    }
}

/// Prefetch hint for `n` rows of `row_bytes` bytes, `stride_bytes` apart.
fn prefetch_blocks(simd: bool, src: &[u8], stride_bytes: usize, n: usize, row_bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    if simd && n > 0 && src.len() >= (n - 1) * stride_bytes + row_bytes {
        // SAFETY: `simd` implies AVX2; the rows lie inside `src` (checked).
        unsafe { kvq::prefetch_bytes(src.as_ptr(), stride_bytes, n, row_bytes) };
    }
    let _ = (simd, src, stride_bytes, n, row_bytes);
}

/// Start-up check of the SIMD dequantizers at `isa` against scalar on fixed
/// blocks (random codes and scales, some negative), two rows at a block stride
/// of 3. Takes the level explicitly: it runs before [`isa::active`] is decided.
#[cfg(target_arch = "x86_64")]
pub(crate) fn self_test(isa: Isa, byte: &mut dyn FnMut() -> u8) -> Result<(), String> {
    let (d, stride, n) = (64, 3, 2);
    let mut raw8: Vec<u8> = (0..n * stride * 34).map(|_| byte()).collect();
    let mut raw4: Vec<u8> = (0..n * stride * 18).map(|_| byte()).collect();
    // Sane scales (the random bytes could spell NaN or infinities).
    for (i, b) in raw8.chunks_exact_mut(34).enumerate() {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01 * (i as f32 - 2.5)).to_bits().to_le_bytes());
    }
    for (i, b) in raw4.chunks_exact_mut(18).enumerate() {
        b[..2].copy_from_slice(&half::f16::from_f32(0.03 * (2.5 - i as f32)).to_bits().to_le_bytes());
    }
    let (b8, b4): (&[BlockQ8_0], &[BlockQ4_0]) = (bytemuck::cast_slice(&raw8), bytemuck::cast_slice(&raw4));
    let (mut want, mut got) = (vec![0f32; n * d], vec![0f32; n * d]);
    widen_q8_0(Isa::Scalar, b8, stride, n, d, &mut want);
    widen_q8_0(isa, b8, stride, n, d, &mut got);
    if want.iter().zip(&got).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(format!("{isa} Q8_0 KV widen differs from scalar"));
    }
    widen_q4_0(Isa::Scalar, b4, stride, n, d, &mut want);
    widen_q4_0(isa, b4, stride, n, d, &mut got);
    if want.iter().zip(&got).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(format!("{isa} Q4_0 KV widen differs from scalar"));
    }
    Ok(())
}
