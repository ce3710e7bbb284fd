//! Quantized KV cache (Q8_0, Q4_0): the store against the reference quantizers,
//! the widen and the integer score kernels at every ISA level against scalar
//! (bit for bit), and tiled attention at depth (contiguous, sliding window,
//! paged) at the active ISA level against a naive f64 attention over the
//! dequantized cache.
//!
//! The tiled attention scores Q8_0/Q4_0 keys against the query quantized to
//! int8 (`kv_int_dot`), so it is checked twice: against the naive attention fed
//! the same quantized query (the same values: the f16 bound, 2e-5 of the
//! output scale), and against the naive attention of the exact query with the
//! bound the query's rounding allows (derived in [`query_rounding_bound`]).

mod common;

use bytemuck::Zeroable;
use common::*;
use rand::Rng;
use shardlm_kernels::attention::{self, AttnShape, KvElem, KvView};
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::kv_int_dot::{q4_0_scores, q8_0_scores, QuantQuery};
use shardlm_kernels::kv_quant::{widen_q4_0, widen_q8_0};
use shardlm_kernels::quant::q4_0::{self, BlockQ4_0};
use shardlm_kernels::quant::q8_0::{self, BlockQ8_0};
use shardlm_kernels::ThreadPool;

/// Naive two-pass attention in f64 over a cache of f32 values (`ctx × n_kv_heads × d`).
fn naive(q: &[f32], k: &[f32], v: &[f32], sh: &AttnShape) -> Vec<f64> {
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
                    qh.iter().zip(kp).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * sh.scale as f64
                })
                .collect();
            let m = s.iter().fold(f64::MIN, |a, &b| a.max(b));
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (p, w) in keys.zip(&e) {
                for (o, &x) in out[(i * nh + h) * d..][..d].iter_mut().zip(&v[p * stride + off..][..d]) {
                    *o += w / sum * x as f64;
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

/// A quantized type under test: its name, its reference dequantizer and its
/// integer score kernel.
trait Quant: KvElem + bytemuck::Zeroable {
    const NAME: &'static str;
    fn dequantize(b: &[Self], out: &mut [f32]);
    fn scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize);
}

impl Quant for BlockQ8_0 {
    const NAME: &'static str = "q8_0";
    fn dequantize(b: &[Self], out: &mut [f32]) {
        q8_0::dequantize(b, out)
    }
    fn scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
        q8_0_scores(isa, q, k, stride, n, s, s_stride)
    }
}

impl Quant for BlockQ4_0 {
    const NAME: &'static str = "q4_0";
    fn dequantize(b: &[Self], out: &mut [f32]) {
        q4_0::dequantize(b, out)
    }
    fn scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
        q4_0_scores(isa, q, k, stride, n, s, s_stride)
    }
}

/// The query as the tiled attention sees it: `q · scale` quantized per row and
/// 32-value block (`n_new · n_heads` rows of `d`), dequantized (`code · step`).
fn quantized_query(q: &[f32], scale: f32, d: usize) -> (QuantQuery, Vec<f32>) {
    let scaled: Vec<f32> = q.iter().map(|&x| x * scale).collect();
    let mut qq = QuantQuery::default();
    qq.quantize(&scaled, q.len() / d, d);
    let back = qq.codes.iter().enumerate().map(|(i, &c)| c as f32 * qq.scales[i / 32]).collect();
    (qq, back)
}

/// How far the attention output may move when each query value is rounded to
/// its int8 code (per output value `(token, head, c)`), against the exact query.
///
/// Rounding moves query value `i` of block `b` by at most half a step
/// (`step_b / 2`), so a score moves by `|Δs_j| ≤ Δ = Σ_b (step_b / 2) · K_b`,
/// where `K_b` bounds `Σ_{i∈b} |k_ji|` over every key `j` (the max over the
/// whole cache of this KV head). A softmax weight `p_j = e^(s_j) / Σ e^(s)` then
/// changes by a factor within `[e^(−2Δ), e^(2Δ)]`, so `Σ_j |p'_j − p_j| ≤
/// e^(2Δ) − 1`, and output value `c` moves by at most `(e^(2Δ) − 1) · max_j |v_jc|`.
/// Rigorous, not first-order; the tests add 2e-5 of the output scale for the
/// float arithmetic.
fn query_rounding_bound(qq: &QuantQuery, kf: &[f32], vf: &[f32], sh: &AttnShape) -> Vec<f64> {
    let (nh, d, nkv) = (sh.n_heads, sh.head_dim, sh.n_kv_heads);
    let (group, nb, stride) = (nh / nkv, d / 32, nkv * d);
    let ctx = kf.len() / stride;
    let mut out = vec![0f64; sh.n_new * nh * d];
    for h in 0..nh {
        let off = (h / group) * d;
        let k1: Vec<f64> = (0..nb)
            .map(|b| {
                (0..ctx)
                    .map(|p| kf[p * stride + off + 32 * b..][..32].iter().map(|x| x.abs() as f64).sum::<f64>())
                    .fold(0.0, f64::max)
            })
            .collect();
        let vmax: Vec<f64> =
            (0..d).map(|c| (0..ctx).map(|p| vf[p * stride + off + c].abs() as f64).fold(0.0, f64::max)).collect();
        for i in 0..sh.n_new {
            let row = i * nh + h;
            let delta: f64 = (0..nb).map(|b| qq.scales[row * nb + b] as f64 / 2.0 * k1[b]).sum();
            for c in 0..d {
                out[row * d + c] = ((2.0 * delta).exp() - 1.0) * vmax[c];
            }
        }
    }
    out
}

/// `n` values stored as `T` (through [`KvElem::store`]) and what they dequantize to.
fn stored<T: Quant>(rng: &mut TestRng, n: usize) -> (Vec<T>, Vec<f32>) {
    // Keys and values of very different magnitudes per block, as real K rows.
    let x: Vec<f32> = (0..n).map(|i| rng.gen_range(-1.0..1.0) * (1 + (i / 32) % 5) as f32).collect();
    let mut blocks = vec![T::zeroed(); n / 32];
    T::store(&x, &mut blocks);
    let mut back = vec![0f32; n];
    T::dequantize(&blocks, &mut back);
    (blocks, back)
}

/// (n_new, start_pos, heads, kv heads, head_dim, window, |q|).
type Case = (usize, usize, usize, usize, usize, Option<usize>, f32);

fn attention_at_depth<T: Quant>() {
    let mut rng = rng(71);
    let cases: &[Case] = &[
        (1, 3000, 9, 3, 64, None, 1.0),
        (1, 3000, 8, 2, 128, None, 4.0),
        (1, 3000, 9, 3, 64, Some(512), 1.0),
        (7, 3000, 12, 4, 64, None, 1.0),
        (37, 2000, 9, 3, 64, Some(100), 1.0),
        (40, 5, 12, 3, 128, None, 1.0),
        (20, 100, 6, 2, 32, Some(16), 1.0),
        (1, 0, 4, 4, 64, None, 1.0),
    ];
    for &(n_new, start_pos, nh, nkv, hd, window, qa) in cases {
        let ctx = start_pos + n_new + if n_new % 2 == 1 { 0 } else { 3 };
        let stride = nkv * hd / 32;
        let q: Vec<f32> = (0..n_new * nh * hd).map(|_| rng.gen_range(-qa..qa)).collect();
        let (k, kf) = stored::<T>(&mut rng, ctx * nkv * hd);
        let (v, vf) = stored::<T>(&mut rng, ctx * nkv * hd);
        let scale = 1.0 / (hd as f32).sqrt();
        let sh = AttnShape {
            n_new,
            start_pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            window,
            scale,
            sinks: None,
            prefill: false,
        };
        let want_exact_q = naive(&q, &kf, &vf, &sh);
        let what = format!("{} {sh:?}", T::NAME);
        let mut out = vec![f32::NAN; n_new * nh * hd];
        attention::attention_reference(&q, &k, &v, &sh, &mut out);
        close(&out, &want_exact_q, 2e-5, &format!("reference {what}"));
        // The tiled attention's query: quantized, already scaled.
        let (qq, q_deq) = quantized_query(&q, scale, hd);
        let want = naive(&q_deq, &kf, &vf, &AttnShape { scale: 1.0, ..sh });
        let bound = query_rounding_bound(&qq, &kf, &vf, &sh);
        let out_scale = want_exact_q.iter().fold(0f64, |m, v| m.max(v.abs()));
        for threads in [1, 3] {
            let mut out = vec![f32::NAN; n_new * nh * hd];
            attention::attention(&ThreadPool::new(threads), &q, &k, &v, &sh, &mut out);
            close(&out, &want, 2e-5, &format!("tiled {what} threads {threads}"));
            let (mut worst_err, mut worst_ratio) = (0f64, 0f64);
            for (i, ((&g, &w), &b)) in out.iter().zip(&want_exact_q).zip(&bound).enumerate() {
                let err = (g as f64 - w).abs();
                assert!(err <= b + 2e-5 * out_scale, "tiled {what} vs exact query [{i}]: {err} > bound {b}");
                (worst_err, worst_ratio) = (worst_err.max(err), worst_ratio.max(err / (b + 2e-5 * out_scale)));
            }
            if threads == 1 {
                eprintln!(
                    "{what}: vs exact query max err {:.2e} of output scale, {:.3} of the bound",
                    worst_err / out_scale,
                    worst_ratio
                );
            }
        }
        // Scattered over shuffled blocks of a pool (paged KV): a block size that
        // divides the key step and one that does not.
        for block in [16, 48] {
            let n_blocks = ctx.div_ceil(block);
            let mut table: Vec<u32> = (0..n_blocks as u32).collect();
            table.sort_by_key(|&b| b.wrapping_mul(2_654_435_761).rotate_left(7));
            let (mut kp, mut vp) =
                (vec![T::zeroed(); n_blocks * block * stride], vec![T::zeroed(); n_blocks * block * stride]);
            for p in 0..ctx {
                let at = (table[p / block] as usize * block + p % block) * stride;
                kp[at..at + stride].copy_from_slice(&k[p * stride..(p + 1) * stride]);
                vp[at..at + stride].copy_from_slice(&v[p * stride..(p + 1) * stride]);
            }
            let view = KvView { k: &kp, v: &vp, table: &table, block };
            let mut out = vec![f32::NAN; n_new * nh * hd];
            attention::attention_paged(&ThreadPool::new(3), &q, &view, &sh, &mut out);
            close(&out, &want, 2e-5, &format!("paged (block {block}) {what}"));
        }
    }
}

#[test]
fn q8_0_attention_at_depth() {
    attention_at_depth::<BlockQ8_0>();
}

#[test]
fn q4_0_attention_at_depth() {
    attention_at_depth::<BlockQ4_0>();
}

/// The integer score kernels at every ISA level against the scalar reference,
/// bit for bit, and the reference against the f64 dot product of the
/// dequantized query and keys.
fn int_scores_at_every_level<T: Quant>() {
    let mut rng = rng(74);
    // (query rows, head_dim, keys, key stride in blocks): full groups of 16
    // and 8 keys, tails, one key, none, a head_dim of 128.
    for (rows, d, n, stride) in [(3, 64, 32, 6), (1, 64, 21, 2), (7, 128, 17, 4), (2, 32, 1, 1), (2, 64, 0, 2)] {
        let x: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let mut q = QuantQuery::default();
        q.quantize(&x, rows, d);
        let (k, kf) = stored::<T>(&mut rng, (n.max(1) * stride) * 32);
        let s_stride = n + 3;
        let mut want = vec![0f32; rows * s_stride];
        T::scores(Isa::Scalar, &q, &k, stride, n, &mut want, s_stride);
        for r in 0..rows {
            for j in 0..n {
                let exact: f64 = (0..d)
                    .map(|i| {
                        q.codes[r * d + i] as f64
                            * q.scales[r * d / 32 + i / 32] as f64
                            * kf[j * stride * 32 + i] as f64
                    })
                    .sum();
                let mag: f64 = (0..d).map(|i| (x[r * d + i] as f64 * kf[j * stride * 32 + i] as f64).abs()).sum();
                let got = want[r * s_stride + j] as f64;
                assert!(
                    (got - exact).abs() <= 1e-6 * mag.max(1e-30),
                    "{} reference score {r},{j}: {got} vs {exact}",
                    T::NAME
                );
            }
        }
        for level in isa::available() {
            let mut got = vec![0f32; rows * s_stride];
            T::scores(level, &q, &k, stride, n, &mut got, s_stride);
            let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{} scores at {level} (rows {rows}, d {d}, n {n}) differ from scalar", T::NAME);
        }
    }
}

#[test]
fn q8_0_int_scores_at_every_level() {
    int_scores_at_every_level::<BlockQ8_0>();
}

#[test]
fn q4_0_int_scores_at_every_level() {
    int_scores_at_every_level::<BlockQ4_0>();
}

#[test]
fn query_quantizer_edges() {
    // All-zero block, a block with one value, ±amax ties and a tiny block.
    let mut x = vec![0f32; 128];
    x[32] = -2.5;
    x[64..96].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 1.0 } else { -1.0 });
    x[96..].iter_mut().enumerate().for_each(|(i, v)| *v = 1e-30 * i as f32);
    let mut q = QuantQuery::default();
    q.quantize(&x, 1, 128);
    assert_eq!((q.scales[0], q.sums[0]), (0.0, 0), "zero block");
    assert!(q.codes[..32].iter().all(|&c| c == 0));
    assert_eq!((q.codes[32], q.sums[1]), (-127, -127), "single value");
    assert!(q.codes[64..96].iter().all(|&c| c == 127 || c == -127) && q.sums[2] == 0, "ties");
    assert_eq!(q.codes[127], 127, "tiny values keep their range");
}

#[test]
fn store_is_the_reference_quantizer() {
    let mut rng = rng(72);
    let mut x = random_acts(&mut rng, 32 * 40);
    x[..32].fill(0.0); // an all-zero block
    let (mut a8, mut b8) = (vec![BlockQ8_0::zeroed(); 40], vec![BlockQ8_0::zeroed(); 40]);
    KvElem::store(&x, &mut a8);
    q8_0::quantize_activations(&x, &mut b8);
    assert_eq!(a8, b8, "q8_0 store");
    let (mut a4, mut b4) = (vec![BlockQ4_0::zeroed(); 40], vec![BlockQ4_0::zeroed(); 40]);
    KvElem::store(&x, &mut a4);
    q4_0::quantize(&x, &mut b4);
    assert_eq!(a4, b4, "q4_0 store");
}

#[test]
fn widen_is_bit_identical_at_every_level() {
    let mut rng = rng(73);
    let (d, stride, n) = (128, 13, 7);
    let (b8, _) = stored::<BlockQ8_0>(&mut rng, (n * stride) * 32);
    let (b4, _) = stored::<BlockQ4_0>(&mut rng, (n * stride) * 32);
    let (mut want, mut got) = (vec![0f32; n * d], vec![0f32; n * d]);
    for level in isa::available() {
        widen_q8_0(isa::Isa::Scalar, &b8[1..], stride, n - 1, d, &mut want);
        widen_q8_0(level, &b8[1..], stride, n - 1, d, &mut got);
        assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "q8_0 widen at {level}");
        widen_q4_0(isa::Isa::Scalar, &b4[2..], stride, n - 1, d, &mut want);
        widen_q4_0(level, &b4[2..], stride, n - 1, d, &mut got);
        assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "q4_0 widen at {level}");
    }
}

/// AVX-512 decode runs P·V straight from Q8_0 value rows
/// (`attention::direct::pv_q8_0`, [`KvElem::DIRECT_PV`]): at every level it
/// gives the bits of widening the rows (scalar widen) and one FMA per value and
/// key in key order. Row counts 1–5 (the 4-row and tail kernels), d of 32, 64
/// and 96 (the 64-value chunk and the 32-value tail), a row stride of several
/// KV heads, the slice ending at the last row read.
#[test]
fn q8_0_direct_pv_is_the_widened_pv_at_every_level() {
    let mut rng = rng(74);
    for &(rows, n, d, stride) in &[(3, 32, 64, 6), (1, 7, 32, 1), (4, 13, 96, 9), (5, 9, 64, 2), (2, 1, 128, 4)] {
        let (blocks, _) = stored::<BlockQ8_0>(&mut rng, ((n - 1) * stride + d / 32) * 32);
        let p: Vec<f32> = (0..rows * 40).map(|_| rng.gen_range(0.0..1.0)).collect();
        let o0: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut vals = vec![0f32; n * d];
        widen_q8_0(Isa::Scalar, &blocks, stride, n, d, &mut vals);
        let mut want = o0.clone();
        for r in 0..rows {
            for j in 0..n {
                for c in 0..d {
                    want[r * d + c] = p[r * 40 + j].mul_add(vals[j * d + c], want[r * d + c]);
                }
            }
        }
        for level in isa::available() {
            let mut got = o0.clone();
            attention::direct::pv_q8_0(level, &p, 40, rows, &blocks, stride, n, d, &mut got);
            assert!(
                want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level} rows {rows} n {n} d {d} stride {stride}"
            );
        }
    }
    const { assert!(BlockQ8_0::DIRECT_PV) };
}
