//! ops (at the active ISA level) against naive f64 versions.

mod common;

use common::*;
use rand::Rng;
use shardlm_kernels::ops::{self, RopeStyle};

fn close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= rel * scale.max(w.abs()), "{what}[{k}]: {g} vs {w}");
    }
}

fn randv(rng: &mut TestRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

#[test]
fn norms_and_elementwise() {
    let mut rng = rng(31);
    for dim in [1, 7, 64, 576, 1001] {
        let x = randv(&mut rng, 3 * dim, 3.0);
        let w = randv(&mut rng, dim, 2.0);
        let mut out = vec![0f32; 3 * dim];
        ops::rms_norm(&x, &w, 1e-5, dim, &mut out);
        let mut want = vec![0f64; 3 * dim];
        for r in 0..3 {
            let xr = &x[r * dim..(r + 1) * dim];
            let ms: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for j in 0..dim {
                want[r * dim + j] = xr[j] as f64 * inv * w[j] as f64;
            }
        }
        close(&out, &want, 1e-5, "rms_norm");
        let mut inplace = x.clone();
        ops::rms_norm_inplace(&mut inplace, &w, 1e-5, dim);
        close(&inplace, &want, 1e-5, "rms_norm_inplace");

        let mut g = randv(&mut rng, dim, 30.0);
        g[0] = -100.0;
        let u = randv(&mut rng, dim, 2.0);
        let want: Vec<f64> =
            g.iter().zip(&u).map(|(&g, &u)| g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64).collect();
        ops::silu_mul(&mut g, &u);
        close(&g, &want, 1e-5, "silu_mul");

        // GeGLU (tanh GELU), against the textbook ½·x·(1 + tanh(…)) in f64,
        // the SIMD path and the scalar one.
        let mut g = randv(&mut rng, dim, 12.0);
        if dim > 2 {
            g[1] = -40.0;
            g[2] = 40.0;
        }
        let u = randv(&mut rng, dim, 2.0);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let x = g as f64;
                let t = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + t.tanh()) * u as f64
            })
            .collect();
        // (Compared once other values set the scale: a lone value near −∞'s
        // zero is 1e-33 in f32 against 0 in f64.)
        let mut scalar = g.clone();
        ops::gelu_tanh_mul_scalar(&mut scalar, &u);
        ops::gelu_tanh_mul(&mut g, &u);
        if dim > 2 {
            close(&scalar, &want, 1e-5, "gelu_tanh_mul_scalar");
            close(&g, &want, 1e-5, "gelu_tanh_mul");
        }

        // gpt-oss: gate clamped above at 7, up at ±7 (both sides reached here).
        let mut g = randv(&mut rng, dim, 12.0);
        let u = randv(&mut rng, dim, 12.0);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let x = (g as f64).min(7.0);
                ((u as f64).clamp(-7.0, 7.0) + 1.0) * x / (1.0 + (-1.702 * x).exp())
            })
            .collect();
        ops::swiglu_clamped(&mut g, &u, 1.702, 7.0);
        close(&g, &want, 1e-5, "swiglu_clamped");

        let mut s = randv(&mut rng, dim, 20.0);
        let max = s.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let e: Vec<f64> = s.iter().map(|&v| (v as f64 - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|v| v / sum).collect();
        ops::softmax(&mut s);
        close(&s, &want, 1e-5, "softmax");

        let mut a = randv(&mut rng, dim, 1.0);
        let b = randv(&mut rng, dim, 1.0);
        let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect();
        let d: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let dd = ops::dot(&a, &b);
        assert!((dd as f64 - d).abs() <= 1e-5 * dim as f64, "dot {dd} vs {d}");
        ops::add_inplace(&mut a, &b);
        close(&a, &want, 1e-6, "add_inplace");
    }
}

#[test]
fn rope_styles() {
    let (head_dim, half) = (8, 4);
    let cos: Vec<f32> = (0..half).map(|i| (0.3 * i as f32).cos()).collect();
    let sin: Vec<f32> = (0..half).map(|i| (0.3 * i as f32).sin()).collect();
    let x: Vec<f32> = (0..2 * head_dim).map(|i| i as f32 + 1.0).collect();
    let mut n = x.clone();
    ops::rope(&mut n, head_dim, &cos, &sin, RopeStyle::Neox);
    // Pair (1, 5) of head 0: [x1·c1 − x5·s1, x5·c1 + x1·s1].
    assert!((n[1] - (2.0 * cos[1] - 6.0 * sin[1])).abs() < 1e-6);
    assert!((n[5] - (6.0 * cos[1] + 2.0 * sin[1])).abs() < 1e-6);
    let mut il = x.clone();
    ops::rope(&mut il, head_dim, &cos, &sin, RopeStyle::Interleaved);
    // Pair (2, 3) of head 1 (elements 10, 11) uses angle index 1.
    assert!((il[10] - (11.0 * cos[1] - 12.0 * sin[1])).abs() < 1e-5);
    assert!((il[11] - (12.0 * cos[1] + 11.0 * sin[1])).abs() < 1e-5);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_accuracy() {
    use shardlm_kernels::isa::{self, Isa};
    if !isa::available().contains(&Isa::Avx2) {
        return;
    }
    let mut xs: Vec<f32> = (-10000..=10000).map(|i| i as f32 * 0.0088).collect();
    xs.extend([-86.5, -100.0, 0.0, 1e-8, -1e-8]);
    let mut buf = xs.clone();
    let sum = unsafe { shardlm_kernels::simd::avx2_ops::exp_sub_sum(buf.as_mut_ptr(), 0.0, buf.len()) };
    let mut want_sum = 0f64;
    for (&x, &e) in xs.iter().zip(&buf) {
        let w = (x as f64).exp();
        want_sum += if x < -86.0 { 0.0 } else { w };
        if x < -86.0 {
            assert_eq!(e, 0.0);
        } else {
            assert!(((e as f64) - w).abs() <= 3e-7 * w, "exp({x}) = {e}, want {w}");
        }
    }
    let _ = (sum, want_sum); // the full range overflows f32 sums; check a softmax-like range
    let mut small: Vec<f32> = (0..1003).map(|i| -(i as f32) * 0.02).collect();
    let want: f64 = small.iter().map(|&x| (x as f64).exp()).sum();
    let got = unsafe { shardlm_kernels::simd::avx2_ops::exp_sub_sum(small.as_mut_ptr(), 0.0, small.len()) };
    assert!((got as f64 - want).abs() <= 1e-5 * want, "{got} vs {want}");
}

/// The softmax exp of the attention (AVX2 `exp8` and AVX-512 `exp16`, through
/// their `exp_sub_sum`) over the range attention uses, `x ≤ 0` down to −100:
/// relative error against f64 `exp` below 2.5e-7 for `x ≥ −86`, exactly 0 below,
/// and both levels bit-identical.
#[cfg(target_arch = "x86_64")]
#[test]
fn softmax_exp_accuracy() {
    use shardlm_kernels::isa::{self, Isa};
    use shardlm_kernels::simd::{avx2_ops, avx512_attn};
    if !isa::available().contains(&Isa::Avx2) {
        return;
    }
    // Dense over [−100, 0] (step ~1e-4), plus the edges; 13 values past a
    // multiple of 16 so the masked tail runs.
    let mut xs: Vec<f32> = (0..=1_000_000).map(|i| -(i as f32) * 1e-4).collect();
    xs.extend([
        -86.0,
        -85.999,
        -86.001,
        -87.5,
        -1e-30,
        -0.0,
        -103.0,
        -150.0,
        f32::NEG_INFINITY,
        -0.5,
        -1.5,
        -2.5,
        -3.5,
    ]);
    let mut e2 = xs.clone();
    // SAFETY: AVX2 checked above.
    let s2 = unsafe { avx2_ops::exp_sub_sum(e2.as_mut_ptr(), 0.0, e2.len()) };
    let mut worst = 0f64;
    let mut want_sum = 0f64;
    for (&x, &e) in xs.iter().zip(&e2) {
        if x < -86.0 {
            assert_eq!(e, 0.0, "exp({x})");
            continue;
        }
        let w = (x as f64).exp();
        want_sum += w;
        worst = worst.max(((e as f64) - w).abs() / w);
    }
    assert!(worst < 2.5e-7, "AVX2 exp: max relative error {worst:e}");
    // The f32 running sums over a million terms lose ~4e-5 to rounding.
    assert!((s2 as f64 - want_sum).abs() <= 1e-4 * want_sum, "sum {s2} vs {want_sum}");
    eprintln!("softmax exp: max relative error {worst:e} over [-86, 0]");
    if isa::available().contains(&Isa::Avx512) {
        let mut e5 = xs.clone();
        // SAFETY: AVX-512 checked above.
        let s5 = unsafe { avx512_attn::exp_sub_sum(e5.as_mut_ptr(), 0.0, e5.len()) };
        assert!(e2.iter().zip(&e5).all(|(a, b)| a.to_bits() == b.to_bits()), "AVX-512 exp differs from AVX2");
        assert!((s5 as f64 - want_sum).abs() <= 1e-4 * want_sum, "AVX-512 sum {s5} vs {want_sum}");
        // A shift by the row maximum, as attention calls it.
        let mut row: Vec<f32> = (0..29).map(|i| i as f32 * 0.7).collect();
        let max = 28.0 * 0.7;
        let want: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
        // SAFETY: as above.
        let got = unsafe { avx512_attn::exp_sub_sum(row.as_mut_ptr(), max, row.len()) };
        assert!((got as f64 - want).abs() <= 1e-6 * want, "{got} vs {want}");
    }
}
