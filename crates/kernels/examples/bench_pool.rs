//! Cost of an empty `ThreadPool::run` (the per-op synchronization overhead).
//!
//! `cargo run --release -p shardlm-kernels --example bench_pool -- [threads]`

use shardlm_kernels::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let c = AtomicUsize::new(0);
    for _ in 0..1000 {
        pool.run(|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
    }
    let n = 100_000;
    let t = Instant::now();
    for _ in 0..n {
        pool.run(|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
    }
    println!("threads={threads}: {:.2} µs per run", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}
