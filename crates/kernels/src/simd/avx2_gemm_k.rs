//! AVX2 prefill GEMM for the K-quants (Q4_K, Q5_K, Q6_K; Q2_K, Q3_K, IQ4_XS
//! and the grid I-quants through the decoders of [`super::gemm_lowk`]) with Q8_K
//! activations: the 8-lane sibling of [`super::avx512_gemm_k`] (read its docs
//! for the why and the layouts), for CPUs without AVX-512.
//!
//! Differences: groups of 8 activation rows (position group `p` is 32 bytes),
//! and without `vpdpbusd` each 4-position product sum is `vpmaddubsw` (u8 × i8
//! pairs to i16; position groups are added in i16 before `vpmaddwd` widens
//! them: at most 2·2·63·127 = 32004 for two of Q6_K's 6-bit codes, 2·2·45·127 for
//! Q2_K's scale-folded ones, 8·2·15·127 for eight of Q4_K's, so nothing saturates) and the `bsums` pairs meet the weights' `c` pairs in one
//! `vpmaddwd` each. IQ4_XS's codes (−127..113) take the sign trick instead
//! (see [`super::gemm_lowk`]). The grid I-quants' signed codes are offset to
//! unsigned ones: by 16 for IQ3_S (magnitudes ≤ 15) and IQ1_S/IQ1_M
//! (`8·grid ± 1`), two position groups a `vpmaddwd` as above; by 64 for the
//! IQ2 types and IQ3_XXS (magnitudes ≤ 62), one position group a
//! `vpmaddubsw` (2·126·127 = 32004). The sign trick took five µops per four
//! positions and row where these take three: at plain AVX2 it had left the
//! 1.1B prefill at 0.81–0.93× llama.cpp's AVX2 build (IQ3_S at 0.83× before
//! its offset); offset, pp256 rose 1.34–1.9× (IQ1_S 80 → 150 tok/s, IQ2_XS
//! 82 → 110, IQ2_XXS 84 → 119, IQ3_XXS 90 → 127).
//!
//! The i16 sums widen in a `vpmaddwd` against the sub-block's scale in
//! every word, not against ones and then a `vpmulld` a sub-block, and as
//! many position groups add up in i16 first as the codes allow (`STEPS`:
//! Q4_K eight, a whole sub-block; Q5_K, IQ3_S and the IQ1 types four, and
//! Q3_K's four, its whole sub-block of 16; Q6_K and Q2_K two). Measured (`bench_matmul 2 256`, the Zen 3 VM, two or
//! three alternating pairs): Q4_K 1.04×, Q5_K 1.07×, Q6_K 1.04×, IQ3_S
//! 1.18×, IQ4_XS 1.05×, Q2_K unchanged.
//!
//! Numerics: as the AVX-512 one, every integer sum is exact and the float
//! steps are the scalar reference's, so results equal `matmul_reference` bit
//! for bit at `m ≥` [`MIN_M`].

use super::gemm_lowk::{self, f16, pair, Scales};
use super::lane_gemm::{self, Split};
use crate::matmul::MatRef;
use crate::quant::q4_k::scales_mins;
use crate::{DType, ThreadPool};
use std::arch::x86_64::*;

/// The offset of IQ1_S's and IQ1_M's unsigned codes (`8·grid ± 1` is −9..9).
const IQ1_OFFSET: i32 = 16;
/// The offset of IQ2_XXS's, IQ2_XS's, IQ2_S's and IQ3_XXS's unsigned codes
/// (`±grid`, magnitudes at most 62: codes 2..126, one position group per
/// `vpmaddubsw`, at most 2·126·127 = 32004).
const GRID_OFFSET: i32 = 64;

/// How [`rows_x_group`] multiplies codes: unsigned, two position groups
/// added in i16 before widening (codes small enough: Q-K types, IQ3_S, IQ1);
/// signed with the sign trick (IQ4_XS), no `msum`; unsigned, one position
/// group per `vpmaddubsw` (the offset grid codes).
const PAIRS: u8 = 0;
const SIGNED: u8 = 1;
const SINGLE: u8 = 2;

/// Smallest batch that takes this path (decode batches stay on the one-row
/// kernels, bit-identical to single-row decode).
pub const MIN_M: usize = 32;

/// The smallest batch the grid I-quants (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS,
/// IQ2_S, IQ1_S, IQ1_M) take the GEMM from. Their one-row kernels are bound
/// by the grid lookups, which a batch repeats for every row: at the 1.1B
/// shapes (`bench_matmul 2 M`, the Zen 3 VM) m = 8 ran 9.7–13.9 tok/s in
/// the row kernels and 35–45 in this GEMM, m = 4 10–13 against 16–20; at
/// m = 2 the row kernels stay ahead (10.8–11.7 against 8.1–10.6).
pub const MIN_M_GRID: usize = 4;
/// Weight rows decoded per unit of work.
const UNIT_ROWS: usize = 16;
/// Activation rows per group (the vector lanes).
const LANES: usize = 8;
/// Bytes of one super-block of one activation group: 64 × 32 quant bytes,
/// 8 f32 `d` (offset [`D_AT`]), 8 × 32 bytes of `bsums` pairs ([`BSUM_AT`]).
const GROUP_BLOCK: usize = 2048 + 32 + 256;
const D_AT: usize = 2048;
const BSUM_AT: usize = 2080;
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
                dst[p * 32 + lane * 4..p * 32 + lane * 4 + 4].copy_from_slice(&blk[4 + 4 * p..8 + 4 * p]);
            }
            dst[D_AT + lane * 4..D_AT + lane * 4 + 4].copy_from_slice(&blk[..4]);
            for t in 0..8 {
                let o = BSUM_AT + t * 32 + lane * 4;
                dst[o..o + 4].copy_from_slice(&blk[260 + 4 * t..264 + 4 * t]);
            }
        }
    }
}

/// Adds `o` to the 256 signed codes at `q` (making them unsigned).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn add_offset(q: *mut u8, o: i32) {
    let o = _mm256_set1_epi8(o as i8);
    for c in 0..8 {
        let p = q.add(32 * c) as *mut __m256i;
        _mm256_storeu_si256(p, _mm256_add_epi8(_mm256_loadu_si256(p), o));
    }
}

/// Decodes one super-block `x` of `dtype` into 256 codes at `q` and its scales.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_block(dtype: DType, x: &[u8], q: *mut u8) -> Scales {
    let ld = |o: usize| _mm256_loadu_si256(x.as_ptr().add(o) as *const __m256i);
    let st = |o: usize, v: __m256i| _mm256_storeu_si256(q.add(o) as *mut __m256i, v);
    let low = _mm256_set1_epi8(0x0F);
    let mut s = Scales::default();
    match dtype {
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
        DType::IQ4_XS => return gemm_lowk::decode_iq4_xs(x, q, true),
        DType::IQ3_S => return gemm_lowk::decode_iq3_s_avx2::<true>(x, q),
        DType::IQ3_XXS | DType::IQ2_XS | DType::IQ2_XXS | DType::IQ2_S => {
            let s = match dtype {
                DType::IQ3_XXS => gemm_lowk::decode_iq3_xxs_avx2(x, q),
                DType::IQ2_XS => gemm_lowk::decode_iq2_xs_avx2(x, q),
                DType::IQ2_XXS => gemm_lowk::decode_iq2_xxs_avx2(x, q),
                _ => gemm_lowk::decode_iq(dtype, x, &mut *(q as *mut [u8; 256]), true),
            };
            add_offset(q, GRID_OFFSET);
            return s;
        }
        DType::IQ1_S | DType::IQ1_M => {
            // Codes 8·grid ± 1 (−9..9) offset by IQ1_OFFSET: unsigned, so the
            // two-position-group path takes them (at most 2·2·25·127).
            let s = gemm_lowk::decode_iq(dtype, x, &mut *(q as *mut [u8; 256]), true);
            add_offset(q, IQ1_OFFSET);
            return s;
        }
        t if gemm_lowk::is_grid_iq(t) => {
            return gemm_lowk::decode_iq(t, x, &mut *(q as *mut [u8; 256]), true);
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

/// Decodes rows `r0..r1` of `w` (file or packed layout) into `d`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_rows(w: &MatRef<'_>, r0: usize, r1: usize, d: &mut Decoded) {
    let (nb, bb) = (w.cols / 256, w.dtype.block_bytes());
    let mut buf = std::mem::take(&mut d.row);
    let rows = w.rows_file(r0, r1, &mut buf);
    for k in 0..r1 - r0 {
        let row = &rows[k * w.row_bytes()..];
        for b in 0..nb {
            let q = d.q.as_mut_ptr().add(k * w.cols + b * 256);
            let s = decode_block(w.dtype, &row[b * bb..(b + 1) * bb], q);
            d.s[k * nb + b] = if gemm_lowk::scale_per_32(w.dtype) { gemm_lowk::fold_to_32(s) } else { s };
            // Codes offset for the unsigned path carry their offset, not 128,
            // in the `c` pairs.
            let s = &mut d.s[k * nb + b];
            let o = match w.dtype {
                DType::IQ3_S => gemm_lowk::IQ3S_OFFSET,
                DType::IQ1_S | DType::IQ1_M => IQ1_OFFSET,
                DType::IQ3_XXS | DType::IQ2_XS | DType::IQ2_XXS | DType::IQ2_S => GRID_OFFSET,
                _ => 0,
            };
            if o != 0 && gemm_lowk::scale_per_32(w.dtype) {
                for j in 0..8 {
                    s.c[j] = pair(o * s.sc[j], o * s.sc[j]);
                }
            } else if o != 0 {
                for t in 0..8 {
                    s.c[t] = pair(o * s.sc[2 * t], o * s.sc[2 * t + 1]);
                }
            }
        }
    }
    d.row = buf;
}

/// `R` decoded rows (codes `q` rows `cols` apart, scales `s` rows `nb` apart)
/// × one activation group: `out[r]` = the 16 lanes' results of row `r`.
/// `SUB`: sub-block length (32: Q4_K/Q5_K/IQ4_XS, 16: Q6_K/Q3_K, 256: Q2_K's
/// scale-folded codes);
/// `MINS`: the `d`/`dmin` combination (Q4_K, Q5_K, Q2_K), else `d·(isum − msum)`;
/// `MODE`: [`PAIRS`], [`SINGLE`], or [`SIGNED`]: the codes are i8 (IQ4_XS),
/// multiplied as `|w|·sign(a, w)`, one position group per `vpmaddubsw` (at
/// most 2·127·127 = 32258), no `msum`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_x_group<const R: usize, const SUB: usize, const MINS: bool, const MODE: u8, const STEPS: usize>(
    nb: usize,
    cols: usize,
    q: *const u8,
    s: *const Scales,
    act: *const u8,
) -> [__m256; R] {
    let mut accf = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let blk = act.add(b * GROUP_BLOCK);
        let mut isum = [_mm256_setzero_si256(); R];
        for j in 0..256 / SUB {
            // Sub-block j's scale in every word: `vpmaddwd` widens the i16
            // sums and scales them in one µop (no `vpmulld` a sub-block).
            let sc = |r: usize| _mm256_set1_epi16((*s.add(r * nb + b)).sc[j] as i16);
            if MODE == SINGLE {
                for p in 0..SUB / 4 {
                    let pos = j * SUB + 4 * p;
                    let a = _mm256_loadu_si256(blk.add(pos * 8) as *const __m256i);
                    for (r, is) in isum.iter_mut().enumerate() {
                        let w = _mm256_set1_epi32((q.add(r * cols + b * 256 + pos) as *const i32).read_unaligned());
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), sc(r)));
                    }
                }
            } else if MODE == SIGNED {
                for p in 0..SUB / 4 {
                    let pos = j * SUB + 4 * p;
                    let a = _mm256_loadu_si256(blk.add(pos * 8) as *const __m256i);
                    for (r, is) in isum.iter_mut().enumerate() {
                        let w = _mm256_set1_epi32((q.add(r * cols + b * 256 + pos) as *const i32).read_unaligned());
                        let p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(p16, sc(r)));
                    }
                }
            } else {
                for p0 in (0..SUB / 4).step_by(STEPS) {
                    let mut s16 = [_mm256_setzero_si256(); R];
                    for p in p0..p0 + STEPS {
                        let pos = j * SUB + 4 * p;
                        let a = _mm256_loadu_si256(blk.add(pos * 8) as *const __m256i);
                        for (r, s16_r) in s16.iter_mut().enumerate() {
                            let w = _mm256_set1_epi32((q.add(r * cols + b * 256 + pos) as *const i32).read_unaligned());
                            *s16_r = _mm256_add_epi16(*s16_r, _mm256_maddubs_epi16(w, a));
                        }
                    }
                    for (r, is) in isum.iter_mut().enumerate() {
                        *is = _mm256_add_epi32(*is, _mm256_madd_epi16(s16[r], sc(r)));
                    }
                }
            }
        }
        let mut msum = [_mm256_setzero_si256(); R];
        for t in 0..if MODE == SIGNED { 0 } else { 8 } {
            let bs = _mm256_loadu_si256(blk.add(BSUM_AT + t * 32) as *const __m256i);
            for r in 0..R {
                let c = _mm256_set1_epi32((*s.add(r * nb + b)).c[t]);
                msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(bs, c));
            }
        }
        let da = _mm256_loadu_ps(blk.add(D_AT) as *const f32);
        for r in 0..R {
            let sc = &*s.add(r * nb + b);
            // The scalar reference's float steps, in its order (no FMA).
            let part = if !MINS {
                let sumi = _mm256_sub_epi32(isum[r], msum[r]);
                _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(sc.d), da), _mm256_cvtepi32_ps(sumi))
            } else {
                let t1 = _mm256_mul_ps(_mm256_mul_ps(da, _mm256_set1_ps(sc.d)), _mm256_cvtepi32_ps(isum[r]));
                let t2 = _mm256_mul_ps(_mm256_mul_ps(da, _mm256_set1_ps(sc.dmin)), _mm256_cvtepi32_ps(msum[r]));
                _mm256_sub_ps(t1, t2)
            };
            accf[r] = _mm256_add_ps(accf[r], part);
        }
    }
    accf
}

/// The decoded rows `r0..r1` × every activation group, into `y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unit_groups<const SUB: usize, const MINS: bool, const MODE: u8, const STEPS: usize>(
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
    lane_gemm::tiles8(
        m,
        r1 - r0,
        w.rows,
        r0,
        act,
        nb * GROUP_BLOCK,
        y,
        // SAFETY: this CPU (the caller's target features); rows k.. of the decoded unit.
        |k, ag| unsafe { rows_x_group::<4, SUB, MINS, MODE, STEPS>(nb, cols, q.add(k * cols), s.add(k * nb), ag) },
        |k, ag| unsafe { rows_x_group::<1, SUB, MINS, MODE, STEPS>(nb, cols, q.add(k * cols), s.add(k * nb), ag) },
    );
}

/// Rows `r0..r1` of weight `w` for all `m` activation rows, into `y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unit(w: &MatRef<'_>, r0: usize, r1: usize, act: &[u8], m: usize, y: *mut f32) {
    DECODED.with(|cell| {
        let mut d = cell.borrow_mut();
        d.q.resize(UNIT_ROWS * w.cols, 0);
        d.s.resize(UNIT_ROWS * (w.cols / 256), Scales::default());
        decode_rows(w, r0, r1, &mut d);
        match w.dtype {
            // STEPS: position groups whose `vpmaddubsw` pairs add up in i16
            // (at most 2·STEPS·max code·127 < 2¹⁵).
            DType::Q4_K => unit_groups::<32, true, PAIRS, 8>(w, r0, r1, &d, act, m, y),
            DType::Q5_K => unit_groups::<32, true, PAIRS, 4>(w, r0, r1, &d, act, m, y),
            DType::Q2_K => unit_groups::<256, true, PAIRS, 2>(w, r0, r1, &d, act, m, y),
            DType::Q3_K => unit_groups::<16, false, PAIRS, 4>(w, r0, r1, &d, act, m, y),
            DType::IQ4_XS => unit_groups::<32, false, SIGNED, 1>(w, r0, r1, &d, act, m, y),
            DType::IQ3_S | DType::IQ1_S => unit_groups::<32, false, PAIRS, 4>(w, r0, r1, &d, act, m, y),
            DType::IQ1_M => unit_groups::<16, false, PAIRS, 4>(w, r0, r1, &d, act, m, y),
            t if gemm_lowk::scale_per_32(t) => unit_groups::<32, false, SINGLE, 1>(w, r0, r1, &d, act, m, y),
            t if gemm_lowk::is_grid_iq(t) => unit_groups::<16, false, SINGLE, 1>(w, r0, r1, &d, act, m, y),
            _ => unit_groups::<16, false, PAIRS, 2>(w, r0, r1, &d, act, m, y),
        }
    });
}

/// `ys[k] = x · ws[k]ᵀ` for K-quant weights (Q2_K..Q6_K, IQ4_XS, the grid I-quants, mixed freely;
/// file layout), `a` the `m` Q8_K activation rows (`a_stride` bytes apart),
/// `act` a reusable buffer.
///
/// # Safety
/// AVX2+FMA CPU; shapes as checked by `matmul` (`ys[k]` holds
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
