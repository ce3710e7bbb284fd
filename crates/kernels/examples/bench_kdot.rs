//! In-cache speed of the four-row decode kernels (compute, not memory):
//! `cargo run --release -p shardlm-kernels --example bench_kdot -- [rows] [cols]`
//! Runs every type's `dot4` (and its one-row `dot`) at the active ISA over a
//! weight small enough for L2 and prints ns per super-block-row and GB/s of
//! weights. `ONLY=iq1_s` times one type; `PACKED=1` the packed kernels.

use shardlm_kernels::isa;
use shardlm_kernels::quant::{dot4_fn, dot_fn, quantize_act_fn, VecDotType};
use shardlm_kernels::DType;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(256);
    let cols: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(2048);
    let isa = isa::active();
    let only = std::env::var("ONLY").ok();
    for (dt, vdt) in [
        (DType::Q4_0, VecDotType::Q8_0),
        (DType::Q4_K, VecDotType::Q8_K),
        (DType::Q5_K, VecDotType::Q8_K),
        (DType::Q6_K, VecDotType::Q8_K),
        (DType::Q2_K, VecDotType::Q8_K),
        (DType::Q3_K, VecDotType::Q8_K),
        (DType::IQ4_XS, VecDotType::Q8_K),
        (DType::IQ4_NL, VecDotType::Q8_0),
        (DType::IQ3_S, VecDotType::Q8_K),
        (DType::IQ3_XXS, VecDotType::Q8_K),
        (DType::IQ2_S, VecDotType::Q8_K),
        (DType::IQ2_XS, VecDotType::Q8_K),
        (DType::IQ2_XXS, VecDotType::Q8_K),
        (DType::IQ1_S, VecDotType::Q8_K),
        (DType::IQ1_M, VecDotType::Q8_K),
    ] {
        if only.as_ref().is_some_and(|o| !format!("{dt}").eq_ignore_ascii_case(o)) {
            continue;
        }
        let one = dot_fn(dt, isa);
        let four = dot4_fn(dt, isa);
        // Packed: the types the loader packs at this level (random bytes in
        // the packed layout time as well as real ones).
        if std::env::var("PACKED").is_ok_and(|v| v == "1") && !shardlm_kernels::packed::worth_packing(dt, isa) {
            continue;
        }
        let rb = dt.bytes_for(cols).unwrap();
        let mut w = vec![0u8; rb * rows];
        let mut s = 12345u64;
        for b in w.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = s as u8;
        }
        let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02).collect();
        let mut a = vec![0u8; cols / vdt.block_elems() * vdt.block_bytes()];
        quantize_act_fn(vdt, isa)(&x, &mut a);
        let mut out = vec![0f32; rows];
        let iters = (200_000_000 / w.len()).max(3);
        let report = |what: &str, dt_s: f64| {
            println!(
                "{dt} {what} {rows}x{cols}: {:.2} ns per 256 values of a row, {:.1} GB/s",
                dt_s * 1e9 / (rows * cols / 256) as f64,
                w.len() as f64 / dt_s / 1e9
            )
        };
        let packed = std::env::var("PACKED").is_ok_and(|v| v == "1");
        let four = if packed { shardlm_kernels::packed::dot4_fn(dt, isa) } else { four };
        if let Some(f) = four {
            let t = Instant::now();
            for _ in 0..iters {
                for r in (0..rows).step_by(4) {
                    unsafe { f(cols, w.as_ptr().add(r * rb), rb, a.as_ptr(), out.as_mut_ptr().add(r)) };
                }
            }
            report("dot4", t.elapsed().as_secs_f64() / iters as f64);
        }
        if let Some(f) = shardlm_kernels::dispatch::kernels(dt, isa, packed).rows16 {
            // `M=64`: that many activation rows (the prefill GEMM's shape).
            let m: usize = std::env::var("M").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
            let am: Vec<u8> = a.iter().copied().cycle().take(a.len() * m).collect();
            let mut outm = vec![0f32; rows * m];
            let iters = (iters / m).max(3);
            let t = Instant::now();
            for _ in 0..iters {
                unsafe { f(cols, w.as_ptr(), rb, rows, am.as_ptr(), a.len(), m, outm.as_mut_ptr(), rows) };
            }
            report(&format!("rows m={m}"), t.elapsed().as_secs_f64() / iters as f64 / m as f64);
        }
        if !packed {
            let t = Instant::now();
            for _ in 0..iters {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = unsafe { one(cols, w.as_ptr().add(r * rb), a.as_ptr()) };
                }
            }
            report("dot", t.elapsed().as_secs_f64() / iters as f64);
        }
    }
}
