//! Small f32 steps of a transformer layer. Shapes are given per function; all
//! buffers are row-major and caller-owned so the hot loop does not allocate.

use crate::ThreadPool;

/// RMSNorm of each row of `x` (`rows × dim`) into `out`: `x / rms(x) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// In-place RMSNorm of each `dim`-sized chunk of `x` (per-head q/k norm).
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, dim: usize) {
    for xr in x.chunks_exact_mut(dim) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for (o, &w) in xr.iter_mut().zip(weight) {
            *o = *o * inv * w;
        }
    }
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
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x[i] += y[i]`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Numerically stable in-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
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
/// Online softmax over the keys (one pass, no score buffer), split over
/// (token, head) pairs across the pool.
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
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.run(|t, nt| {
        let out_ptr = &out_ptr;
        let mut acc = vec![0f32; head_dim];
        let per = jobs.div_ceil(nt);
        for job in (t * per)..((t + 1) * per).min(jobs) {
            let (i, h) = (job / n_heads, job % n_heads);
            let kvh = h / group;
            let qh = &q[(i * n_heads + h) * head_dim..][..head_dim];
            let n_keys = start_pos + i + 1;
            let mut max = f32::NEG_INFINITY;
            let mut denom = 0f32;
            acc.iter_mut().for_each(|a| *a = 0.0);
            for p in 0..n_keys {
                let kp = &k[p * kv_stride + kvh * head_dim..][..head_dim];
                let s = qh.iter().zip(kp).map(|(a, b)| a * b).sum::<f32>() * scale;
                let vp = &v[p * kv_stride + kvh * head_dim..][..head_dim];
                if s > max {
                    let c = (max - s).exp();
                    denom = denom * c + 1.0;
                    for (a, &b) in acc.iter_mut().zip(vp) {
                        *a = *a * c + b;
                    }
                    max = s;
                } else {
                    let e = (s - max).exp();
                    denom += e;
                    for (a, &b) in acc.iter_mut().zip(vp) {
                        *a += e * b;
                    }
                }
            }
            // SAFETY: each (i, h) job writes a disjoint head_dim slice of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add((i * n_heads + h) * head_dim), head_dim) };
            let inv = 1.0 / denom;
            for (d, &a) in o.iter_mut().zip(&acc) {
                *d = a * inv;
            }
        }
    });
}

/// A raw pointer that may cross into pool workers; users guarantee disjoint writes.
pub struct SendPtr<T>(pub *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
