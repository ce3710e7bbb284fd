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
//! Batches above `ACTS` rows decode a group's blocks once (the looked-up
//! magnitudes and signed values, 1 KiB a block) into a thread-local scratch
//! that tiles of `TILE_ACTS` activation rows then read, both halves at once:
//! each activation broadcast feeds two products. Tiles of one half, which
//! broadcast every activation twice, ran 5.5–6.3 ns per 256 values and
//! activation row against 4.6 for both halves in `M=64 PACKED=1
//! ONLY=iq4_nl bench_kdot 256 2048` on the Zen 3 VM (three rows a tile ran
//! the same as four).
//!
//! With AVX-VNNI ([`rows16_iq4_nl_vnni`]) each nibble looks up `K[q] + 128`
//! once into `vpdpbusd` and `128·Σy` of each activation block comes back out.
//! Both forms are one `#[inline(always)]` body generic over `V`, with no
//! closure around an intrinsic (see [`super::avx2_rows16_k`]).
//!
//! Numerics: the integer sums are exact and the float step is the scalar
//! reference's (`quant::iq4_nl::vec_dot`: `sum + (d_a·d)·isum`, no FMA,
//! blocks in order), so every row equals the reference bit for bit at every
//! batch size.

use super::avx2_rows16_k::bcast4;
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Whether this CPU has AVX-VNNI (and `SHARDLM_AVXVNNI` is not `0`).
pub fn has_avxvnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::is_x86_feature_detected!("avxvnni") && std::env::var("SHARDLM_AVXVNNI").map_or(true, |v| v.trim() != "0")
    })
}

/// Rows per group (the lanes of two vectors).
const ROWS: usize = 16;
/// Activation rows per register tile (both halves' sums stay in registers).
const ACTS: usize = 2;
/// Activation rows per tile over decoded blocks (larger batches).
const TILE_ACTS: usize = 4;
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

/// `K[q] + 128` (the unsigned codes of the AVX-VNNI kernel).
static K128: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut q = 0;
    while q < 16 {
        t[q] = (crate::quant::iq4_nl::KVALUES[q] as u8) ^ 0x80;
        q += 1;
    }
    t
};

thread_local! {
    /// The current group's blocks, decoded once (batches above `ACTS`).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
    /// `128·Σy` of every activation block of the call (`m × nb`, AVX-VNNI only).
    static OFFSETS: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The f16 `d` of every activation block of the call as f32 (`m × nb`):
    /// converted once a call, not once per group of rows and half.
    static ACT_D: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of sixteen rows, decoded: per half `h`, `abs[h][v]` /
/// `sgn[h][v]` the looked-up `|K[q]|` / `K[q]` of values `4v..4v+4` (v < 4)
/// and `16+4(v−4)..` (v ≥ 4), `d[h]` the half's scales. With AVX-VNNI
/// (`V`) `abs` holds `K[q] + 128` and `sgn` is unused.
#[derive(Clone, Copy)]
struct Block {
    abs: [[__m256i; 8]; 2],
    sgn: [[__m256i; 8]; 2],
    d: [__m256; 2],
}

/// Block `b` of the group at `w`, decoded (its stream prefetched ahead).
#[inline(always)]
unsafe fn decode<const V: bool>(w: *const u8, b: usize) -> Block {
    let x = w.add(b * BLOCK);
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    for l in 0..BLOCK.div_ceil(64) {
        prefetch_l2(ahead.wrapping_add(64 * l));
    }
    // Plain loops, no closures: this is inlined into the `#[target_feature]`
    // entry points, and a closure would not get their features.
    let low4 = _mm256_set1_epi8(0x0F);
    let abs_t =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(if V { K128.as_ptr() } else { ABS.as_ptr() } as *const __m128i));
    let sgn_t = _mm256_broadcastsi128_si256(_mm_loadu_si128(SIGNED.as_ptr() as *const __m128i));
    let mut blk = Block {
        abs: [[_mm256_setzero_si256(); 8]; 2],
        sgn: [[_mm256_setzero_si256(); 8]; 2],
        d: [_mm256_setzero_ps(); 2],
    };
    for h in 0..2 {
        for v in 0..4 {
            let q = _mm256_loadu_si256(x.add(64 * v + 32 * h) as *const __m256i);
            let (lo, hi) = (_mm256_and_si256(q, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4));
            blk.abs[h][v] = _mm256_shuffle_epi8(abs_t, lo);
            blk.abs[h][v + 4] = _mm256_shuffle_epi8(abs_t, hi);
            if !V {
                blk.sgn[h][v] = _mm256_shuffle_epi8(sgn_t, lo);
                blk.sgn[h][v + 4] = _mm256_shuffle_epi8(sgn_t, hi);
            }
        }
        blk.d[h] = _mm256_cvtph_ps(_mm_loadu_si128(x.add(4 * 64 + 16 * h) as *const __m128i));
    }
    blk
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
    rows16::<false>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// [`rows16_iq4_nl`] with AVX-VNNI: `K[q] + 128` meets the activations in
/// one `vpdpbusd` (i32 sums, no saturation) and `128·Σy` comes back out per
/// block, seven µops per 64 products instead of fifteen. Equal to the
/// reference bit for bit as well.
///
/// # Safety
/// As [`rows16_iq4_nl`], and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_iq4_nl_vnni(
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
    rows16::<true>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// The body of both kernels.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows16<const V: bool>(
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
    // closure around the kernel code (a closure does not get this
    // function's target features, and the intrinsics in it would not inline).
    let mut offsets = OFFSETS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let mut scratch = SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let mut act_d = ACT_D.with(|c| std::mem::take(&mut *c.borrow_mut()));
    offsets.clear();
    act_d.clear();
    for j in 0..m {
        for b in 0..nb {
            let yb = a.add(j * a_stride + b * ACT_BYTES);
            act_d.push(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((yb as *const u16).read_unaligned() as i32))));
            if V {
                offsets.push(128 * code_sum(yb.add(2)));
            }
        }
    }
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        let yg = y.add(g * ROWS);
        if m <= ACTS {
            match m {
                1 => tile::<1, V>(nb, gw, a, a_stride, &offsets, &act_d, yg, y_stride),
                _ => tile::<ACTS, V>(nb, gw, a, a_stride, &offsets, &act_d, yg, y_stride),
            }
            continue;
        }
        scratch.clear();
        for b in 0..nb {
            scratch.push(decode::<V>(gw, b));
        }
        let mut j = 0;
        while j < m {
            let take = (m - j).min(TILE_ACTS);
            let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride));
            let oj = if V { &offsets[j * nb..] } else { &offsets[..] };
            let dj = &act_d[j * nb..];
            match take {
                1 => tile_decoded::<1, V>(&scratch, aj, a_stride, oj, dj, yj, y_stride),
                2 => tile_decoded::<2, V>(&scratch, aj, a_stride, oj, dj, yj, y_stride),
                3 => tile_decoded::<3, V>(&scratch, aj, a_stride, oj, dj, yj, y_stride),
                _ => tile_decoded::<TILE_ACTS, V>(&scratch, aj, a_stride, oj, dj, yj, y_stride),
            }
            j += take;
        }
    }
    OFFSETS.with(|c| *c.borrow_mut() = offsets);
    SCRATCH.with(|c| *c.borrow_mut() = scratch);
    ACT_D.with(|c| *c.borrow_mut() = act_d);
}

/// Σ of the 32 signed codes at `q` (one Q8_0 block).
#[inline(always)]
pub(super) unsafe fn code_sum(q: *const u8) -> i32 {
    let v = _mm256_loadu_si256(q as *const __m256i);
    let s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// `acc + Σ w·y` over four values of each lane: `abs`/`sgn` the looked-up
/// weights (with `V`, `K + 128` in `abs`), `yq` four activation bytes in
/// every lane.
#[inline(always)]
unsafe fn product<const V: bool>(acc: __m256i, abs: __m256i, sgn: __m256i, yq: __m256i) -> __m256i {
    if V {
        _mm256_dpbusd_avx_epi32(acc, abs, yq)
    } else {
        let p = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(yq, sgn));
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}

/// One group of sixteen rows at `gw` × `J` activation rows, decoding each
/// block as it goes; with `V`, `offs[j·nb + b]` is `128·Σy` of activation
/// row `j`'s block `b`; `act_d[j·nb + b]` is its `d`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const J: usize, const V: bool>(
    nb: usize,
    gw: *const u8,
    a: *const u8,
    a_stride: usize,
    offs: &[i32],
    act_d: &[f32],
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        block_step::<J, V>(&decode::<V>(gw, b), b, nb, a, a_stride, offs, act_d, &mut sums);
    }
    store_sums(&sums, y, y_stride);
}

/// [`tile`] over a group's blocks decoded once (larger batches).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_decoded<const J: usize, const V: bool>(
    blocks: &[Block],
    a: *const u8,
    a_stride: usize,
    offs: &[i32],
    act_d: &[f32],
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for (b, blk) in blocks.iter().enumerate() {
        block_step::<J, V>(blk, b, blocks.len(), a, a_stride, offs, act_d, &mut sums);
    }
    store_sums(&sums, y, y_stride);
}

/// Block `b` (of `nb`) of a group, decoded, × `J` activation rows into
/// `sums[j][h]` (rows `8h..8h + 8`): each activation broadcast feeds both
/// halves' products, then one float step per half and row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_step<const J: usize, const V: bool>(
    blk: &Block,
    b: usize,
    nb: usize,
    a: *const u8,
    a_stride: usize,
    offs: &[i32],
    act_d: &[f32],
    sums: &mut [[__m256; 2]; J],
) {
    let mut acc = [[_mm256_setzero_si256(); 2]; J];
    for v in 0..8 {
        // Values 4v.. (v < 4) or 16 + 4(v − 4).. (v ≥ 4) of the block.
        let at = if v < 4 { 4 * v } else { 16 + 4 * (v - 4) };
        for (j, acc_j) in acc.iter_mut().enumerate() {
            let yq = bcast4(a.add(j * a_stride + b * ACT_BYTES + 2 + at));
            for (h, acc_jh) in acc_j.iter_mut().enumerate() {
                *acc_jh = product::<V>(*acc_jh, blk.abs[h][v], blk.sgn[h][v], yq);
            }
        }
    }
    for (j, sum) in sums.iter_mut().enumerate() {
        let da = _mm256_set1_ps(*act_d.get_unchecked(j * nb + b));
        let off = _mm256_set1_epi32(if V { *offs.get_unchecked(j * nb + b) } else { 0 });
        for h in 0..2 {
            let isum = if V { _mm256_sub_epi32(acc[j][h], off) } else { acc[j][h] };
            sum[h] = _mm256_add_ps(sum[h], _mm256_mul_ps(_mm256_mul_ps(blk.d[h], da), _mm256_cvtepi32_ps(isum)));
        }
    }
}

/// Each activation row's sixteen sums to `y` (row `j` at `j·y_stride`).
#[inline(always)]
pub(super) unsafe fn store_sums<const J: usize>(sums: &[[__m256; 2]; J], y: *mut f32, y_stride: usize) {
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}
