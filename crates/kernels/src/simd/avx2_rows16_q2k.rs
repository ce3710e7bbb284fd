//! The plain-AVX2 (no VNNI) Q2_K tile of the sixteen-row kernels in
//! [`super::avx2_rows16_k`]: both eight-row halves of a group at once, and
//! the code planes masked in place where the product allows.
//!
//! Why: the first AVX2 Q2_K tile ran one half at a time, so each four-byte
//! activation broadcast fed one product and every activation was broadcast
//! twice a group; and each of a byte's four 2-bit planes cost a shift and a
//! mask. Q2_K was the one compute-bound type of a Q2_K file on the Zen 3 VM:
//! 8.8 ns per 256 values of a row in L2 (9.6 GB/s a core, below a core's
//! share of the memory bandwidth), and two threads streamed 18.5 GB/s of
//! weights where Q6_K and Q4_K streamed 22–28.
//!
//! Now per code vector `q` (four bytes of each of eight rows) the planes are
//! `q & 3`, `q & 12`, `(q >> 4) & 3` and `(q >> 4) & 12` (one 16-bit shift
//! shared by two planes; the mask drops what crosses from the neighbouring
//! byte): the odd planes carry their codes times 4. A group's four
//! `vpmaddubsw` then sum in i16 to at most 4 · 2 · 12 · 127 = 12192 < 2¹⁵,
//! and the odd planes' `vpmaddwd` sums gather in their own i32 accumulator,
//! shifted right by 2 once a super-block (exact: every term is a multiple
//! of 4). Each activation broadcast feeds both halves.
//!
//! Each plane's loops are spelled out (`Quarter::run::<J, JB>`): with the
//! plane a loop variable LLVM kept the loops rolled, and the first version
//! of this tile gained only 4%. `ONLY=q2_k PACKED=1 bench_kdot 256 2048`
//! (L2, one core, four alternating runs): 6.2–6.7 ns per 256 values of a
//! row before, 4.65–4.9 after.
//!
//! Numerics are the first tile's: exact integer sums, then `q2_k::combine`'s
//! float step in super-block order, so every row still equals
//! `quant::q2_k::vec_dot` bit for bit.

use super::avx2_k::ld;
use super::avx2_rows16_k::{bcast4, byte_ctl, f16_pairs, q2k_min_ctl, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Lanes16 bytes of one Q2_K super-block of sixteen rows (84 bytes a row).
const BLOCK: usize = 16 * 84;

/// Plane `jb` of the code vector at `q`: bits `2jb..2jb + 2` of each byte,
/// in place for odd `jb` (times 4).
#[inline(always)]
unsafe fn plane(q: *const u8, jb: usize, three: __m256i, twelve: __m256i) -> __m256i {
    let v = ld(q);
    match jb {
        0 => _mm256_and_si256(v, three),
        1 => _mm256_and_si256(v, twelve),
        2 => _mm256_and_si256(_mm256_srli_epi16::<4>(v), three),
        _ => _mm256_and_si256(_mm256_srli_epi16::<4>(v), twelve),
    }
}

/// One group of sixteen Q2_K rows × `J` activation rows, both halves at
/// once (layout and mins as in `avx2_rows16_k::tile_q2_k`). `V` must be
/// false: the AVX-VNNI kernel keeps the first tile.
///
/// # Safety
/// AVX2/FMA/F16C, called from a `#[target_feature]` entry point; `w` holds
/// `nb` super-blocks of the group, `a` `J` Q8_K rows `a_stride` apart, `y`
/// sixteen floats at each of `J` rows `y_stride` apart.
#[inline(always)]
pub(super) unsafe fn tile_q2_k_halves<const J: usize, const V: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    debug_assert!(!V);
    let (low4, three, twelve) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3), _mm256_set1_epi8(12));
    let pairs = [byte_ctl(0, false), byte_ctl(1, false), byte_ctl(2, false), byte_ctl(3, false)];
    let (m01, m23) = q2k_min_ctl();
    let zero = _mm256_setzero_si256();
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..BLOCK / 64 {
            prefetch_l2(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        // [j][half]: Σ sc·S of the even planes, and 4·Σ sc·S of the odd ones.
        let mut even = [[zero; 2]; J];
        let mut odd = [[zero; 2]; J];
        for h in 0..2 {
            let q = Quarter { x, h, three, twelve, low4 };
            q.run::<J, 0>(&act, &pairs, &mut even);
            q.run::<J, 1>(&act, &pairs, &mut odd);
            q.run::<J, 2>(&act, &pairs, &mut even);
            q.run::<J, 3>(&act, &pairs, &mut odd);
        }
        // Mins: groups (2t, 2t + 1) are bytes 2(t mod 2), +1 of vector t / 2.
        let mut summ = [[zero; 2]; J];
        for t in 0..8 {
            let mut bs = [zero; J];
            for (j, v) in bs.iter_mut().enumerate() {
                *v = bcast4(act[j].add(Q8K_BSUMS + 4 * t));
            }
            for r in 0..2 {
                let mv = _mm256_and_si256(_mm256_srli_epi16::<4>(ld(x.add(64 * (t / 2) + 32 * r))), low4);
                let mp = _mm256_shuffle_epi8(mv, if t % 2 == 0 { m01 } else { m23 });
                for j in 0..J {
                    summ[j][r] = _mm256_add_epi32(summ[j][r], _mm256_madd_epi16(mp, bs[j]));
                }
            }
        }
        for r in 0..2 {
            let (d, dmin) = f16_pairs(ld(x.add(20 * 64 + 32 * r)));
            for j in 0..J {
                let sumi = _mm256_add_epi32(even[j][r], _mm256_srai_epi32::<2>(odd[j][r]));
                let yd = _mm256_set1_ps((act[j] as *const f32).read_unaligned());
                let t1 = _mm256_mul_ps(_mm256_mul_ps(yd, d), _mm256_cvtepi32_ps(sumi));
                let t2 = _mm256_mul_ps(_mm256_mul_ps(yd, dmin), _mm256_cvtepi32_ps(summ[j][r]));
                sums[j][r] = _mm256_add_ps(sums[j][r], _mm256_sub_ps(t1, t2));
            }
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}

/// Plane `JB` of half `h` of one super-block: groups `8h + 2JB` and
/// `8h + 2JB + 1` (the loops are spelled out per plane so that each
/// plane's mask and shift are constants).
struct Quarter {
    x: *const u8,
    h: usize,
    three: __m256i,
    twelve: __m256i,
    low4: __m256i,
}

impl Quarter {
    /// Adds `Σ sc·S` of the quarter's two groups (times 4 for odd `JB`)
    /// to `acc[j][half]`.
    #[inline(always)]
    unsafe fn run<const J: usize, const JB: usize>(
        &self,
        act: &[*const u8; J],
        pairs: &[__m256i; 4],
        acc: &mut [[__m256i; 2]; J],
    ) {
        let (x, h) = (self.x, self.h);
        for gi in 0..2 {
            let g = 8 * h + 2 * JB + gi;
            let mut p = [[_mm256_setzero_si256(); 2]; J];
            for u in 4 * gi..4 * gi + 4 {
                let mut ya = [_mm256_setzero_si256(); J];
                for (j, v) in ya.iter_mut().enumerate() {
                    *v = bcast4(act[j].add(Q8K_QS + 128 * h + 32 * JB + 4 * u));
                }
                for r in 0..2 {
                    let c = plane(x.add(64 * (4 + 8 * h + u) + 32 * r), JB, self.three, self.twelve);
                    for j in 0..J {
                        p[j][r] = _mm256_add_epi16(p[j][r], _mm256_maddubs_epi16(c, ya[j]));
                    }
                }
            }
            for r in 0..2 {
                let sv = _mm256_and_si256(ld(x.add(64 * (g / 4) + 32 * r)), self.low4);
                let sc = _mm256_shuffle_epi8(sv, pairs[(2 * JB + gi) % 4]);
                for j in 0..J {
                    acc[j][r] = _mm256_add_epi32(acc[j][r], _mm256_madd_epi16(p[j][r], sc));
                }
            }
        }
    }
}
