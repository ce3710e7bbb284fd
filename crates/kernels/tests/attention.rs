//! Tiled attention (at the active ISA level; `SHARDLM_ISA=scalar` runs the scalar
//! tiles) against a naive f64 version over the same f16 cache, and the f16 store.

mod common;

use common::*;
use half::f16;
use rand::Rng;
use shardlm_kernels::attention::{self, AttnShape};
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::ThreadPool;

/// Naive two-pass attention in f64 over the f16-widened cache.
fn naive(q: &[f32], k: &[f16], v: &[f16], sh: &AttnShape) -> Vec<f64> {
    let (nh, d) = (sh.n_heads, sh.head_dim);
    let (group, stride) = (nh / sh.n_kv_heads, sh.n_kv_heads * d);
    let mut out = vec![0f64; sh.n_new * nh * d];
    for i in 0..sh.n_new {
        for h in 0..nh {
            let off = (h / group) * d;
            let qh = &q[(i * nh + h) * d..][..d];
            let keys = sh.keys(i);
            let s: Vec<f64> = keys
                .clone()
                .map(|p| {
                    let kp = &k[p * stride + off..][..d];
                    qh.iter().zip(kp).map(|(&a, b)| a as f64 * b.to_f64()).sum::<f64>() * sh.scale as f64
                })
                .collect();
            // A sink joins the denominator only.
            let sink = sh.sinks.map(|s| s[h] as f64);
            let m = s.iter().copied().chain(sink).fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
            for (p, w) in keys.zip(&e) {
                let vp = &v[p * stride + off..][..d];
                for (o, x) in out[(i * nh + h) * d..][..d].iter_mut().zip(vp) {
                    *o += w / sum * x.to_f64();
                }
            }
        }
    }
    out
}

fn close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= rel * scale, "{what}[{k}]: {g} vs {w}");
    }
}

fn halves(rng: &mut TestRng, n: usize, a: f32) -> Vec<f16> {
    (0..n).map(|_| f16::from_f32(rng.gen_range(-a..a))).collect()
}

/// (n_new, start_pos, heads, kv heads, head_dim, window, |q|, sinks: none, or
/// logits drawn in ±this (large values dominate the scores, small ones not)).
type Case = (usize, usize, usize, usize, usize, Option<usize>, f32, Option<f32>);

#[test]
fn attention_matches_naive() {
    let mut rng = rng(32);
    let cases: &[Case] = &[
        (1, 0, 9, 3, 64, None, 1.0, None),
        (1, 37, 9, 3, 64, None, 1.0, None),
        (1, 3000, 9, 3, 64, None, 1.0, None),
        (1, 3000, 8, 2, 128, None, 4.0, None),
        (1, 2500, 4, 4, 64, None, 1.0, None),
        (7, 3000, 12, 4, 64, None, 1.0, None),
        (5, 3, 4, 4, 16, None, 1.0, None),
        (17, 0, 8, 2, 12, None, 1.0, None),
        (33, 0, 4, 4, 64, None, 3.0, None),
        (40, 5, 12, 3, 128, None, 1.0, None),
        (19, 60, 6, 2, 80, None, 2.0, None),
        (3, 10, 32, 1, 64, None, 1.0, None),
        (3, 40, 72, 1, 64, None, 1.0, None),
        (2, 70, 136, 2, 16, Some(50), 1.0, None),
        (200, 0, 9, 3, 64, None, 1.0, None),
        (20, 100, 6, 2, 64, Some(16), 1.0, None),
        (1, 3000, 9, 3, 64, Some(512), 1.0, None),
        (37, 2000, 9, 3, 64, Some(100), 1.0, None),
        (9, 0, 4, 2, 64, Some(1), 1.0, None),
        // gpt-oss: sinks, with and without a window, prefill and (split) decode.
        (1, 0, 8, 2, 32, None, 1.0, Some(2.0)),
        (1, 3000, 8, 2, 32, None, 1.0, Some(2.0)),
        (1, 3000, 8, 2, 32, Some(128), 1.0, Some(20.0)),
        (24, 0, 8, 2, 32, Some(8), 1.0, Some(2.0)),
        (37, 60, 8, 2, 64, None, 2.0, Some(20.0)),
        (5, 3, 4, 4, 16, None, 1.0, Some(0.5)),
    ];
    for &(n_new, start_pos, nh, nkv, hd, window, qa, sinks) in cases {
        let sinks: Option<Vec<f32>> = sinks.map(|a| (0..nh).map(|_| rng.gen_range(-a..a)).collect());
        // The cache ends exactly at the last new token on odd cases (no slack to
        // read past), with slack on even ones.
        let ctx = start_pos + n_new + if n_new % 2 == 1 { 0 } else { 3 };
        let q: Vec<f32> = (0..n_new * nh * hd).map(|_| rng.gen_range(-qa..qa)).collect();
        let k = halves(&mut rng, ctx * nkv * hd, 1.0);
        let v = halves(&mut rng, ctx * nkv * hd, 1.0);
        let sh = AttnShape {
            n_new,
            start_pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            window,
            scale: 1.0 / (hd as f32).sqrt(),
            sinks: sinks.as_deref(),
            prefill: false,
        };
        let want = naive(&q, &k, &v, &sh);
        let what = format!("{sh:?}");
        let mut reference = vec![f32::NAN; n_new * nh * hd];
        attention::attention_reference(&q, &k, &v, &sh, &mut reference);
        close(&reference, &want, 2e-5, &format!("reference {what}"));
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads);
            for _ in 0..2 {
                // Twice: the second call reuses warm scratch.
                let mut out = vec![f32::NAN; n_new * nh * hd];
                attention::attention(&pool, &q, &k, &v, &sh, &mut out);
                close(&out, &want, 2e-5, &format!("tiled {what} threads {threads}"));
            }
            // The same values in an f32 cache (the type float checkpoints use).
            let (k32, v32): (Vec<f32>, Vec<f32>) =
                (k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect());
            let mut out = vec![f32::NAN; n_new * nh * hd];
            attention::attention(&pool, &q, &k32, &v32, &sh, &mut out);
            close(&out, &want, 2e-5, &format!("tiled f32 cache {what} threads {threads}"));
        }
        // The same cache scattered over shuffled blocks of a pool (paged KV),
        // with a block size that divides the key step (16) and one that does not (48).
        for block in [16, 48] {
            let stride = nkv * hd;
            let n_blocks = ctx.div_ceil(block);
            let mut table: Vec<u32> = (0..n_blocks as u32).collect();
            table.sort_by_key(|&b| b.wrapping_mul(2_654_435_761).rotate_left(7));
            let (mut kp, mut vp) =
                (vec![f16::ZERO; n_blocks * block * stride], vec![f16::ZERO; n_blocks * block * stride]);
            for p in 0..ctx {
                let at = (table[p / block] as usize * block + p % block) * stride;
                kp[at..at + stride].copy_from_slice(&k[p * stride..(p + 1) * stride]);
                vp[at..at + stride].copy_from_slice(&v[p * stride..(p + 1) * stride]);
            }
            let view = attention::KvView { k: &kp, v: &vp, table: &table, block };
            for threads in [1, 3] {
                let mut out = vec![f32::NAN; n_new * nh * hd];
                attention::attention_paged(&ThreadPool::new(threads), &q, &view, &sh, &mut out);
                close(&out, &want, 2e-5, &format!("paged (block {block}) {what} threads {threads}"));
            }
            let mut out = vec![f32::NAN; n_new * nh * hd];
            attention::attention_reference_paged(&q, &view, &sh, &mut out);
            close(&out, &want, 2e-5, &format!("paged reference (block {block}) {what}"));
        }
        let mut reference32 = vec![f32::NAN; n_new * nh * hd];
        let (k32, v32): (Vec<f32>, Vec<f32>) =
            (k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect());
        attention::attention_reference(&q, &k32, &v32, &sh, &mut reference32);
        close(&reference32, &want, 2e-5, &format!("reference f32 cache {what}"));
    }
}

#[test]
fn f16_store_rounds_like_half() {
    let mut rng = rng(33);
    let mut x: Vec<f32> =
        (0..1003).map(|_| rng.gen_range(-70000.0f32..70000.0) * rng.gen_range(0.0f32..1.0).powi(8)).collect();
    // Halfway cases, subnormals, overflow, zeros and infinities.
    x.extend([1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 6e-8, 3e-8, 1e-6, 65520.0, 1e9, -0.0, 0.0, f32::INFINITY]);
    x.extend([f32::NEG_INFINITY, 2049.0, 2051.0, -65504.0]);
    let mut got = vec![f16::ZERO; x.len()];
    attention::f32_to_f16(&x, &mut got);
    for (g, &v) in got.iter().zip(&x) {
        assert_eq!(g.to_bits(), f16::from_f32(v).to_bits(), "{v}");
    }
}

/// The decode steps that read an f16 cache in place (`attention::direct`) at
/// every level this CPU has, against their scalar loops: scores within 1e-6 of
/// `Σ|q·k|` (another summation order), P·V bit for bit (one FMA per key in key
/// order at every level). Odd key counts and a stride wider than `d` (several
/// KV heads per row); the slice ends at the last key row.
#[test]
fn direct_steps_match_scalar() {
    let mut rng = rng(34);
    for &(rows, n, d, stride) in &[(3, 32, 64, 192), (1, 7, 64, 64), (4, 13, 128, 256), (2, 1, 32, 96), (5, 9, 16, 48)]
    {
        let q: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let k = halves(&mut rng, (n - 1) * stride + d, 1.0);
        let p: Vec<f32> = (0..rows * 40).map(|_| rng.gen_range(0.0..1.0)).collect();
        let o0: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut want_s = vec![f32::NAN; rows * 40];
        attention::direct::scores(Isa::Scalar, &q, rows, &k, stride, n, d, &mut want_s, 40);
        let mut want_o = o0.clone();
        attention::direct::pv(Isa::Scalar, &p, 40, rows, &k, stride, n, d, &mut want_o);
        for level in isa::available() {
            let mut s = vec![f32::NAN; rows * 40];
            attention::direct::scores(level, &q, rows, &k, stride, n, d, &mut s, 40);
            for r in 0..rows {
                for j in 0..40 {
                    let (got, want) = (s[r * 40 + j], want_s[r * 40 + j]);
                    if j >= n {
                        assert!(got.is_nan(), "{level}: score past n written");
                        continue;
                    }
                    let mag: f32 = (0..d).map(|c| (q[r * d + c] * k[j * stride + c].to_f32()).abs()).sum();
                    assert!((got - want).abs() <= 1e-6 * mag, "{level} rows {rows} n {n} d {d}: {got} vs {want}");
                }
            }
            let mut o = o0.clone();
            attention::direct::pv(level, &p, 40, rows, &k, stride, n, d, &mut o);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o), bits(&want_o), "{level} pv rows {rows} n {n} d {d}");
        }
    }
}

/// A prefill row's output does not depend on the chunk it ran in (the prefix
/// cache relies on it): one chunk of 45 tokens against 50 cached positions,
/// and the same tokens in chunks of 3, 27, 1 and 14, give the same bits. The
/// one-row chunk (a prompt resumed one row before its end) is marked
/// `prefill`, so it does not take the decode path.
#[test]
fn prefill_rows_do_not_depend_on_their_chunk() {
    let mut rng = rng(35);
    for &(nh, nkv, d) in &[(9, 3, 64), (4, 4, 64), (8, 2, 32), (6, 2, 80)] {
        let (start, n_new) = (50, 45);
        let ctx = start + n_new;
        let q: Vec<f32> = (0..n_new * nh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let k = halves(&mut rng, ctx * nkv * d, 1.0);
        let v = halves(&mut rng, ctx * nkv * d, 1.0);
        let shape = |start_pos, n_new| AttnShape {
            n_new,
            start_pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            window: None,
            scale: 1.0 / (d as f32).sqrt(),
            sinks: None,
            prefill: true,
        };
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            let mut whole = vec![f32::NAN; n_new * nh * d];
            attention::attention(&pool, &q, &k, &v, &shape(start, n_new), &mut whole);
            let mut parts = vec![f32::NAN; n_new * nh * d];
            let mut t = 0;
            for len in [3, 27, 1, 14] {
                let (a, b) = (t * nh * d, (t + len) * nh * d);
                attention::attention(&pool, &q[a..b], &k, &v, &shape(start + t, len), &mut parts[a..b]);
                t += len;
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&parts), "heads {nh}/{nkv} d {d} threads {threads}");
        }
    }
}
