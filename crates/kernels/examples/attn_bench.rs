//! Times `attention::attention` on SmolLM2-135M's shape (9 heads, 3 KV heads,
//! head_dim 64): a 512-token prefill chunk at several depths, and decode steps,
//! over an f16 (default), q8_0 or q4_0 KV cache.
//! `cargo run --release -p shardlm-kernels --example attn_bench [threads] [f16|q8_0|q4_0]`.

use bytemuck::Zeroable;
use half::f16;
use shardlm_kernels::attention::{attention, AttnShape, KvElem};
use shardlm_kernels::quant::{q4_0::BlockQ4_0, q8_0::BlockQ8_0};
use shardlm_kernels::ThreadPool;
use std::time::Instant;

fn main() {
    let threads = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let pool = ThreadPool::new(threads);
    match std::env::args().nth(2).as_deref().unwrap_or("f16") {
        "q8_0" => bench::<BlockQ8_0>(&pool, BlockQ8_0::zeroed()),
        "q4_0" => bench::<BlockQ4_0>(&pool, BlockQ4_0::zeroed()),
        _ => bench::<f16>(&pool, f16::ZERO),
    }
}

/// The shape: `ATTN_SHAPE=heads,kv_heads,head_dim,layers` (default SmolLM2's
/// `9,3,64,30`; the Qwen3-Next test model's attention layers: `8,2,128,6`).
fn shape() -> (usize, usize, usize, usize) {
    let v: Vec<usize> =
        std::env::var("ATTN_SHAPE").unwrap_or_default().split(',').filter_map(|s| s.trim().parse().ok()).collect();
    match v[..] {
        [h, kv, d, l] => (h, kv, d, l),
        _ => (9, 3, 64, 30),
    }
}

fn bench<T: KvElem>(pool: &ThreadPool, zero: T) {
    let (nh, nkv, d, n_layers) = shape();
    let scale = 1.0 / (d as f32).sqrt();
    let ctx = 8192 + 512;
    let x: Vec<f32> = (0..ctx * nkv * d).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let (mut k, mut v) = (vec![zero; x.len() / T::VALUES], vec![zero; x.len() / T::VALUES]);
    T::store(&x, &mut k);
    let xr: Vec<f32> = x.iter().rev().copied().collect();
    T::store(&xr, &mut v);
    let cases: &[(usize, usize)] = if std::env::var_os("ATTN_DECODE_ONLY").is_some() {
        &[(1, 8192)]
    } else {
        &[(512, 0), (512, 1536), (1, 512), (1, 2048), (1, 8192)]
    };
    for &(n_new, start) in cases {
        let q: Vec<f32> = (0..n_new * nh * d).map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5).collect();
        let mut out = vec![0f32; n_new * nh * d];
        let sh = AttnShape {
            n_new,
            start_pos: start,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            window: None,
            scale,
            sinks: None,
            prefill: false,
        };
        let reps = if n_new == 1 { 300 } else { 5 };
        attention(pool, &q, &k, &v, &sh, &mut out);
        let (t, c) = (Instant::now(), cpu_ns());
        for _ in 0..reps {
            attention(pool, &q, &k, &v, &sh, &mut out);
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let cpu = (cpu_ns() - c) as f64 * 1e-9 / reps as f64;
        let pairs: f64 = (0..n_new).map(|i| (start + i + 1) as f64).sum::<f64>() * nh as f64;
        println!(
            "n_new {n_new:4} start {start:5}: {:8.3} ms/call ({:8.3} ms on the calling thread's CPU), {:6.1} GFLOP/s (x{n_layers} layers = {:.1} ms)",
            s * 1e3,
            cpu * 1e3,
            pairs * d as f64 * 4.0 / s / 1e9,
            s * 1e3 * n_layers as f64
        );
    }
    // Decode at depth 8192 as a model runs it: 30 layers' caches (190 MB for
    // f16, more than the caches hold), one call each per token, so the keys and
    // values stream from memory rather than from a cache-resident single layer.
    {
        let layers: Vec<(Vec<T>, Vec<T>)> = (0..n_layers)
            .map(|i| {
                let x: Vec<f32> = (0..ctx * nkv * d).map(|j| (((i + j) * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
                let (mut k, mut v) = (vec![zero; x.len() / T::VALUES], vec![zero; x.len() / T::VALUES]);
                T::store(&x, &mut k);
                T::store(&x[..x.len() / 2], &mut v[..x.len() / 2 / T::VALUES]);
                T::store(&x[x.len() / 2..], &mut v[x.len() / 2 / T::VALUES..]);
                (k, v)
            })
            .collect();
        let start = 8192;
        let q: Vec<f32> = (0..nh * d).map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5).collect();
        let mut out = vec![0f32; nh * d];
        let sh = AttnShape {
            n_new: 1,
            start_pos: start,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            window: None,
            scale,
            sinks: None,
            prefill: false,
        };
        let reps = if std::env::var_os("ATTN_DECODE_ONLY").is_some() { 400 } else { 20 };
        let mut best = f64::MAX;
        let t = Instant::now();
        for _ in 0..reps {
            let t1 = Instant::now();
            for (k, v) in &layers {
                attention(pool, &q, k, v, &sh, &mut out);
            }
            best = best.min(t1.elapsed().as_secs_f64());
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let bytes = (start + 1) as f64 * (nkv * d) as f64 * 2.0 * n_layers as f64 * std::mem::size_of::<T>() as f64
            / T::VALUES as f64;
        println!(
            "decode at depth {start}, {n_layers} layers' caches: {:7.2} ms/token (best {:.2}), KV read {:5.1} GB/s",
            s * 1e3,
            best * 1e3,
            bytes / s / 1e9
        );
    }
    // A whole prompt's attention, as `shardlm bench -p P` runs it (chunks of 512,
    // each against the cache so far): one layer, once, and × 30 layers.
    let prompts: &[usize] = if std::env::var_os("ATTN_DECODE_ONLY").is_some() { &[] } else { &[2048, 8192] };
    for &prompt in prompts {
        let mut total = 0.0;
        for start in (0..prompt).step_by(512) {
            let n_new = 512.min(prompt - start);
            let q: Vec<f32> = (0..n_new * nh * d).map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5).collect();
            let mut out = vec![0f32; n_new * nh * d];
            let sh = AttnShape {
                n_new,
                start_pos: start,
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: d,
                window: None,
                scale,
                sinks: None,
                prefill: false,
            };
            let t = Instant::now();
            attention(pool, &q, &k, &v, &sh, &mut out);
            total += t.elapsed().as_secs_f64();
        }
        println!(
            "prefill {prompt:5} in chunks of 512: {:8.1} ms per layer (x{n_layers} layers = {:.2} s)",
            total * 1e3,
            total * n_layers as f64
        );
    }
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat; 0 elsewhere).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}
