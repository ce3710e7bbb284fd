//! In-cache speed of the four-row decode kernels (compute, not memory):
//! `cargo run --release -p shardlm-kernels --example bench_kdot -- [rows] [cols]`
//! Runs every type's `dot4` at the active ISA over a weight small enough for
//! L2 and prints ns per super-block-row and GB/s of weights.

use shardlm_kernels::isa;
use shardlm_kernels::quant::{dot4_fn, quantize_act_fn, VecDotType};
use shardlm_kernels::DType;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(256);
    let cols: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(2048);
    let isa = isa::active();
    for (dt, vdt) in [
        (DType::Q4_0, VecDotType::Q8_0),
        (DType::Q4_K, VecDotType::Q8_K),
        (DType::Q5_K, VecDotType::Q8_K),
        (DType::Q6_K, VecDotType::Q8_K),
    ] {
        let Some(mut f) = dot4_fn(dt, isa) else { continue };
        if std::env::var("PACKED").is_ok_and(|v| v == "1") {
            if let Some(p) = shardlm_kernels::packed::dot4_fn(dt, isa) {
                f = p
            } else {
                continue;
            }
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
        let t = Instant::now();
        for _ in 0..iters {
            for r in (0..rows).step_by(4) {
                unsafe { f(cols, w.as_ptr().add(r * rb), rb, a.as_ptr(), out.as_mut_ptr().add(r)) };
            }
        }
        let dt_s = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "{dt} {rows}x{cols}: {:.2} ns per 256 values of a row, {:.1} GB/s",
            dt_s * 1e9 / (rows * cols / 256) as f64,
            w.len() as f64 / dt_s / 1e9
        );
    }
}
