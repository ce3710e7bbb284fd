//! AVX2 sixteen-row kernel of IQ4_NL in the transposed layout of
//! [`crate::packed::lanes16`] (each block stored codes first, its `d` last):
//! the 256-bit sibling of [`super::avx512_rows16_nl`] for CPUs without
//! AVX-512. Lane `ℓ` of the low vector is weight row `ℓ`, of the high one
//! row `8 + ℓ`: one kernel for every batch size, no horizontal sums, no
//! shuffles of the weights.
//!
//! Why: the one-row AVX2 kernel ([`super::avx2_lowk::dot_iq4_nl`]) pays,
//! per 32-value block, for joining two nibble halves into one vector, a
//! horizontal reduction and a float step of its own: ~12 µops per 32
//! products. It read 8.9 GB/s of weights a core from memory where the
//! K-quants' kernels read 12, and IQ4_NL decode stood at 1.19× llama.cpp's
//! AVX2 build and 52% of the bandwidth. Here a vector of codes holds four
//! bytes of eight rows, so every `vpshufb` and product works on 64 of the
//! block's values, and the float step is one per eight rows and block.
//!
//! Per block of sixteen rows (288 bytes), half `h` (rows `8h..8h + 8`) and
//! activation row:
//! * vector `v` (0..4) holds codes `4v..4v+4` of each row; its low nibbles
//!   are values `4v..4v+4`, its high nibbles values `16+4v..`;
//! * without VNNI the product is `vpmaddubsw`, unsigned × signed into i16
//!   pairs. `K[q] + 128` (as the AVX-512 kernel uses) would saturate them
//!   (2·255·127 > 2¹⁵), so each nibble looks up `|K[q]|` and `K[q]` (two
//!   `vpshufb`) and the four activation bytes broadcast from memory take the
//!   weight's sign (`vpsignb`; no `K` is 0): pairs ≤ 2·127·127 < 2¹⁵;
//! * `vpmaddwd` against ones widens each row's four products into its lane.
//!
//! Batches above [`ACTS`] rows decode a group's blocks once (the looked-up
//! magnitudes and signed values, 1 KiB a block) into a thread-local scratch
//! that tiles of [`HALF_ACTS`] activation rows then read, one half of the
//! rows at a time (four rows' sums fit the registers that way).
//!
//! Numerics: the integer sums are exact and the float step is the scalar
//! reference's (`quant::iq4_nl::vec_dot`: `sum + (d_a·d)·isum`, no FMA,
//! blocks in order), so every row equals the reference bit for bit at every
//! batch size.

use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Rows per group (the lanes of two vectors).
const ROWS: usize = 16;
/// Activation rows per register tile (both halves' sums stay in registers).
const ACTS: usize = 2;
/// Activation rows per tile of one half over decoded blocks (larger batches).
const HALF_ACTS: usize = 4;
/// One block of sixteen rows: four code vectors, then sixteen f16 `d`.
const BLOCK: usize = ROWS * 18;
/// Q8_0 activation block: an f16 `d`, then 32 codes.
const ACT_BYTES: usize = 34;

/// `|K[q]|` for each IQ4_NL nibble `q`.
static ABS: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut q = 0;
    while q < 16 {
        t[q] = crate::quant::iq4_nl::KVALUES[q].unsigned_abs();
        q += 1;
    }
    t
};

/// `K[q]` (only its sign is used).
static SIGNED: [i8; 16] = crate::quant::iq4_nl::KVALUES;

thread_local! {
    /// The current group's blocks, decoded once (batches above [`ACTS`]).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of sixteen rows, decoded: per half `h`, `abs[h][v]` /
/// `sgn[h][v]` the looked-up `|K[q]|` / `K[q]` of values `4v..4v+4` (v < 4)
/// and `16+4(v−4)..` (v ≥ 4), `d[h]` the half's scales.
#[derive(Clone, Copy)]
struct Block {
    abs: [[__m256i; 8]; 2],
    sgn: [[__m256i; 8]; 2],
    d: [__m256; 2],
}

/// Block `b` of the group at `w`, decoded (its stream prefetched ahead).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode(w: *const u8, b: usize) -> Block {
    let x = w.add(b * BLOCK);
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    for l in 0..BLOCK.div_ceil(64) {
        prefetch_l2(ahead.wrapping_add(64 * l));
    }
    let low4 = _mm256_set1_epi8(0x0F);
    let abs_t = _mm256_broadcastsi128_si256(_mm_loadu_si128(ABS.as_ptr() as *const __m128i));
    let sgn_t = _mm256_broadcastsi128_si256(_mm_loadu_si128(SIGNED.as_ptr() as *const __m128i));
    let half = |h: usize| -> ([__m256i; 8], [__m256i; 8]) {
        let q: [__m256i; 4] = std::array::from_fn(|v| _mm256_loadu_si256(x.add(64 * v + 32 * h) as *const __m256i));
        let nib: [__m256i; 8] = std::array::from_fn(|v| {
            if v < 4 {
                _mm256_and_si256(q[v], low4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(q[v - 4]), low4)
            }
        });
        (nib.map(|n| _mm256_shuffle_epi8(abs_t, n)), nib.map(|n| _mm256_shuffle_epi8(sgn_t, n)))
    };
    let (a0, s0) = half(0);
    let (a1, s1) = half(1);
    let d = |h: usize| _mm256_cvtph_ps(_mm_loadu_si128(x.add(4 * 64 + 16 * h) as *const __m128i));
    Block { abs: [a0, a1], sgn: [s0, s1], d: [d(0), d(1)] }
}

/// `rows` (a multiple of 16) IQ4_NL rows in the lanes16 layout × `m` Q8_0
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::iq4_nl::vec_dot`.
///
/// # Safety
/// AVX2/FMA/F16C CPU; `w` holds `rows / 16` lanes16 groups of `row_bytes`
/// per row (`n` a multiple of 32); `a` holds `m` Q8_0 rows of `n` values
/// `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_iq4_nl(
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
    debug_assert!(rows.is_multiple_of(ROWS) && n.is_multiple_of(32));
    let nb = n / 32;
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        let yg = y.add(g * ROWS);
        if m <= ACTS {
            let blocks = |b: usize| decode(gw, b);
            run_tile(m, nb, &blocks, a, a_stride, yg, y_stride);
            continue;
        }
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            scratch.clear();
            scratch.extend((0..nb).map(|b| decode(gw, b)));
            for h in 0..2 {
                let mut j = 0;
                while j < m {
                    let take = (m - j).min(HALF_ACTS);
                    let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride + 8 * h));
                    match take {
                        1 => tile_half::<1>(h, &scratch, aj, a_stride, yj, y_stride),
                        2 => tile_half::<2>(h, &scratch, aj, a_stride, yj, y_stride),
                        3 => tile_half::<3>(h, &scratch, aj, a_stride, yj, y_stride),
                        _ => tile_half::<HALF_ACTS>(h, &scratch, aj, a_stride, yj, y_stride),
                    }
                    j += take;
                }
            }
        });
    }
}

/// [`tile`] for `m` (1..=[`ACTS`]) activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn run_tile(
    m: usize,
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    match m {
        1 => tile::<1>(nb, blocks, a, a_stride, y, y_stride),
        _ => tile::<ACTS>(nb, blocks, a, a_stride, y, y_stride),
    }
}

#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// One group of sixteen rows × `J` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile<const J: usize>(
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let ones = _mm256_set1_epi16(1);
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        let blk = blocks(b);
        let mut acc = [[_mm256_setzero_si256(); 2]; J];
        for v in 0..8 {
            // Values 4v.. (v < 4) or 16 + 4(v − 4).. (v ≥ 4) of the block.
            let at = if v < 4 { 4 * v } else { 16 + 4 * (v - 4) };
            for j in 0..J {
                let yq = bcast4(a.add(j * a_stride + b * ACT_BYTES + 2 + at));
                for h in 0..2 {
                    let p = _mm256_maddubs_epi16(blk.abs[h][v], _mm256_sign_epi8(yq, blk.sgn[h][v]));
                    acc[j][h] = _mm256_add_epi32(acc[j][h], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for j in 0..J {
            let da = act_d(a.add(j * a_stride + b * ACT_BYTES));
            for h in 0..2 {
                let t = _mm256_mul_ps(_mm256_mul_ps(blk.d[h], da), _mm256_cvtepi32_ps(acc[j][h]));
                sums[j][h] = _mm256_add_ps(sums[j][h], t);
            }
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}

/// Rows `8h..8h + 8` of a group × `J` activation rows over its decoded
/// blocks (the same arithmetic as [`tile`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_half<const J: usize>(
    h: usize,
    blocks: &[Block],
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let ones = _mm256_set1_epi16(1);
    let mut sums = [_mm256_setzero_ps(); J];
    for (b, blk) in blocks.iter().enumerate() {
        let mut acc = [_mm256_setzero_si256(); J];
        for v in 0..8 {
            let at = if v < 4 { 4 * v } else { 16 + 4 * (v - 4) };
            let (abs, sgn) = (blk.abs[h][v], blk.sgn[h][v]);
            for (j, acc_j) in acc.iter_mut().enumerate() {
                let yq = bcast4(a.add(j * a_stride + b * ACT_BYTES + 2 + at));
                let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(yq, sgn));
                *acc_j = _mm256_add_epi32(*acc_j, _mm256_madd_epi16(p, ones));
            }
        }
        for (j, sum) in sums.iter_mut().enumerate() {
            let t = _mm256_mul_ps(
                _mm256_mul_ps(blk.d[h], act_d(a.add(j * a_stride + b * ACT_BYTES))),
                _mm256_cvtepi32_ps(acc[j]),
            );
            *sum = _mm256_add_ps(*sum, t);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), *s);
    }
}

/// The f16 `d` of the Q8_0 activation block at `yb`, in every lane.
#[inline(always)]
unsafe fn act_d(yb: *const u8) -> __m256 {
    _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((yb as *const u16).read_unaligned() as i32))))
}
