//! AVX2 decode kernels of Q4_K and Q5_K in sub-block lanes
//! ([`crate::packed::k45_lanes`]): a row-range kernel (every batch size
//! below the GEMM's) and a four-row one, and the blocks' recoding both ways
//! in vector code (the loader, and the prefill GEMM's way back).
//!
//! Why: the file-layout dot ([`super::avx2_k`]) spends per 32-value vector
//! a `vpshufb` for its sub-block's scale words, a `vpmaddwd` and an add
//! besides the product: about 58 vector µops a Q4_K super-block-row, 10.4
//! ns in L2 on the AMD EPYC (Zen 3) VM, 13.8 GB/s a core, close to each
//! core's share of the memory bandwidth. In the lanes, dword `d` of every
//! code vector is sub-block `d`, so per block:
//! * the eight vectors' `vpmaddubsw` pairs add up in i16 (Q4_K: |Σ| ≤
//!   8·2·15·128 < 2¹⁵; Q5_K's codes reach 31, so two sums of four) and one
//!   `vpmaddwd` against `[sc0, sc0, sc1, sc1, …]` gives the block's lanes;
//! * the scales and the mins come out of their bit string in three µops
//!   each (a `vpshufb`, a `vpmullw`, a `vpsrlw`), where `scales_mins` took
//!   about twenty scalar and five vector ones; one `vpmaddwd` of the mins
//!   against the activation's `bsums` gives the min term;
//! * four blocks' sums reduce together and their float steps run in four
//!   lanes.
//!
//! Q5_K's even code vectors are one mask, the odd ones five µops (their
//! low three bits beside the even vector's code, their top two in a shared
//! 32-byte field), where the file's fifth bits cost three µops a vector more
//! than the nibbles.
//!
//! Numerics: the integer sums are exact and the float step is the scalar
//! reference's (`d_a·d·isum − d_a·dmin·msum` a block, added in block
//! order), so each row equals `quant::q4_k` / `quant::q5_k` of its
//! file-layout row bit for bit (the file-layout AVX2 dot does not: it sums
//! in eight lanes).
//!
//! One row at a time, as the Q3_K planes ([`super::avx2_q3k_rows`]): the
//! recoded rows keep the file's order, and one stream reads faster than
//! four on this class of VM.

use super::avx2_k::ld;
use super::avx2_q3k_recode::{shift, st};
use super::avx2_rows::prefetch;
use super::avx512_lowk::{f16_at, sum1};
use super::avx512_rows16_k::PREFETCH_AHEAD;
use crate::packed::k45_lanes::{bits_to_scales, scales_to_bits};
use std::arch::x86_64::*;

/// Q8_K activation block: `d` (f32), 256 codes, 16 i16 sub-block sums.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// Block bytes and the codes' offset.
const fn geometry(q5: bool) -> (usize, usize) {
    if q5 {
        (176, 48)
    } else {
        (144, 16)
    }
}

/// The 8 × 8 transpose of four-byte groups: dword `d` of `r[k]` becomes
/// dword `k` of the result's vector `d`. Its own inverse.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose_dwords(r: &[__m256i; 8]) -> [__m256i; 8] {
    let z = _mm256_setzero_si256();
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved (dwords 0, 1 / 4, 5
    // and 2, 3 / 6, 7).
    let mut t = [z; 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4h + c]: dword c (low half) and c + 4 (high) of rows 4h..4h + 4.
    let mut u = [z; 8];
    for h in 0..2 {
        let b = 4 * h;
        u[b] = _mm256_unpacklo_epi64(t[b], t[b + 2]);
        u[b + 1] = _mm256_unpackhi_epi64(t[b], t[b + 2]);
        u[b + 2] = _mm256_unpacklo_epi64(t[b + 1], t[b + 3]);
        u[b + 3] = _mm256_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    let mut o = [z; 8];
    for c in 0..4 {
        o[c] = _mm256_permute2x128_si256::<0x20>(u[c], u[4 + c]);
        o[4 + c] = _mm256_permute2x128_si256::<0x31>(u[c], u[4 + c]);
    }
    o
}

/// The file's eight code vectors (vector `j`: sub-block `j`), Q5_K's with
/// their fifth bits.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn file_codes<const Q5: bool>(src: *const u8) -> [__m256i; 8] {
    let qs = geometry(Q5).1;
    let low = _mm256_set1_epi8(0x0F);
    let qh = ld(src.add(16));
    let mut n = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let q = ld(src.add(qs + 32 * c));
        n[2 * c] = _mm256_and_si256(q, low);
        n[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
    }
    if Q5 {
        for (j, nj) in n.iter_mut().enumerate() {
            *nj = _mm256_or_si256(*nj, _mm256_and_si256(shift(qh, 4 - j as i32), _mm256_set1_epi8(0x10)));
        }
    }
    n
}

/// [`file_codes`]' inverse into `dst`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn put_file_codes<const Q5: bool>(n: &[__m256i; 8], dst: *mut u8) {
    let qs = geometry(Q5).1;
    let low = _mm256_set1_epi8(0x0F);
    for c in 0..4 {
        let hi = _mm256_slli_epi16::<4>(_mm256_and_si256(n[2 * c + 1], low));
        st(dst.add(qs + 32 * c), _mm256_or_si256(_mm256_and_si256(n[2 * c], low), hi));
    }
    if Q5 {
        let mut qh = _mm256_setzero_si256();
        for (j, &nj) in n.iter().enumerate() {
            qh = _mm256_or_si256(qh, shift(_mm256_and_si256(nj, _mm256_set1_epi8(0x10)), j as i32 - 4));
        }
        st(dst.add(16), qh);
    }
}

/// Chunk `c`'s two code vectors of a recoded block at `x` (`top`: a Q5_K
/// block's top bits, at 16).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lane_pair<const Q5: bool>(x: *const u8, top: __m256i, c: usize) -> (__m256i, __m256i) {
    let qs = geometry(Q5).1;
    let q = ld(x.add(qs + 32 * c));
    if Q5 {
        let lo = _mm256_and_si256(q, _mm256_set1_epi8(0x1F));
        let hi3 = _mm256_and_si256(_mm256_srli_epi16::<5>(q), _mm256_set1_epi8(0x07));
        let hi2 = _mm256_and_si256(shift(top, 3 - 2 * c as i32), _mm256_set1_epi8(0x18));
        (lo, _mm256_or_si256(hi3, hi2))
    } else {
        let low = _mm256_set1_epi8(0x0F);
        (_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16::<4>(q), low))
    }
}

/// [`lane_pair`]'s vectors `2c` and `2c + 1` packed into `dst`'s chunk `c`;
/// returns the Q5_K top bits of vector `2c + 1` at their place.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn put_lane_pair<const Q5: bool>(lo: __m256i, hi: __m256i, dst: *mut u8, c: usize) -> __m256i {
    let qs = geometry(Q5).1;
    if Q5 {
        let hi3 = _mm256_slli_epi16::<5>(_mm256_and_si256(hi, _mm256_set1_epi8(0x07)));
        st(dst.add(qs + 32 * c), _mm256_or_si256(lo, hi3));
        shift(_mm256_and_si256(hi, _mm256_set1_epi8(0x18)), 2 * c as i32 - 3)
    } else {
        st(dst.add(qs + 32 * c), _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hi)));
        _mm256_setzero_si256()
    }
}

/// The recoding of one block into `dst` (`ENCODE`), or back.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn recode<const Q5: bool, const ENCODE: bool>(src: *const u8, dst: *mut u8) {
    std::ptr::copy_nonoverlapping(src, dst, 4);
    let sc = &*(src.add(4) as *const [u8; 12]);
    let sc = if ENCODE { scales_to_bits(sc) } else { bits_to_scales(sc) };
    std::ptr::copy_nonoverlapping(sc.as_ptr(), dst.add(4), 12);
    if ENCODE {
        let t = transpose_dwords(&file_codes::<Q5>(src));
        let mut top = _mm256_setzero_si256();
        for c in 0..4 {
            top = _mm256_or_si256(top, put_lane_pair::<Q5>(t[2 * c], t[2 * c + 1], dst, c));
        }
        if Q5 {
            st(dst.add(16), top);
        }
    } else {
        let top = ld(src.add(16));
        let mut v = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            (v[2 * c], v[2 * c + 1]) = lane_pair::<Q5>(src, top, c);
        }
        put_file_codes::<Q5>(&transpose_dwords(&v), dst);
    }
}

/// [`crate::packed::k45_lanes::encode_q4k`] of one block.
///
/// # Safety
/// AVX2; `src`, `dst`: 144 bytes each.
#[target_feature(enable = "avx2")]
pub unsafe fn encode_q4k(src: *const u8, dst: *mut u8) {
    recode::<false, true>(src, dst)
}

/// [`crate::packed::k45_lanes::decode_q4k`] of one block.
///
/// # Safety
/// As for [`encode_q4k`].
#[target_feature(enable = "avx2")]
pub unsafe fn decode_q4k(src: *const u8, dst: *mut u8) {
    recode::<false, false>(src, dst)
}

/// [`crate::packed::k45_lanes::encode_q5k`] of one block.
///
/// # Safety
/// AVX2; `src`, `dst`: 176 bytes each.
#[target_feature(enable = "avx2")]
pub unsafe fn encode_q5k(src: *const u8, dst: *mut u8) {
    recode::<true, true>(src, dst)
}

/// [`crate::packed::k45_lanes::decode_q5k`] of one block.
///
/// # Safety
/// As for [`encode_q5k`].
#[target_feature(enable = "avx2")]
pub unsafe fn decode_q5k(src: *const u8, dst: *mut u8) {
    recode::<true, false>(src, dst)
}

/// `vpshufb` control and `vpmullw` factors that lay six-bit code `first +
/// w / 2` of the bit string over word `w` at its top: its 16-bit window is
/// bytes `2 + 6c / 8`, `3 + 6c / 8` of the 16 loaded from the block's byte 2
/// (the string starts at 4), at bit `6c % 8`.
#[repr(C, align(32))]
struct Codes {
    ctrl: [u8; 32],
    mul: [u16; 16],
}

const fn codes(first: usize) -> Codes {
    let (mut ctrl, mut mul) = ([0u8; 32], [0u16; 16]);
    let mut w = 0;
    while w < 16 {
        let c = first + w / 2;
        ctrl[2 * w] = (2 + 6 * c / 8) as u8;
        ctrl[2 * w + 1] = (3 + 6 * c / 8) as u8;
        mul[w] = 1 << (10 - 6 * c % 8);
        w += 1;
    }
    Codes { ctrl, mul }
}

static SCALES: Codes = codes(0);
static MINS: Codes = codes(8);

/// Words `[c0, c0, c1, c1, …, c7, c7]` of the eight codes `t` describes, from
/// the block's bytes `b` (loaded from its byte 2 into both halves).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn code_words(b: __m256i, t: &Codes) -> __m256i {
    let w = _mm256_shuffle_epi8(b, _mm256_load_si256(t.ctrl.as_ptr() as *const __m256i));
    _mm256_srli_epi16::<10>(_mm256_mullo_epi16(w, _mm256_load_si256(t.mul.as_ptr() as *const __m256i)))
}

/// One Q8_K activation block in the lanes' order.
#[derive(Clone, Copy)]
#[repr(C)]
struct Acts {
    /// Vector `k`, byte `l`: value `4k + l % 4` of sub-block `l / 4`.
    q: [__m256i; 8],
    /// The 16 sums of 16 values (word `w`: sub-block `w / 2`).
    bsums: __m256i,
}

thread_local! {
    /// One activation row's blocks in the lanes' order and their scales
    /// (reused across calls).
    static ACTS: std::cell::RefCell<(Vec<Acts>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `acts`, `yd` filled with the `nb` blocks of each of the `m` Q8_K rows
/// at `a`, `a_stride` bytes apart.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn fill(acts: &mut Vec<Acts>, yd: &mut Vec<f32>, a: *const u8, a_stride: usize, m: usize, nb: usize) {
    acts.clear();
    yd.clear();
    for i in 0..m * nb {
        let y = a.add(i / nb * a_stride + i % nb * Q8K_BYTES);
        let mut v = [_mm256_setzero_si256(); 8];
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = ld(y.add(Q8K_QS + 32 * j));
        }
        acts.push(Acts { q: transpose_dwords(&v), bsums: ld(y.add(Q8K_BSUMS)) });
        yd.push((y as *const f32).read_unaligned());
    }
}

/// One weight block's codes and scale words, decoded once for every
/// activation row it meets.
#[derive(Clone, Copy)]
struct Block {
    q: [__m256i; 8],
    /// `[sc0, sc0, sc1, sc1, …]` and the mins the same way.
    sc: __m256i,
    mn: __m256i,
}

/// The recoded block at `x`, decoded.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_block<const Q5: bool>(x: *const u8) -> Block {
    let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(x.add(2) as *const __m128i));
    let top = if Q5 { ld(x.add(16)) } else { _mm256_setzero_si256() };
    let mut q = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        (q[2 * c], q[2 * c + 1]) = lane_pair::<Q5>(x, top, c);
    }
    Block { q, sc: code_words(b, &SCALES), mn: code_words(b, &MINS) }
}

/// Block `w` against `t`: `(Σ_j sc_j·Σ q·y, Σ_j m_j·bsum_j)`, each spread
/// over 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_sums<const Q5: bool>(w: &Block, t: &Acts) -> (__m256i, __m256i) {
    let mut p = [_mm256_setzero_si256(); 2];
    for k in 0..8 {
        // Q5_K: vectors 0..4 and 4..8 in separate sums (codes up to 31).
        let s = if Q5 { k / 4 } else { 0 };
        p[s] = _mm256_add_epi16(p[s], _mm256_maddubs_epi16(w.q[k], t.q[k]));
    }
    let isum = if Q5 {
        _mm256_add_epi32(_mm256_madd_epi16(p[0], w.sc), _mm256_madd_epi16(p[1], w.sc))
    } else {
        _mm256_madd_epi16(p[0], w.sc)
    };
    (isum, _mm256_madd_epi16(w.mn, t.bsums))
}

/// `[d0, d1, d2, d3 | dmin0, …, dmin3]` of the four blocks from `x`, `bb`
/// bytes apart.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn scales4(x: *const u8, bb: usize) -> __m256 {
    let dd = _mm_setr_epi32(
        (x as *const i32).read_unaligned(),
        (x.add(bb) as *const i32).read_unaligned(),
        (x.add(2 * bb) as *const i32).read_unaligned(),
        (x.add(3 * bb) as *const i32).read_unaligned(),
    );
    _mm256_permutevar8x32_ps(_mm256_cvtph_ps(dd), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7))
}

/// Four blocks' `(isum, msum)` lanes against four activation blocks, and
/// their float steps added to `sum` in block order (the scalar reference's
/// `d_a·d·isum − d_a·dmin·msum`, so bit for bit).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step4<const Q5: bool>(w: &[Block; 4], d: __m256, t: &[Acts], yd: &[f32], sum: &mut f32) {
    let (mut is, mut ms) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
    for b in 0..4 {
        (is[b], ms[b]) = block_sums::<Q5>(&w[b], &t[b]);
    }
    let u = sum8(is, ms);
    let y4 = _mm_loadu_ps(yd.as_ptr());
    let t = _mm256_mul_ps(_mm256_mul_ps(_mm256_set_m128(y4, y4), d), _mm256_cvtepi32_ps(u));
    let mut v = [0f32; 4];
    _mm_storeu_ps(v.as_mut_ptr(), _mm_sub_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t)));
    for vb in v {
        *sum += vb;
    }
}

/// One block's float step (the tail below four blocks).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step1<const Q5: bool>(x: *const u8, w: &Block, t: &Acts, yd: f32, sum: &mut f32) {
    let (isum, msum) = block_sums::<Q5>(w, t);
    *sum += yd * f16_at(x) * sum1(isum) as f32 - yd * f16_at(x.add(2)) * sum1(msum) as f32;
}

/// `[Σa0, Σa1, Σa2, Σa3 | Σm0, Σm1, Σm2, Σm3]` of eight 8-lane vectors.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum8(a: [__m256i; 4], m: [__m256i; 4]) -> __m256i {
    let ga = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
    let gm = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(ga, gm), _mm256_permute2x128_si256::<0x31>(ga, gm))
}

/// One row at `x0` against the activation row `acts` (scales `yd`): four
/// blocks' sums reduce together and their float steps run in four lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn one_row<const Q5: bool>(x0: *const u8, acts: &[Acts], yd: &[f32]) -> f32 {
    let bb = geometry(Q5).0;
    let mut sum = 0f32;
    let nb = acts.len();
    let mut i = 0;
    while i + 4 <= nb {
        let x = x0.add(i * bb);
        for l in 0..(4 * bb).div_ceil(64) {
            prefetch(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let mut w = [decode_block::<Q5>(x); 4];
        for (b, wb) in w.iter_mut().enumerate().skip(1) {
            *wb = decode_block::<Q5>(x.add(b * bb));
        }
        step4::<Q5>(&w, scales4(x, bb), &acts[i..i + 4], &yd[i..i + 4], &mut sum);
        i += 4;
    }
    for b in i..nb {
        let x = x0.add(b * bb);
        for l in 0..bb.div_ceil(64) {
            prefetch(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        step1::<Q5>(x, &decode_block::<Q5>(x), &acts[b], yd[b], &mut sum);
    }
    sum
}

/// Rows handled together by [`tile`] (each activation block stays in L1
/// while it meets them all).
const TILE_ROWS: usize = 4;
/// Activation rows [`tile`] keeps sums for.
const TILE_ACTS: usize = 16;

/// Up to [`TILE_ROWS`] rows from `x0` (`row_bytes` apart) against `m ≤`
/// [`TILE_ACTS`] activation rows (`acts`, `yd`: `nb` blocks each): four
/// blocks of a row are decoded once for every activation row, the rows
/// take turns a block group at a time so each group's activation blocks
/// serve them all from L1, and every (row, activation) sum still adds its
/// blocks' float steps in block order. `sums[r·m + j]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const Q5: bool>(
    x0: *const u8,
    row_bytes: usize,
    rows: usize,
    acts: &[Acts],
    yd: &[f32],
    m: usize,
    nb: usize,
    sums: &mut [f32; TILE_ROWS * TILE_ACTS],
) {
    let bb = geometry(Q5).0;
    sums.fill(0.0);
    let mut i = 0;
    while i + 4 <= nb {
        for r in 0..rows {
            let x = x0.add(r * row_bytes + i * bb);
            for l in 0..(4 * bb).div_ceil(64) {
                prefetch(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
            }
            let mut w = [decode_block::<Q5>(x); 4];
            for (b, wb) in w.iter_mut().enumerate().skip(1) {
                *wb = decode_block::<Q5>(x.add(b * bb));
            }
            let d = scales4(x, bb);
            for j in 0..m {
                let at = j * nb + i;
                step4::<Q5>(&w, d, &acts[at..at + 4], &yd[at..at + 4], &mut sums[r * m + j]);
            }
        }
        i += 4;
    }
    for b in i..nb {
        for r in 0..rows {
            let x = x0.add(r * row_bytes + b * bb);
            let w = decode_block::<Q5>(x);
            for j in 0..m {
                step1::<Q5>(x, &w, &acts[j * nb + b], yd[j * nb + b], &mut sums[r * m + j]);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const Q5: bool>(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    // Taken out of its cell for the call: no closure around kernel code (a
    // closure does not get this function's target features).
    let (mut acts, mut yd) = ACTS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let nb = n / 256;
    fill(&mut acts, &mut yd, a, a_stride, m, nb);
    if m == 1 {
        for r in 0..rows {
            *y.add(r) = one_row::<Q5>(w.add(r * row_bytes), &acts, &yd);
        }
    } else {
        // Batches: tiles of rows × activation rows (each block decoded once
        // per tile, its weights read from memory once per call).
        let mut sums = [0f32; TILE_ROWS * TILE_ACTS];
        for j0 in (0..m).step_by(TILE_ACTS) {
            let mj = (m - j0).min(TILE_ACTS);
            let (ta, ty) = (&acts[j0 * nb..(j0 + mj) * nb], &yd[j0 * nb..(j0 + mj) * nb]);
            for r0 in (0..rows).step_by(TILE_ROWS) {
                let rt = (rows - r0).min(TILE_ROWS);
                tile::<Q5>(w.add(r0 * row_bytes), row_bytes, rt, ta, ty, mj, nb, &mut sums);
                for r in 0..rt {
                    for j in 0..mj {
                        *y.add((j0 + j) * y_stride + r0 + r) = sums[r * mj + j];
                    }
                }
            }
        }
    }
    ACTS.with(|c| *c.borrow_mut() = (acts, yd));
}

/// `rows` Q4_K rows in sub-block lanes, `row_bytes` apart, × `m` Q8_K
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::q4_k`'s dot of the file-layout row.
///
/// # Safety
/// AVX2/FMA/F16C CPU; `w` holds `rows` recoded rows of `n / 256` blocks;
/// `a` holds `m` Q8_K rows `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_q4_k(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    self::rows::<false>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// The same for Q5_K.
///
/// # Safety
/// As for [`rows_q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_q5_k(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    self::rows::<true>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// Four Q4_K rows in sub-block lanes, `stride` bytes apart (see
/// [`crate::quant::Dot4Fn`]); each equals the scalar dot of its file-layout
/// row bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; AVX2/FMA/F16C CPU.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    self::rows::<false>(n, w, stride, 4, a, 0, 1, out, 0)
}

/// The same for Q5_K.
///
/// # Safety
/// As for [`dot4_q4_k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q5_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    self::rows::<true>(n, w, stride, 4, a, 0, 1, out, 0)
}

#[cfg(test)]
mod tests {
    use crate::packed::k45_lanes;
    use crate::quant::{self, q8_k};
    use crate::DType;

    /// A recoding's byte-loop way.
    type ByteWay = fn(&[u8], &mut [u8]);

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    /// Both ways equal the byte loops on random blocks.
    #[test]
    fn vector_recoding_equals_scalar() {
        if !avx2() {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        type Way = unsafe fn(*const u8, *mut u8);
        let ways: [(usize, ByteWay, Way, Way); 2] = [
            (144, k45_lanes::encode_q4k, super::encode_q4k, super::decode_q4k),
            (176, k45_lanes::encode_q5k, super::encode_q5k, super::decode_q5k),
        ];
        let mut rng = super::super::XorShift(0x1357_9BDF_2468_ACE0);
        for (bb, scalar_encode, encode, decode) in ways {
            for _ in 0..100 {
                let src: Vec<u8> = (0..bb).map(|_| rng.next() as u8).collect();
                let (mut want, mut got, mut back) = (vec![0u8; bb], vec![0u8; bb], vec![0u8; bb]);
                scalar_encode(&src, &mut want);
                unsafe { encode(src.as_ptr(), got.as_mut_ptr()) };
                assert_eq!(got, want, "{bb}-byte encode");
                unsafe { decode(want.as_ptr(), back.as_mut_ptr()) };
                assert_eq!(back, src, "{bb}-byte decode");
            }
        }
    }

    /// The lanes kernels (four-row and row-range, one and three activation
    /// rows, a range not a multiple of four rows, block counts with and
    /// without a tail of four) equal the scalar dot of the file-layout rows
    /// bit for bit.
    #[test]
    fn lanes_kernels_equal_scalar() {
        if !avx2() {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        type Dot4 = unsafe fn(usize, *const u8, usize, *const u8, *mut f32);
        let kinds: [(DType, ByteWay, Dot4, crate::quant::Rows16Fn); 2] = [
            (DType::Q4_K, k45_lanes::encode_q4k, super::dot4_q4_k, super::rows_q4_k),
            (DType::Q5_K, k45_lanes::encode_q5k, super::dot4_q5_k, super::rows_q5_k),
        ];
        let mut rng = super::super::XorShift(0xC0FF_EE00_1234_5678);
        for (dtype, encode, dot4, rows_fn) in kinds {
            let bb = dtype.block_bytes();
            let scalar = quant::scalar::dot_fn(dtype);
            let rows = 7;
            for nb in [1usize, 3, 4, 9] {
                let (n, rb) = (256 * nb, bb * nb);
                let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
                for blk in w.chunks_exact_mut(bb) {
                    // Finite d, dmin: f16 0.0–1.0.
                    blk[0..2].copy_from_slice(&((rng.next() % 0x3C00) as u16).to_le_bytes());
                    blk[2..4].copy_from_slice(&((rng.next() % 0x3C00) as u16).to_le_bytes());
                }
                let mut pw = vec![0u8; w.len()];
                for (s, d) in w.chunks_exact(bb).zip(pw.chunks_exact_mut(bb)) {
                    encode(s, d);
                }
                // Three activation rows: one tile; seventeen: two.
                let m = if nb == 3 { 17 } else { 3 };
                let x: Vec<f32> = (0..m * n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); m * nb];
                q8_k::quantize(&x, &mut a);
                let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
                let want = |r: usize, j: usize| unsafe { scalar(n, w[r * rb..].as_ptr(), ap.add(j * 292 * nb)) };
                let mut got = [0f32; 4];
                unsafe { dot4(n, pw.as_ptr(), rb, ap, got.as_mut_ptr()) };
                for (r, g) in got.iter().enumerate() {
                    assert_eq!(g.to_bits(), want(r, 0).to_bits(), "{dtype} dot4 row {r}, {nb} blocks");
                }
                let mut y = vec![0f32; m * rows];
                unsafe { rows_fn(n, pw.as_ptr(), rb, rows, ap, 292 * nb, m, y.as_mut_ptr(), rows) };
                for j in 0..m {
                    for r in 0..rows {
                        let g = y[j * rows + r];
                        assert_eq!(g.to_bits(), want(r, j).to_bits(), "{dtype} rows: row {r}, act {j}, {nb} blocks");
                    }
                }
            }
        }
    }
}
