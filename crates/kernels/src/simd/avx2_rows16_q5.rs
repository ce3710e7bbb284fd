//! AVX2 sixteen-row kernels of Q5_0, Q5_1 and Q4_1 in the transposed layout
//! of [`crate::packed::lanes16`] (the Q5 types with their fifth bits
//! bit-sliced): lane `ℓ` of the low vector is weight row `ℓ`, of the high
//! one row `8 + ℓ`, as in [`super::avx2_rows16_nl`] (IQ4_NL), one kernel for
//! every batch size.
//!
//! Why: Q5_0 is what llama-quantize falls back to where a width is not a
//! multiple of 256 (SmolLM2's 576, Qwen2.5-0.5B's 896), so most of such a
//! "Q4_K_M" file is Q5_0. Its one-row AVX2 kernel builds the fifth bits of
//! every block from `qh` with a 32-bit mask expansion, reduces a vector
//! horizontally and runs a float step per block and row: SmolLM2 "Q4_K_M"
//! decoded at 51% of the bandwidth ceiling, and a batch ran that kernel once
//! per activation row, so `serve`'s batches did not scale (20.6 / 21.2 /
//! 21.0 tok/s at m = 1 / 4 / 8 on the 1.1B shapes). Q5_1 had nothing but
//! the one-row kernel at AVX2, prefill included.
//!
//! Q4_1 (the default model's type) is a Q5_1 without the fifth bits. At
//! AVX2 it ran a four-row kernel over the head/quants layout for decode and
//! its 4 × 2 tile for every batch: 1.1B batches of 256 at 42 tok/s against
//! Q4_0's GEMM at 105, and no GEMM could join them, for the tile sums in
//! its own float order and the serving tests hold the default model's
//! prefill batch-invariant. Here every batch size is one kernel that equals
//! the scalar reference.
//!
//! Layout of one block of sixteen rows (`head_last` moves the scales after
//! the codes, so every field is a whole word):
//! * Q5 only, vector 0 (64 bytes): each row's `qh`, bit-sliced
//!   ([`crate::packed::lanes16::slice_qh`]): byte `k` holds, at bit `i`, the
//!   fifth bit of value `4i + k`;
//! * the next four vectors: codes `4v..4v+4` of the sixteen rows (low
//!   nibbles values `4v + k`, high nibbles `16 + 4v + k`), as IQ4_NL;
//! * the tail: Q5_0 the sixteen f16 `d`; Q5_1 sixteen `(d, m)` words; Q4_1
//!   the sixteen `d`, then the sixteen `m` (`split_head`: two `vcvtph2ps`
//!   from memory a half, where the words take six shuffles and conversions).
//!
//! With the bits sliced so, the fifth bit of every byte of code vector `v`
//! is one 16-bit shift of the row's `qh` word and a mask: `(qh << (4 − v))
//! & 0x10` for the low nibbles, `(qh >> v) & 0x10` for the high ones (a
//! shift's spill into the neighbouring byte is masked off). In file order
//! each byte would need its own bit: a compare per vector.
//!
//! Products: the 5-bit codes are unsigned (0..31), so `vpmaddubsw` takes
//! them against the signed activations directly (pairs ≤ 2·31·128), four
//! code vectors' pairs (Q4_1's 4-bit ones: all eight, 8·2·15·128 = 30720)
//! add up in i16 (< 2¹⁵) and one `vpmaddwd` with ones
//! widens them into each row's lane (1.33× at m = 8 against widening every
//! vector); with AVX-VNNI one `vpdpbusd` a vector. Q5_0's `−16` comes out
//! once per block and activation row as `16·Σy` (exact).
//!
//! Batches above `ACTS` rows decode a group's blocks once into a thread-local
//! scratch (1 KiB a block) that tiles of `TILE_ACTS` activation rows read.
//! That serves prefill too: at m = 64 and 256 it ran 1.15× and 1.12× the
//! exact AVX2 GEMM ([`super::avx2_gemm_32`]) on the file layout, which on a
//! packed weight would first read the rows back (0.6× there).
//!
//! Numerics: the integer sums are exact and the float steps are the scalar
//! references' (`quant::q5_0::vec_dot`: `sum + isum·(d·d_a)`;
//! `quant::q5_1::vec_dot` and `quant::q4_1::vec_dot`:
//! `sum + (isum·(d·d_a) + m·s_a)`; no FMA, blocks in order), so every row
//! equals the reference bit for bit at every batch size.

use super::avx2_rows16_k::bcast4;
use super::avx2_rows16_nl::{code_sum, store_sums};
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Rows per group (the lanes of two vectors).
const ROWS: usize = 16;
/// Activation rows per streaming tile (both halves' sums in registers).
const ACTS: usize = 2;
/// Activation rows per tile over decoded blocks (larger batches).
const TILE_ACTS: usize = 4;
/// The types of these kernels (their const parameter `K`; the AVX-512
/// kernels of [`super::avx512_rows16_q5`] take the same).
pub(super) const Q5_0: u8 = 0;
pub(super) const Q5_1: u8 = 1;
pub(super) const Q4_1: u8 = 2;

/// Whether type `k` has fifth bits (a sliced `qh` vector first).
pub(super) const fn has_qh(k: u8) -> bool {
    k != Q4_1
}

/// Whether type `k` has a min `m` per block (its Q8_1 activations carry `s`).
pub(super) const fn has_min(k: u8) -> bool {
    k != Q5_0
}

/// Where the codes start in a group's block (after the sliced `qh`).
pub(super) const fn codes_start(k: u8) -> usize {
    if has_qh(k) {
        64
    } else {
        0
    }
}

/// Where the scales start (after the four code vectors).
pub(super) const fn scales_start(k: u8) -> usize {
    codes_start(k) + 4 * 64
}

/// Code vectors whose `vpmaddubsw` pairs add up in i16 before a `vpmaddwd`.
const fn i16_steps(k: u8) -> usize {
    if has_qh(k) {
        4
    } else {
        8
    }
}

/// One group's block bytes: Q5_0 22 a row, Q5_1 24, Q4_1 20.
pub(super) const fn block_bytes(k: u8) -> usize {
    ROWS * match k {
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 20,
    }
}

/// An activation block (Q8_0: `d`, 32 codes; Q8_1: `d`, `s`, 32 codes) and
/// where its codes start.
pub(super) const fn act_geometry(k: u8) -> (usize, usize) {
    if has_min(k) {
        (36, 4)
    } else {
        (34, 2)
    }
}

thread_local! {
    /// The current group's blocks, decoded once (batches above `ACTS`).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per activation block of the call (`m × nb`): `d` as f32, then Q5_0's
    /// `16·Σy` or Q5_1's `s` as f32 bits.
    static ACT: std::cell::RefCell<(Vec<f32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// One block of sixteen rows, decoded: per half `h`, `q[h][v]` the 5-bit
/// (Q4_1: 4-bit) codes of values `4v..4v+4` (v < 4) and `16+4(v−4)..` (v ≥ 4), `d[h]`
/// the scales and (Q5_1, Q4_1) `m[h]` the offsets of rows `8h..8h + 8`.
#[derive(Clone, Copy)]
struct Block {
    q: [[__m256i; 8]; 2],
    d: [__m256; 2],
    m: [__m256; 2],
}

/// The group's block [`PREFETCH_AHEAD`] bytes past `x`, into L2.
#[inline(always)]
fn prefetch_block<const K: u8>(x: *const u8) {
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    for l in 0..block_bytes(K).div_ceil(64) {
        prefetch_l2(ahead.wrapping_add(64 * l));
    }
}

/// Block `b` of the group at `w`, decoded (its stream prefetched ahead).
#[inline(always)]
unsafe fn decode<const K: u8>(w: *const u8, b: usize) -> Block {
    let x = w.add(b * block_bytes(K));
    prefetch_block::<K>(x);
    // Plain loops, no closures: this is inlined into the `#[target_feature]`
    // entry points, and a closure would not get their features.
    let (low4, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let mut blk =
        Block { q: [[_mm256_setzero_si256(); 8]; 2], d: [_mm256_setzero_ps(); 2], m: [_mm256_setzero_ps(); 2] };
    for h in 0..2 {
        for v in 0..4 {
            let q = _mm256_loadu_si256(x.add(codes_start(K) + 64 * v + 32 * h) as *const __m256i);
            blk.q[h][v] = _mm256_and_si256(q, low4);
            blk.q[h][v + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
        }
        if has_qh(K) {
            let qh = _mm256_loadu_si256(x.add(32 * h) as *const __m256i);
            // Bit `v` (low nibbles) and bit `4 + v` (high) of each byte to bit 4.
            let low_bits = [
                _mm256_slli_epi16::<4>(qh),
                _mm256_slli_epi16::<3>(qh),
                _mm256_slli_epi16::<2>(qh),
                _mm256_slli_epi16::<1>(qh),
            ];
            let high_bits = [qh, _mm256_srli_epi16::<1>(qh), _mm256_srli_epi16::<2>(qh), _mm256_srli_epi16::<3>(qh)];
            for v in 0..4 {
                blk.q[h][v] = _mm256_or_si256(blk.q[h][v], _mm256_and_si256(low_bits[v], bit4));
                blk.q[h][v + 4] = _mm256_or_si256(blk.q[h][v + 4], _mm256_and_si256(high_bits[v], bit4));
            }
        }
        (blk.d[h], blk.m[h]) = scales::<K>(x, h);
    }
    blk
}

/// `(d, m)` of half `h` (rows `8h..8h + 8`) of the group's block at `x`
/// (Q5_0: `m` zero).
#[inline(always)]
unsafe fn scales<const K: u8>(x: *const u8, h: usize) -> (__m256, __m256) {
    if K == Q4_1 {
        // Split (`Form::split_head`): the sixteen d's, then the sixteen m's.
        let at = x.add(scales_start(K) + 16 * h);
        let load = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        (load(at), load(at.add(32)))
    } else if has_min(K) {
        // Eight `(d, m)` words: the d's to the low half, the m's high.
        let s = _mm256_loadu_si256(x.add(scales_start(K) + 32 * h) as *const __m256i);
        let dm = _mm256_packus_epi32(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32::<16>(s));
        let dm = _mm256_permute4x64_epi64::<0b11_01_10_00>(dm);
        (_mm256_cvtph_ps(_mm256_castsi256_si128(dm)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(dm)))
    } else {
        (_mm256_cvtph_ps(_mm_loadu_si128(x.add(scales_start(K) + 16 * h) as *const __m128i)), _mm256_setzero_ps())
    }
}

macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $features:literal, $k:expr, $vnni:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
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
            rows16::<{ $k }, $vnni>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
        }
    };
}

entry!(
    /// `rows` (a multiple of 16) Q5_0 rows in the sliced lanes16 layout × `m`
    /// Q8_0 activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride +
    /// r] = row r · act j`, each equal to `quant::q5_0::vec_dot`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C CPU; `w` holds `rows / 16` groups of `row_bytes` per row
    /// (`n` a multiple of 32); `a` holds `m` Q8_0 rows of `n` values
    /// `a_stride` bytes apart; `y` valid for the writes.
    rows16_q5_0, "avx2,fma,f16c", Q5_0, false
);
entry!(
    /// [`rows16_q5_0`] with AVX-VNNI (`vpdpbusd`), equal bit for bit.
    ///
    /// # Safety
    /// As [`rows16_q5_0`], and the CPU has AVX-VNNI.
    rows16_q5_0_vnni, "avx2,fma,f16c,avxvnni", Q5_0, true
);
entry!(
    /// `rows` Q5_1 rows in the sliced lanes16 layout × `m` Q8_1 activation
    /// rows, each equal to `quant::q5_1::vec_dot` (as [`rows16_q5_0`]).
    ///
    /// # Safety
    /// As [`rows16_q5_0`], with Q8_1 activations.
    rows16_q5_1, "avx2,fma,f16c", Q5_1, false
);
entry!(
    /// [`rows16_q5_1`] with AVX-VNNI, equal bit for bit.
    ///
    /// # Safety
    /// As [`rows16_q5_1`], and the CPU has AVX-VNNI.
    rows16_q5_1_vnni, "avx2,fma,f16c,avxvnni", Q5_1, true
);
entry!(
    /// `rows` Q4_1 rows in the lanes16 layout (no `qh`) × `m` Q8_1
    /// activation rows, each equal to `quant::q4_1::vec_dot` (as
    /// [`rows16_q5_0`]).
    ///
    /// # Safety
    /// As [`rows16_q5_0`], with Q8_1 activations.
    rows16_q4_1, "avx2,fma,f16c", Q4_1, false
);
entry!(
    /// [`rows16_q4_1`] with AVX-VNNI, equal bit for bit.
    ///
    /// # Safety
    /// As [`rows16_q4_1`], and the CPU has AVX-VNNI.
    rows16_q4_1_vnni, "avx2,fma,f16c,avxvnni", Q4_1, true
);

/// The body of the six kernels.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows16<const K: u8, const V: bool>(
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
    // The thread's buffers are taken out of their cells for the call: no
    // closure around the kernel code (it would not get the target features).
    let mut scratch = SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let (mut act_d, mut act_x) = ACT.with(|c| std::mem::take(&mut *c.borrow_mut()));
    act_scales::<K>(a, a_stride, m, nb, &mut act_d, &mut act_x);
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        let yg = y.add(g * ROWS);
        if m <= ACTS {
            match m {
                1 => tile::<1, K, V>(nb, gw, a, a_stride, &act_d, &act_x, yg, y_stride),
                _ => tile::<ACTS, K, V>(nb, gw, a, a_stride, &act_d, &act_x, yg, y_stride),
            }
            continue;
        }
        scratch.clear();
        for b in 0..nb {
            scratch.push(decode::<K>(gw, b));
        }
        let mut j = 0;
        while j < m {
            let take = (m - j).min(TILE_ACTS);
            let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride));
            let (dj, xj) = (&act_d[j * nb..], &act_x[j * nb..]);
            match take {
                1 => tile_decoded::<1, K, V>(&scratch, aj, a_stride, dj, xj, yj, y_stride),
                2 => tile_decoded::<2, K, V>(&scratch, aj, a_stride, dj, xj, yj, y_stride),
                3 => tile_decoded::<3, K, V>(&scratch, aj, a_stride, dj, xj, yj, y_stride),
                _ => tile_decoded::<TILE_ACTS, K, V>(&scratch, aj, a_stride, dj, xj, yj, y_stride),
            }
            j += take;
        }
    }
    SCRATCH.with(|c| *c.borrow_mut() = scratch);
    ACT.with(|c| *c.borrow_mut() = (act_d, act_x));
}

/// Per activation block of a call (`m` rows of `nb` blocks, `a_stride` bytes
/// apart; index `j·nb + b`): `act_d` its `d` as f32, `act_x` Q5_0's `16·Σy`
/// or the Q8_1 `s` as f32 bits. Shared with [`super::avx512_rows16_q5`].
#[inline(always)]
pub(super) unsafe fn act_scales<const K: u8>(
    a: *const u8,
    a_stride: usize,
    m: usize,
    nb: usize,
    act_d: &mut Vec<f32>,
    act_x: &mut Vec<i32>,
) {
    let (ab, codes_at) = act_geometry(K);
    act_d.resize(m * nb, 0.0);
    act_x.resize(m * nb, 0);
    for j in 0..m {
        let (row, at) = (a.add(j * a_stride), j * nb..(j + 1) * nb);
        f16s_to_f32(row, ab, &mut act_d[at.clone()]);
        if has_min(K) {
            f16s_to_f32(row.add(2), ab, bytemuck::cast_slice_mut(&mut act_x[at]));
        } else {
            for (b, x) in act_x[at].iter_mut().enumerate() {
                *x = 16 * code_sum(row.add(b * ab + codes_at));
            }
        }
    }
}

/// `out[i]` = the f16 at `p + i·stride` as f32: the activation blocks'
/// scales (`d`, Q8_1's `s`), eight a `vcvtph2ps`. One at a time, each
/// conversion waited on the last through a false dependency and a store
/// forward: a quarter of a 64-row batch's time at SmolLM2's widths.
#[inline(always)]
pub(super) unsafe fn f16s_to_f32(p: *const u8, stride: usize, out: &mut [f32]) {
    let mut i = 0;
    while i < out.len() {
        let mut h = [0u16; 8];
        let take = (out.len() - i).min(8);
        for (k, hk) in h.iter_mut().enumerate().take(take) {
            *hk = (p.add((i + k) * stride) as *const u16).read_unaligned();
        }
        let f = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), f);
        out[i..i + take].copy_from_slice(&v[..take]);
        i += take;
    }
}

/// One group of sixteen rows at `gw` × `J` activation rows, decoding each
/// block as it goes.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const J: usize, const K: u8, const V: bool>(
    nb: usize,
    gw: *const u8,
    a: *const u8,
    a_stride: usize,
    act_d: &[f32],
    act_x: &[i32],
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        if has_qh(K) {
            block_step::<J, K, V>(&decode::<K>(gw, b), b, nb, a, a_stride, act_d, act_x, &mut sums);
        } else {
            let x = gw.add(b * block_bytes(K));
            prefetch_block::<K>(x);
            stream_step::<J, K, V>(x, b, nb, a, a_stride, act_d, act_x, &mut sums);
        }
    }
    store_sums(&sums, y, y_stride);
}

/// [`tile`] over a group's blocks decoded once (larger batches).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_decoded<const J: usize, const K: u8, const V: bool>(
    blocks: &[Block],
    a: *const u8,
    a_stride: usize,
    act_d: &[f32],
    act_x: &[i32],
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for (b, blk) in blocks.iter().enumerate() {
        block_step::<J, K, V>(blk, b, blocks.len(), a, a_stride, act_d, act_x, &mut sums);
    }
    store_sums(&sums, y, y_stride);
}

/// Block `b` (of `nb`) of a group, decoded, × `J` activation rows into
/// `sums[j][h]` (rows `8h..8h + 8`): each activation broadcast feeds both
/// halves' products, then one float step per half and activation row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_step<const J: usize, const K: u8, const V: bool>(
    blk: &Block,
    b: usize,
    nb: usize,
    a: *const u8,
    a_stride: usize,
    act_d: &[f32],
    act_x: &[i32],
    sums: &mut [[__m256; 2]; J],
) {
    let (ab, codes_at) = act_geometry(K);
    // Without VNNI the `vpmaddubsw` pairs (at most 2·31·128) of four
    // vectors (Q4_1's, at most 2·15·128: eight) add up in i16 (under 2¹⁵)
    // before one `vpmaddwd`.
    let (mut acc, mut acc16) = ([[_mm256_setzero_si256(); 2]; J], [[_mm256_setzero_si256(); 2]; J]);
    for v in 0..8 {
        // Values 4v.. (v < 4) or 16 + 4(v − 4).. (v ≥ 4) of the block.
        let at = if v < 4 { 4 * v } else { 16 + 4 * (v - 4) };
        for j in 0..J {
            let yq = bcast4(a.add(j * a_stride + b * ab + codes_at + at));
            for h in 0..2 {
                if V {
                    acc[j][h] = _mm256_dpbusd_avx_epi32(acc[j][h], blk.q[h][v], yq);
                } else {
                    acc16[j][h] = _mm256_add_epi16(acc16[j][h], _mm256_maddubs_epi16(blk.q[h][v], yq));
                }
            }
        }
        if !V && v % i16_steps(K) == i16_steps(K) - 1 {
            for j in 0..J {
                for h in 0..2 {
                    acc[j][h] = _mm256_add_epi32(acc[j][h], _mm256_madd_epi16(acc16[j][h], _mm256_set1_epi16(1)));
                    acc16[j][h] = _mm256_setzero_si256();
                }
            }
        }
    }
    float_steps::<J, K>(&acc, &blk.d, &blk.m, b, nb, act_d, act_x, sums);
}

/// One block's float steps: `sums[j][h] += isum·(d·d_a) + m·s_a` (Q5_0:
/// `(isum − 16·Σy)·(d·d_a)`), the scalar references' order, for the integer
/// sums `acc[j][h]` of rows `8h..8h + 8` against activation row `j`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn float_steps<const J: usize, const K: u8>(
    acc: &[[__m256i; 2]; J],
    d: &[__m256; 2],
    m: &[__m256; 2],
    b: usize,
    nb: usize,
    act_d: &[f32],
    act_x: &[i32],
    sums: &mut [[__m256; 2]; J],
) {
    for (j, sum) in sums.iter_mut().enumerate() {
        let at = j * nb + b;
        let da = _mm256_set1_ps(*act_d.get_unchecked(at));
        let x = *act_x.get_unchecked(at);
        for h in 0..2 {
            let dd = _mm256_mul_ps(d[h], da);
            let step = if has_min(K) {
                let ms = _mm256_mul_ps(m[h], _mm256_set1_ps(f32::from_bits(x as u32)));
                _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[j][h]), dd), ms)
            } else {
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[j][h], _mm256_set1_epi32(x))), dd)
            };
            sum[h] = _mm256_add_ps(sum[h], step);
        }
    }
}

/// Q4_1's streaming block step (no fifth bits): [`block_step`] with each
/// code vector used as it is loaded, where decoding the whole block first
/// kept 16 code vectors live and spilled them (0.83× the four-row kernel it
/// replaced at `m = 1`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stream_step<const J: usize, const K: u8, const V: bool>(
    x: *const u8,
    b: usize,
    nb: usize,
    a: *const u8,
    a_stride: usize,
    act_d: &[f32],
    act_x: &[i32],
    sums: &mut [[__m256; 2]; J],
) {
    debug_assert!(!has_qh(K) && i16_steps(K) == 8);
    let (ab, codes_at) = act_geometry(K);
    let low4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_si256(); 2]; J];
    let mut acc16 = [[_mm256_setzero_si256(); 2]; J];
    for v in 0..4 {
        // Values 4v.. (low nibbles) and 16 + 4v.. (high) of the block.
        let mut y = [[_mm256_setzero_si256(); 2]; J];
        for (j, yj) in y.iter_mut().enumerate() {
            let row = a.add(j * a_stride + b * ab + codes_at);
            *yj = [bcast4(row.add(4 * v)), bcast4(row.add(16 + 4 * v))];
        }
        for h in 0..2 {
            let q = _mm256_loadu_si256(x.add(codes_start(K) + 64 * v + 32 * h) as *const __m256i);
            let (lo, hi) = (_mm256_and_si256(q, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4));
            for j in 0..J {
                if V {
                    acc[j][h] = _mm256_dpbusd_avx_epi32(acc[j][h], lo, y[j][0]);
                    acc[j][h] = _mm256_dpbusd_avx_epi32(acc[j][h], hi, y[j][1]);
                } else {
                    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, y[j][0]), _mm256_maddubs_epi16(hi, y[j][1]));
                    acc16[j][h] = _mm256_add_epi16(acc16[j][h], p);
                }
            }
        }
    }
    if !V {
        for j in 0..J {
            for h in 0..2 {
                acc[j][h] = _mm256_madd_epi16(acc16[j][h], _mm256_set1_epi16(1));
            }
        }
    }
    let (d0, m0) = scales::<K>(x, 0);
    let (d1, m1) = scales::<K>(x, 1);
    float_steps::<J, K>(&acc, &[d0, d1], &[m0, m1], b, nb, act_d, act_x, sums);
}
