//! AVX-512 VNNI prefill GEMM for the K-quants (Q4_K, Q5_K, Q6_K; Q2_K, Q3_K,
//! IQ4_XS and the grid I-quants IQ2_XXS/XS/S, IQ3_XXS/S through the decoders
//! of [`super::gemm_lowk`]) with Q8_K
//! activations: `y = x · Wᵀ` for `m ≥` [`MIN_M`] activation rows, with the
//! activation rows in the 16 vector lanes (the K-quant sibling of
//! [`super::avx512_gemm`]).
//!
//! Why: the K-quants had one-row kernels only, so prefill decoded every
//! super-block (scales, mins, 4–6-bit codes) once per activation row and
//! paid a horizontal reduction per row pair. Here a unit of 16 weight rows is
//! decoded once per call into unsigned codes in element order plus integer
//! sub-block scales, and every `vpdpbusd` multiplies 4 codes of one row
//! (broadcast) by the same 4 positions of 16 activation rows.
//!
//! Layouts (built per call):
//! * **Activations** (Q8_K rows → lanes): per group of 16 rows and super-block,
//!   64 × 64 bytes (position group `p` = positions `4p..4p+4` for the 16 rows),
//!   then the 16 rows' `d` (f32), then 8 vectors of `bsums` pairs (lane `l` of
//!   vector `t`: `bsums[2t], bsums[2t+1]` of row `l`, two i16). Rows past `m`
//!   are zero.
//! * **Weights**: codes `q` (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) and per
//!   super-block the sub-block scales `sc` (i32), the i16 pairs `c` that meet
//!   the `bsums` pairs in one `vpdpwssd` each, and the float scales:
//!
//! | type  | sub-block | `c` pair `t`                 | result per super-block |
//! |-------|-----------|------------------------------|------------------------|
//! | Q4_K, Q5_K | 32   | `(m_t, m_t)`                 | `d_a·d·Σ sc·S − d_a·dmin·Σ m·B` |
//! | Q6_K  | 16        | `(32·sc_2t, 32·sc_2t+1)`     | `d_a·d·(Σ sc·S − Σ 32·sc·B)`   |
//!
//! with `S` a sub-block's `Σ q·a` and `B` its `Σ a`; Q2_K, Q3_K and IQ4_XS in
//! [`super::gemm_lowk`]'s table (Q2_K takes the Q4_K combination over its
//! scale-folded codes, Q3_K and IQ4_XS the Q6_K one over 16 and 32).
//!
//! Numerics: every integer sum is exact and the float steps are the scalar
//! reference's (`quant::q4_k::vec_dot` etc.: the same products, no FMA, super-
//! blocks summed in order), so the results equal `matmul_reference` bit for
//! bit. The one-row SIMD kernels below [`MIN_M`] sum in another order, so a
//! row's result still depends on whether its batch reached the threshold.

use super::avx512_fp4_vbmi::has_vbmi as vbmi;
use super::avx512_gemm::store_unit;
use super::gemm_lowk::{self, f16, pair, Scales};
use super::lane_gemm::{self, Split};
use crate::matmul::MatRef;
use crate::quant::q4_k::scales_mins;
use crate::{DType, ThreadPool};
use std::arch::x86_64::*;

/// Smallest batch that takes this path (decode batches stay on the one-row
/// kernels, bit-identical to single-row decode).
pub const MIN_M: usize = 32;
/// Weight rows decoded per unit of work.
const UNIT_ROWS: usize = 16;
/// Activation rows per group (the vector lanes).
const LANES: usize = 16;
/// Bytes of one super-block of one activation group: 64 × 64 quant bytes,
/// 16 f32 `d` (offset [`D_AT`]), 8 × 64 bytes of `bsums` pairs ([`BSUM_AT`]),
/// 4 × 64 bytes of 32-position sum pairs ([`SUM32_AT`]).
const GROUP_BLOCK: usize = 4096 + 64 + 512 + 256;
const D_AT: usize = 4096;
const BSUM_AT: usize = 4160;
/// Lane `l` of vector `u`: `(B₂ᵤ, B₂ᵤ₊₁)` of row `l`, two i16, where `Bᵢ` =
/// `bsums[2i] + bsums[2i+1]`, the sum of 32-position sub-block `i` (at most
/// 32 · 128: fits). The 32-wide sub-block types (Q4_K, Q5_K, IQ4_XS), whose
/// `c` pairs repeat one value, meet them in 4 `vpdpwssd` instead of 8.
const SUM32_AT: usize = 4672;
/// Q8_K block bytes: `d` (f32), 256 × i8, 16 × i16 `bsums`.
const Q8K_BYTES: usize = 292;

thread_local! {
    /// This thread's decode scratch.
    static DECODED: std::cell::RefCell<Decoded> =
        const { std::cell::RefCell::new(Decoded { q: Vec::new(), s: Vec::new(), row: Vec::new() }) };
}

struct Decoded {
    /// `UNIT_ROWS × cols` unsigned codes, row after row, in element order.
    q: Vec<u8>,
    /// `UNIT_ROWS × cols / 256` decoded scales.
    s: Vec<Scales>,
    /// The unit's rows of a packed weight, unpacked to the file layout.
    row: Vec<u8>,
}

/// Group `g` of the activations in the lane layout into `dst`
/// (`nb · GROUP_BLOCK` bytes, zeroed).
fn act_group(a: &[u8], a_stride: usize, m: usize, nb: usize, g: usize, dst: &mut [u8]) {
    for lane in 0..(m - g * LANES).min(LANES) {
        let row = &a[(g * LANES + lane) * a_stride..];
        for b in 0..nb {
            let blk = &row[b * Q8K_BYTES..(b + 1) * Q8K_BYTES];
            let dst = &mut dst[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            for p in 0..64 {
                dst[p * 64 + lane * 4..p * 64 + lane * 4 + 4].copy_from_slice(&blk[4 + 4 * p..8 + 4 * p]);
            }
            dst[D_AT + lane * 4..D_AT + lane * 4 + 4].copy_from_slice(&blk[..4]);
            for t in 0..8 {
                let o = BSUM_AT + t * 64 + lane * 4;
                dst[o..o + 4].copy_from_slice(&blk[260 + 4 * t..264 + 4 * t]);
            }
            let bsum = |i: usize| i16::from_le_bytes([blk[260 + 2 * i], blk[261 + 2 * i]]);
            for u in 0..4 {
                let o = SUM32_AT + u * 64 + lane * 4;
                let (lo, hi) = (bsum(4 * u) + bsum(4 * u + 1), bsum(4 * u + 2) + bsum(4 * u + 3));
                dst[o..o + 2].copy_from_slice(&lo.to_le_bytes());
                dst[o + 2..o + 4].copy_from_slice(&hi.to_le_bytes());
            }
        }
    }
}

/// Decodes one super-block `x` of `dtype` into 256 codes at `q` and its scales
/// (`recoded`: as recoded at load, see [`reads_recoded`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_block(dtype: DType, x: &[u8], q: *mut u8, recoded: bool) -> Scales {
    let ld = |o: usize| _mm256_loadu_si256(x.as_ptr().add(o) as *const __m256i);
    let st = |o: usize, v: __m256i| _mm256_storeu_si256(q.add(o) as *mut __m256i, v);
    let low = _mm256_set1_epi8(0x0F);
    let mut s = Scales::default();
    match dtype {
        // Sign masks recoded at load, read as they lie.
        DType::IQ3_XXS if recoded => return super::avx512_iq::decode_iq3_xxs_recoded(x.as_ptr(), q),
        DType::IQ2_XXS if recoded => return super::avx512_iq::decode_iq2_xxs_recoded(x.as_ptr(), q),
        DType::IQ2_XS if recoded => return super::avx512_iq::decode_iq2_xs_recoded(x.as_ptr(), q),
        DType::Q4_K | DType::Q5_K => {
            // [d, dmin, scales[12], (Q5_K: qh[32]), qs[128]]
            let (sc, mn) = scales_mins(x[4..16].try_into().expect("12 scale bytes"));
            for j in 0..8 {
                s.sc[j] = sc[j] as i32;
                s.c[j] = pair(mn[j] as i32, mn[j] as i32);
            }
            s.d = f16(&x[0..2]);
            s.dmin = f16(&x[2..4]);
            let q5 = dtype == DType::Q5_K;
            let qs = if q5 { 48 } else { 16 };
            let one = _mm256_set1_epi8(1);
            for c in 0..4 {
                let v = ld(qs + 32 * c);
                let (mut lo, mut hi) = (_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
                if q5 {
                    // qh[l] bit 2c: element 64c+l; bit 2c+1: element 64c+32+l.
                    let h = _mm256_srl_epi16(ld(16), _mm_cvtsi32_si128(2 * c as i32));
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4));
                }
                st(64 * c, lo);
                st(64 * c + 32, hi);
            }
        }
        DType::Q2_K => return gemm_lowk::decode_q2_k(x, q),
        DType::Q3_K => return gemm_lowk::decode_q3_k(x, q),
        DType::IQ4_XS => return gemm_lowk::decode_iq4_xs(x, q, false),
        // Gathered grids where written (equal to `decode_iq`, tested).
        DType::IQ3_S => return super::avx512_iq::decode_iq3_s(x.as_ptr(), q),
        DType::IQ2_XS => return super::avx512_iq::decode_iq2_xs(x.as_ptr(), q),
        DType::IQ2_S => return super::avx512_iq::decode_iq2_s(x.as_ptr(), q),
        DType::IQ1_S => return super::avx512_iq::decode_iq1_s(x.as_ptr(), q),
        DType::IQ1_M => return super::avx512_iq::decode_iq1_m(x.as_ptr(), q),
        DType::IQ3_XXS if vbmi() => return super::avx512_iq::decode_iq3_xxs(x.as_ptr(), q),
        DType::IQ2_XXS if vbmi() => return super::avx512_iq::decode_iq2_xxs(x.as_ptr(), q),
        t if gemm_lowk::is_grid_iq(t) => {
            return gemm_lowk::decode_iq(t, x, &mut *(q as *mut [u8; 256]), false);
        }
        _ => {
            // Q6_K: [ql[128], qh[64], scales[16] (i8), d]
            for k in 0..16 {
                s.sc[k] = x[192 + k] as i8 as i32;
            }
            for t in 0..8 {
                s.c[t] = pair(32 * s.sc[2 * t], 32 * s.sc[2 * t + 1]);
            }
            s.d = f16(&x[208..210]);
            let top = _mm256_set1_epi8(0x30);
            for h in 0..2 {
                let (a, b, hb) = (ld(64 * h), ld(64 * h + 32), ld(128 + 32 * h));
                let o = 128 * h;
                st(o, _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), top)));
                st(o + 32, _mm256_or_si256(_mm256_and_si256(b, low), _mm256_and_si256(_mm256_slli_epi16(hb, 2), top)));
                let a4 = _mm256_and_si256(_mm256_srli_epi16(a, 4), low);
                st(o + 64, _mm256_or_si256(a4, _mm256_and_si256(hb, top)));
                let b4 = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
                st(o + 96, _mm256_or_si256(b4, _mm256_and_si256(_mm256_srli_epi16(hb, 2), top)));
            }
        }
    }
    s
}

/// Whether `w`'s blocks are decoded as they lie in their recoded layout
/// instead of going back to the file's first: the sign masks of IQ3_XXS
/// ([`crate::packed::xxs_signs`]), IQ2_XXS and IQ2_XS
/// ([`crate::packed::iq2_signs`]; rows stay in place). For IQ3_XXS the way
/// back through the file's sign indices cost 12% of a pp256.
fn reads_recoded(w: &MatRef<'_>) -> bool {
    use crate::packed::Recoding::{Iq2xsSignMasks, Iq2xxsSignMasks, Iq3xxsSignMasks};
    w.packed && matches!(crate::packed::recoding(w.dtype), Some(Iq3xxsSignMasks | Iq2xxsSignMasks | Iq2xsSignMasks))
}

/// Decodes rows `r0..r1` of `w` (file or packed layout) into `d`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_rows(w: &MatRef<'_>, r0: usize, r1: usize, d: &mut Decoded) {
    let (nb, bb) = (w.cols / 256, w.dtype.block_bytes());
    let mut buf = std::mem::take(&mut d.row);
    let recoded = reads_recoded(w);
    let rows = if recoded { &w.data[r0 * w.row_bytes()..r1 * w.row_bytes()] } else { w.rows_file(r0, r1, &mut buf) };
    for k in 0..r1 - r0 {
        let row = &rows[k * w.row_bytes()..];
        for b in 0..nb {
            let q = d.q.as_mut_ptr().add(k * w.cols + b * 256);
            let s = decode_block(w.dtype, &row[b * bb..(b + 1) * bb], q, recoded);
            d.s[k * nb + b] = if gemm_lowk::scale_per_32(w.dtype) { gemm_lowk::fold_to_32(s) } else { s };
        }
    }
    d.row = buf;
}

/// Super-block `b` of `R` decoded rows (codes `q` rows `cols` apart, scales
/// `s` rows `nb` apart) × `G` activation groups (`act[g]`: the group's first
/// super-block): `out[g][r]` = row `r`'s float part for group `g`'s 16 lanes.
/// `SUB`: sub-block length (32: Q4_K/Q5_K/IQ4_XS, 16: Q6_K/Q3_K, 256: Q2_K's
/// scale-folded codes); `MINS`: the `d`/`dmin` combination (Q4_K, Q5_K,
/// Q2_K), else `d·(isum − msum)`.
///
/// Why `R × G` (4 × 3): each code broadcast meets `G` activation vectors and
/// each activation vector `R` codes, so 12 independent `vpdpbusd` chains hide
/// its latency with 7 loads per 12 (8 × 1 made 9 per 8, and 8 chains). Not
/// inlined: the caller's float accumulators stay out of this loop's registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline(never)]
unsafe fn block_parts<const R: usize, const G: usize, const SUB: usize, const MINS: bool>(
    nb: usize,
    cols: usize,
    q: *const u8,
    s: *const Scales,
    act: [*const u8; G],
    b: usize,
) -> [[__m512; R]; G] {
    let blk = act.map(|a| a.add(b * GROUP_BLOCK));
    let mut isum = [[_mm512_setzero_si512(); R]; G];
    for j in 0..256 / SUB {
        let mut acc = [[_mm512_setzero_si512(); R]; G];
        for p in 0..SUB / 4 {
            let pos = j * SUB + 4 * p;
            let av = blk.map(|a| _mm512_loadu_si512(a.add(pos * 16) as *const _));
            for r in 0..R {
                let wq = _mm512_set1_epi32((q.add(r * cols + b * 256 + pos) as *const i32).read_unaligned());
                for g in 0..G {
                    acc[g][r] = _mm512_dpbusd_epi32(acc[g][r], wq, av[g]);
                }
            }
        }
        for r in 0..R {
            let sc = _mm512_set1_epi32((*s.add(r * nb + b)).sc[j]);
            for g in 0..G {
                isum[g][r] = _mm512_add_epi32(isum[g][r], _mm512_mullo_epi32(acc[g][r], sc));
            }
        }
    }
    let mut msum = [[_mm512_setzero_si512(); R]; G];
    if SUB == 32 {
        // `c[t]` = (x_t, x_t): pairs of 32-position sums meet (x_2u, x_2u+1).
        for u in 0..4 {
            let bs = blk.map(|a| _mm512_loadu_si512(a.add(SUM32_AT + u * 64) as *const _));
            for r in 0..R {
                let sc = &*s.add(r * nb + b);
                let c = _mm512_set1_epi32(pair(sc.c[2 * u], sc.c[2 * u + 1]));
                for g in 0..G {
                    msum[g][r] = _mm512_dpwssd_epi32(msum[g][r], bs[g], c);
                }
            }
        }
    } else {
        for t in 0..8 {
            let bs = blk.map(|a| _mm512_loadu_si512(a.add(BSUM_AT + t * 64) as *const _));
            for r in 0..R {
                let c = _mm512_set1_epi32((*s.add(r * nb + b)).c[t]);
                for g in 0..G {
                    msum[g][r] = _mm512_dpwssd_epi32(msum[g][r], bs[g], c);
                }
            }
        }
    }
    let mut parts = [[_mm512_setzero_ps(); R]; G];
    for g in 0..G {
        let da = _mm512_loadu_ps(blk[g].add(D_AT) as *const f32);
        for r in 0..R {
            let sc = &*s.add(r * nb + b);
            // The scalar reference's float steps, in its order (no FMA).
            parts[g][r] = if !MINS {
                let sumi = _mm512_sub_epi32(isum[g][r], msum[g][r]);
                _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sc.d), da), _mm512_cvtepi32_ps(sumi))
            } else {
                let t1 = _mm512_mul_ps(_mm512_mul_ps(da, _mm512_set1_ps(sc.d)), _mm512_cvtepi32_ps(isum[g][r]));
                let t2 = _mm512_mul_ps(_mm512_mul_ps(da, _mm512_set1_ps(sc.dmin)), _mm512_cvtepi32_ps(msum[g][r]));
                _mm512_sub_ps(t1, t2)
            };
        }
    }
    parts
}

/// Adds super-block `b` of rows `0..n` (of the unit) × groups `g0 .. g0 + G`
/// to their accumulators (`acc[g · UNIT_ROWS + row]`, `g` from the chunk's
/// first group), in row tiles of 4 then 1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn add_groups<const G: usize, const SUB: usize, const MINS: bool>(
    (nb, cols, n): (usize, usize, usize),
    q: *const u8,
    s: *const Scales,
    act: [*const u8; G],
    b: usize,
    gi: usize,
    acc: &mut [__m512],
) {
    let mut add = |k: usize, part: &[__m512], g: usize| {
        for (j, v) in part.iter().enumerate() {
            let a = &mut acc[(gi + g) * UNIT_ROWS + k + j];
            *a = _mm512_add_ps(*a, *v);
        }
    };
    let mut k = 0;
    while k + 4 <= n {
        let part = block_parts::<4, G, SUB, MINS>(nb, cols, q.add(k * cols), s.add(k * nb), act, b);
        for (g, p) in part.iter().enumerate() {
            add(k, p, g);
        }
        k += 4;
    }
    while k < n {
        let part = block_parts::<1, G, SUB, MINS>(nb, cols, q.add(k * cols), s.add(k * nb), act, b);
        for (g, p) in part.iter().enumerate() {
            add(k, p, g);
        }
        k += 1;
    }
}

/// Activation groups per pass of [`unit_groups`]: their float accumulators
/// (`UNIT_ROWS × GROUP_CHUNK` vectors, 16 KiB) stay in L1 with the unit's
/// codes of one super-block.
const GROUP_CHUNK: usize = 16;

/// The decoded rows `r0..r1` × every activation group, into `y`. Super-
/// blocks outermost: one super-block of one group's activations (4.6 KB) is
/// read from L2 once and serves all the unit's rows from L1, instead of each
/// 8-row tile streaming the group's whole row of activations (37–103 KB on
/// the 1.1B shapes, more than L1). Each accumulator still adds its super-
/// blocks in order, so the bits do not change.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unit_groups<const SUB: usize, const MINS: bool>(
    w: &MatRef<'_>,
    r0: usize,
    r1: usize,
    d: &Decoded,
    act: &[u8],
    m: usize,
    y: *mut f32,
) {
    let (nb, cols) = (w.cols / 256, w.cols);
    let (q, s) = (d.q.as_ptr(), d.s.as_ptr());
    let n = r1 - r0;
    let groups = m.div_ceil(LANES);
    let mut acc = [_mm512_setzero_ps(); UNIT_ROWS * GROUP_CHUNK];
    for g0 in (0..groups).step_by(GROUP_CHUNK) {
        let gn = GROUP_CHUNK.min(groups - g0);
        acc.fill(_mm512_setzero_ps());
        for b in 0..nb {
            let ag = |g: usize| act.as_ptr().add(g * nb * GROUP_BLOCK);
            // Threes, then twos (16 groups: 3+3+3+3+2+2), then a one: a lone
            // group reloads every code broadcast for 4 `vpdpbusd` (load bound).
            let mut gi = 0;
            while gn - gi >= 3 && gn - gi != 4 {
                let g = g0 + gi;
                add_groups::<3, SUB, MINS>((nb, cols, n), q, s, [ag(g), ag(g + 1), ag(g + 2)], b, gi, &mut acc);
                gi += 3;
            }
            while gn - gi >= 2 {
                let g = g0 + gi;
                add_groups::<2, SUB, MINS>((nb, cols, n), q, s, [ag(g), ag(g + 1)], b, gi, &mut acc);
                gi += 2;
            }
            while gi < gn {
                add_groups::<1, SUB, MINS>((nb, cols, n), q, s, [ag(g0 + gi)], b, gi, &mut acc);
                gi += 1;
            }
        }
        for gi in 0..gn {
            let g = g0 + gi;
            let lanes = (m - g * LANES).min(LANES);
            let tile: &[__m512; UNIT_ROWS] = acc[gi * UNIT_ROWS..][..UNIT_ROWS].try_into().expect("16 rows");
            store_unit(tile, n, lanes, y.add(g * LANES * w.rows + r0), w.rows);
        }
    }
}

/// Rows `r0..r1` of weight `w` for all `m` activation rows, into `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unit(w: &MatRef<'_>, r0: usize, r1: usize, act: &[u8], m: usize, y: *mut f32) {
    DECODED.with(|cell| {
        let mut d = cell.borrow_mut();
        d.q.resize(UNIT_ROWS * w.cols, 0);
        d.s.resize(UNIT_ROWS * (w.cols / 256), Scales::default());
        decode_rows(w, r0, r1, &mut d);
        match w.dtype {
            DType::Q4_K | DType::Q5_K => unit_groups::<32, true>(w, r0, r1, &d, act, m, y),
            DType::Q2_K => unit_groups::<256, true>(w, r0, r1, &d, act, m, y),
            DType::IQ4_XS => unit_groups::<32, false>(w, r0, r1, &d, act, m, y),
            t if gemm_lowk::scale_per_32(t) => unit_groups::<32, false>(w, r0, r1, &d, act, m, y),
            t if gemm_lowk::is_grid_iq(t) => unit_groups::<16, false>(w, r0, r1, &d, act, m, y),
            _ => unit_groups::<16, false>(w, r0, r1, &d, act, m, y),
        }
    });
}

/// `ys[k] = x · ws[k]ᵀ` for K-quant weights (Q2_K..Q6_K, IQ4_XS, the grid I-quants, mixed freely;
/// file layout), `a` the `m` Q8_K activation rows (`a_stride` bytes apart),
/// `act` a reusable buffer.
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
    let nb = ws[0].cols / 256;
    let split = Split { groups: m.div_ceil(LANES), group_bytes: nb * GROUP_BLOCK, unit_rows: UNIT_ROWS };
    lane_gemm::drive(
        pool,
        ws,
        ys,
        act,
        split,
        |g, dst| act_group(a, a_stride, m, nb, g, dst),
        // SAFETY: the caller's contract (this CPU, these shapes); `y` rows r0..r1 are this unit's.
        |w, r0, r1, act, y| unsafe { unit(w, r0, r1, act, m, y) },
    );
}
