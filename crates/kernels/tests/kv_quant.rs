//! Quantized KV cache (Q8_0, Q4_0): the store against the reference quantizers,
//! the widen at every ISA level against scalar (bit for bit), and tiled
//! attention at depth (contiguous, sliding window, paged) at the active ISA
//! level against a naive f64 attention over the dequantized cache: the same
//! stored values, so the bound stays as tight as for f16.

mod common;

use bytemuck::Zeroable;
use common::*;
use rand::Rng;
use shardlm_kernels::attention::{self, AttnShape, KvElem, KvView};
use shardlm_kernels::isa;
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

/// A quantized type under test: its name and its reference dequantizer.
trait Quant: KvElem + bytemuck::Zeroable {
    const NAME: &'static str;
    fn dequantize(b: &[Self], out: &mut [f32]);
}

impl Quant for BlockQ8_0 {
    const NAME: &'static str = "q8_0";
    fn dequantize(b: &[Self], out: &mut [f32]) {
        q8_0::dequantize(b, out)
    }
}

impl Quant for BlockQ4_0 {
    const NAME: &'static str = "q4_0";
    fn dequantize(b: &[Self], out: &mut [f32]) {
        q4_0::dequantize(b, out)
    }
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
        let sh = AttnShape { n_new, start_pos, n_heads: nh, n_kv_heads: nkv, head_dim: hd, window, scale, sinks: None };
        let want = naive(&q, &kf, &vf, &sh);
        let what = format!("{} {sh:?}", T::NAME);
        let mut out = vec![f32::NAN; n_new * nh * hd];
        attention::attention_reference(&q, &k, &v, &sh, &mut out);
        close(&out, &want, 2e-5, &format!("reference {what}"));
        for threads in [1, 3] {
            let mut out = vec![f32::NAN; n_new * nh * hd];
            attention::attention(&ThreadPool::new(threads), &q, &k, &v, &sh, &mut out);
            close(&out, &want, 2e-5, &format!("tiled {what} threads {threads}"));
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
