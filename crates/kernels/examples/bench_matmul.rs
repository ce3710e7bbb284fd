//! Decode-shaped matmul benchmark (SmolLM2-135M: 30 layers of Q4_1 q/k/v/o and
//! gate/up/down, a Q8_0 49152 × 576 output head).
//!
//! `cargo run --release -p shardlm-kernels --example bench_matmul -- [threads] [m] [isa]`

use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::matmul::{matmul_isa, MatmulScratch};
use shardlm_kernels::{DType, MatRef, ThreadPool};
use std::time::Instant;

fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n = dtype.bytes_for(rows * cols).unwrap();
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    // Sane f16 scales at the start of every block (FP8: an f32 scale, no NaN codes).
    let bb = dtype.block_bytes();
    if dtype == DType::FP8 {
        for b in v.chunks_exact_mut(bb) {
            b[0..4].copy_from_slice(&0.01f32.to_le_bytes());
            b[4..].iter_mut().filter(|q| **q & 0x7F == 0x7F).for_each(|q| *q -= 1);
        }
    } else if dtype.is_quantized() {
        for b in v.chunks_exact_mut(bb) {
            b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            if dtype == DType::Q4_1 {
                b[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_bits().to_le_bytes());
            }
        }
    }
    v
}

/// Process CPU seconds (user + system) from /proc, so a busy machine does not
/// distort single-thread numbers.
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 =
        f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1);
    let m: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1);
    let isa = args.get(3).and_then(|v| Isa::parse(v)).unwrap_or_else(isa::active);
    let wdt = std::env::var("WDTYPE").ok().and_then(|v| DType::parse(&v)).unwrap_or(DType::Q4_1);
    let odt = std::env::var("ODTYPE").ok().and_then(|v| DType::parse(&v)).unwrap_or(DType::Q8_0);
    let layers: usize = std::env::var("LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let vocab: usize = std::env::var("VOCAB").ok().and_then(|v| v.parse().ok()).unwrap_or(49152);
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (hidden, ffn, kv) = (env("HIDDEN", 576), env("FFN", 1536), env("KV", 192));
    let shapes =
        [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (ffn, hidden), (ffn, hidden), (hidden, ffn)];
    let mut ws = Vec::new();
    for l in 0..layers {
        for (k, &(r, c)) in shapes.iter().enumerate() {
            ws.push((wdt, r, c, weight(wdt, r, c, (l * 10 + k) as u64)));
        }
    }
    if vocab > 0 {
        ws.push((odt, vocab, hidden, weight(odt, vocab, hidden, 999)));
    }
    // PACKED=1: the packed layout the model loader uses, where it uses one
    // (a type is packed only where the level has a kernel for the layout, as
    // `model::linear` decides; packing it anyway would time a scalar fallback).
    let packed = std::env::var("PACKED").is_ok_and(|v| v == "1");
    let pack_it = |dt: DType, r: usize, c: usize| {
        shardlm_kernels::packed::packable(dt, r, c) && shardlm_kernels::packed::worth_packing(dt, isa)
    };
    if packed {
        for w in ws.iter_mut() {
            if pack_it(w.0, w.1, w.2) {
                w.3 = shardlm_kernels::packed::pack(w.0, w.1, w.2, &w.3);
            }
        }
    }
    let total_bytes: usize = ws.iter().map(|w| w.3.len()).sum();
    let pool = ThreadPool::new(threads);
    let mut scratch = MatmulScratch::default();
    let x: Vec<f32> = (0..m * ffn).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02).collect();
    let mut y = vec![0f32; m * vocab.max(ffn)];
    let mut run = || {
        for (dt, r, c, d) in &ws {
            let w = if packed && pack_it(*dt, *r, *c) {
                MatRef::new_packed(*dt, *r, *c, d).unwrap()
            } else {
                MatRef::new(*dt, *r, *c, d).unwrap()
            };
            matmul_isa(isa, &pool, w, &x[..m * c], m, &mut y[..m * r], &mut scratch);
        }
    };
    run();
    // ITERS overrides the number of timed passes.
    let iters = env("ITERS", 0);
    let iters = if iters > 0 {
        iters
    } else if m == 1 {
        (3_000_000_000 / total_bytes.max(1)).max(3)
    } else {
        (100_000_000 / (total_bytes.max(1) * m)).max(3)
    };
    let t = Instant::now();
    let c = cpu_seconds();
    for _ in 0..iters {
        run();
    }
    let dt = t.elapsed().as_secs_f64() / iters as f64;
    let cpu = (cpu_seconds() - c) / iters as f64;
    println!(
        "{wdt}+{odt} isa={isa} threads={threads} m={m}: {:.2} ms/pass (cpu {:.2} ms), {:.1} tok/s, {:.1} GB/s weights",
        dt * 1e3,
        cpu * 1e3,
        m as f64 / dt,
        total_bytes as f64 / dt / 1e9
    );
}
