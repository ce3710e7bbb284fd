//! AVX-512 (BW, VNNI) one-row decode dots for the grid I-quants (IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_S; IQ1_S and IQ1_M) against Q8_K.
//!
//! IQ1_S, IQ1_M and IQ2_S build their gather indices 16 at a time (the `qh`
//! bits widened once a block, one `vpermd` and a variable shift) and their
//! scales once a block; the IQ1 types gather unsigned rows
//! ([`super::iq1_tables`]). Their old per-chunk scalar-to-vector moves, all
//! on the shuffle port, cost more than the gathers: IQ1_S 16.2 → 10.0,
//! IQ1_M 18.3 → 10.9, IQ2_S 15.6 → 9.4 ns a super-block-row.
//!
//! Why: these types spend their time looking codes up, not reading memory
//! (a 1.1B model's IQ3_S decodes at ~3 GB/s of weights a core). The AVX2
//! kernels of [`super::avx2_lowk`], like llama.cpp's, insert grid entries one
//! by one and read each 8 values' signs from a byte table. Here 64 values take:
//! * one gather of their grid entries (`vpgatherdd`: 16 four-value IQ3_S
//!   entries; `vpgatherdq`: 8 eight-value IQ2 entries);
//! * one 64-bit sign mask: IQ3_S stores sign bytes; IQ2_XXS and IQ2_XS store
//!   7-bit even-parity indices, expanded 32 at a time ([`ksigns_vec`]: the
//!   parity bit from a nibble table; IQ2_XXS's fields pulled out of its
//!   words with `vpmultishiftqb`, so it needs VBMI). The mask negates the
//!   activations (Q8_K codes are −127..127, so a negation never wraps);
//! * one `vpdpbusd` of the unsigned magnitudes (≤ 62) with those activations,
//!   then one `vpdpwssd` with the sub-block scales `2s + 1` laid over the
//!   lanes (a lane's four values always share a sub-block).
//!
//! The same gathers and sign masks decode whole super-blocks for the AVX-512
//! lane GEMM ([`super::avx512_gemm_k`]: IQ3_S, IQ2_XS, and with VBMI IQ3_XXS
//! and IQ2_XXS), each equal to the scalar `codes()` path of
//! [`super::gemm_lowk::decode_iq`], which the others keep (the AVX2 GEMM
//! gathers IQ3_S, IQ3_XXS, IQ2_XS and IQ2_XXS in `gemm_lowk` too).
//!
//! Measured against the AVX2 kernels (`bench_matmul 1 1`, 1.1B shapes, CPU
//! time, AMD EPYC Zen 4): IQ2_XS 1.5×, IQ3_S 1.07×, IQ2_XXS 1.07×. IQ3_XXS with the gather
//! and vector signs measured level with AVX2, so it keeps the AVX2 kernel
//! without VBMI. IQ2_S first measured 0.9× with its 10-bit indices built in
//! scalar code; built in vectors (a `vpsrlvd` of the two `qh` bytes), and
//! with the prefetch all these kernels now have, it runs 1.34× the AVX2
//! kernel out of cache (Intel Xeon, one thread, 4.7 against 3.5 GB/s).
//!
//! Numerics: the block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s (`d·d_a·isum` added block by block, then the type's
//! constant), so every kernel equals scalar bit for bit.

use super::avx2_lowk::{blk, finish, q8k};
use super::avx2_rows::prefetch_block;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use super::gemm_lowk::{pair, Scales};
use super::iq1_tables::{iq1m_codes_plus_nine, iq1s_grid_plus_one};
use crate::quant::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::{iq1_m, iq1_s, iq2_s, iq2_xs, iq3_s, iq3_xxs, q8_k};
use std::arch::x86_64::*;

/// `acc + Σ mag·(±q8)` per lane (four values each) with the signs of `neg`
/// applied to the 64 activations at `q8`, times the lanes' scales `ls`:
/// `vpdpwssd` against `(ls, 0)` word pairs, exact because a lane's sum of
/// four products is under 2¹⁵ in magnitude (magnitudes ≤ 62 in every
/// caller), so its low word is the whole signed sum (one µop where
/// `vpmulld` + `vpaddd` took three).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn chunk(acc: __m512i, mag: __m512i, neg: u64, q8: *const i8, ls: __m512i) -> __m512i {
    let y = _mm512_loadu_si512(q8 as *const _);
    let ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, ys), ls)
}

/// Scales for 64 values in sub-blocks of 32: `a` on lanes 0–7, `b` on 8–15.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ls32(a: u32, b: u32) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi32(a as i32), _mm256_set1_epi32(b as i32))
}

/// Scales for 64 values in sub-blocks of 16: `s[g]` on lanes `4g..4g+4`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ls16(s: [u32; 4]) -> __m512i {
    let lo = _mm256_set_m128i(_mm_set1_epi32(s[1] as i32), _mm_set1_epi32(s[0] as i32));
    let hi = _mm256_set_m128i(_mm_set1_epi32(s[3] as i32), _mm_set1_epi32(s[2] as i32));
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Even-parity sign bytes of 7-bit indices (bit 7 of each byte ignored):
/// `KSIGNS[i] = i | parity(i) << 7`, 32 at once.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn ksigns_vec(idx: __m256i) -> __m256i {
    let low7 = _mm256_and_si256(idx, _mm256_set1_epi8(0x7F));
    // Parity of a nibble, looked up; a byte's is its nibbles' xor.
    let tab = _mm256_setr_epi8(
        0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0,
    );
    let nib = _mm256_set1_epi8(0x0F);
    let lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(low7, nib));
    let hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16::<4>(low7), nib));
    // Only bit 0 is set in `lo ^ hi`, so a 16-bit shift keeps it in its byte.
    _mm256_or_si256(low7, _mm256_slli_epi16::<7>(_mm256_xor_si256(lo, hi)))
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq3_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    let grid = IQ3S_GRID.as_ptr() as *const i32;
    let high = _mm512_set1_epi32(256);
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq3_s::BlockIq3S = blk(w.add(i * 110));
        prefetch_block(w.add(i * 110), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let mut acc = _mm512_setzero_si512();
        for h in 0..4 {
            // Group k's index: qs[k] | bit k % 8 of qh[k / 8] << 8.
            let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * h) as *const __m128i));
            let hb = u16::from_le_bytes([x.qh[2 * h], x.qh[2 * h + 1]]);
            let idx = _mm512_mask_or_epi32(idx, hb, idx, high);
            let mag = _mm512_i32gather_epi32::<4>(idx, grid);
            let neg = u64::from_le_bytes(x.signs[8 * h..8 * h + 8].try_into().expect("8 sign bytes"));
            let ls = ls32(2 * x.scale(2 * h) as u32 + 1, 2 * x.scale(2 * h + 1) as u32 + 1);
            acc = chunk(acc, mag, neg, y.qs.as_ptr().add(64 * h), ls);
        }
        sum += x.d.to_f32() * y.d * _mm512_reduce_add_epi32(acc) as f32;
    }
    finish(sum, 1.0)
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dot_iq2_xxs(n: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sum = 0f32;
    for i in 0..n / 256 {
        // [d, then per sub-block of 32 a qword: four grid indices, then a u32
        // of four 7-bit sign indices and the scale in bits 28..32]
        let xp = w.add(i * 66);
        prefetch_block(xp, PREFETCH_AHEAD);
        let d = half::f16::from_bits((xp as *const u16).read_unaligned()).to_f32();
        let y = q8k(a, i);
        let v = _mm512_loadu_si512(xp.add(2) as *const _);
        let idx: [u8; 32] = std::mem::transmute(_mm512_cvtepi64_epi32(v));
        let (signs, ls) = ksigns_and_scales(_mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v)));
        let mut acc = _mm512_setzero_si512();
        for h in 0..4 {
            let iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(idx.as_ptr().add(8 * h) as *const __m128i));
            let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XXS_GRID.as_ptr() as *const i64);
            acc = chunk(acc, mag, signs[h], y.qs.as_ptr().add(64 * h), ls32(ls[2 * h], ls[2 * h + 1]));
        }
        sum += d * y.d * _mm512_reduce_add_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq2_xs(n: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq2_xs::BlockIq2Xs = blk(w.add(i * 74));
        prefetch_block(w.add(i * 74), PREFETCH_AHEAD);
        let y = q8k(a, i);
        // Word k: a 9-bit grid index and a 7-bit KSIGNS index.
        let words = _mm512_loadu_si512(x.qs.as_ptr() as *const _);
        let signs: [u64; 4] = std::mem::transmute(ksigns_vec(_mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(words))));
        let idx: [u16; 32] = std::mem::transmute(_mm512_and_si512(words, _mm512_set1_epi16(511)));
        let mut acc = _mm512_setzero_si512();
        for h in 0..4 {
            let iv = _mm256_cvtepu16_epi32(_mm_loadu_si128(idx.as_ptr().add(8 * h) as *const __m128i));
            let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XS_GRID.as_ptr() as *const i64);
            let ls = ls16(std::array::from_fn(|g| 2 * x.scale(4 * h + g) as u32 + 1));
            acc = chunk(acc, mag, signs[h], y.qs.as_ptr().add(64 * h), ls);
        }
        sum += x.d.to_f32() * y.d * _mm512_reduce_add_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// Chunk `h` (64 values) of an IQ2_S block: its eight grid rows' magnitudes,
/// gathered, and its sign mask (bit `j` of sign byte `k`: value `8k + j`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq2_s_rows(x: &iq2_s::BlockIq2S, h: usize) -> (__m512i, u64) {
    // Group k = 8h + t: index qs[k] | ((qh[k / 4] >> 2(k % 4)) & 3) << 8, so
    // group t's two high bits sit at bit 2t of the chunk's two `qh` bytes.
    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * h) as *const __m128i));
    let qh = _mm256_set1_epi32(i32::from(u16::from_le_bytes([x.qh[2 * h], x.qh[2 * h + 1]])));
    let hi =
        _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), _mm256_set1_epi32(3));
    let iv = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(hi));
    let mag = _mm512_i32gather_epi64::<8>(iv, IQ2S_GRID.as_ptr() as *const i64);
    (mag, u64::from_le_bytes(x.qs[32 + 8 * h..40 + 8 * h].try_into().expect("8 sign bytes")))
}

/// The grid rows (magnitudes) of IQ2_S chunks `2p` and `2p + 1` (groups
/// `16p..16p + 16`), their 10-bit indices built 16 at a time: two gathers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq2_s_rows_pair(x: &iq2_s::BlockIq2S, p: usize) -> [__m512i; 2] {
    let lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * p) as *const __m128i));
    // Lane t: qh byte 4p + t/4, its bits 2(t mod 4).. moved to 8–9.
    let qh = _mm512_cvtepu8_epi32(_mm_cvtsi32_si128((x.qh.as_ptr().add(4 * p) as *const i32).read_unaligned()));
    let hi = _mm512_permutexvar_epi32(WORD_OF_GROUP.0, qh);
    let hi = _mm512_sllv_epi32(hi, _mm512_setr_epi32(8, 6, 4, 2, 8, 6, 4, 2, 8, 6, 4, 2, 8, 6, 4, 2));
    // lo | hi & 0x300.
    let iv = _mm512_ternarylogic_epi32::<0xEA>(hi, _mm512_set1_epi32(0x300), lo);
    let grid = IQ2S_GRID.as_ptr() as *const i64;
    [
        _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(iv), grid),
        _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(iv), grid),
    ]
}

/// `2s + 1` of an IQ2_S block's sixteen groups of 16, group `g` on lane `g`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq2_s_scales(x: &iq2_s::BlockIq2S) -> __m512i {
    let b = _mm512_cvtepu8_epi32(_mm_loadl_epi64(x.scales.as_ptr() as *const __m128i));
    let b = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), b);
    // Nibble g mod 2, doubled: (b << 1 >> 4(g mod 2)) & 30, | 1.
    let s =
        _mm512_srlv_epi32(_mm512_slli_epi32::<1>(b), _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
    _mm512_ternarylogic_epi32::<0xEA>(s, _mm512_set1_epi32(30), _mm512_set1_epi32(1))
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq2_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq2_s::BlockIq2S = blk(w.add(i * 82));
        prefetch_block(w.add(i * 82), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let ls = iq2_s_scales(x);
        let mut acc = _mm512_setzero_si512();
        for p in 0..2 {
            let mag = iq2_s_rows_pair(x, p);
            for (c, &m) in mag.iter().enumerate() {
                let h = 2 * p + c;
                // Bit j of sign byte k: value 8k + j.
                let neg = _load_mask64(x.qs.as_ptr().add(32 + 8 * h) as *const u64);
                let lsh =
                    _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(4 * h as i32), WORD_OF_GROUP.0), ls);
                acc = chunk(acc, m, neg, y.qs.as_ptr().add(64 * h), lsh);
            }
        }
        sum += x.d.to_f32() * y.d * _mm512_reduce_add_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// Chunk `h` (64 values, sub-blocks 2h and 2h + 1) of an IQ1_S block: its
/// eight ternary grid rows (−1, 0, 1 bytes), gathered.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq1_s_rows(x: &iq1_s::BlockIq1S, h: usize) -> __m512i {
    // Group t of 8: its three high index bits at bit 3(t mod 4) of its
    // sub-block's `qh` word.
    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * h) as *const __m128i));
    let qh = _mm256_set_m128i(_mm_set1_epi32(i32::from(x.qh(2 * h + 1))), _mm_set1_epi32(i32::from(x.qh(2 * h))));
    let hi = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9)), _mm256_set1_epi32(7));
    let iv = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(hi));
    _mm512_i32gather_epi64::<8>(iv, IQ1S_GRID.as_ptr() as *const i64)
}

/// [`super::avx2_lowk::iq1_s_words`] in the low half of a `zmm` (upper lanes zero).
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn iq1_s_words(x: &iq1_s::BlockIq1S) -> (__m512i, __m512i) {
    let (qh, ls) = super::avx2_lowk::iq1_s_words(x);
    (_mm512_zextsi256_si512(qh), _mm512_zextsi256_si512(ls))
}

/// The grid rows (plus one, [`iq1s_grid_plus_one`]) of chunks `2p` and
/// `2p + 1` (groups `16p..16p + 16`): their 11-bit indices built 16 at a
/// time from the `qs` bytes and the `qh` dwords ([`iq1_s_words`]), then two
/// gathers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq1_s_rows_pair(x: &iq1_s::BlockIq1S, qh: __m512i, p: usize, grid: *const i64) -> [__m512i; 2] {
    let lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * p) as *const __m128i));
    // Lane t: word 4p + t/4; group t's three bits at 3(t mod 4), moved to 8–10.
    let w = _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(4 * p as i32), WORD_OF_GROUP.0), qh);
    let hi = _mm512_sllv_epi32(w, _mm512_setr_epi32(8, 5, 2, 0, 8, 5, 2, 0, 8, 5, 2, 0, 8, 5, 2, 0));
    let hi = _mm512_mask_srli_epi32::<1>(hi, 0x8888, w);
    // lo | hi & 0x700.
    let iv = _mm512_ternarylogic_epi32::<0xEA>(hi, _mm512_set1_epi32(0x700), lo);
    [
        _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(iv), grid),
        _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(iv), grid),
    ]
}

/// `t / 4` for lanes `t = 0..16` (the `qh` word of group `t` of 16).
struct WordOfGroup(__m512i);
const WORD_OF_GROUP: WordOfGroup =
    WordOfGroup(unsafe { std::mem::transmute::<[i32; 16], __m512i>([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]) });

/// [`super::avx2_lowk::iq1_s_terms`] in the low half of a `zmm`.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn iq1_s_terms(qh: __m512i, ls: __m512i, y: &q8_k::BlockQ8K) -> __m512i {
    let t = super::avx2_lowk::iq1_s_terms(_mm512_castsi512_si256(qh), _mm512_castsi512_si256(ls), y);
    _mm512_zextsi256_si512(t)
}

/// One IQ1_S block's `8·s + sumi1` spread over 16 lanes (see
/// [`super::avx2_lowk::iq1_s_terms`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
#[inline]
unsafe fn iq1_s_block(x: &iq1_s::BlockIq1S, y: &q8_k::BlockQ8K, grid: *const i64) -> __m512i {
    let (qh, ls) = iq1_s_words(x);
    let mut acc = _mm512_setzero_si512();
    for p in 0..2 {
        let g = iq1_s_rows_pair(x, qh, p, grid);
        for (c, &gc) in g.iter().enumerate() {
            let h = 2 * p + c;
            // Lanes 0–7: sub-block 2h's 2s + 1, lanes 8–15: 2h + 1's.
            let (a, b) = (2 * h as i32, 2 * h as i32 + 1);
            let lsh = _mm512_permutexvar_epi32(_mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b), ls);
            // A lane's four products are at most 4·2·127 < 2¹⁵: its low word is
            // the whole signed sum ([`chunk`]).
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * h) as *const _);
            acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), gc, q8), lsh);
        }
    }
    _mm512_add_epi32(_mm512_slli_epi32::<3>(acc), iq1_s_terms(qh, ls, y))
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq1_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    let grid = iq1s_grid_plus_one().as_ptr() as *const i64;
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq1_s::BlockIq1S = blk(w.add(i * 50));
        prefetch_block(w.add(i * 50), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let t = _mm512_reduce_add_epi32(iq1_s_block(x, y, grid));
        sum += x.d.to_f32() * y.d * (t as f32 * iq1_s::DELTA);
    }
    sum
}

/// Chunk `h` (64 values) of an IQ1_M block as signed codes `8·grid ± 1` (the
/// group's shift `±1/8` made integer), in element order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq1_m_codes(x: &iq1_m::BlockIq1M, h: usize) -> __m512i {
    // Group t of 8: its nibble at bit 4t of the chunk's four `qh` bytes (bits
    // 0–2: the index's high bits, bit 3: the shift's sign).
    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * h) as *const __m128i));
    let qh = u32::from_le_bytes(x.qh[4 * h..4 * h + 4].try_into().expect("4 qh bytes"));
    let nib = _mm256_srlv_epi32(_mm256_set1_epi32(qh as i32), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    let hi = _mm256_and_si256(nib, _mm256_set1_epi32(7));
    let iv = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(hi));
    let g = _mm512_i32gather_epi64::<8>(iv, IQ1S_GRID.as_ptr() as *const i64);
    // 8·g: a 16-bit shift with each byte's carried-in bits cleared; then the
    // group's sign.
    let minus = _mm256_test_epi32_mask(nib, _mm256_set1_epi32(8));
    let sign = _mm512_mask_blend_epi64(minus, _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
    _mm512_add_epi8(_mm512_and_si512(_mm512_slli_epi16::<3>(g), _mm512_set1_epi8(0xF8u8 as i8)), sign)
}

/// The codes ([`iq1m_codes_plus_nine`]) of chunks `2p` and `2p + 1` (groups
/// `16p..16p + 16`), their 12-bit indices built 16 at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq1_m_codes_pair(x: &iq1_m::BlockIq1M, p: usize, table: *const i64) -> [__m512i; 2] {
    let lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * p) as *const __m128i));
    // Lane t: qh byte 8p + t/2, its low nibble for even t, high for odd,
    // moved to bits 8–11.
    let qh = _mm512_cvtepu8_epi32(_mm_loadl_epi64(x.qh.as_ptr().add(8 * p) as *const __m128i));
    let nib = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), qh);
    let nib = _mm512_sllv_epi32(nib, _mm512_setr_epi32(8, 4, 8, 4, 8, 4, 8, 4, 8, 4, 8, 4, 8, 4, 8, 4));
    // lo | nib & 0xF00.
    let iv = _mm512_ternarylogic_epi32::<0xEA>(nib, _mm512_set1_epi32(0xF00), lo);
    [
        _mm512_i32gather_epi64::<8>(_mm512_castsi512_si256(iv), table),
        _mm512_i32gather_epi64::<8>(_mm512_extracti64x4_epi64::<1>(iv), table),
    ]
}

/// `2s + 1` of an IQ1_M block's sixteen groups of 16, group `g` on lane `g`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
unsafe fn iq1_m_scales(x: &iq1_m::BlockIq1M) -> __m512i {
    let words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_loadl_epi64(x.scales.as_ptr() as *const __m128i)));
    let w = _mm512_permutexvar_epi32(WORD_OF_GROUP.0, words);
    // Group g's three bits at 3(g mod 4), doubled: (w >> 3(g mod 4) - 1) & 14, | 1
    // (g mod 4 = 0: w << 1).
    let s =
        _mm512_srlv_epi32(_mm512_slli_epi32::<1>(w), _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9));
    _mm512_ternarylogic_epi32::<0xEA>(s, _mm512_set1_epi32(14), _mm512_set1_epi32(1))
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq1_m(n: usize, w: *const u8, a: *const u8) -> f32 {
    let table = iq1m_codes_plus_nine().as_ptr() as *const i64;
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq1_m::BlockIq1M = blk(w.add(i * 56));
        prefetch_block(w.add(i * 56), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let ls = iq1_m_scales(x);
        let mut acc = _mm512_setzero_si512();
        for p in 0..2 {
            let code = iq1_m_codes_pair(x, p, table);
            for (c, &cc) in code.iter().enumerate() {
                let h = 2 * p + c;
                // Lanes 4t..4t + 4: group 4h + t's 2s + 1.
                let ctl = _mm512_add_epi32(_mm512_set1_epi32(4 * h as i32), WORD_OF_GROUP.0);
                let lsh = _mm512_permutexvar_epi32(ctl, ls);
                // A lane's four products are at most 4·18·127 < 2¹⁵ ([`chunk`]).
                let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * h) as *const _);
                acc = _mm512_dpwssd_epi32(acc, _mm512_dpbusd_epi32(_mm512_setzero_si512(), cc, q8), lsh);
            }
        }
        // Less the +9: 9·ls·bsums, group g on lane g.
        let bsums = _mm512_cvtepi16_epi32(_mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i));
        let nine = _mm512_mullo_epi32(_mm512_mullo_epi32(ls, _mm512_set1_epi32(9)), bsums);
        // `Σ ls·Σ code·q8 = 8·sumi1 + sumi2`; its eighth is the reference's
        // `sumi1 + δ·sumi2` exactly (at most 24 significant bits).
        let t = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc, nine));
        sum += x.d() * y.d * (t as f32 * iq1_s::DELTA);
    }
    sum
}

// ------------------------------------------------ prefill decoders

/// The lane GEMM's record of one super-block ([`super::gemm_lowk::decode_iq`]'s,
/// unsigned): scales `ls` per 16 values, the `128·ls` pairs, `c·d`.
fn scales(ls: [u32; 16], d: f32, c: f32) -> Scales {
    let mut s = Scales::default();
    for g in 0..16 {
        s.sc[g] = ls[g] as i32;
    }
    for t in 0..8 {
        s.c[t] = pair(128 * s.sc[2 * t], 128 * s.sc[2 * t + 1]);
    }
    s.d = c * d;
    s
}

/// Stores 64 codes `±mag + 128` (negated under `neg`) at `q`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn store_codes(q: *mut u8, mag: __m512i, neg: u64) {
    let v = _mm512_mask_sub_epi8(mag, neg, _mm512_setzero_si512(), mag);
    _mm512_storeu_si512(q as *mut _, _mm512_xor_si512(v, _mm512_set1_epi8(0x80u8 as i8)));
}

/// IQ2_S super-block `x` (82 bytes) → as [`decode_iq3_s`], equal to
/// `decode_iq(IQ2_S, x, q, false)`.
///
/// # Safety
/// AVX-512 F/BW CPU; `x` holds 82 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
pub(super) unsafe fn decode_iq2_s(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq2_s::BlockIq2S = blk(x);
    for h in 0..4 {
        let (mag, neg) = iq2_s_rows(x, h);
        store_codes(q.add(64 * h), mag, neg);
    }
    scales(std::array::from_fn(|g| 2 * x.scale(g) as u32 + 1), x.d.to_f32(), 0.125)
}

/// IQ1_S super-block `x` (50 bytes) → as [`decode_iq3_s`], equal to
/// `decode_iq(IQ1_S, x, q, false)`: codes `8·grid ± 1 + 128`, eight grid rows
/// gathered per 64 values (the indices as in [`dot_iq1_s`]).
///
/// # Safety
/// AVX-512 F/BW CPU; `x` holds 50 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
pub(super) unsafe fn decode_iq1_s(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq1_s::BlockIq1S = blk(x);
    let mut ls = [0u32; 16];
    for h in 0..4 {
        let g = iq1_s_rows(x, h);
        let ((l0, s0), (l1, s1)) = (x.scale_delta(2 * h), x.scale_delta(2 * h + 1));
        ls[4 * h..4 * h + 4].copy_from_slice(&[l0 as u32, l0 as u32, l1 as u32, l1 as u32]);
        // 8·g: a 16-bit shift, each byte's low three bits (carried in from
        // its neighbour) cleared; then the sub-block's ±1 and the offset 128.
        let g8 = _mm512_and_si512(_mm512_slli_epi16::<3>(g), _mm512_set1_epi8(0xF8u8 as i8));
        let sign = _mm512_inserti64x4::<1>(_mm512_set1_epi8(s0 as i8), _mm256_set1_epi8(s1 as i8));
        let code = _mm512_xor_si512(_mm512_add_epi8(g8, sign), _mm512_set1_epi8(0x80u8 as i8));
        _mm512_storeu_si512(q.add(64 * h) as *mut _, code);
    }
    scales(ls, x.d.to_f32(), 0.125)
}

/// IQ1_M super-block `x` (56 bytes) → as [`decode_iq3_s`], equal to
/// `decode_iq(IQ1_M, x, q, false)`.
///
/// # Safety
/// AVX-512 F/BW CPU; `x` holds 56 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
#[inline]
pub(super) unsafe fn decode_iq1_m(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq1_m::BlockIq1M = blk(x);
    for h in 0..4 {
        let code = _mm512_xor_si512(iq1_m_codes(x, h), _mm512_set1_epi8(0x80u8 as i8));
        _mm512_storeu_si512(q.add(64 * h) as *mut _, code);
    }
    scales(std::array::from_fn(|g| x.ls(g) as u32), x.d(), 0.125)
}

/// IQ3_S super-block `x` (110 bytes) → 256 codes at `q` for the AVX-512 lane
/// GEMM, equal to `decode_iq(IQ3_S, x, q, false)` (64 values a gather
/// instead of the scalar `codes()`).
///
/// # Safety
/// AVX-512 F/BW CPU; `x` holds 110 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn decode_iq3_s(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq3_s::BlockIq3S = blk(x);
    let grid = IQ3S_GRID.as_ptr() as *const i32;
    let high = _mm512_set1_epi32(256);
    for h in 0..4 {
        let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * h) as *const __m128i));
        let hb = u16::from_le_bytes([x.qh[2 * h], x.qh[2 * h + 1]]);
        let mag = _mm512_i32gather_epi32::<4>(_mm512_mask_or_epi32(idx, hb, idx, high), grid);
        let neg = u64::from_le_bytes(x.signs[8 * h..8 * h + 8].try_into().expect("8 sign bytes"));
        store_codes(q.add(64 * h), mag, neg);
    }
    scales(std::array::from_fn(|g| 2 * x.scale(g / 2) as u32 + 1), x.d.to_f32(), 1.0)
}

/// IQ2_XS super-block `x` (74 bytes) → as [`decode_iq3_s`].
///
/// # Safety
/// AVX-512 F/BW CPU; `x` holds 74 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(super) unsafe fn decode_iq2_xs(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq2_xs::BlockIq2Xs = blk(x);
    let words = _mm512_loadu_si512(x.qs.as_ptr() as *const _);
    let signs: [u64; 4] = std::mem::transmute(ksigns_vec(_mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(words))));
    let idx: [u16; 32] = std::mem::transmute(_mm512_and_si512(words, _mm512_set1_epi16(511)));
    for h in 0..4 {
        let iv = _mm256_cvtepu16_epi32(_mm_loadu_si128(idx.as_ptr().add(8 * h) as *const __m128i));
        let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XS_GRID.as_ptr() as *const i64);
        store_codes(q.add(64 * h), mag, signs[h]);
    }
    scales(std::array::from_fn(|g| 2 * x.scale(g) as u32 + 1), x.d.to_f32(), 0.125)
}

/// The 32 sign bytes of a super-block whose four qwords (`aux`) each hold two
/// sub-blocks' u32s of four 7-bit `KSIGNS` indices (and a scale in bits
/// 28..32), and those eight sub-blocks' `2s + 1`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
#[inline]
unsafe fn ksigns_and_scales(aux: __m256i) -> ([u64; 4], [u32; 8]) {
    // Byte t of each qword ← the 8 bits from bit 7t (t < 4) or 32 + 7(t − 4).
    let fields = _mm256_set1_epi64x(i64::from_le_bytes([0, 7, 14, 21, 32, 39, 46, 53]));
    let signs = std::mem::transmute::<__m256i, [u64; 4]>(ksigns_vec(_mm256_multishift_epi64_epi8(fields, aux)));
    let ls = _mm256_add_epi32(_mm256_slli_epi32::<1>(_mm256_srli_epi32::<28>(aux)), _mm256_set1_epi32(1));
    (signs, std::mem::transmute::<__m256i, [u32; 8]>(ls))
}

/// IQ3_XXS super-block `x` (98 bytes) → as [`decode_iq3_s`].
///
/// # Safety
/// AVX-512 F/BW/VBMI CPU; `x` holds 98 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c")]
pub(super) unsafe fn decode_iq3_xxs(x: *const u8, q: *mut u8) -> Scales {
    let x: &iq3_xxs::BlockIq3Xxs = blk(x);
    let grid = IQ3XXS_GRID.as_ptr() as *const i32;
    let (signs, ls) = ksigns_and_scales(_mm256_loadu_si256(x.qs.as_ptr().add(64) as *const __m256i));
    for h in 0..4 {
        let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * h) as *const __m128i));
        store_codes(q.add(64 * h), _mm512_i32gather_epi32::<4>(idx, grid), signs[h]);
    }
    scales(std::array::from_fn(|g| ls[g / 2]), x.d.to_f32(), 0.25)
}

/// [`decode_iq3_xxs`] of a block recoded at load
/// ([`crate::packed::xxs_signs`]), read as it lies: the element-order sign
/// bits of each 64 values are the four masks' 16-bit pieces interleaved,
/// four `pdep`, instead of the way back to the file's sign indices.
///
/// # Safety
/// AVX-512 F/BW/VBMI and BMI2 CPU; `x` holds 98 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c,bmi2")]
pub(super) unsafe fn decode_iq3_xxs_recoded(x: *const u8, q: *mut u8) -> Scales {
    let m = x.add(66) as *const u64;
    let (m0, m1, m2) = (m.read_unaligned(), m.add(1).read_unaligned(), m.add(2).read_unaligned());
    let even = _pdep_u64((x.add(90) as *const u32).read_unaligned() as u64, 0x5555_5555_5555_5555);
    let masks = [m0, m1, m2, crate::packed::xxs_signs::mask3(m0, m1, m2, even)];
    let grid = IQ3XXS_GRID.as_ptr() as *const i32;
    for h in 0..4 {
        let mut signs = 0u64;
        for (j, mj) in masks.iter().enumerate() {
            signs |= _pdep_u64(mj >> (16 * h), 0x1111_1111_1111_1111 << j);
        }
        let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(x.add(2 + 16 * h) as *const __m128i));
        store_codes(q.add(64 * h), _mm512_i32gather_epi32::<4>(idx, grid), signs);
    }
    let sc = (x.add(94) as *const u32).read_unaligned();
    let d = half::f16::from_bits((x as *const u16).read_unaligned()).to_f32();
    scales(std::array::from_fn(|g| 2 * (sc >> (4 * (g / 2)) & 0xF) + 1), d, 0.25)
}

/// The element-order sign bits of an IQ2_XXS or IQ2_XS block recoded at load
/// ([`crate::packed::iq2_signs`], its seven masks at `m`, 28 bytes with 4
/// more readable after): quadword `h` bit `8b + i` = bit `8h + b` of mask
/// `i`. One byte permute puts byte `h` of every mask in quadword `h`
/// (reversed), and one `vgf2p8affineqb` transposes each 8 × 8 bit block.
///
/// # Safety
/// AVX-512 F/VL/VBMI and GFNI CPU; `m` holds 32 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,gfni")]
#[inline]
unsafe fn iq2_recoded_signs(m: *const u8) -> [u64; 4] {
    let words: [u32; 7] = std::array::from_fn(|j| (m.add(4 * j) as *const u32).read_unaligned());
    let v = _mm256_insert_epi32::<7>(
        _mm256_loadu_si256(m as *const __m256i),
        crate::packed::iq2_signs::mask7(&words) as i32,
    );
    // Output byte 8h + 7 − j = input byte 4j + h (mask j's byte h).
    let ctl = _mm256_setr_epi8(
        28, 24, 20, 16, 12, 8, 4, 0, 29, 25, 21, 17, 13, 9, 5, 1, 30, 26, 22, 18, 14, 10, 6, 2, 31, 27, 23, 19, 15, 11,
        7, 3,
    );
    let t = _mm256_permutexvar_epi8(ctl, v);
    // Output byte b bit i = input byte 7 − i bit b (one-hot data bytes).
    let one_hot = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    std::mem::transmute::<__m256i, [u64; 4]>(_mm256_gf2p8affine_epi64_epi8::<0>(one_hot, t))
}

/// [`decode_iq2_xxs`] of a block recoded at load ([`crate::packed::iq2_signs`]),
/// read as it lies.
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI and GFNI CPU; `x` holds 66 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c,gfni")]
pub(super) unsafe fn decode_iq2_xxs_recoded(x: *const u8, q: *mut u8) -> Scales {
    let d = half::f16::from_bits((x as *const u16).read_unaligned()).to_f32();
    let signs = iq2_recoded_signs(x.add(crate::packed::iq2_signs::XXS_MASKS));
    for h in 0..4 {
        let iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(2 + 8 * h) as *const __m128i));
        let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XXS_GRID.as_ptr() as *const i64);
        store_codes(q.add(64 * h), mag, signs[h]);
    }
    let sc = (x.add(62) as *const u32).read_unaligned();
    scales(std::array::from_fn(|g| 2 * (sc >> (4 * (g / 2)) & 0xF) + 1), d, 0.125)
}

/// [`decode_iq2_xs`] of a block recoded at load ([`crate::packed::iq2_signs`]),
/// read as it lies.
///
/// # Safety
/// As for [`decode_iq2_xxs_recoded`]; `x` holds 74 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c,gfni")]
pub(super) unsafe fn decode_iq2_xs_recoded(x: *const u8, q: *mut u8) -> Scales {
    let d = half::f16::from_bits((x as *const u16).read_unaligned()).to_f32();
    let signs = iq2_recoded_signs(x.add(crate::packed::iq2_signs::XS_MASKS));
    let hi = (x.add(34) as *const u32).read_unaligned();
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for h in 0..4 {
        let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(2 + 8 * h) as *const __m128i));
        let bit8 =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((hi >> (8 * h)) as i32), lanes), _mm256_set1_epi32(1));
        let iv = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(bit8));
        let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XS_GRID.as_ptr() as *const i64);
        store_codes(q.add(64 * h), mag, signs[h]);
    }
    let sc = x.add(66);
    scales(std::array::from_fn(|g| 2 * u32::from(*sc.add(g / 2) >> (4 * (g % 2)) & 0xF) + 1), d, 0.125)
}

/// [`crate::packed::iq2_signs::encode_xxs`] of one block in vector code: the
/// sign bytes as the file-layout decoder makes them, each mask one
/// `vptestmb` (the byte loops ran at about 1 GB/s, slower than loading).
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI; `src`, `dst`: 66 bytes each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub unsafe fn encode_iq2_xxs(src: *const u8, dst: *mut u8) {
    std::ptr::copy_nonoverlapping(src, dst, 2);
    // Per sub-block a quadword: four grid indices, then the signs-and-scale u32.
    let v = _mm512_loadu_si512(src.add(2) as *const _);
    _mm256_storeu_si256(dst.add(2) as *mut __m256i, _mm512_cvtepi64_epi32(v));
    let aux = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v));
    let (signs, _) = ksigns_and_scales(aux);
    put_sign_masks(std::mem::transmute::<[u64; 4], __m256i>(signs), dst.add(crate::packed::iq2_signs::XXS_MASKS));
    let mut scales = 0u32;
    for l in 0..8 {
        scales |= ((src.add(6 + 8 * l) as *const u32).read_unaligned() >> 28) << (4 * l);
    }
    (dst.add(62) as *mut u32).write_unaligned(scales);
}

/// [`crate::packed::iq2_signs::encode_xs`] of one block in vector code.
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI; `src`, `dst`: 74 bytes each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
pub unsafe fn encode_iq2_xs(src: *const u8, dst: *mut u8) {
    std::ptr::copy_nonoverlapping(src, dst, 2);
    let words = _mm512_loadu_si512(src.add(2) as *const _);
    _mm256_storeu_si256(dst.add(2) as *mut __m256i, _mm512_cvtepi16_epi8(words));
    let hi = _mm512_test_epi16_mask(words, _mm512_set1_epi16(0x100));
    (dst.add(34) as *mut u32).write_unaligned(hi);
    let signs = ksigns_vec(_mm512_cvtepi16_epi8(_mm512_srli_epi16::<9>(words)));
    put_sign_masks(signs, dst.add(crate::packed::iq2_signs::XS_MASKS));
    std::ptr::copy_nonoverlapping(src.add(66), dst.add(66), 8);
}

/// The seven sign masks of 32 entries (`signs` byte `e` bit `j` = the sign of
/// value `8e + j`) as words at `dst`: mask `j` bit `e` = bit `j` of byte `e`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn put_sign_masks(signs: __m256i, dst: *mut u8) {
    for j in 0..7 {
        let m = _mm256_test_epi8_mask(signs, _mm256_set1_epi8(1 << j));
        (dst.add(4 * j) as *mut u32).write_unaligned(m);
    }
}

/// IQ2_XXS super-block `x` (66 bytes) → as [`decode_iq3_s`].
///
/// # Safety
/// AVX-512 F/BW/VBMI CPU; `x` holds 66 bytes, `q` 256 writable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,f16c")]
pub(super) unsafe fn decode_iq2_xxs(x: *const u8, q: *mut u8) -> Scales {
    let d = half::f16::from_bits((x as *const u16).read_unaligned()).to_f32();
    // Per sub-block a qword: four grid indices, then the signs-and-scale u32.
    let v = _mm512_loadu_si512(x.add(2) as *const _);
    let idx: [u8; 32] = std::mem::transmute(_mm512_cvtepi64_epi32(v));
    let (signs, ls) = ksigns_and_scales(_mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v)));
    for h in 0..4 {
        let iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(idx.as_ptr().add(8 * h) as *const __m128i));
        let mag = _mm512_i32gather_epi64::<8>(iv, IQ2XXS_GRID.as_ptr() as *const i64);
        store_codes(q.add(64 * h), mag, signs[h]);
    }
    scales(std::array::from_fn(|g| ls[g / 2]), d, 0.125)
}
