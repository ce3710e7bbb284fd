//! The gated delta rule: Gated DeltaNet's linear attention, one value head at
//! a time (Qwen3-Next, Qwen3.5).
//!
//! A head keeps a state `S` of `dk × dv` values (row `i`: key dim `i`,
//! contiguous over the value dim). Per token, with the key `k` and query `q`
//! L2-normalized (and `q` scaled by `1/√dk` — the caller's job), the value
//! `v`, the log-decay `g ≤ 0` and the write strength `β ∈ (0, 1)`:
//!
//! ```text
//! S ← exp(g)·S
//! S ← S + k ⊗ β·(v − Sᵀk)        (the delta rule: replace what k recalls)
//! o = Sᵀq
//! ```
//!
//! * [`recurrent`]: the token loop, for decode. Every step is a row-wise
//!   `axpy` over the value dim, compiled with AVX2+FMA where the CPU has it
//!   (the same body compiled plain is [`recurrent_scalar`]).
//! * [`chunked`]: prefill in chunks of [`CHUNK`] tokens in the WY form (as
//!   flash-linear-attention and transformers' `torch_chunk_gated_delta_rule`):
//!   within a chunk the delta rule's sequential dependence is one small
//!   lower-triangular solve, and the state is read and written once per chunk
//!   instead of once per token.
//! * [`recurrent_f64`]: the reference in f64, for tests.

use crate::isa::{self, Isa};

/// Tokens per chunk of [`chunked`] (flash-linear-attention's and transformers').
pub const CHUNK: usize = 64;

/// One head's inputs for `n` tokens: `q`, `k` `[n × dk]` (normalized; `q`
/// scaled), `v` `[n × dv]`, `g` and `beta` `[n]`.
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl HeadInputs<'_> {
    pub fn len(&self) -> usize {
        self.g.len()
    }

    pub fn is_empty(&self) -> bool {
        self.g.is_empty()
    }

    fn check(&self, s: &[f32], dk: usize, dv: usize, out: &[f32]) {
        let n = self.len();
        assert!(s.len() == dk * dv, "state is dk × dv");
        assert!(self.q.len() >= n * dk && self.k.len() >= n * dk && self.v.len() >= n * dv);
        assert!(self.beta.len() >= n && out.len() >= n * dv);
    }
}

fn simd() -> bool {
    matches!(isa::active(), Isa::Avx2 | Isa::Avx512)
}

/// `y += a · x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * *x;
    }
}

/// `x · y` with eight independent partial sums (so it vectorizes).
#[inline(always)]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (a, b) in xr.iter().zip(yr) {
        s += a * b;
    }
    s
}

/// The token loop (decode), updating `s` in place; `out`: `[n × dv]`.
pub fn recurrent(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize, out: &mut [f32], sc: &mut ChunkScratch) {
    x.check(s, dk, dv, out);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: AVX2 and FMA are available (isa::active checked them).
        unsafe { recurrent_avx2(s, x, dk, dv, out, sc) };
        return;
    }
    recurrent_body(s, x, dk, dv, out, sc);
}

/// [`recurrent`] without SIMD (its reference).
pub fn recurrent_scalar(
    s: &mut [f32],
    x: &HeadInputs<'_>,
    dk: usize,
    dv: usize,
    out: &mut [f32],
    sc: &mut ChunkScratch,
) {
    x.check(s, dk, dv, out);
    recurrent_body(s, x, dk, dv, out, sc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_avx2(
    s: &mut [f32],
    x: &HeadInputs<'_>,
    dk: usize,
    dv: usize,
    out: &mut [f32],
    sc: &mut ChunkScratch,
) {
    let _ftz = FlushSubnormals::on();
    recurrent_body(s, x, dk, dv, out, sc);
}

/// Subnormal floats flushed to zero (MXCSR FTZ and DAZ) on this thread while
/// alive; the previous mode comes back on drop. The delta rule's decays
/// compound over a chunk (`gc` sums up to 64 gates, and gates reach −20 per
/// token in trained and random models alike), so `exp` of decay differences
/// and their products with small q/k/β land in the subnormal range, and
/// every operation on a subnormal costs an x86 core ~100 cycles: on a random
/// Qwen3-Next-shaped model (hidden 1024, 16 value heads of 128) the chunked
/// form took 38% of a 512-token prefill, 9% with subnormals flushed (pp512
/// +25–40%). The values flushed are below 1.2e-38, far under f32 rounding of
/// the O(1) terms they are summed with.
#[cfg(target_arch = "x86_64")]
struct FlushSubnormals(u32);

#[cfg(target_arch = "x86_64")]
impl FlushSubnormals {
    fn on() -> FlushSubnormals {
        let mut old = 0u32;
        // SAFETY: stmxcsr stores the 32-bit MXCSR to a valid, aligned u32.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack, preserves_flags)) };
        // FTZ (bit 15) and DAZ (bit 6).
        set_mxcsr(old | 0x8040);
        FlushSubnormals(old)
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for FlushSubnormals {
    fn drop(&mut self) {
        set_mxcsr(self.0);
    }
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(v: u32) {
    // SAFETY: ldmxcsr loads a valid MXCSR value (the saved one, or it with
    // the FTZ/DAZ mode bits set) from a valid u32.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, readonly, preserves_flags)) };
}

/// Per token, two passes over the state rows, each an `axpy` over the value
/// dim: (1) `Sᵀk` and `Sᵀq` of the old state; then `δ = β(v − e·Sᵀk)` with
/// `e = exp(g)`, and `o = e·Sᵀq + (q·k)·δ` (= the new state's `Sᵀq`);
/// (2) `S ← e·S + k ⊗ δ`.
#[inline(always)]
fn recurrent_body(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize, out: &mut [f32], sc: &mut ChunkScratch) {
    grow(&mut sc.row, dv);
    let delta = &mut sc.row[..dv];
    for t in 0..x.len() {
        let (q, k) = (&x.q[t * dk..(t + 1) * dk], &x.k[t * dk..(t + 1) * dk]);
        let v = &x.v[t * dv..(t + 1) * dv];
        let o = &mut out[t * dv..(t + 1) * dv];
        let (e, beta) = (decay(x.g[t]), x.beta[t]);
        delta.fill(0.0);
        o.fill(0.0);
        for i in 0..dk {
            let row = &s[i * dv..(i + 1) * dv];
            axpy(delta, k[i], row);
            axpy(o, q[i], row);
        }
        let qk = dot(q, k);
        for j in 0..dv {
            let d = beta * (v[j] - e * delta[j]);
            delta[j] = d;
            o[j] = e * o[j] + qk * d;
        }
        for i in 0..dk {
            let ki = k[i];
            for (r, d) in s[i * dv..(i + 1) * dv].iter_mut().zip(delta.iter()) {
                *r = e * *r + ki * *d;
            }
        }
    }
}

/// Reusable buffers of [`chunked`].
#[derive(Debug, Default, Clone)]
pub struct ChunkScratch {
    /// Cumulative log-decay within the chunk, `[L]`.
    gc: Vec<f32>,
    /// `K·Kᵀ` then `(I − N)⁻¹` (`N` strictly lower: `−β_i (k_i·k_j)
    /// exp(gc_i − gc_j)`), `[L × L]`.
    t: Vec<f32>,
    /// `Q·Kᵀ` masked and decayed, `[L × L]`.
    p: Vec<f32>,
    /// `Kᵀ` `[dk × L]`, then `(k_j · exp(gc_L − gc_j))ᵀ`.
    kt: Vec<f32>,
    /// `β v` `[L × dv]`; `β k exp(gc)` and `q exp(gc)` `[L × dk]`.
    bv: Vec<f32>,
    bk: Vec<f32>,
    qe: Vec<f32>,
    /// `T·(β v)` then the corrected values `v_new`, `[L × dv]`.
    u: Vec<f32>,
    /// `T·(β k exp(gc))`, `[L × dk]`.
    w: Vec<f32>,
    /// A row of `dv` values (the token loop's delta).
    row: Vec<f32>,
}

/// `C += alpha · A·B` with `A` `m × k` (row stride `lda`), `B` `k × n` (row
/// stride `ldb`), `C` `m × n` (row stride `ldc`): tiles of 4 rows × 16
/// columns accumulated in registers, so each row of `B` is loaded once per
/// four output rows (the chunked form's products are small GEMMs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_acc<const AVX: bool>(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, k, n): (usize, usize, usize),
    alpha: f32,
) {
    const R: usize = 4;
    const W: usize = 16;
    let mut i = 0;
    while i < m {
        let rows = R.min(m - i);
        let mut j = 0;
        while j + W <= n {
            #[cfg(target_arch = "x86_64")]
            if AVX && rows == R {
                assert!((i + R - 1) * lda + k <= a.len() && (k.max(1) - 1) * ldb + j + W <= b.len());
                assert!((i + R - 1) * ldc + j + W <= c.len());
                // SAFETY: AVX is only set under AVX2+FMA; the bounds are checked above.
                unsafe {
                    let cp = c.as_mut_ptr().add(i * ldc + j);
                    tile_4x16(cp, ldc, a.as_ptr().add(i * lda), lda, b.as_ptr().add(j), ldb, k, alpha)
                };
                j += W;
                continue;
            }
            let mut acc = [[0f32; W]; R];
            for p in 0..k {
                let bp: &[f32; W] = b[p * ldb + j..p * ldb + j + W].try_into().expect("16 values");
                for r in 0..rows {
                    let av = a[(i + r) * lda + p];
                    for l in 0..W {
                        acc[r][l] += av * bp[l];
                    }
                }
            }
            for r in 0..rows {
                let cr = &mut c[(i + r) * ldc + j..(i + r) * ldc + j + W];
                for l in 0..W {
                    cr[l] += alpha * acc[r][l];
                }
            }
            j += W;
        }
        // Columns past the last whole tile.
        for r in 0..rows {
            for jj in j..n {
                let mut acc = 0f32;
                for p in 0..k {
                    acc += a[(i + r) * lda + p] * b[p * ldb + jj];
                }
                c[(i + r) * ldc + jj] += alpha * acc;
            }
        }
        i += R;
    }
}

/// One 4 × 16 tile of [`gemm_acc`] in eight AVX2 accumulators.
///
/// # Safety
/// AVX2 and FMA available; `a` holds 4 rows of `k` (stride `lda`), `b` `k`
/// rows of 16 (stride `ldb`), `c` 4 rows of 16 (stride `ldc`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_4x16(
    c: *mut f32,
    ldc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    k: usize,
    alpha: f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 8];
    for p in 0..k {
        let b0 = _mm256_loadu_ps(b.add(p * ldb));
        let b1 = _mm256_loadu_ps(b.add(p * ldb + 8));
        for r in 0..4 {
            let av = _mm256_set1_ps(*a.add(r * lda + p));
            acc[2 * r] = _mm256_fmadd_ps(av, b0, acc[2 * r]);
            acc[2 * r + 1] = _mm256_fmadd_ps(av, b1, acc[2 * r + 1]);
        }
    }
    let al = _mm256_set1_ps(alpha);
    for r in 0..4 {
        let cr = c.add(r * ldc);
        _mm256_storeu_ps(cr, _mm256_fmadd_ps(al, acc[2 * r], _mm256_loadu_ps(cr)));
        _mm256_storeu_ps(cr.add(8), _mm256_fmadd_ps(al, acc[2 * r + 1], _mm256_loadu_ps(cr.add(8))));
    }
}

/// The chunked (WY) form over `n` tokens, updating `s`; `out`: `[n × dv]`.
/// Equal to [`recurrent`] up to rounding.
pub fn chunked(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize, out: &mut [f32], sc: &mut ChunkScratch) {
    x.check(s, dk, dv, out);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: AVX2 and FMA are available (isa::active checked them).
        unsafe { chunked_avx2(s, x, dk, dv, out, sc) };
        return;
    }
    chunked_body::<false>(s, x, dk, dv, out, sc);
}

/// [`chunked`] without SIMD (its reference).
pub fn chunked_scalar(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize, out: &mut [f32], sc: &mut ChunkScratch) {
    x.check(s, dk, dv, out);
    chunked_body::<false>(s, x, dk, dv, out, sc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunked_avx2(
    s: &mut [f32],
    x: &HeadInputs<'_>,
    dk: usize,
    dv: usize,
    out: &mut [f32],
    sc: &mut ChunkScratch,
) {
    let _ftz = FlushSubnormals::on();
    chunked_body::<true>(s, x, dk, dv, out, sc);
}

/// `exp(x)` of a (negative) log-decay, 0 below `e^-64` ≈ 1.6e-28. Decays
/// compound over a chunk (`gc` sums 64 gates; a trained or random model's
/// gates reach −20 per token), and an `exp` in the subnormal band (x in
/// −104..−87), or a product of a tiny decay with a small q/k/β, makes
/// subnormal floats, which cost x86 cores ~100 cycles per operation in the
/// GEMMs that follow: on a random Qwen3-Next-shaped model (A up to 16) this
/// form ran at ~25 µs per token and head instead of 3. Terms below 1e-28 of
/// the unit diagonal are far under f32 rounding, so dropping them changes
/// nothing representable.
#[inline(always)]
fn decay(x: f32) -> f32 {
    if x < -64.0 {
        0.0
    } else {
        x.exp()
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Per chunk of `L` tokens (all products as [`gemm_acc`]):
/// `T = (I − N)⁻¹` from `K·Kᵀ` by forward substitution; `U = T·(βv)`,
/// `W = T·(βk e^{gc})`; `v_new = U − W·S`; `o = (q e^{gc})·S + P·v_new` with
/// `P_ij = (q_i·k_j) e^{gc_i − gc_j}` (`j ≤ i`); `S ← e^{gc_L} S +
/// (k e^{gc_L − gc})ᵀ·v_new`.
#[inline(always)]
fn chunked_body<const AVX: bool>(
    s: &mut [f32],
    x: &HeadInputs<'_>,
    dk: usize,
    dv: usize,
    out: &mut [f32],
    sc: &mut ChunkScratch,
) {
    let n = x.len();
    const C: usize = CHUNK;
    grow(&mut sc.gc, C);
    for (b, len) in [(&mut sc.t, C * C), (&mut sc.p, C * C), (&mut sc.kt, dk * C), (&mut sc.bk, C * dk)] {
        grow(b, len);
    }
    for (b, len) in [(&mut sc.qe, C * dk), (&mut sc.w, C * dk), (&mut sc.bv, C * dv), (&mut sc.u, C * dv)] {
        grow(b, len);
    }
    let mut c0 = 0;
    while c0 < n {
        let l = C.min(n - c0);
        let kc = &x.k[c0 * dk..(c0 + l) * dk];
        let qc = &x.q[c0 * dk..(c0 + l) * dk];
        let vc = &x.v[c0 * dv..(c0 + l) * dv];
        let beta = &x.beta[c0..c0 + l];
        let gc = &mut sc.gc[..l];
        let mut acc = 0.0;
        for (t, g) in gc.iter_mut().enumerate() {
            acc += x.g[c0 + t];
            *g = acc;
        }
        // Kᵀ, then the Gram matrices K·Kᵀ (into t) and Q·Kᵀ (into p).
        let kt = &mut sc.kt[..dk * l];
        for j in 0..l {
            for r in 0..dk {
                kt[r * l + j] = kc[j * dk + r];
            }
        }
        let (tm, pm) = (&mut sc.t[..l * l], &mut sc.p[..l * l]);
        tm.fill(0.0);
        pm.fill(0.0);
        gemm_acc::<AVX>(tm, l, kc, dk, kt, l, (l, dk, l), 1.0);
        gemm_acc::<AVX>(pm, l, qc, dk, kt, l, (l, dk, l), 1.0);
        // T in place, row by row: row i's N entries replace its Gram row,
        // then T[i][j] = N[i][j] + Σ_{j<m<i} N[i][m] T[m][j], T[i][i] = 1.
        for i in 0..l {
            let (done, rest) = tm.split_at_mut(i * l);
            let ti = &mut rest[..l];
            let mut nrow = [0f32; C];
            for m in 0..i {
                nrow[m] = -beta[i] * ti[m] * decay(gc[i] - gc[m]);
            }
            ti.fill(0.0);
            for m in 0..i {
                axpy(&mut ti[..=m], nrow[m], &done[m * l..m * l + m + 1]);
            }
            ti[i] = 1.0;
            // P row i: causal mask and decay.
            let pi = &mut pm[i * l..(i + 1) * l];
            for j in 0..l {
                pi[j] = if j <= i { pi[j] * decay(gc[i] - gc[j]) } else { 0.0 };
            }
        }
        // βv, βk e^{gc}, q e^{gc}.
        let (bv, bk, qe) = (&mut sc.bv[..l * dv], &mut sc.bk[..l * dk], &mut sc.qe[..l * dk]);
        for t in 0..l {
            let e = decay(gc[t]);
            for j in 0..dv {
                bv[t * dv + j] = beta[t] * vc[t * dv + j];
            }
            for r in 0..dk {
                bk[t * dk + r] = beta[t] * e * kc[t * dk + r];
                qe[t * dk + r] = e * qc[t * dk + r];
            }
        }
        let (u, w) = (&mut sc.u[..l * dv], &mut sc.w[..l * dk]);
        u.fill(0.0);
        w.fill(0.0);
        gemm_acc::<AVX>(u, dv, tm, l, bv, dv, (l, l, dv), 1.0);
        gemm_acc::<AVX>(w, dk, tm, l, bk, dk, (l, l, dk), 1.0);
        // v_new = U − W·S.
        gemm_acc::<AVX>(u, dv, w, dk, s, dv, (l, dk, dv), -1.0);
        // o = (q e^{gc})·S + P·v_new.
        let o = &mut out[c0 * dv..(c0 + l) * dv];
        o.fill(0.0);
        gemm_acc::<AVX>(o, dv, qe, dk, s, dv, (l, dk, dv), 1.0);
        gemm_acc::<AVX>(o, dv, pm, l, u, dv, (l, l, dv), 1.0);
        // S ← e^{gc_L} S + (k e^{gc_L − gc})ᵀ·v_new.
        let last = gc[l - 1];
        let mut coef = [0f32; C];
        for j in 0..l {
            coef[j] = decay(last - gc[j]);
        }
        for r in 0..dk {
            for j in 0..l {
                kt[r * l + j] *= coef[j];
            }
        }
        let el = decay(last);
        s.iter_mut().for_each(|v| *v *= el);
        gemm_acc::<AVX>(s, dv, kt, l, u, dv, (dk, l, dv), 1.0);
        c0 += l;
    }
}

/// The token loop in f64 in the reference's order (transformers'
/// `torch_recurrent_gated_delta_rule`), for tests: returns the outputs.
pub fn recurrent_f64(s: &mut [f64], x: &HeadInputs<'_>, dk: usize, dv: usize) -> Vec<f64> {
    let mut out = vec![0f64; x.len() * dv];
    for t in 0..x.len() {
        let decay = (x.g[t] as f64).exp();
        s.iter_mut().for_each(|v| *v *= decay);
        let k = &x.k[t * dk..(t + 1) * dk];
        let q = &x.q[t * dk..(t + 1) * dk];
        for j in 0..dv {
            let mem: f64 = (0..dk).map(|i| s[i * dv + j] * k[i] as f64).sum();
            let delta = (x.v[t * dv + j] as f64 - mem) * x.beta[t] as f64;
            for i in 0..dk {
                s[i * dv + j] += k[i] as f64 * delta;
            }
            out[t * dv + j] = (0..dk).map(|i| s[i * dv + j] * q[i] as f64).sum();
        }
    }
    out
}

/// `x / ‖x‖` with transformers' `l2norm`: `x · rsqrt(Σx² + eps)`, per row of `dim`.
pub fn l2norm_rows(x: &mut [f32], dim: usize, eps: f32) {
    for r in x.chunks_exact_mut(dim) {
        let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
        r.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic inputs like a real layer's: unit q, k (q scaled), g ≤ 0.
    /// q, k, v, g, beta.
    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    fn inputs(n: usize, dk: usize, dv: usize, seed: u64) -> Inputs {
        let mut st = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut q: Vec<f32> = (0..n * dk).map(|_| rnd()).collect();
        let mut k: Vec<f32> = (0..n * dk).map(|_| rnd()).collect();
        let v = (0..n * dv).map(|_| rnd()).collect();
        l2norm_rows(&mut q, dk, 1e-6);
        l2norm_rows(&mut k, dk, 1e-6);
        let scale = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|v| *v *= scale);
        let g = (0..n).map(|_| -(rnd().abs() * 0.5 + 0.01)).collect();
        let beta = (0..n).map(|_| 1.0 / (1.0 + (-2.0 * rnd()).exp())).collect();
        (q, k, v, g, beta)
    }

    fn max_err(a: &[f32], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn every_form_matches_the_f64_reference() {
        for (n, dk, dv) in [(1, 16, 16), (7, 16, 16), (64, 32, 24), (150, 16, 32), (130, 128, 128)] {
            let (q, k, v, g, beta) = inputs(n, dk, dv, (n * dk + dv) as u64);
            let x = HeadInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
            // A non-zero initial state, as after a previous chunk.
            let s0: Vec<f32> = (0..dk * dv).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.05).collect();
            let mut s64: Vec<f64> = s0.iter().map(|&v| v as f64).collect();
            let want = recurrent_f64(&mut s64, &x, dk, dv);
            let mut sc = ChunkScratch::default();
            type Form = fn(&mut [f32], &HeadInputs<'_>, usize, usize, &mut [f32], &mut ChunkScratch);
            let forms: [(&str, Form); 4] = [
                ("recurrent", recurrent),
                ("recurrent_scalar", recurrent_scalar),
                ("chunked", chunked),
                ("chunked_scalar", chunked_scalar),
            ];
            for (name, f) in forms {
                let mut s = s0.clone();
                let mut out = vec![0f32; n * dv];
                f(&mut s, &x, dk, dv, &mut out, &mut sc);
                let (eo, es) = (max_err(&out, &want), max_err(&s, &s64));
                assert!(eo < 2e-5 && es < 2e-5, "{name} n={n} dk={dk} dv={dv}: out {eo:e}, state {es:e}");
            }
        }
    }

    #[test]
    fn chunked_in_pieces_equals_one_call() {
        let (n, dk, dv) = (100, 16, 16);
        let (q, k, v, g, beta) = inputs(n, dk, dv, 5);
        let mut sc = ChunkScratch::default();
        let x = HeadInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let (mut s1, mut o1) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
        chunked(&mut s1, &x, dk, dv, &mut o1, &mut sc);
        let (mut s2, mut o2) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
        for (a, b) in [(0, 33), (33, 97), (97, 100)] {
            let part = HeadInputs {
                q: &q[a * dk..b * dk],
                k: &k[a * dk..b * dk],
                v: &v[a * dv..b * dv],
                g: &g[a..b],
                beta: &beta[a..b],
            };
            chunked(&mut s2, &part, dk, dv, &mut o2[a * dv..b * dv], &mut sc);
        }
        let d = o1.iter().zip(&o2).chain(s1.iter().zip(&s2)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1e-5, "{d}");
    }

    /// Rough speeds of the forms on one head of 128 × 128 (not a benchmark:
    /// `cargo test --release -p shardlm-kernels --lib delta_rule -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn speed_of_the_forms() {
        let (n, dk, dv) = (512, 128, 128);
        let (q, k, v, g, beta) = inputs(n, dk, dv, 3);
        let x = HeadInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let mut sc = ChunkScratch::default();
        type Form = fn(&mut [f32], &HeadInputs<'_>, usize, usize, &mut [f32], &mut ChunkScratch);
        let forms: [(&str, Form); 4] = [
            ("recurrent", recurrent),
            ("recurrent_scalar", recurrent_scalar),
            ("chunked", chunked),
            ("chunked_scalar", chunked_scalar),
        ];
        for (name, f) in forms {
            let (mut s, mut out) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
            // The fastest of 20 runs (the machine may be shared).
            let per_tok = (0..20)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    f(&mut s, &x, dk, dv, &mut out, &mut sc);
                    t0.elapsed().as_secs_f64() / n as f64
                })
                .fold(f64::MAX, f64::min);
            eprintln!("{name}: {:.2} µs per token per head", per_tok * 1e6);
        }
    }
}
