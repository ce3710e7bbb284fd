//! AVX-512 (BW, VNNI) decode dot products for the K-quants against Q8_K
//! activations, one or four weight rows × one activation row.
//!
//! Per super-block (256 values) and row, the work is kept to a few 512-bit
//! ops, because at one activation row these kernels are compute bound (the
//! first version, at ~6 GB/s a core, was; Q4_0 streams twice that):
//! * a 64-value chunk of Q4_K/Q5_K (two 32-value sub-blocks: low nibbles,
//!   then high) is its 32 bytes broadcast to both halves of a vector, shifted
//!   by `[0 | 4]` per half (`vpsrlvw`) and masked: 3 ops, where splitting and
//!   joining took 5;
//! * the sub-block scales (6-bit, unpacked in two 64-bit registers, no trip
//!   through memory) multiply in through `vpdpwssd` with a `vpermw` of the
//!   scale words; the mins meet Q8_K's 16-value sums once per block;
//! * `d` and `dmin` convert together (one `vcvtph2ps`);
//! * the four-row kernel names its accumulators (no array the compiler may
//!   spill) and shares the activation loads between the rows.
//!
//! Every row gets exactly the one-row arithmetic, so `dot4` equals `dot` row
//! by row, bit for bit (the batches' exactness rests on it).

use super::avx2::hsum_ps;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

#[inline(always)]
pub(super) unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
pub(super) unsafe fn ld512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// The 32 bytes at `p` in both halves of a vector.
#[inline(always)]
pub(super) unsafe fn bcast256(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(ld256(p))
}

/// Word vector: 16 × `a` then 16 × `b`.
#[inline(always)]
pub(super) unsafe fn words2(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(a)), _mm256_set1_epi16(b), 1)
}

/// Word vector: 8 × `b`, 8 × `b+1`, 8 × `b+2`, 8 × `b+3`.
#[inline(always)]
pub(super) unsafe fn words4(b: i16) -> __m512i {
    let lo = _mm256_setr_epi16(b, b, b, b, b, b, b, b, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1);
    let hi = _mm256_add_epi16(lo, _mm256_set1_epi16(2));
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// The 6-bit scales and mins of a Q4_K/Q5_K super-block (its 12 scale
/// bytes at `s`), eight bytes each, as [`crate::quant::q4_k::scales_mins`].
#[inline(always)]
unsafe fn scales_mins(s: *const u8) -> (u64, u64) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let a = (s as *const u32).read_unaligned();
    let b = (s.add(4) as *const u32).read_unaligned();
    let c = (s.add(8) as *const u32).read_unaligned();
    let sc_hi = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let m_hi = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    ((a & LOW6) as u64 | (sc_hi as u64) << 32, (b & LOW6) as u64 | (m_hi as u64) << 32)
}

/// What every row of a Q4_K/Q5_K super-block shares: the activation block
/// and the constants.
struct K45Act {
    /// The four 64-value chunks of the activations.
    ys: [__m512i; 4],
    /// Q8_K's 16 sums of 16 values.
    bsums: __m256i,
    /// Q8_K's scale in all four lanes.
    yd: __m128,
}

struct K45Consts {
    low: __m512i,
    nibble_shift: __m512i,
    one: __m512i,
    /// Scale-word index per chunk: 16 × `2c`, 16 × `2c + 1`.
    idx: [__m512i; 4],
}

#[inline(always)]
unsafe fn k45_consts() -> K45Consts {
    K45Consts {
        low: _mm512_set1_epi8(0x0F),
        nibble_shift: words2(0, 4),
        one: _mm512_set1_epi8(1),
        idx: [words2(0, 1), words2(2, 3), words2(4, 5), words2(6, 7)],
    }
}

#[inline(always)]
unsafe fn k45_act(a: *const u8, i: usize) -> K45Act {
    let y = a.add(i * Q8K_BYTES);
    K45Act {
        ys: [ld512(y.add(Q8K_QS)), ld512(y.add(Q8K_QS + 64)), ld512(y.add(Q8K_QS + 128)), ld512(y.add(Q8K_QS + 192))],
        bsums: ld256(y.add(Q8K_BSUMS)),
        yd: _mm_set1_ps((y as *const f32).read_unaligned()),
    }
}

/// One row's Q4_K (`Q5 = false`, 144-byte blocks) or Q5_K (176) super-block
/// at `x` against `act`: the scaled sums go into `acc` (16 lanes), the mins'
/// term (to subtract) into `accm`.
#[inline(always)]
unsafe fn k45_block<const Q5: bool>(x: *const u8, act: &K45Act, k: &K45Consts, acc: &mut __m512, accm: &mut __m256) {
    let qs_off = if Q5 { 48 } else { 16 };
    // [d, dmin] × the activation scale.
    let dm = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((x as *const i32).read_unaligned())), act.yd);
    let (sc, mn) = scales_mins(x.add(4));
    // Words m0, m0, m1, m1, …: each min meets both 16-value sums of its sub-block.
    let m8 = _mm_cvtsi64_si128(mn as i64);
    let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    *accm = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(act.bsums, m16)), *accm);
    let scw = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    // Q5: the fifth bits of chunk c are bits 2c (low half) and 2c + 1 (high half) of qh.
    let mut qh = if Q5 { _mm512_srlv_epi16(bcast256(x.add(16)), words2(0, 1)) } else { _mm512_setzero_si512() };
    let mut sumi = _mm512_setzero_si512();
    for c in 0..4 {
        let mut q = _mm512_and_si512(_mm512_srlv_epi16(bcast256(x.add(qs_off + 32 * c)), k.nibble_shift), k.low);
        if Q5 {
            q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(qh, k.one), 4));
            qh = _mm512_srli_epi16(qh, 2);
        }
        let p = _mm512_maddubs_epi16(q, act.ys[c]);
        sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(k.idx[c], scw));
    }
    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(sumi), *acc);
}

/// `acc`'s 16 lanes summed, less `accm`'s 8.
#[inline(always)]
unsafe fn k45_finish(acc: __m512, accm: __m256) -> f32 {
    _mm512_reduce_add_ps(acc) - hsum_ps(accm)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_k45<const Q5: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    let bb = if Q5 { 176 } else { 144 };
    let k = k45_consts();
    let (mut acc, mut accm) = (_mm512_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        k45_block::<Q5>(w.add(i * bb), &k45_act(a, i), &k, &mut acc, &mut accm);
    }
    k45_finish(acc, accm)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot4_k45<const Q5: bool>(n: usize, w: *const u8, stride: usize, step: usize, a: *const u8, out: *mut f32) {
    let k = k45_consts();
    let (mut a0, mut a1, mut a2, mut a3) =
        (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut m0, mut m1, mut m2, mut m3) =
        (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..n / 256 {
        let act = k45_act(a, i);
        let x = w.add(i * step);
        k45_block::<Q5>(x, &act, &k, &mut a0, &mut m0);
        k45_block::<Q5>(x.add(stride), &act, &k, &mut a1, &mut m1);
        k45_block::<Q5>(x.add(2 * stride), &act, &k, &mut a2, &mut m2);
        k45_block::<Q5>(x.add(3 * stride), &act, &k, &mut a3, &mut m3);
    }
    *out = k45_finish(a0, m0);
    *out.add(1) = k45_finish(a1, m1);
    *out.add(2) = k45_finish(a2, m2);
    *out.add(3) = k45_finish(a3, m3);
}

/// Four Q4_K rows × one Q8_K row (see [`crate::quant::Dot4Fn`]); each row's
/// result equals [`dot_q4_k`]'s.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q4_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4_k45::<false>(n, w, stride, 144, a, out)
}

/// Four Q5_K rows × one Q8_K row; each row's result equals [`dot_q5_k`]'s.
///
/// # Safety
/// As for [`dot4_q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q5_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4_k45::<true>(n, w, stride, 176, a, out)
}

/// Q4_K × Q8_K (see [`crate::quant::DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k45::<false>(n, w, a)
}

/// Q5_K × Q8_K.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k45::<true>(n, w, a)
}

/// What every row of a Q6_K super-block shares.
struct K6Consts {
    low: __m512i,
    top2: __m512i,
    /// `vpsrlvw` counts: 0 for the low half (quarter 0/2 bits), 2 for the high.
    qh_shift: __m512i,
    /// Scale-word index per (half, pair of quarters): 8 words each of four groups.
    idx: [__m512i; 4],
}

#[inline(always)]
unsafe fn k6_consts() -> K6Consts {
    K6Consts {
        low: _mm512_set1_epi8(0x0F),
        top2: _mm512_set1_epi8(0x30),
        qh_shift: words2(0, 2),
        idx: [words4(0), words4(4), words4(8), words4(12)],
    }
}

/// One row's Q6_K super-block (210 bytes: `ql[128] qh[64] scales[16] d`) at
/// `x` against the Q8_K block at `y`, into `acc`.
///
/// Half `h` (128 values) takes `ql[64h..64h+64]` and `qh[32h..32h+32]`:
/// values `0..64` of it are the low nibbles with qh bits 0–1 (first 32) and
/// 2–3 (next 32), values `64..128` the high nibbles with bits 4–5 and 6–7.
/// The stored values are `q + 32`; the offset comes off once per block
/// through Q8_K's sums (`32 · Σ_g sc_g · bsum_g`).
#[inline(always)]
unsafe fn k6_block(x: *const u8, y: *const u8, yd: __m512, k: &K6Consts, acc: &mut __m512) {
    let d = _mm512_mul_ps(
        yd,
        _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (x.add(208) as *const u16).read_unaligned() as i32
        )))),
    );
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
    let off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, ld256(y.add(Q8K_BSUMS))), 5);
    let mut sumi = _mm512_castsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
    sumi = _mm512_inserti64x4(sumi, _mm256_setzero_si256(), 1);
    let scw = _mm512_castsi256_si512(sc16);
    for h in 0..2 {
        let ql = ld512(x.add(64 * h));
        // Low half: qh as is; high half: qh >> 2. Bits 0-1 then feed values
        // 0..64 (moved up to 4-5), bits 4-5 values 64..128 (already there).
        let qh = _mm512_srlv_epi16(bcast256(x.add(128 + 32 * h)), k.qh_shift);
        let ha = _mm512_and_si512(_mm512_slli_epi16(qh, 4), k.top2);
        // (ql & 0x0F) | ha, and (ql >> 4 & 0x0F) | (qh & 0x30): one ternary op each.
        let qa = _mm512_ternarylogic_epi32(ql, k.low, ha, 0xEA);
        let qb = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), k.low, _mm512_and_si512(qh, k.top2), 0xEA);
        for (j, q) in [qa, qb].into_iter().enumerate() {
            let p = _mm512_maddubs_epi16(q, ld512(y.add(Q8K_QS + 128 * h + 64 * j)));
            sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(k.idx[2 * h + j], scw));
        }
    }
    *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), *acc);
}

/// Q6_K × Q8_K.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q6_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    let k = k6_consts();
    let mut acc = _mm512_setzero_ps();
    for i in 0..n / 256 {
        let y = a.add(i * Q8K_BYTES);
        k6_block(w.add(i * 210), y, _mm512_set1_ps((y as *const f32).read_unaligned()), &k, &mut acc);
    }
    _mm512_reduce_add_ps(acc)
}

/// Four Q6_K rows × one Q8_K row; each row's result equals [`dot_q6_k`]'s.
///
/// # Safety
/// As for [`dot4_q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q6_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4_k6(n, w, stride, 210, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot4_k6(n: usize, w: *const u8, stride: usize, step: usize, a: *const u8, out: *mut f32) {
    let k = k6_consts();
    let (mut a0, mut a1, mut a2, mut a3) =
        (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    for i in 0..n / 256 {
        let y = a.add(i * Q8K_BYTES);
        let yd = _mm512_set1_ps((y as *const f32).read_unaligned());
        let x = w.add(i * step);
        k6_block(x, y, yd, &k, &mut a0);
        k6_block(x.add(stride), y, yd, &k, &mut a1);
        k6_block(x.add(2 * stride), y, yd, &k, &mut a2);
        k6_block(x.add(3 * stride), y, yd, &k, &mut a3);
    }
    *out = _mm512_reduce_add_ps(a0);
    *out.add(1) = _mm512_reduce_add_ps(a1);
    *out.add(2) = _mm512_reduce_add_ps(a2);
    *out.add(3) = _mm512_reduce_add_ps(a3);
}
