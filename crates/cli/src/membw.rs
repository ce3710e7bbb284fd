//! `shardlm membw`: memory read bandwidth, the ceiling of batch-1 decode speed
//! (tokens/s ≤ bandwidth ÷ weight bytes read per token).
//!
//! A buffer (2 GiB by default, far larger than any cache) is filled once, then
//! summed as u64 words by 1 thread and by N threads, each thread over its own
//! contiguous slice, with AVX2 loads and four independent accumulators where the
//! CPU has AVX2 and an unrolled scalar loop otherwise. Each case is repeated and
//! the best repetition is reported.

use anyhow::{bail, Result};
use clap::Args;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct MembwArgs {
    /// Buffer size in MiB.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    size_mib: u64,
    /// Thread counts to measure, comma-separated (default: 1 and all cores).
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Repetitions per thread count; the best is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// Sums `words` with plain loads, eight accumulators so the adds never serialize.
fn sum_scalar(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// Sums `words` with 256-bit loads, 16 words (two cache lines) per iteration.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let n16 = words.len() / 16 * 16;
    let p = words.as_ptr();
    let mut a0 = _mm256_setzero_si256();
    let mut a1 = _mm256_setzero_si256();
    let mut a2 = _mm256_setzero_si256();
    let mut a3 = _mm256_setzero_si256();
    let mut i = 0;
    while i < n16 {
        // SAFETY: i + 16 <= words.len(); unaligned loads.
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(p.add(i) as *const __m256i));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(p.add(i + 4) as *const __m256i));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(p.add(i + 8) as *const __m256i));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(p.add(i + 12) as *const __m256i));
        i += 16;
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, s);
    lanes.iter().fold(sum_scalar(&words[n16..]), |a, &w| a.wrapping_add(w))
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn sum_words(words: &[u64], avx2: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true when the CPU reports AVX2.
        return unsafe { sum_avx2(words) };
    }
    let _ = avx2;
    sum_scalar(words)
}

/// One timed pass of `threads` threads over `buf`; returns bytes per second.
fn one_pass(buf: &[u64], threads: usize, avx2: bool) -> f64 {
    let per = buf.len().div_ceil(threads);
    let barrier = Barrier::new(threads + 1);
    let secs = std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks(per)
            .map(|part| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    black_box(sum_words(black_box(part), avx2))
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for h in handles {
            h.join().expect("membw thread panicked");
        }
        t0.elapsed().as_secs_f64()
    });
    std::mem::size_of_val(buf) as f64 / secs.max(1e-9)
}

pub fn membw(a: MembwArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut counts = a.threads.clone().unwrap_or_else(|| if cores > 1 { vec![1, cores] } else { vec![1] });
    counts.dedup();
    if counts.iter().any(|&t| t == 0 || t > 1024) {
        bail!("--threads values must be in 1..=1024");
    }
    let bytes = a.size_mib as usize * (1 << 20);
    let words = bytes / 8;
    // On huge pages where the system allows, as the repacked weights are (a
    // ceiling measured on 4 KiB pages would understate the hardware). Touch
    // every page (and make the contents non-trivial) before timing.
    let mut buf = vec![0u64; words];
    kernels::hugepages::advise(bytemuck::cast_slice_mut(&mut buf));
    buf.iter_mut().enumerate().for_each(|(i, w)| *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let avx2 = has_avx2();
    let mut results = Vec::new();
    for &t in &counts {
        let mut best = 0f64;
        let mut all = Vec::new();
        for r in 0..a.reps {
            eprintln!("membw: {t} thread(s), repetition {}/{} ...", r + 1, a.reps);
            let bw = one_pass(&buf, t, avx2);
            all.push(bw);
            best = best.max(bw);
        }
        if !a.json {
            println!(
                "{t:>4} thread(s): {:8.2} GB/s  ({:.2} GiB/s) best of {}",
                best / 1e9,
                best / (1u64 << 30) as f64,
                a.reps
            );
        }
        results.push(serde_json::json!({
            "threads": t,
            "best_bytes_per_s": best,
            "best_gb_s": best / 1e9,
            "samples_gb_s": all.iter().map(|b| b / 1e9).collect::<Vec<_>>(),
        }));
    }
    if a.json {
        let j = serde_json::json!({
            "buffer_bytes": bytes,
            "reps": a.reps,
            "kernel": if avx2 { "avx2" } else { "scalar" },
            "results": results,
        });
        println!("{j}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_agree() {
        let v: Vec<u64> = (0..1003u64).map(|i| i * 7919).collect();
        let want = v.iter().fold(0u64, |a, &w| a.wrapping_add(w));
        assert_eq!(sum_scalar(&v), want);
        assert_eq!(sum_words(&v, has_avx2()), want);
        assert!(one_pass(&v, 3, has_avx2()) > 0.0);
    }
}
