//! Super-block decoders of Q2_K, Q3_K and IQ4_XS for the lane GEMMs
//! ([`super::avx512_gemm_k`], [`super::avx2_gemm_k`]), and the decoded-scales
//! record both GEMMs share.
//!
//! Each decoder turns one 256-value super-block into 256 codes in element
//! order (one byte each, what `vpdpbusd` / `vpmaddubsw` broadcast per weight
//! row) and a [`Scales`]. The GEMM then computes per super-block
//! `isum = Σ_j sc_j·S_j` (`S_j` a sub-block's `Σ code·a`) and
//! `msum = Σ_t c_t·(bsums pair t)`, and one of two float combinations:
//!
//! | type   | sub-block | code            | `c` pair `t`               | result per super-block |
//! |--------|-----------|-----------------|----------------------------|------------------------|
//! | Q2_K   | 256 (one) | `q·sc` (0..45)  | `(m_2t, m_2t+1)`           | `(d_a·d)·isum − (d_a·dmin)·msum` |
//! | Q3_K   | 16        | `q + 4` (0..7)  | `(4·sc_2t, 4·sc_2t+1)`     | `(d·d_a)·(isum − msum)` |
//! | IQ4_XS | 32        | `K[q] + 128` (1..241) | `(128·sc_t, 128·sc_t)` | `(d·d_a)·(isum − msum)` |
//! | IQ4_XS, signed | 32 | `K[q]` (−127..113) | `0`                   | `(d·d_a)·isum` |
//! | IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S | 16 | `±grid + 128` (66..190) | `(128·ls_2t, 128·ls_2t+1)` | `(d'·d_a)·(isum − msum)` |
//! | IQ1_S, IQ1_M | 16 | `8·grid ± 1 + 128` (119..137) | the same | the same (`d' = d/8`) |
//! | IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S folded ([`fold_to_32`]) | 32 | the same | `(128·ls_t, 128·ls_t)` | the same |
//! | IQ3_S, AVX2 ([`decode_iq3_s_avx2`]) | 32 | `±grid + 16` (1..31) | `(16·ls_t, 16·ls_t)` | the same |
//! | IQ1_S, IQ1_M, AVX2 | 32, 16 | `8·grid ± 1 + 16` (7..25) | `16·ls` pairs | the same |
//! | IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, AVX2 | 32, 16, 16, 32 | `±grid + 64` (2..126) | `64·ls` pairs | the same |
//!
//! (The AVX2 GEMM adds its offsets to the decoders' signed codes, `±grid`
//! or `8·grid ± 1`; see [`super::avx2_gemm_k`].)
//!
//! Q2_K's 4-bit scales are folded into its codes (`3·15 = 45` fits a byte),
//! so its whole super-block is one "sub-block" of scale 1: no per-16-value
//! scale multiply in the GEMM's inner loop. The offsets make the codes
//! unsigned for `vpdpbusd`; `c·bsums` takes them
//! back out exactly (`Σ sc·(code − o)·a = Σ sc·code·a − o·Σ sc·B`, `B` a
//! sub-block's `Σ a` = its Q8_K `bsums`). The signed IQ4_XS codes are for
//! AVX2, whose `vpmaddubsw` would saturate on 241·127 pairs: it uses the sign
//! trick (`|w|·sign(a, w)`, exact since Q8_K codes are −127..127). The float
//! steps are the scalar references' (`quant::q2_k::combine`,
//! `quant::q3_k::vec_dot`, `quant::iq4_xs::vec_dot`, the I-quants'
//! `grouped_sum` form), so the GEMMs match them bit for bit.
//!
//! The grid I-quants (IQ2_*, IQ3_*) decode through their blocks' scalar
//! `codes()` (signed grid points with the signs applied, and `ls = 2s + 1`
//! per 16 values): once per weight row and call, which a prefill of `m ≥ 32`
//! rows amortizes, where the one-row kernels looked the grid up again for
//! every activation row (the AVX-512 GEMM decodes IQ3_S, IQ2_XS and, with
//! VBMI, IQ3_XXS and IQ2_XXS with gathers instead: `avx512_iq`; the AVX2 one
//! IQ3_S, IQ3_XXS, IQ2_XS and IQ2_XXS: [`decode_iq3_s_avx2`] and its siblings; IQ2_S keeps `codes()`). Their
//! references end with a constant factor
//! (`0.125·Σ` for IQ2_*, `0.25·Σ` for IQ3_XXS); `d' = c·d` folds it in, exact
//! because `c` is a power of two (every product and partial sum scales
//! exactly), so the bits stay the reference's.

use crate::quant::iq4_nl::KVALUES;
use crate::quant::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, q3_k};
use crate::DType;
use std::arch::x86_64::*;

/// One decoded super-block of one weight row (all K-quant lane GEMM types).
#[derive(Clone, Copy, Default)]
pub(super) struct Scales {
    /// Sub-block scales (8 used for 32-value sub-blocks, 16 for 16-value).
    pub sc: [i32; 16],
    /// The i16 pairs for the `bsums` pairs (see the GEMMs' module tables).
    pub c: [i32; 8],
    pub d: f32,
    pub dmin: f32,
}

#[inline(always)]
pub(super) fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Two i16 in one i32 (`lo` in the low half), the operand `vpdpwssd` /
/// `vpmaddwd` pairs with one `bsums` pair.
#[inline(always)]
pub(super) fn pair(lo: i32, hi: i32) -> i32 {
    (lo & 0xFFFF) | (hi << 16)
}

/// Q2_K `[scales[16], qs[64], d, dmin]` (84 bytes) → codes times their
/// group's scale (`q·sc`, 0..45) at `q[0..256]`, one sub-block of scale 1.
///
/// # Safety
/// AVX2 CPU; `x` holds 84 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_q2_k(x: &[u8], q: *mut u8) -> Scales {
    let mut s = Scales::default();
    s.sc[0] = 1;
    for t in 0..8 {
        s.c[t] = pair((x[2 * t] >> 4) as i32, (x[2 * t + 1] >> 4) as i32);
    }
    s.d = f16(&x[80..82]);
    s.dmin = f16(&x[82..84]);
    let (three, even) = (_mm256_set1_epi8(3), _mm256_set1_epi16(0x00FF));
    for h in 0..2 {
        // Element 128h + 32j + l: bits 2j..2j+2 of qs[32h + l].
        let v = _mm256_loadu_si256(x.as_ptr().add(16 + 32 * h) as *const __m256i);
        for j in 0..4 {
            let c = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), three);
            // Groups 8h + 2j (low 16 bytes) and 8h + 2j + 1: each byte times
            // its scale in 16-bit lanes (products < 256 stay in their byte).
            let g = 8 * h + 2 * j;
            let sc = _mm256_set_m128i(_mm_set1_epi16((x[g + 1] & 15) as i16), _mm_set1_epi16((x[g] & 15) as i16));
            let lo = _mm256_mullo_epi16(_mm256_and_si256(c, even), sc);
            let hi = _mm256_slli_epi16(_mm256_mullo_epi16(_mm256_srli_epi16(c, 8), sc), 8);
            _mm256_storeu_si256(q.add(128 * h + 32 * j) as *mut __m256i, _mm256_or_si256(lo, hi));
        }
    }
    s
}

/// Q3_K `[hmask[32], qs[64], scales[12], d]` (110 bytes) → codes `q + 4`
/// (0..7: the two low bits, plus 4 where the high bit is set).
///
/// # Safety
/// AVX2 CPU; `x` holds 110 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_q3_k(x: &[u8], q: *mut u8) -> Scales {
    let mut s = Scales::default();
    let sc = q3_k::scales(x[96..108].try_into().expect("12 scale bytes"));
    for g in 0..16 {
        s.sc[g] = sc[g] as i32;
    }
    for t in 0..8 {
        s.c[t] = pair(4 * s.sc[2 * t], 4 * s.sc[2 * t + 1]);
    }
    s.d = f16(&x[108..110]);
    let (three, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    let hm = _mm256_loadu_si256(x.as_ptr() as *const __m256i);
    for h in 0..2 {
        // Element 128h + 32j + l: bits 2j.. of qs[32h + l], bit 4h + j of hmask[l].
        let v = _mm256_loadu_si256(x.as_ptr().add(32 + 32 * h) as *const __m256i);
        for j in 0..4 {
            let lo = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), three);
            let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)), one);
            let c = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
            _mm256_storeu_si256(q.add(128 * h + 32 * j) as *mut __m256i, c);
        }
    }
    s
}

/// IQ4_XS `[d, scales_h[2], scales_l[4], qs[128]]` (136 bytes) → codes
/// `K[q] + 128` as u8 (`signed == false`, with the `128·sc` pairs) or `K[q]`
/// as i8 (`signed`, `c = 0`).
///
/// # Safety
/// AVX2 CPU; `x` holds 136 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_iq4_xs(x: &[u8], q: *mut u8, signed: bool) -> Scales {
    let mut s = Scales::default();
    let h = u16::from_le_bytes([x[2], x[3]]);
    for ib in 0..8 {
        let lo = (x[4 + ib / 2] >> (4 * (ib % 2))) & 15;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        s.sc[ib] = (lo | (hi << 4)) as i32 - 32;
    }
    if !signed {
        for t in 0..8 {
            s.c[t] = pair(128 * s.sc[t], 128 * s.sc[t]);
        }
    }
    s.d = f16(&x[0..2]);
    let mut table = [0u8; 16];
    for (t, &k) in table.iter_mut().zip(&KVALUES) {
        *t = if signed { k as u8 } else { (k as u8) ^ 0x80 };
    }
    let tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    let low = _mm256_set1_epi8(0x0F);
    for k in 0..4 {
        // qs[16ib + j]: low nibble element 32ib + j, high nibble 32ib + 16 + j;
        // one load covers sub-blocks 2k (lane 0) and 2k + 1 (lane 1).
        let v = _mm256_loadu_si256(x.as_ptr().add(8 + 32 * k) as *const __m256i);
        let lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, low));
        let hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        _mm256_storeu_si256(q.add(64 * k) as *mut __m256i, _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(q.add(64 * k + 32) as *mut __m256i, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    s
}

/// The grid I-quants' super-block `x` → codes `±grid + 128` as u8 (with the
/// `128·ls` pairs) or `±grid` as i8 (`signed`, `c = 0`), sub-blocks of 16 of
/// scale `ls`, and `d` times the reference's closing constant.
///
/// # Panics
/// If `dtype` is not IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S or IQ1_M, or `x` is
/// shorter than its block.
pub(super) fn decode_iq(dtype: DType, x: &[u8], q: &mut [u8; 256], signed: bool) -> Scales {
    fn block<T: bytemuck::Pod>(x: &[u8]) -> &T {
        bytemuck::from_bytes(&x[..std::mem::size_of::<T>()])
    }
    let (codes, ls, d, c) = match dtype {
        DType::IQ2_XXS => {
            let b: &iq2_xxs::BlockIq2Xxs = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 0.125)
        }
        DType::IQ2_XS => {
            let b: &iq2_xs::BlockIq2Xs = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 0.125)
        }
        DType::IQ2_S => {
            let b: &iq2_s::BlockIq2S = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 0.125)
        }
        DType::IQ3_XXS => {
            let b: &iq3_xxs::BlockIq3Xxs = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 0.25)
        }
        DType::IQ3_S => {
            let b: &iq3_s::BlockIq3S = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 1.0)
        }
        DType::IQ1_S => {
            let b: &iq1_s::BlockIq1S = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d.to_f32(), 0.125)
        }
        DType::IQ1_M => {
            let b: &iq1_m::BlockIq1M = block(x);
            let (q, ls) = b.codes();
            (q, ls, b.d(), 0.125)
        }
        other => panic!("decode_iq: {other} is not a grid I-quant"),
    };
    let mut s = Scales::default();
    for g in 0..16 {
        s.sc[g] = ls[g] as i32;
    }
    if !signed {
        for t in 0..8 {
            s.c[t] = pair(128 * s.sc[2 * t], 128 * s.sc[2 * t + 1]);
        }
    }
    s.d = c * d;
    let flip = if signed { 0 } else { 0x80 };
    for (o, &v) in q.iter_mut().zip(&codes) {
        *o = (v as u8) ^ flip;
    }
    s
}

/// The grid I-quants whose scale covers 32 values (IQ3_S, IQ3_XXS, IQ2_XXS):
/// the lane GEMMs run them with 32-value sub-blocks, as IQ4_XS, from their
/// record folded by [`fold_to_32`]. Half the scale multiplies of the 16-value
/// path (at AVX-512, 12 `vpmulld` per 48 `vpdpbusd` there), the same integer sums.
pub(super) fn scale_per_32(dtype: DType) -> bool {
    matches!(dtype, DType::IQ3_S | DType::IQ3_XXS | DType::IQ2_XXS | DType::IQ1_S)
}

/// A grid I-quant's record (one `ls` per 16 values, equal in pairs, and the
/// `128·ls` pairs) as one per 32 with the `(128·ls, 128·ls)` pairs that meet
/// the 32-position sums: `Σ_j ls_j·S_j` and `Σ_t 128·ls_t·B_t` are the same
/// integers, so the result's bits are unchanged.
pub(super) fn fold_to_32(s: Scales) -> Scales {
    let mut out = Scales { d: s.d, dmin: s.dmin, ..Scales::default() };
    for j in 0..8 {
        debug_assert_eq!(s.sc[2 * j], s.sc[2 * j + 1], "a 32-value scale");
        out.sc[j] = s.sc[2 * j];
        out.c[j] = pair(128 * out.sc[j], 128 * out.sc[j]);
    }
    out
}

/// Whether [`decode_iq`] takes `dtype`.
pub(super) fn is_grid_iq(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S | DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S | DType::IQ1_M
    )
}

/// 32 bytes, byte `j` = −1 where bit `j` of the four sign bytes `s` is set,
/// else 0.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn sign_mask32(s: u32) -> __m256i {
    sign_mask32_of(_mm256_set1_epi32(s as i32))
}

/// [`sign_mask32`] of the four sign bytes in dword 0 of each 128-bit lane of
/// `v` (a broadcast: `vpbroadcastd`, or `vpermd` of a vector of them).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn sign_mask32_of(v: __m256i) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_set1_epi64x(i64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]));
    let v = _mm256_shuffle_epi8(v, spread);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit)
}

/// The offset of the AVX2 GEMM's unsigned IQ3_S codes (its grid magnitudes
/// are odd, 1..15).
pub(super) const IQ3S_OFFSET: i32 = 16;

/// IQ3_S super-block `x` (110 bytes) → signed codes at `q`, equal to
/// `decode_iq(IQ3_S, x, q, true)`: 32 values a gather (`vpgatherdd`) and a
/// sign mask, instead of the scalar `codes()`. For the AVX2 lane GEMM, which
/// takes them offset (`OFFSET`: `v +` [`IQ3S_OFFSET`], 1..31, unsigned) so
/// that they run its unsigned path: two `vpmaddubsw` a step added in i16
/// (2·2·31·127 < 2¹⁵), where the signed path takes one and an `abs` and a
/// `sign` per 4 positions.
///
/// # Safety
/// AVX2 CPU; `x` holds 110 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_iq3_s_avx2<const OFFSET: bool>(x: &[u8], q: *mut u8) -> Scales {
    let b: &iq3_s::BlockIq3S = bytemuck::from_bytes(&x[..std::mem::size_of::<iq3_s::BlockIq3S>()]);
    let grid = crate::quant::iq_grids::IQ3S_GRID.as_ptr() as *const i32;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let one = _mm256_set1_epi32(1);
    for ib in 0..8 {
        // Group k of sub-block ib: qs[8ib + k] | bit k of qh[ib] << 8.
        let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.qs.as_ptr().add(8 * ib) as *const __m128i));
        let hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.qh[ib] as i32), lanes), one);
        let mag = _mm256_i32gather_epi32::<4>(grid, _mm256_or_si256(lo, _mm256_slli_epi32::<8>(hi)));
        let s = u32::from_le_bytes(b.signs[4 * ib..4 * ib + 4].try_into().expect("4 sign bytes"));
        let neg = sign_mask32(s);
        let v = _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg);
        let v = if OFFSET { _mm256_add_epi8(v, _mm256_set1_epi8(IQ3S_OFFSET as i8)) } else { v };
        _mm256_storeu_si256(q.add(32 * ib) as *mut __m256i, v);
    }
    let mut s = Scales::default();
    for g in 0..16 {
        s.sc[g] = 2 * b.scale(g / 2) as i32 + 1;
    }
    s.d = b.d.to_f32();
    s
}

/// The four sign bytes of 32 values from their 7-bit `KSIGNS` indices (the
/// low 7 bits of each `idx`), as one u32 for [`sign_mask32`].
#[inline(always)]
fn ksigns4(idx: [u32; 4]) -> u32 {
    let k = |l: usize| crate::quant::iq_grids::KSIGNS[(idx[l] & 127) as usize] as u32;
    k(0) | k(1) << 8 | k(2) << 16 | k(3) << 24
}

/// IQ3_XXS super-block `x` (98 bytes) → as [`decode_iq3_s_avx2`].
///
/// # Safety
/// AVX2 CPU; `x` holds 98 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_iq3_xxs_avx2(x: &[u8], q: *mut u8) -> Scales {
    let b: &iq3_xxs::BlockIq3Xxs = bytemuck::from_bytes(&x[..std::mem::size_of::<iq3_xxs::BlockIq3Xxs>()]);
    let grid = crate::quant::iq_grids::IQ3XXS_GRID.as_ptr() as *const i32;
    let mut s = Scales::default();
    for ib in 0..8 {
        let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.qs.as_ptr().add(8 * ib) as *const __m128i));
        let mag = _mm256_i32gather_epi32::<4>(grid, idx);
        let aux = b.aux(ib);
        let neg = sign_mask32(ksigns4(std::array::from_fn(|l| aux >> (7 * l))));
        _mm256_storeu_si256(q.add(32 * ib) as *mut __m256i, _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg));
        s.sc[2 * ib] = 2 * (aux >> 28) as i32 + 1;
        s.sc[2 * ib + 1] = s.sc[2 * ib];
    }
    s.d = 0.25 * b.d.to_f32();
    s
}

/// IQ2_XXS super-block `x` (66 bytes) → as [`decode_iq3_s_avx2`] (signed):
/// per 32 values one gather of their four eight-value grid entries
/// (`vpgatherdq`) and a sign mask from the four 7-bit `KSIGNS` indices.
///
/// # Safety
/// AVX2 CPU; `x` holds 66 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_iq2_xxs_avx2(x: &[u8], q: *mut u8) -> Scales {
    let b: &iq2_xxs::BlockIq2Xxs = bytemuck::from_bytes(&x[..std::mem::size_of::<iq2_xxs::BlockIq2Xxs>()]);
    let grid = crate::quant::iq_grids::IQ2XXS_GRID.as_ptr() as *const i64;
    let mut s = Scales::default();
    for ib in 0..8 {
        // Four grid indices (a byte each), then a word of four 7-bit sign
        // indices and the scale in bits 28..32.
        let (idx, aux) = b.sub(ib);
        let iv = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(i32::from_le_bytes(idx)));
        let mag = _mm256_i32gather_epi64::<8>(grid, iv);
        let neg = sign_mask32(ksigns4(std::array::from_fn(|l| aux >> (7 * l))));
        _mm256_storeu_si256(q.add(32 * ib) as *mut __m256i, _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg));
        s.sc[2 * ib] = 2 * (aux >> 28) as i32 + 1;
        s.sc[2 * ib + 1] = s.sc[2 * ib];
    }
    s.d = 0.125 * b.d.to_f32();
    s
}

/// IQ2_XS super-block `x` (74 bytes) → as [`decode_iq3_s_avx2`].
///
/// # Safety
/// AVX2 CPU; `x` holds 74 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_iq2_xs_avx2(x: &[u8], q: *mut u8) -> Scales {
    let b: &iq2_xs::BlockIq2Xs = bytemuck::from_bytes(&x[..std::mem::size_of::<iq2_xs::BlockIq2Xs>()]);
    let grid = crate::quant::iq_grids::IQ2XS_GRID.as_ptr() as *const i64;
    let mut s = Scales::default();
    for ib in 0..8 {
        // Word k: a 9-bit grid index (eight values) and a 7-bit KSIGNS index.
        let w: [u32; 4] = std::array::from_fn(|l| b.word(4 * ib + l) as u32);
        let idx = _mm_setr_epi32((w[0] & 511) as i32, (w[1] & 511) as i32, (w[2] & 511) as i32, (w[3] & 511) as i32);
        let mag = _mm256_i32gather_epi64::<8>(grid, idx);
        let neg = sign_mask32(ksigns4(w.map(|v| v >> 9)));
        _mm256_storeu_si256(q.add(32 * ib) as *mut __m256i, _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg));
    }
    for g in 0..16 {
        s.sc[g] = 2 * b.scale(g) as i32 + 1;
    }
    s.d = 0.125 * b.d.to_f32();
    s
}
