//! AVX2 prefill GEMM for the 32-value types whose blocks are one scale and
//! 32 signed codes against Q8_0 activations (IQ4_NL, Q5_0, Q4_0, Q8_0), with eight
//! activation rows in the vector lanes: the AVX2 counterpart of what
//! [`super::avx512_gemm`] does for the 32-value types at AVX-512.
//!
//! Why: at AVX2, IQ4_NL prefill ran the 4 × 2 tile, one weight block looked
//! up and reduced per pair of activation rows (the 1.1B IQ4_NL file
//! prefilled at 0.41–0.50× llama.cpp's AVX2 build), and Q5_0 (most of a
//! SmolLM2 "Q4_K_M") ran its one-row decode kernel for every activation
//! row. Here each weight block is decoded once per call into
//! signed codes (IQ4_NL: `vpshufb` of the nibbles in the codebook; Q5_0: the
//! nibbles with their fifth bits, −16) and then meets every
//! group of eight activation rows.
//!
//! Layouts:
//! * activations, per group of 8 rows and per 32-value block
//!   ([`GROUP_BLOCK`] bytes): 8 position groups of 4 values × 8 lanes
//!   (32 bytes each, lane = row), then the 8 rows' `d` as f32, then their
//!   code sums `Σ a` as i32;
//! * decoded weights, per row: `cols` codes (signed −127..127, or Q4_0's
//!   and Q5_0's unsigned ones) and one f32 `d` per block.
//!
//! Products, two ways:
//! * Q4_0 and Q5_0 keep their codes unsigned (`n`, 0..15 or 0..31) and
//!   take the offset out afterwards: `Σ (n − o)·a = Σ n·a − o·Σ a`, with
//!   `Σ a` of each activation block laid out beside its codes. `vpmaddubsw`
//!   reads `n` as it is, so a step is one `vpmaddubsw` and one i16 add; the
//!   pairs of a block add up in i16 before one `vpmaddwd` (Q4_0: eight
//!   steps, at most 8·2·15·127 = 30480 < 2¹⁵; Q5_0: two sums of four,
//!   4·2·31·127 = 31496). Before, every step also took a `vpabsb`, a
//!   `vpsignb` and a `vpmaddwd`: five vector µops for 32 products, now two.
//! * IQ4_NL's and Q8_0's codes span most of i8, where an offset would
//!   overflow the pairs: `vpmaddubsw` takes `|w|` and the activations with
//!   `w`'s sign (`vpsignb`; Q8_0 activation codes are −127..127, so no
//!   negation wraps, and a pair is at most 2·127·127 < 2¹⁵), then `vpmaddwd`
//!   with ones into i32.
//!
//! Numerics: a block's integer sum is exact and its float step is the scalar
//! reference's, `(d_a·d)·isum` added block by block (the two references
//! write it `d_a·d·isum` and `isum·(d·d_a)`: the same bits), so every result
//! equals the scalar `vec_dot` bit for bit.

use super::lane_gemm::{self, Split};
use crate::matmul::MatRef;
use crate::quant::iq4_nl::KVALUES;
use crate::{DType, ThreadPool};
use std::arch::x86_64::*;

/// Smallest batch that takes this path (below it IQ4_NL's tile, Q5_0's
/// one-row kernel).
pub const MIN_M: usize = 32;
/// Weight rows decoded per unit of work.
const UNIT_ROWS: usize = 16;
/// Activation rows per group (the vector lanes).
const LANES: usize = 8;
/// Bytes of one block of one activation group: 8 × 32 quant bytes, 8 f32
/// `d`, 8 i32 code sums.
const GROUP_BLOCK: usize = 256 + 32 + 32;
const D_AT: usize = 256;
const SUM_AT: usize = 288;
/// Q8_0 activation block bytes.
const A_BYTES: usize = 34;

thread_local! {
    /// This thread's decoded rows: codes, per-block `d`, and a buffer for
    /// the rows of a packed weight unpacked.
    static DECODED: std::cell::RefCell<(Vec<i8>, Vec<f32>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Group `g` of the activations in the lane layout into `dst`
/// (`nb · GROUP_BLOCK` bytes, zeroed).
fn act_group(a: &[u8], a_stride: usize, m: usize, nb: usize, g: usize, dst: &mut [u8]) {
    for lane in 0..(m - g * LANES).min(LANES) {
        let row = &a[(g * LANES + lane) * a_stride..];
        for b in 0..nb {
            let blk = &row[b * A_BYTES..(b + 1) * A_BYTES];
            let dst = &mut dst[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
            for p in 0..8 {
                dst[p * 32 + lane * 4..p * 32 + lane * 4 + 4].copy_from_slice(&blk[2 + 4 * p..6 + 4 * p]);
            }
            let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
            dst[D_AT + lane * 4..D_AT + lane * 4 + 4].copy_from_slice(&d.to_le_bytes());
            let sum: i32 = blk[2..A_BYTES].iter().map(|&c| c as i8 as i32).sum();
            dst[SUM_AT + lane * 4..SUM_AT + lane * 4 + 4].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Rows `r0..r1` of `w` into codes `q` (row after row, `cols` apart) and
/// block scales `d` (`nb` apart).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_rows(w: &MatRef<'_>, r0: usize, r1: usize, q: &mut [i8], d: &mut [f32], buf: &mut Vec<u8>) {
    let (nb, bb) = (w.cols / 32, w.dtype.block_bytes());
    let t = _mm_loadu_si128(KVALUES.as_ptr() as *const __m128i);
    let low = _mm_set1_epi8(0x0F);
    let rows = w.rows_file(r0, r1, buf);
    for k in 0..r1 - r0 {
        let row = &rows[k * w.row_bytes()..];
        for b in 0..nb {
            let x = row.as_ptr().add(b * bb);
            d[k * nb + b] = half::f16::from_bits((x as *const u16).read_unaligned()).to_f32();
            let dst = q.as_mut_ptr().add(k * w.cols + 32 * b) as *mut __m256i;
            let codes = match w.dtype {
                DType::Q5_0 => {
                    // [d, qh (u32), qs[16]]: value j < 16 is qs[j]'s low
                    // nibble | bit j of qh << 4, value j + 16 the high nibble
                    // | bit j + 16; minus 16.
                    let qh = (x.add(2) as *const u32).read_unaligned();
                    let v = _mm_loadu_si128(x.add(6) as *const __m128i);
                    let nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(v), low), _mm_and_si128(v, low));
                    let high = _mm256_and_si256(super::gemm_lowk::sign_mask32(qh), _mm256_set1_epi8(0x10));
                    // Unsigned: the −16 is taken out with the block's Σ a.
                    _mm256_or_si256(nib, high)
                }
                DType::Q4_0 => {
                    // [d, qs[16]]: value j < 16 the low nibble of qs[j], value
                    // j + 16 its high nibble (unsigned: the −8 as for Q5_0).
                    let v = _mm_loadu_si128(x.add(2) as *const __m128i);
                    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(v), low), _mm_and_si128(v, low))
                }
                // [d, qs[32]]: the codes as they are. A −128 works too: its
                // `vpabsb` is 0x80, which `vpmaddubsw` reads as 128.
                DType::Q8_0 => _mm256_loadu_si256(x.add(2) as *const __m256i),
                _ => {
                    // IQ4_NL [d, qs[16]]: values 0..16 are the low nibbles'
                    // codebook entries, 16..32 the high ones'.
                    let v = _mm_loadu_si128(x.add(2) as *const __m128i);
                    let lo = _mm_shuffle_epi8(t, _mm_and_si128(v, low));
                    let hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16::<4>(v), low));
                    _mm256_set_m128i(hi, lo)
                }
            };
            _mm256_storeu_si256(dst, codes);
        }
    }
}

/// The integer sums of block `b` (at `blk`) of `R` decoded rows: lane `l` of
/// `acc[r]` is row `r`'s codes against activation row `l`'s. `OFF` 0: the
/// codes are signed; else unsigned, less `OFF`, their i16 pairs added over
/// `STEPS` steps before each `vpmaddwd`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_isums<const R: usize, const OFF: i32, const STEPS: usize>(
    cols: usize,
    q: *const i8,
    b: usize,
    blk: *const u8,
) -> [__m256i; R] {
    let ones = _mm256_set1_epi16(1);
    let w_at =
        |r: usize, p: usize| _mm256_set1_epi32((q.add(r * cols + 32 * b + 4 * p) as *const i32).read_unaligned());
    let mut acc = [_mm256_setzero_si256(); R];
    if OFF == 0 {
        for p in 0..8 {
            let a = _mm256_loadu_si256(blk.add(p * 32) as *const __m256i);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let w = w_at(r, p);
                let p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
                *acc_r = _mm256_add_epi32(*acc_r, _mm256_madd_epi16(p16, ones));
            }
        }
        return acc;
    }
    for p0 in (0..8).step_by(STEPS) {
        let mut s16 = [_mm256_setzero_si256(); R];
        for p in p0..p0 + STEPS {
            let a = _mm256_loadu_si256(blk.add(p * 32) as *const __m256i);
            for (r, s) in s16.iter_mut().enumerate() {
                *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(w_at(r, p), a));
            }
        }
        for (acc_r, s) in acc.iter_mut().zip(s16) {
            *acc_r = _mm256_add_epi32(*acc_r, _mm256_madd_epi16(s, ones));
        }
    }
    let off = _mm256_mullo_epi32(_mm256_loadu_si256(blk.add(SUM_AT) as *const __m256i), _mm256_set1_epi32(OFF));
    for acc_r in acc.iter_mut() {
        *acc_r = _mm256_sub_epi32(*acc_r, off);
    }
    acc
}

/// `R` decoded rows × one activation group: lane `l` of `out[r]` is row `r`
/// against activation row `l`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_x_group<const R: usize, const OFF: i32, const STEPS: usize>(
    nb: usize,
    cols: usize,
    q: *const i8,
    d: *const f32,
    act: *const u8,
) -> [__m256; R] {
    let mut accf = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let blk = act.add(b * GROUP_BLOCK);
        let acc = block_isums::<R, OFF, STEPS>(cols, q, b, blk);
        let da = _mm256_loadu_ps(blk.add(D_AT) as *const f32);
        for r in 0..R {
            // The scalar reference's `d_a · d · isum`, in its order (no FMA).
            let dw = _mm256_set1_ps(*d.add(r * nb + b));
            accf[r] = _mm256_add_ps(accf[r], _mm256_mul_ps(_mm256_mul_ps(da, dw), _mm256_cvtepi32_ps(acc[r])));
        }
    }
    accf
}

/// Rows `r0..r1` of weight `w` for all `m` activation rows, into `y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unit(w: &MatRef<'_>, r0: usize, r1: usize, act: &[u8], m: usize, y: *mut f32) {
    DECODED.with(|cell| {
        let (q, d, buf) = &mut *cell.borrow_mut();
        let nb = w.cols / 32;
        q.resize(UNIT_ROWS * w.cols, 0);
        d.resize(UNIT_ROWS * nb, 0.0);
        decode_rows(w, r0, r1, q, d, buf);
        // `OFF`, `STEPS` of [`block_isums`]: Q4_0 and Q5_0 unsigned with
        // their offsets, the rest signed.
        match w.dtype {
            DType::Q4_0 => groups::<8, 8>(w, r0, r1, act, m, y, q, d),
            DType::Q5_0 => groups::<16, 4>(w, r0, r1, act, m, y, q, d),
            _ => groups::<0, 8>(w, r0, r1, act, m, y, q, d),
        }
    });
}

/// Decoded rows `r0..r1` (`q`, `d`) against every activation group, into
/// `y` ([`block_isums`]' `OFF` and `STEPS`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups<const OFF: i32, const STEPS: usize>(
    w: &MatRef<'_>,
    r0: usize,
    r1: usize,
    act: &[u8],
    m: usize,
    y: *mut f32,
    q: &[i8],
    d: &[f32],
) {
    let (nb, cols) = (w.cols / 32, w.cols);
    let (q, d) = (q.as_ptr(), d.as_ptr());
    lane_gemm::tiles8(
        m,
        r1 - r0,
        w.rows,
        r0,
        act,
        nb * GROUP_BLOCK,
        y,
        // SAFETY: this CPU (the caller's target features); rows k.. of the decoded unit.
        |k, ag| unsafe { rows_x_group::<4, OFF, STEPS>(nb, cols, q.add(k * cols), d.add(k * nb), ag) },
        |k, ag| unsafe { rows_x_group::<1, OFF, STEPS>(nb, cols, q.add(k * cols), d.add(k * nb), ag) },
    );
}

/// Whether this GEMM reads `dtype`.
pub fn takes(dtype: DType) -> bool {
    matches!(dtype, DType::IQ4_NL | DType::Q5_0 | DType::Q4_0 | DType::Q8_0)
}

/// `ys[k] = x · ws[k]ᵀ` for IQ4_NL, Q5_0, Q4_0 and Q8_0 weights (mixed freely),
/// `a` the `m` Q8_0 activation rows
/// (`a_stride` bytes apart), `act` a reusable buffer.
///
/// # Safety
/// AVX2+FMA+F16C CPU; shapes as checked by `matmul` (`ys[k]` holds
/// `m × ws[k].rows`, every weight is of a type [`takes`] lists, with `a`'s
/// column count).
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
