//! Every ISA level's dot kernels and activation quantizers against the scalar
//! reference, called directly (not through `SHARDLM_ISA`).

mod common;

use common::*;
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::quant::{self, VecDotType};
use shardlm_kernels::DType;

fn quantize_acts(vdt: VecDotType, isa: Isa, x: &[f32]) -> Vec<u8> {
    let mut buf = vec![0u64; vdt.row_bytes(x.len()).div_ceil(8)];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    let out = &mut bytes[..vdt.row_bytes(x.len())];
    quant::quantize_act_fn(vdt, isa)(x, out);
    out.to_vec()
}

/// Allowed |kernel − scalar| for one weight row `w` and f32 activations `x`:
/// `default`, or for FP8 kernels that round activations to bf16 their derived
/// bound ([`quant::fp8::bf16_dot_bound`]).
fn tolerance(dtype: DType, isa: Isa, w: &[u8], x: &[f32], default: f32) -> f32 {
    if dtype == DType::FP8 && quant::fp8::bf16_activations(isa) {
        quant::fp8::bf16_dot_bound(bytemuck::cast_slice(w), x)
    } else {
        default
    }
}

#[test]
fn reports_isa() {
    eprintln!("detected {} active {} available {:?}", isa::detected(), isa::active(), isa::available());
    assert!(isa::available().contains(&isa::active()));
}

#[test]
fn activation_quantizers_bit_identical() {
    let mut rng = rng(21);
    for vdt in [VecDotType::Q8_0, VecDotType::Q8_1, VecDotType::Q8_K] {
        for n in [512, 768, 2048] {
            let mut x = random_acts(&mut rng, n);
            x[0..32].iter_mut().for_each(|v| *v = 0.0);
            x[40] = -1e4;
            // A block whose largest magnitude is tied between signs (first one wins).
            for (i, v) in x[256..512].iter_mut().enumerate() {
                *v = ((i % 13) as f32 - 6.0) * 0.5;
            }
            x[256 + 3] = -4.0;
            x[256 + 100] = 4.0;
            let want = quantize_acts(vdt, Isa::Scalar, &x);
            for isa in isa::available() {
                assert_eq!(quantize_acts(vdt, isa, &x), want, "{vdt:?} at {isa}");
            }
        }
    }
}

#[test]
fn dot_kernels_match_scalar() {
    let mut rng = rng(22);
    for dtype in DType::ALL {
        let vdt = VecDotType::of(dtype);
        let sizes: &[usize] = if dtype.block_elems() == 256 { &[256, 512, 1536] } else { &[32, 64, 96, 576, 1536] };
        for &n in sizes.iter().filter(|&&n| n % dtype.block_elems() == 0) {
            let mut sizes_f = vec![n];
            if !dtype.is_quantized() {
                sizes_f.extend([1, 7, 9, 33, n + 3]); // float tails
            }
            for n in sizes_f {
                for _ in 0..20 {
                    let w = random_weight(&mut rng, dtype, 1, n);
                    let x = random_acts(&mut rng, n);
                    let xq: Vec<u8> = if vdt == VecDotType::F32 {
                        bytemuck::cast_slice(&x).to_vec()
                    } else {
                        quantize_acts(vdt, Isa::Scalar, &x)
                    };
                    // Realign to 8 bytes for Q8_K.
                    let mut abuf = vec![0u64; xq.len().div_ceil(8)];
                    bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[..xq.len()].copy_from_slice(&xq);
                    let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
                    let want = unsafe { quant::scalar::dot_fn(dtype)(n, w.as_ptr(), a) };
                    let mut wd = vec![0f32; n];
                    quant::dequantize_row(dtype, &w, &mut wd);
                    let mut xd = vec![0f32; n];
                    if vdt == VecDotType::F32 {
                        xd.copy_from_slice(&x);
                    } else {
                        dequant_acts(vdt, &xq, &mut xd);
                    }
                    let mag: f32 = wd.iter().zip(&xd).map(|(a, b)| (a * b).abs()).sum();
                    for isa in isa::available() {
                        let got = unsafe { quant::dot_fn(dtype, isa)(n, w.as_ptr(), a) };
                        assert!(
                            (got - want).abs() <= tolerance(dtype, isa, &w, &x, 1e-5 * mag + 1e-6),
                            "{dtype} n={n} {isa}: {got} vs scalar {want} (mag {mag})"
                        );
                    }
                }
            }
        }
    }
}

fn dequant_acts(vdt: VecDotType, q: &[u8], out: &mut [f32]) {
    match vdt {
        VecDotType::Q8_0 => quant::dequantize_row(DType::Q8_0, q, out),
        VecDotType::Q8_1 => quant::q8_1::dequantize(bytemuck::cast_slice(q), out),
        VecDotType::Q8_K => {
            let blocks: Vec<quant::q8_k::BlockQ8K> = q
                .chunks_exact(292)
                .map(|c| {
                    let mut b = quant::q8_k::BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] };
                    bytemuck::bytes_of_mut(&mut b).copy_from_slice(c);
                    b
                })
                .collect();
            quant::q8_k::dequantize(&blocks, out)
        }
        VecDotType::F32 => unreachable!(),
    }
}

/// Unaligned weight rows (a memory map gives no alignment guarantee).
#[test]
fn unaligned_weights() {
    let mut rng = rng(23);
    for dtype in DType::ALL {
        let n = 512;
        let w = random_weight(&mut rng, dtype, 1, n);
        let mut shifted = vec![0u8; w.len() + 1];
        shifted[1..].copy_from_slice(&w);
        let x = random_acts(&mut rng, n);
        let vdt = VecDotType::of(dtype);
        let xq = if vdt == VecDotType::F32 {
            bytemuck::cast_slice(&x).to_vec()
        } else {
            quantize_acts(vdt, Isa::Scalar, &x)
        };
        let mut abuf = vec![0u64; xq.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[..xq.len()].copy_from_slice(&xq);
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        for isa in isa::available() {
            let f = quant::dot_fn(dtype, isa);
            let (p, q) = unsafe { (f(n, w.as_ptr(), a), f(n, shifted[1..].as_ptr(), a)) };
            assert_eq!(p.to_bits(), q.to_bits(), "{dtype} {isa}");
        }
    }
}

/// Four-row kernels against the scalar dot of each row (even and odd block counts).
#[test]
fn dot4_kernels_match_scalar() {
    let mut rng = rng(24);
    for dtype in DType::ALL {
        let vdt = VecDotType::of(dtype);
        let sizes: &[usize] = if dtype.block_elems() == 256 { &[256, 512, 768] } else { &[32, 544, 576] };
        let sizes: Vec<usize> = sizes.iter().map(|&n| n.next_multiple_of(dtype.block_elems())).collect();
        for &n in sizes.iter().cycle().take(24) {
            let rb = dtype.bytes_for(n).unwrap();
            let w = random_weight(&mut rng, dtype, 4, n);
            let x = random_acts(&mut rng, n);
            let xq = if vdt == VecDotType::F32 {
                bytemuck::cast_slice(&x).to_vec()
            } else {
                quantize_acts(vdt, Isa::Scalar, &x)
            };
            let mut abuf = vec![0u64; xq.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[..xq.len()].copy_from_slice(&xq);
            let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
            let want: Vec<f32> =
                (0..4).map(|r| unsafe { quant::scalar::dot_fn(dtype)(n, w[r * rb..].as_ptr(), a) }).collect();
            let mut wd = vec![0f32; 4 * n];
            quant::dequantize_row(dtype, &w, &mut wd);
            for isa in isa::available() {
                let Some(f) = quant::dot4_fn(dtype, isa) else { continue };
                let mut got = [f32::NAN; 4];
                unsafe { f(n, w.as_ptr(), rb, a, got.as_mut_ptr()) };
                if dtype.block_elems() == 256 {
                    // The K-quant four-row kernels run the one-row arithmetic per
                    // row: the same bits, so decode never depends on the row grouping.
                    let one: Vec<f32> =
                        (0..4).map(|r| unsafe { quant::dot_fn(dtype, isa)(n, w[r * rb..].as_ptr(), a) }).collect();
                    assert_eq!(got.map(f32::to_bits).to_vec(), one.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
                for r in 0..4 {
                    let mag: f32 = wd[r * n..(r + 1) * n].iter().zip(&x).map(|(a, b)| (a * b).abs()).sum::<f32>() * 1.1;
                    let tol = tolerance(dtype, isa, &w[r * rb..(r + 1) * rb], &x, 1e-5 * mag + 1e-6);
                    assert!((got[r] - want[r]).abs() <= tol, "{dtype} n={n} {isa} row {r}: {} vs {}", got[r], want[r]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn self_test_passes_on_every_level() {
    for isa in isa::available() {
        if isa != Isa::Scalar {
            shardlm_kernels::simd::selftest::self_test(isa).unwrap();
        }
    }
}

/// 4 × 2 tile kernels (prefill) against the scalar dot of every pair.
#[test]
fn tile_kernels_match_scalar() {
    let mut rng = rng(25);
    for dtype in DType::ALL {
        let vdt = VecDotType::of(dtype);
        for isa in isa::available() {
            let Some(tile) = quant::tile_fn(dtype, isa) else { continue };
            for n in [32, 64, 96, 576].into_iter().filter(|n| n % dtype.block_elems() == 0) {
                let rb = dtype.bytes_for(n).unwrap();
                let w = random_weight(&mut rng, dtype, 4, n);
                let xs = [random_acts(&mut rng, n), random_acts(&mut rng, n)];
                let len = vdt.row_bytes(n);
                let stride = len.div_ceil(8) * 8 + 8; // padded, unaligned to the row size
                let mut abuf = vec![0u64; 2 * stride / 8];
                for (j, x) in xs.iter().enumerate() {
                    let q = quantize_acts(vdt, Isa::Scalar, x);
                    bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[j * stride..j * stride + len].copy_from_slice(&q);
                }
                let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
                let mut out = [f32::NAN; 10];
                unsafe { tile(n, w.as_ptr(), rb, a, stride, out.as_mut_ptr(), 5) };
                let mut wd = vec![0f32; n];
                for r in 0..4 {
                    quant::dequantize_row(dtype, &w[r * rb..(r + 1) * rb], &mut wd);
                    for (j, x) in xs.iter().enumerate() {
                        let want = unsafe { quant::scalar::dot_fn(dtype)(n, w[r * rb..].as_ptr(), a.add(j * stride)) };
                        let mag: f32 = wd.iter().zip(x).map(|(p, q)| (p * q).abs()).sum::<f32>() * 1.1;
                        let got = out[j * 5 + r];
                        let tol = tolerance(dtype, isa, &w[r * rb..(r + 1) * rb], x, 1e-5 * mag + 1e-6);
                        assert!((got - want).abs() <= tol, "{dtype} {isa} n={n} r={r} j={j}: {got} vs {want}");
                    }
                }
                assert!(out[4].is_nan(), "tile wrote outside its outputs");
            }
        }
    }
}

/// The AVX-512 MXFP4/NVFP4 kernels come in two variants (with VBMI byte permutes, and
/// without for CPUs that lack them; dispatch picks one): both against the
/// scalar dot, on odd and even block counts and (MXFP4) on the extreme E8M0
/// scales (0 and 1 give subnormal f32 scales).
#[cfg(target_arch = "x86_64")]
#[test]
fn fp4_avx512_variants_match_scalar() {
    use shardlm_kernels::simd::{avx512_fp4, avx512_fp4_vbmi};
    if !isa::available().contains(&Isa::Avx512) || !avx512_fp4_vbmi::has_vbmi() {
        eprintln!("skipping: no AVX-512 VBMI here");
        return;
    }
    let mut rng = rng(26);
    type Dot4 = unsafe fn(usize, *const u8, usize, *const u8, *mut f32);
    type Tile = unsafe fn(usize, *const u8, usize, *const u8, usize, *mut f32, usize);
    let variants: [(DType, &str, Dot4, Tile); 4] = [
        (DType::MXFP4, "vbmi", avx512_fp4_vbmi::dot4_mxfp4, avx512_fp4_vbmi::tile_mxfp4),
        (DType::MXFP4, "fallback", avx512_fp4::dot4_mxfp4, avx512_fp4::tile_mxfp4),
        (DType::NVFP4, "vbmi", avx512_fp4_vbmi::dot4_nvfp4, avx512_fp4_vbmi::tile_nvfp4),
        (DType::NVFP4, "fallback", avx512_fp4::dot4_nvfp4, avx512_fp4::tile_nvfp4),
    ];
    let cases = [(DType::MXFP4, [32, 64, 96, 544, 576, 608]), (DType::NVFP4, [64, 128, 192, 576, 640, 704])];
    for (case, (dtype, n)) in cases.into_iter().flat_map(|(d, ns)| ns.map(|n| (d, n))).enumerate() {
        let rb = dtype.bytes_for(n).unwrap();
        let mut w = random_weight(&mut rng, dtype, 4, n);
        if dtype == DType::MXFP4 && case % 2 == 1 {
            let extremes = [0u8, 1, 2, 127, 160, 180];
            for (i, blk) in w.chunks_exact_mut(17).enumerate() {
                blk[0] = extremes[i % extremes.len()];
            }
        }
        let xs = [random_acts(&mut rng, n), random_acts(&mut rng, n)];
        let len = VecDotType::Q8_0.row_bytes(n);
        let stride = len.div_ceil(8) * 8 + 8;
        let mut abuf = vec![0u64; 2 * stride / 8];
        for (j, x) in xs.iter().enumerate() {
            let q = quantize_acts(VecDotType::Q8_0, Isa::Scalar, x);
            bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[j * stride..j * stride + len].copy_from_slice(&q);
        }
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        let mut wd = vec![0f32; n];
        let mut want = [[0f32; 4]; 2];
        let mut mag = [[0f32; 4]; 2];
        for r in 0..4 {
            quant::dequantize_row(dtype, &w[r * rb..(r + 1) * rb], &mut wd);
            for (j, x) in xs.iter().enumerate() {
                want[j][r] = unsafe { quant::scalar::dot_fn(dtype)(n, w[r * rb..].as_ptr(), a.add(j * stride)) };
                mag[j][r] = wd.iter().zip(x).map(|(p, q)| (p * q).abs()).sum::<f32>() * 1.1;
            }
        }
        for (_, name, dot4, tile) in variants.into_iter().filter(|v| v.0 == dtype) {
            let mut one = [f32::NAN; 4];
            let mut two = [f32::NAN; 10];
            unsafe {
                dot4(n, w.as_ptr(), rb, a, one.as_mut_ptr());
                tile(n, w.as_ptr(), rb, a, stride, two.as_mut_ptr(), 5);
            }
            for r in 0..4 {
                for j in 0..2 {
                    let got = two[j * 5 + r];
                    let ok = |v: f32| (v - want[j][r]).abs() <= 1e-5 * mag[j][r] + 1e-30;
                    assert!(ok(got), "{dtype} {name} tile n={n} r={r} j={j}: {got} vs {}", want[j][r]);
                }
                assert_eq!(
                    one[r].to_bits(),
                    two[r].to_bits(),
                    "{dtype} {name} n={n} r={r}: tile row 0 differs from dot4"
                );
            }
            assert!(two[4].is_nan(), "{name}: tile wrote outside its outputs");
        }
    }
}
