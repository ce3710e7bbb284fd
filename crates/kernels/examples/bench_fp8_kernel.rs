//! In-L1 timing of one four-row kernel call (FP8 bf16, FP8 fallback, Q8_0):
//! `cargo run --release -p shardlm-kernels --example bench_fp8_kernel [n] [iters]`.

#[cfg(target_arch = "x86_64")]
fn main() {
    use shardlm_kernels::quant::{self, VecDotType};
    use shardlm_kernels::simd::{avx512, avx512_fp, avx512_fp8_bf16};
    use shardlm_kernels::DType;
    use std::time::Instant;
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(2048);
    let iters: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.02).collect();
    let mut fp8 = vec![0u8; DType::FP8.bytes_for(4 * n).unwrap()];
    quant::quantize_row(DType::FP8, &x.repeat(4), &mut fp8).unwrap();
    let mut q8 = vec![0u8; DType::Q8_0.bytes_for(4 * n).unwrap()];
    quant::quantize_row(DType::Q8_0, &x.repeat(4), &mut q8).unwrap();
    let mut a8 = vec![0u64; VecDotType::Q8_0.row_bytes(n).div_ceil(8)];
    let len = VecDotType::Q8_0.row_bytes(n);
    quant::quantize_act_fn(VecDotType::Q8_0, shardlm_kernels::isa::Isa::Scalar)(
        &x,
        &mut bytemuck::cast_slice_mut(&mut a8)[..len],
    );
    type Dot4 = unsafe fn(usize, *const u8, usize, *const u8, *mut f32);
    let cases: [(&str, Dot4, &[u8], *const u8); 3] = [
        ("fp8 bf16", avx512_fp8_bf16::dot4_fp8, &fp8, x.as_ptr() as *const u8),
        ("fp8 fallback", avx512_fp::dot4_fp8, &fp8, x.as_ptr() as *const u8),
        ("q8_0 file", avx512::dot4_q8_0, &q8, a8.as_ptr() as *const u8),
    ];
    for (name, f, w, a) in cases {
        let rb = w.len() / 4;
        let mut out = [0f32; 4];
        let t = Instant::now();
        for _ in 0..iters {
            unsafe { f(n, std::hint::black_box(w.as_ptr()), rb, a, out.as_mut_ptr()) };
            std::hint::black_box(&out);
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / iters as f64;
        println!("{name}: {ns:.1} ns per call, {:.2} weights/ns", 4.0 * n as f64 / ns);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {}
