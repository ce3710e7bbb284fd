//! Attention scores against a quantized KV cache in integers: each query row
//! (already multiplied by the softmax scale) is quantized once per tile to int8
//! in blocks of 32 values, like Q8_0 ([`QuantQuery`]), and its dot product with a
//! cached key is, per 32-value block `b`, an exact integer sum `I_b = Σ q·k` of
//! codes, scaled by the two block scales:
//!
//! ```text
//! s = Σ_b f32(I_b) · (dq_b · dk_b)      (b = 0: a product; b > 0: an FMA onto s)
//! ```
//!
//! The integer sums are exact at every ISA level (AVX-512 VNNI `vpdpbusd`, AVX2
//! `maddubs`, scalar), and the float steps are the same operations in the same
//! order, so every level gives bit-identical scores; [`q8_0_scores`] and
//! [`q4_0_scores`] at [`Isa::Scalar`] are the references.
//!
//! Why: at depth, decode attention is bound by the arithmetic per key, and
//! widening a Q8_0 key block to f32 costs about what widening f16 does. The
//! integer path reads the codes as they are stored (no widen of K) and does
//! 64 multiply-adds per instruction.
//!
//! Error: the query's rounding (at most half a step, `amax/254` per value of a
//! block) adds `|Δs| ≤ Σ_b (amax_qb/254)·Σ_{i∈b} |k_i|` to each score; the tests
//! state the resulting bound on the output (`tests/kv_quant.rs`).

use crate::isa::Isa;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q8_0::BlockQ8_0;
#[cfg(target_arch = "x86_64")]
use crate::simd::kvq_dot;

/// Values per query block (the KV block size).
pub const QB: usize = 32;

/// Query rows quantized for the integer score path. Row `r`, block `b`:
/// codes `codes[r·d + 32b ..][..32]` (i8 in `−127..=127`), scale
/// `scales[r·nb + b]` (f32: the value of one code step) and the sum of the
/// codes `sums[r·nb + b]` (the SIMD kernels' correction for an offset operand).
#[derive(Debug, Clone, Default)]
pub struct QuantQuery {
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<i32>,
    /// Rows and values per row (a multiple of [`QB`]).
    pub rows: usize,
    pub d: usize,
}

impl QuantQuery {
    /// Quantizes `rows` rows of `d` values (`x`: `rows × d`, `d % 32 == 0`):
    /// per block `scale = amax/127`, `code = round(x·127/amax)` (half away from
    /// zero), clamped to ±127; an all-zero block gets scale 0 and zero codes.
    /// Scalar on purpose: it runs once per tile, and every ISA level then sees
    /// the same codes.
    pub fn quantize(&mut self, x: &[f32], rows: usize, d: usize) {
        assert!(d.is_multiple_of(QB) && x.len() >= rows * d, "query quantize: bad shape");
        let nb = d / QB;
        self.codes.resize(rows * d, 0);
        self.scales.resize(rows * nb, 0.0);
        self.sums.resize(rows * nb, 0);
        (self.rows, self.d) = (rows, d);
        for (i, block) in x[..rows * d].chunks_exact(QB).enumerate() {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            let codes = &mut self.codes[i * QB..(i + 1) * QB];
            let mut sum = 0i32;
            for (c, &v) in codes.iter_mut().zip(block) {
                // `as i8` saturates and maps NaN to 0.
                *c = (v * inv).round().clamp(-127.0, 127.0) as i8;
                sum += *c as i32;
            }
            self.scales[i] = amax / 127.0;
            self.sums[i] = sum;
        }
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.d / QB
    }
}

/// Asserts the score kernels' contract: `n` keys of `d/32` blocks each at block
/// stride `stride` inside `k_len` blocks; `s` holds `rows` rows of `s_stride ≥ n`.
fn check(q: &QuantQuery, k_len: usize, stride: usize, n: usize, s_len: usize, s_stride: usize) {
    let nb = q.blocks();
    assert!(q.d.is_multiple_of(QB) && q.codes.len() >= q.rows * q.d, "int scores: bad query");
    assert!(n == 0 || k_len >= (n - 1) * stride + nb, "int scores: keys past the cache");
    assert!(n <= s_stride && (q.rows == 0 || s_len >= (q.rows - 1) * s_stride + n), "int scores: s too short");
}

/// The float steps shared by every level: `Σ_b f32(I_b)·(dq_b·dk_b)`.
#[inline(always)]
fn combine(ints: impl Iterator<Item = (i32, f32, f32)>) -> f32 {
    let mut acc = 0f32;
    for (b, (i, dq, dk)) in ints.enumerate() {
        let t = dq * dk;
        acc = if b == 0 { i as f32 * t } else { (i as f32).mul_add(t, acc) };
    }
    acc
}

/// Scores of every query row against `n` Q8_0 keys: key `j`'s blocks are
/// `k[j·stride ..][.. d/32]`; writes `s[r·s_stride + j]` for `j < n`.
/// `isa` must be supported (callers pass the active level or one from
/// [`crate::isa::available`]); every level gives the same bits.
pub fn q8_0_scores(isa: Isa, q: &QuantQuery, k: &[BlockQ8_0], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
    check(q, k.len(), stride, n, s.len(), s_stride);
    #[cfg(target_arch = "x86_64")]
    {
        let kp = k.as_ptr() as *const u8;
        match isa {
            // SAFETY: the level is supported; bounds checked above.
            Isa::Avx512 => {
                return unsafe { kvq_dot::q8_0_scores_avx512(q, kp, stride * 34, n, s.as_mut_ptr(), s_stride) }
            }
            Isa::Avx2 => return unsafe { kvq_dot::q8_0_scores_avx2(q, kp, stride * 34, n, s.as_mut_ptr(), s_stride) },
            _ => {}
        }
    }
    let _ = isa;
    let nb = q.blocks();
    for r in 0..q.rows {
        for j in 0..n {
            let key = &k[j * stride..][..nb];
            s[r * s_stride + j] = combine(key.iter().enumerate().map(|(b, blk)| {
                let codes = &q.codes[r * q.d + b * QB..][..QB];
                let dot: i32 = codes.iter().zip(&blk.qs).map(|(&a, &c)| a as i32 * c as i32).sum();
                (dot, q.scales[r * nb + b], blk.d.to_f32())
            }));
        }
    }
}

/// [`q8_0_scores`] for Q4_0 keys (value `i < 16` in the low nibble of `qs[i]`,
/// value `i + 16` in its high nibble, both offset by 8).
pub fn q4_0_scores(isa: Isa, q: &QuantQuery, k: &[BlockQ4_0], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
    check(q, k.len(), stride, n, s.len(), s_stride);
    #[cfg(target_arch = "x86_64")]
    {
        let kp = k.as_ptr() as *const u8;
        match isa {
            // SAFETY: as in `q8_0_scores`.
            Isa::Avx512 => {
                return unsafe { kvq_dot::q4_0_scores_avx512(q, kp, stride * 18, n, s.as_mut_ptr(), s_stride) }
            }
            Isa::Avx2 => return unsafe { kvq_dot::q4_0_scores_avx2(q, kp, stride * 18, n, s.as_mut_ptr(), s_stride) },
            _ => {}
        }
    }
    let _ = isa;
    let nb = q.blocks();
    for r in 0..q.rows {
        for j in 0..n {
            let key = &k[j * stride..][..nb];
            s[r * s_stride + j] = combine(key.iter().enumerate().map(|(b, blk)| {
                let codes = &q.codes[r * q.d + b * QB..][..QB];
                let dot: i32 = (0..16)
                    .map(|i| {
                        let (lo, hi) = ((blk.qs[i] & 15) as i32 - 8, (blk.qs[i] >> 4) as i32 - 8);
                        codes[i] as i32 * lo + codes[i + 16] as i32 * hi
                    })
                    .sum();
                (dot, q.scales[r * nb + b], blk.d.to_f32())
            }));
        }
    }
}

/// Start-up check of the SIMD score kernels at `isa` against scalar (bit for
/// bit) on fixed data: 3 query rows at d = 64, 21 keys at a block stride of 5
/// (a full group and a tail at both levels).
#[cfg(target_arch = "x86_64")]
pub(crate) fn self_test(isa: Isa, byte: &mut dyn FnMut() -> u8) -> Result<(), String> {
    let (rows, d, n, stride) = (3, 64, 21, 5);
    let x: Vec<f32> = (0..rows * d).map(|_| byte() as i8 as f32 / 37.0).collect();
    let mut q = QuantQuery::default();
    q.quantize(&x, rows, d);
    let mut raw8: Vec<u8> = (0..n * stride * 34).map(|_| byte()).collect();
    let mut raw4: Vec<u8> = (0..n * stride * 18).map(|_| byte()).collect();
    for (i, b) in raw8.chunks_exact_mut(34).enumerate() {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01 * (i % 7) as f32 - 0.02).to_bits().to_le_bytes());
    }
    for (i, b) in raw4.chunks_exact_mut(18).enumerate() {
        b[..2].copy_from_slice(&half::f16::from_f32(0.03 - 0.01 * (i % 5) as f32).to_bits().to_le_bytes());
    }
    let (k8, k4): (&[BlockQ8_0], &[BlockQ4_0]) = (bytemuck::cast_slice(&raw8), bytemuck::cast_slice(&raw4));
    let (mut want, mut got) = (vec![0f32; rows * 32], vec![0f32; rows * 32]);
    q8_0_scores(Isa::Scalar, &q, k8, stride, n, &mut want, 32);
    q8_0_scores(isa, &q, k8, stride, n, &mut got, 32);
    if want.iter().zip(&got).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(format!("{isa} Q8_0 integer attention scores differ from scalar"));
    }
    q4_0_scores(Isa::Scalar, &q, k4, stride, n, &mut want, 32);
    q4_0_scores(isa, &q, k4, stride, n, &mut got, 32);
    if want.iter().zip(&got).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(format!("{isa} Q4_0 integer attention scores differ from scalar"));
    }
    Ok(())
}
