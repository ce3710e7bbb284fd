//! Small f32 steps of a transformer layer. Shapes are given per function; all
//! buffers are row-major and caller-owned so the hot loop does not allocate.

use crate::isa::{self, Isa};
#[cfg(target_arch = "x86_64")]
use crate::simd::avx2_ops;

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

/// `gate[i] = gelu_tanh(gate[i]) * up[i]`, the tanh approximation of GELU
/// (PyTorch's `gelu(approximate="tanh")`):
/// `0.5 · g · (1 + tanh(√(2/π) · (g + 0.044715 · g³)))`.
///
/// Computed as `g · σ(2t)` with `t` the tanh's argument (the same function:
/// `½(1 + tanh t) = σ(2t)`), vectorized where the CPU has AVX2: Gemma's
/// GeGLU runs on every prompt token's whole MLP width, and a scalar `tanhf`
/// took a quarter of Gemma 3 270M's prefill.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 checked; both hold at least `n` elements.
        unsafe { avx2_ops::gelu_tanh_mul(gate.as_mut_ptr(), up.as_ptr(), n) };
        return;
    }
    gelu_tanh_mul_scalar(&mut gate[..n], &up[..n]);
}

/// √(2/π), GELU's tanh approximation's scale.
pub const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// The scalar [`gelu_tanh_mul`] (the reference the SIMD one is tested against).
pub fn gelu_tanh_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let t = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
        *g = x / (1.0 + (-2.0 * t).exp()) * u;
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

/// gpt-oss's clamped SwiGLU, in place:
/// `gate[i] = (clamp(up[i], −limit, limit) + 1) · g · sigmoid(alpha · g)` with
/// `g = min(gate[i], limit)`. Scalar only: it runs on the expert width of the
/// few routed tokens, a small fraction of the matmuls around it.
pub fn swiglu_clamped(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let glu = x / (1.0 + (-alpha * x).exp());
        *g = (u.clamp(-limit, limit) + 1.0) * glu;
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

/// A raw pointer that may cross into pool workers; users guarantee disjoint writes.
pub struct SendPtr<T>(pub *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
