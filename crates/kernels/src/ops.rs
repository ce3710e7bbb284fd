//! Small f32 steps of a transformer layer. Shapes are given per function; all
//! buffers are row-major and caller-owned so the hot loop does not allocate.

use crate::isa::{self, Isa};
#[cfg(target_arch = "x86_64")]
use crate::simd::avx2_ops;
use crate::ThreadPool;

/// Whether the AVX2 helpers may be used (cached by [`isa::active`]).
#[inline]
fn avx2() -> bool {
    matches!(isa::active(), Isa::Avx2 | Isa::Avx512)
}

/// RMSNorm of each row of `x` (`rows × dim`) into `out`: `x / rms(x) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    assert!(weight.len() >= dim && out.len() >= x.len() / dim * dim);
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let inv = 1.0 / (sum_sq(xr) / dim as f32 + eps).sqrt();
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: AVX2 checked; all three slices hold `dim` elements.
            unsafe { avx2_ops::scale_mul(or.as_mut_ptr(), xr.as_ptr(), inv, weight.as_ptr(), dim) };
            continue;
        }
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// In-place RMSNorm of each `dim`-sized chunk of `x` (per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, dim: usize) {
    assert!(weight.len() >= dim);
    for xr in x.chunks_exact_mut(dim) {
        let inv = 1.0 / (sum_sq(xr) / dim as f32 + eps).sqrt();
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: AVX2 checked; `xr` and `weight` hold `dim` elements (in place is allowed).
            unsafe { avx2_ops::scale_mul(xr.as_mut_ptr(), xr.as_ptr(), inv, weight.as_ptr(), dim) };
            continue;
        }
        for (o, &w) in xr.iter_mut().zip(weight) {
            *o = *o * inv * w;
        }
    }
}

/// `Σ x²`.
fn sum_sq(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked.
        return unsafe { avx2_ops::sum_sq(x.as_ptr(), x.len()) };
    }
    x.iter().map(|v| v * v).sum()
}

/// `Σ a·b` (SIMD where available).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked; both hold at least `n` elements.
        return unsafe { avx2_ops::dot(a.as_ptr(), b.as_ptr(), n) };
    }
    a[..n].iter().zip(&b[..n]).map(|(x, y)| x * y).sum()
}

/// How rotary pairs are formed within a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF "rotate_half": pairs (i, i + rot_dim/2). Used by HF checkpoints and by
    /// GGUF qwen2/qwen3.
    Neox,
    /// Adjacent pairs (2i, 2i+1). Used by GGUF llama, whose converter permuted
    /// the q/k rows to match.
    Interleaved,
}

/// Applies rope to `x` (`n_heads × head_dim` for one token) at one position.
/// `cos`/`sin` hold `rot_dim/2` values for that position.
pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    for h in x.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::Neox => {
                for i in 0..half {
                    let (a, b) = (h[i], h[i + half]);
                    h[i] = a * cos[i] - b * sin[i];
                    h[i + half] = b * cos[i] + a * sin[i];
                }
            }
            RopeStyle::Interleaved => {
                for i in 0..half {
                    let (a, b) = (h[2 * i], h[2 * i + 1]);
                    h[2 * i] = a * cos[i] - b * sin[i];
                    h[2 * i + 1] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked; both hold at least `n` elements.
        unsafe { avx2_ops::silu_mul(gate.as_mut_ptr(), up.as_ptr(), n) };
        return;
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x[i] += y[i]`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked; both hold at least `n` elements.
        unsafe { avx2_ops::axpy(x.as_mut_ptr(), 1.0, y.as_ptr(), n) };
        return;
    }
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Numerically stable in-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked.
        let sum = unsafe { avx2_ops::exp_sub_sum(x.as_mut_ptr(), max, x.len()) };
        let inv = 1.0 / sum;
        x.iter_mut().for_each(|v| *v *= inv);
        return;
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Causal attention of one sequence's new tokens against its KV cache.
///
/// * `q`: `n_new × n_heads × head_dim`; new token `i` sits at position `start_pos + i`
///   and attends to cache positions `0..=start_pos + i`.
/// * `k`, `v`: the cache, `n_ctx × n_kv_heads × head_dim` (positions `0..start_pos+n_new` valid).
/// * `out`: `n_new × n_heads × head_dim`.
///
/// Grouped-query: query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
/// Per (token, head): scores into a per-thread buffer (SIMD dots), a vectorized
/// exp-and-sum, then the weighted sum of V rows. (Token, head) jobs are dealt
/// round-robin across the pool so causal prefill stays balanced.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_new: usize,
    start_pos: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) {
    let group = n_heads / n_kv_heads;
    let kv_stride = n_kv_heads * head_dim;
    let jobs = n_new * n_heads;
    assert!(q.len() >= jobs * head_dim && out.len() >= jobs * head_dim, "attention: q/out too short");
    let n_ctx = start_pos + n_new;
    assert!(k.len() >= n_ctx * kv_stride && v.len() >= n_ctx * kv_stride, "attention: KV cache too short");
    let simd = avx2();
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.run(|t, nt| {
        let out_ptr = &out_ptr;
        SCORES.with(|buf| {
            let mut buf = buf.borrow_mut();
            for job in (t..jobs).step_by(nt) {
                let (i, h) = (job / n_heads, job % n_heads);
                let kvh = h / group;
                let qh = &q[(i * n_heads + h) * head_dim..][..head_dim];
                let n_keys = start_pos + i + 1;
                if buf.len() < n_keys {
                    buf.resize(n_keys.next_power_of_two(), 0.0);
                }
                let s = &mut buf[..n_keys];
                for (p, sp) in s.iter_mut().enumerate() {
                    let kp = &k[p * kv_stride + kvh * head_dim..][..head_dim];
                    *sp = dot_with(simd, qh, kp) * scale;
                }
                let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let denom = exp_sub_sum_with(simd, s, max);
                // SAFETY: each (i, h) job writes a disjoint head_dim slice of `out`.
                let o =
                    unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add((i * n_heads + h) * head_dim), head_dim) };
                o.fill(0.0);
                for (p, &e) in s.iter().enumerate() {
                    let vp = &v[p * kv_stride + kvh * head_dim..][..head_dim];
                    axpy_with(simd, o, e, vp);
                }
                let inv = 1.0 / denom;
                o.iter_mut().for_each(|d| *d *= inv);
            }
        })
    });
}

thread_local! {
    /// Per-thread attention score buffer (grows to the longest context seen).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[inline]
fn dot_with(simd: bool, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true after the AVX2 check; lengths checked.
        return unsafe { avx2_ops::dot(a.as_ptr(), b.as_ptr(), a.len().min(b.len())) };
    }
    let _ = simd;
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[inline]
fn axpy_with(simd: bool, y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as above.
        unsafe { avx2_ops::axpy(y.as_mut_ptr(), a, x.as_ptr(), y.len().min(x.len())) };
        return;
    }
    let _ = simd;
    for (d, &s) in y.iter_mut().zip(x) {
        *d += a * s;
    }
}

#[inline]
fn exp_sub_sum_with(simd: bool, x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as above.
        return unsafe { avx2_ops::exp_sub_sum(x.as_mut_ptr(), max, x.len()) };
    }
    let _ = simd;
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

/// A raw pointer that may cross into pool workers; users guarantee disjoint writes.
pub struct SendPtr<T>(pub *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
