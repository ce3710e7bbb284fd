//! AVX-512 VNNI prefill GEMM for weights of 32-value blocks with Q8_0 or Q8_1
//! activations (MXFP4, Q4_0, Q5_0, Q8_0, IQ4_NL; Q4_1, Q5_1): `y = x · Wᵀ` for
//! `m ≥` [`MIN_M`] activation rows, with the activation rows in the vector lanes.
//!
//! Why: the 4 × 2 tiles put 64 weights of one row in a vector, so every
//! `vpdpbusd` (64 products) needs its own float epilogue (convert, scale,
//! FMA) because each 32-value block has its own scale: about four instructions
//! per 64 products, and the weight decode is shared by only two activation
//! rows. llama.cpp's repacked GEMMs ran 1.75× (MXFP4) and 1.5× (Q4_0) faster on
//! the 1.1B model. Here the 16 lanes are 16 *activation rows* and one
//! `vpdpbusd` multiplies 4 weights of one row (broadcast) by the same 4
//! positions of 16 activation rows, so a block's 32 positions take 8 of them
//! per row before the one float epilogue (convert, scale, FMA) of that block:
//! 8 integer instructions plus 3 float ones per 512 products.
//!
//! Layouts (built per call):
//! * **Activations** (Q8_0 or Q8_1 rows → the lane layout): per group of 16
//!   rows and block `b`, 8 × 64 bytes (position group `p` = positions `4p..4p+4`
//!   of the block for the 16 rows, 4 bytes each), then the 16 rows' scales `d`
//!   (f32), their sums `Σ q` (i32, to undo the weights' unsigned offset) and,
//!   for Q8_1, their `s = d·Σ q` (f32, for the weights' minimum `m`). Rows past
//!   `m` are zero.
//! * **Weights**: a unit of up to [`UNIT_ROWS`] rows at a time is decoded to
//!   unsigned bytes `q + o` in element order (`vpdpbusd` takes unsigned × signed)
//!   and one f32 scale per block, into the thread's scratch, then meets every
//!   activation group. `Σ (q + o)·a − o·Σ a = Σ q·a`:
//!
//! | type  | decoded byte             | offset `o` | block scale             |
//! |-------|--------------------------|------------|-------------------------|
//! | MXFP4 | `2·E2M1 + 12` (0..24)    | 12         | `2^(e−128)` (ggml's halved E8M0) |
//! | Q4_0  | the nibble (0..15)       | 8          | `d`                     |
//! | Q8_0  | `q + 128` (0..255)       | 128        | `d`                     |
//! | Q5_0  | the 5-bit code (0..31)   | 16         | `d`                     |
//! | IQ4_NL | `K[nibble] + 128` (1..241) | 128      | `d`                     |
//! | Q4_1  | the nibble (0..15)       | 0          | `d`, plus `m·s_a`       |
//! | Q5_1  | the 5-bit code (0..31)   | 0          | `d`, plus `m·s_a`       |
//!
//! Numerics: per (row, activation row, block) the integer sum is exact, as in
//! the other kernels; `d_a · d_w` multiplies it in f32 and the blocks are summed
//! in order. The result differs from the four-row kernels' only in the f32
//! summation order, so a row's result depends on whether its batch reached
//! [`MIN_M`] (below it the 4 × 2 tiles keep batches bit-identical to decode).
//! IQ4_NL is the exception: its epilogue is the scalar reference's (multiply,
//! then add), so its results equal `matmul_reference` (and its scalar-exact
//! one-row kernel) bit for bit at every batch size.

use super::lane_gemm::{self, Split};
use crate::matmul::MatRef;
use crate::quant::minifloat::e8m0_half;
use crate::{DType, ThreadPool};
use std::arch::x86_64::*;

/// Smallest batch that takes this path (prefill chunks; decode batches stay on
/// the batch-invariant tile).
pub const MIN_M: usize = 32;
/// Weight rows decoded per unit of work.
const UNIT_ROWS: usize = 16;
/// Activation rows per group (the vector lanes).
const LANES: usize = 16;
/// Bytes of one block of one activation group: 8 × 64 quant bytes (offset 0),
/// 16 f32 scales (offset 512), 16 i32 sums `Σ q` (offset 576), 16 f32 `s`
/// (offset 640, Q8_1 only).
const GROUP_BLOCK: usize = 8 * 64 + 3 * 64;

/// `2·E2M1(code) + 12` by code (MXFP4).
const E2M1_X2_PLUS12: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// `K[code] + 128` by code (IQ4_NL's table, `quant::iq4_nl::KVALUES`, made unsigned).
const IQ4NL_PLUS128: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::quant::iq4_nl::KVALUES[i] as i32 + 128) as u8;
        i += 1;
    }
    t
};

thread_local! {
    /// This thread's decode scratch.
    static DECODED: std::cell::RefCell<Decoded> =
        const { std::cell::RefCell::new(Decoded { q: Vec::new(), s: Vec::new(), m: Vec::new(), row: Vec::new() }) };
}

/// A unit's decoded weights and the file-layout copy of a packed row.
struct Decoded {
    /// `UNIT_ROWS × cols` unsigned bytes, row after row, in element order.
    q: Vec<u8>,
    /// `UNIT_ROWS × cols / 32` block scales.
    s: Vec<f32>,
    /// `UNIT_ROWS × cols / 32` block minimums (Q4_1, Q5_1).
    m: Vec<f32>,
    /// One packed row unpacked to the file layout.
    row: Vec<u8>,
}

/// The unsigned offset `o` of `dtype`'s decoded bytes, if this GEMM takes it.
fn offset(dtype: DType) -> Option<i32> {
    match dtype {
        DType::MXFP4 => Some(12),
        DType::Q4_0 => Some(8),
        DType::Q8_0 | DType::IQ4_NL => Some(128),
        DType::Q5_0 => Some(16),
        DType::Q4_1 | DType::Q5_1 => Some(0),
        _ => None,
    }
}

/// Whether `dtype` has a block minimum (Q8_1 activations).
fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1)
}

/// Group `g` of the activations (rows `16g..16g+16` of `m`) in the lane layout
/// (see the module docs) into `dst` (`nb · GROUP_BLOCK` bytes, zeroed).
/// `q8_1`: the rows are Q8_1 blocks (`[d, s, 32 × i8]`), else Q8_0 (`[d, 32 × i8]`).
fn act_group(a: &[u8], a_stride: usize, m: usize, nb: usize, g: usize, q8_1: bool, dst: &mut [u8]) {
    let (bb, head) = if q8_1 { (36, 4) } else { (34, 2) };
    for lane in 0..(m - g * LANES).min(LANES) {
        let row = &a[(g * LANES + lane) * a_stride..];
        for b in 0..nb {
            let blk = &row[b * bb..(b + 1) * bb];
            let dst = &mut dst[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            let q = &blk[head..bb];
            if q8_1 {
                let s = half::f16::from_bits(u16::from_le_bytes([blk[2], blk[3]])).to_f32();
                dst[640 + lane * 4..644 + lane * 4].copy_from_slice(&s.to_le_bytes());
            }
            for p in 0..8 {
                dst[p * 64 + lane * 4..p * 64 + lane * 4 + 4].copy_from_slice(&q[4 * p..4 * p + 4]);
            }
            let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
            dst[512 + lane * 4..516 + lane * 4].copy_from_slice(&d.to_le_bytes());
            let sum: i32 = q.iter().map(|&v| v as i8 as i32).sum();
            dst[576 + lane * 4..580 + lane * 4].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Decodes rows `r0..r1` of `w` into `d.q` (`(r1 − r0) × cols` bytes) and
/// `d.s` (see the table in the module docs). Packed rows are first unpacked to
/// the file layout (`d.row`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_rows(w: &MatRef<'_>, r0: usize, r1: usize, d: &mut Decoded) {
    let (nb, rb, bb) = (w.cols / 32, w.row_bytes(), w.dtype.block_bytes());
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_X2_PLUS12.as_ptr() as *const __m128i));
    let lut_nl = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_PLUS128.as_ptr() as *const __m128i));
    let low = _mm_set1_epi8(0x0F);
    d.row.resize(rb, 0);
    for (k, r) in (r0..r1).enumerate() {
        let row: *const u8 = if w.packed {
            let group = &w.data[r / 4 * 4 * rb..(r / 4 + 1) * 4 * rb];
            crate::packed::unpack_row(w.dtype, w.cols, group, r % 4, &mut d.row);
            d.row.as_ptr()
        } else {
            w.data.as_ptr().add(r * rb)
        };
        for b in 0..nb {
            let x = row.add(b * bb);
            let dst = d.q.as_mut_ptr().add(k * w.cols + b * 32) as *mut __m256i;
            let f16 = || half::f16::from_bits(u16::from_le_bytes([*x, *x.add(1)])).to_f32();
            // Block layouts: MXFP4 [e8m0, 16 nibble bytes], Q4_0 and IQ4_NL [f16 d, 16
            // nibble bytes] (element j low nibble of byte j, j+16 high), Q8_0
            // [f16 d, 32 × i8], Q5_0 [f16 d, u32 qh, 16 nibble bytes] (bit j
            // of qh: bit 4 of element j), Q4_1 [f16 d, f16 m, 16 nibble
            // bytes], Q5_1 [f16 d, f16 m, u32 qh, 16 nibble bytes].
            let (scale, codes) = match w.dtype {
                DType::Q8_0 => {
                    (f16(), _mm256_xor_si256(_mm256_loadu_si256(x.add(2) as *const __m256i), _mm256_set1_epi8(-128)))
                }
                dt => {
                    let head = match dt {
                        DType::MXFP4 => 1,
                        DType::Q4_0 | DType::IQ4_NL => 2,
                        DType::Q4_1 => 4,
                        DType::Q5_0 => 6,
                        _ => 8,
                    };
                    let v = _mm_loadu_si128(x.add(head) as *const __m128i);
                    let nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
                    let high = |at: usize| {
                        let qh = (x.add(at) as *const u32).read_unaligned();
                        _mm256_or_si256(nib, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(16)))
                    };
                    match dt {
                        DType::MXFP4 => (e8m0_half(*x), _mm256_shuffle_epi8(lut, nib)),
                        DType::IQ4_NL => (f16(), _mm256_shuffle_epi8(lut_nl, nib)),
                        DType::Q5_0 => (f16(), high(2)),
                        DType::Q5_1 => (f16(), high(4)),
                        _ => (f16(), nib),
                    }
                }
            };
            if has_min(w.dtype) {
                d.m[k * nb + b] = half::f16::from_bits(u16::from_le_bytes([*x.add(2), *x.add(3)])).to_f32();
            }
            d.s[k * nb + b] = scale;
            _mm256_storeu_si256(dst, codes);
        }
    }
}

/// `R` decoded rows (`q` rows `cols` apart, scales `s` and minimums `mn` rows
/// `nb` apart) × `G` activation groups (`act[g]`): `out[g][r]` = group `g`'s
/// 16 lanes' results of row `r`. `MIN`: add `m_w·s_a` per block (Q4_1, Q5_1).
/// `EXACT`: the scalar reference's float step (`(d_a·d)·sumi`, then add; no
/// FMA), for IQ4_NL, whose one-row kernel is scalar-exact: its prefill keeps
/// those bits too. `R × G` = 4 × 3: each code broadcast meets three
/// activation vectors, so 12 independent `vpdpbusd` chains run on 7 loads per
/// 12 (8 × 1 made 9 loads per 8 and only 8 chains).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_x_group<const R: usize, const G: usize, const MIN: bool, const EXACT: bool>(
    nb: usize,
    cols: usize,
    q: *const u8,
    s: *const f32,
    mn: *const f32,
    act: [*const u8; G],
    offset: i32,
) -> [[__m512; R]; G] {
    let mut accf = [[_mm512_setzero_ps(); R]; G];
    let neg_offset = _mm512_set1_epi32(-offset);
    for b in 0..nb {
        let blk = act.map(|a| a.add(b * GROUP_BLOCK));
        // −o·Σa: undoes the weights' unsigned offset.
        let seed = blk.map(|a| _mm512_mullo_epi32(_mm512_loadu_si512(a.add(576) as *const _), neg_offset));
        let mut acc = seed.map(|v| [v; R]);
        for p in 0..8 {
            let av = blk.map(|a| _mm512_loadu_si512(a.add(p * 64) as *const _));
            for r in 0..R {
                let wq = _mm512_set1_epi32((q.add(r * cols + b * 32 + 4 * p) as *const i32).read_unaligned());
                for g in 0..G {
                    acc[g][r] = _mm512_dpbusd_epi32(acc[g][r], wq, av[g]);
                }
            }
        }
        for g in 0..G {
            let d = _mm512_loadu_ps(blk[g].add(512) as *const f32);
            for r in 0..R {
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*s.add(r * nb + b)));
                accf[g][r] = if EXACT {
                    _mm512_add_ps(accf[g][r], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(acc[g][r])))
                } else {
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[g][r]), scale, accf[g][r])
                };
                if MIN {
                    let sa = _mm512_loadu_ps(blk[g].add(640) as *const f32);
                    accf[g][r] = _mm512_fmadd_ps(sa, _mm512_set1_ps(*mn.add(r * nb + b)), accf[g][r]);
                }
            }
        }
    }
    accf
}

/// 16 vectors as the rows of a 16 × 16 matrix → its columns: `out[l]` lane
/// `k` = `v[k]` lane `l`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose16(v: &[__m512; 16]) -> [__m512; 16] {
    let (pd, ps) = (_mm512_castps_pd, _mm512_castpd_ps);
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    // u[4i + c], 128-bit lane L: element 4L + c of rows 4i .. 4i + 3.
    let mut u = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        let (a, b, c, d) = (pd(t[4 * i]), pd(t[4 * i + 2]), pd(t[4 * i + 1]), pd(t[4 * i + 3]));
        u[4 * i] = ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = ps(_mm512_unpackhi_pd(c, d));
    }
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        // Lanes 0 and 2 (x), 1 and 3 (z) of rows 0..8, then of rows 8..16.
        let x = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let z = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
        let x2 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let z2 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(x, x2);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(x, x2);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(z, z2);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(z, z2);
    }
    out
}

/// Stores a unit's results: `v[k]` (weight row `k < n`, lane `l` = activation
/// row `l < lanes`) to `y[l · ys + k]`. Transposed in registers, so each
/// activation row takes one (masked) 64-byte store instead of 16 scattered
/// scalar ones, each of which write-allocated its own line.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_unit(v: &[__m512; 16], n: usize, lanes: usize, y: *mut f32, ys: usize) {
    let cols = transpose16(v);
    let mask: __mmask16 = if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 };
    for (l, c) in cols.iter().enumerate().take(lanes) {
        _mm512_mask_storeu_ps(y.add(l * ys), mask, *c);
    }
}

/// Rows `r0..r1` of weight `w` for all `m` activation rows (`act`: the call's
/// lane layout), into `y` (`m × w.rows`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unit(w: &MatRef<'_>, r0: usize, r1: usize, act: &[u8], m: usize, y: *mut f32) {
    let (nb, cols) = (w.cols / 32, w.cols);
    let off = offset(w.dtype).expect("a type the dispatch table gives this GEMM");
    DECODED.with(|cell| {
        let mut d = cell.borrow_mut();
        d.q.resize(UNIT_ROWS * cols, 0);
        d.s.resize(UNIT_ROWS * nb, 0.0);
        d.m.resize(UNIT_ROWS * nb, 0.0);
        decode_rows(w, r0, r1, &mut d);
        match (has_min(w.dtype), w.dtype == DType::IQ4_NL) {
            (true, _) => unit_groups::<true, false>(w, r0, r1, &d, act, m, off, y),
            (false, true) => unit_groups::<false, true>(w, r0, r1, &d, act, m, off, y),
            (false, false) => unit_groups::<false, false>(w, r0, r1, &d, act, m, off, y),
        }
    });
}

/// The decoded rows `r0..r1` (`d`) × every activation group, into `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn unit_groups<const MIN: bool, const EXACT: bool>(
    w: &MatRef<'_>,
    r0: usize,
    r1: usize,
    d: &Decoded,
    act: &[u8],
    m: usize,
    off: i32,
    y: *mut f32,
) {
    let (nb, cols) = (w.cols / 32, w.cols);
    let (q, s, mn) = (d.q.as_ptr(), d.s.as_ptr(), d.m.as_ptr());
    let n = r1 - r0;
    let groups = m.div_ceil(LANES);
    let ag = |g: usize| act.as_ptr().add(g * nb * GROUP_BLOCK);
    let mut g = 0;
    while g < groups {
        // Three groups at a time while three remain, then one.
        let three = g + 3 <= groups;
        let mut tiles = [[_mm512_setzero_ps(); UNIT_ROWS]; 3];
        let mut k = 0;
        while k + 4 <= n {
            let (qk, sk, mk) = (q.add(k * cols), s.add(k * nb), mn.add(k * nb));
            if three {
                let out = rows_x_group::<4, 3, MIN, EXACT>(nb, cols, qk, sk, mk, [ag(g), ag(g + 1), ag(g + 2)], off);
                for (t, o) in tiles.iter_mut().zip(out) {
                    t[k..k + 4].copy_from_slice(&o);
                }
            } else {
                let out = rows_x_group::<4, 1, MIN, EXACT>(nb, cols, qk, sk, mk, [ag(g)], off);
                tiles[0][k..k + 4].copy_from_slice(&out[0]);
            }
            k += 4;
        }
        while k < n {
            let (qk, sk, mk) = (q.add(k * cols), s.add(k * nb), mn.add(k * nb));
            if three {
                let out = rows_x_group::<1, 3, MIN, EXACT>(nb, cols, qk, sk, mk, [ag(g), ag(g + 1), ag(g + 2)], off);
                for (t, o) in tiles.iter_mut().zip(out) {
                    t[k] = o[0];
                }
            } else {
                tiles[0][k] = rows_x_group::<1, 1, MIN, EXACT>(nb, cols, qk, sk, mk, [ag(g)], off)[0][0];
            }
            k += 1;
        }
        for (i, tile) in tiles.iter().enumerate().take(if three { 3 } else { 1 }) {
            let lanes = (m - (g + i) * LANES).min(LANES);
            store_unit(tile, n, lanes, y.add((g + i) * LANES * w.rows + r0), w.rows);
        }
        g += if three { 3 } else { 1 };
    }
}

/// `ys[k] = x · ws[k]ᵀ` for weights the dispatch table gives this GEMM, `a` the `m` Q8_0
/// (or, for Q4_1/Q5_1, Q8_1) activation rows (`a_stride` bytes apart), `act` a reusable buffer.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; shapes as checked by `matmul` (`ys[k]` holds
/// `m × ws[k].rows`, every weight has `a`'s column count).
pub unsafe fn matmul(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    a: &[u8],
    a_stride: usize,
    m: usize,
    ys: &mut [&mut [f32]],
    act: &mut Vec<u8>,
) {
    let nb = ws[0].cols / 32;
    let q8_1 = has_min(ws[0].dtype);
    let split = Split { groups: m.div_ceil(LANES), group_bytes: nb * GROUP_BLOCK, unit_rows: UNIT_ROWS };
    lane_gemm::drive(
        pool,
        ws,
        ys,
        act,
        split,
        |g, dst| act_group(a, a_stride, m, nb, g, q8_1, dst),
        // SAFETY: the caller's contract (this CPU, these shapes); `y` rows r0..r1 are this unit's.
        |w, r0, r1, act, y| unsafe { unit(w, r0, r1, act, m, y) },
    );
}
