//! The low-bit K-quants (Q2_K, Q3_K) and I-quants: scalar dequantization equals
//! gguf-py's bit for bit (fixture from `scripts/make_quant_fixture.py`), the
//! scalar dot equals `dequantize(w)·dequantize(a)` within f32 rounding, and every
//! SIMD level's dot equals scalar bit for bit (all integer sums, same float order).

mod common;

use common::*;
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::quant::{self, VecDotType};
use shardlm_kernels::DType;

const TYPES: [DType; 11] = [
    DType::Q2_K,
    DType::Q3_K,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ4_NL,
    DType::IQ4_XS,
];

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/quants/gguf_py_dequant.bin");
    let data = std::fs::read(path).expect("fixture (scripts/make_quant_fixture.py)");
    let mut seen = std::collections::HashSet::new();
    let mut o = 0;
    while o < data.len() {
        let (id, nb, nbytes) = (u32_at(&data, o), u32_at(&data, o + 4) as usize, u32_at(&data, o + 8) as usize);
        o += 12;
        let dtype = DType::from_ggml_id(id).unwrap_or_else(|| panic!("fixture type {id}"));
        let blocks = &data[o..o + nbytes];
        o += nbytes;
        let n = nb * dtype.block_elems();
        let want: Vec<u32> =
            data[o..o + 4 * n].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        o += 4 * n;
        let mut got = vec![0f32; n];
        quant::dequantize_row(dtype, blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), *w, "{dtype} element {i}: {g} vs gguf-py {}", f32::from_bits(*w));
        }
        seen.insert(dtype);
    }
    for t in TYPES {
        assert!(seen.contains(&t), "fixture lacks {t}");
    }
}

fn quantize_acts(vdt: VecDotType, x: &[f32]) -> Vec<u64> {
    let len = vdt.row_bytes(x.len());
    let mut buf = vec![0u64; len.div_ceil(8)];
    quant::quantize_act_fn(vdt, Isa::Scalar)(x, &mut bytemuck::cast_slice_mut(&mut buf)[..len]);
    buf
}

fn dequant_acts(vdt: VecDotType, q: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    match vdt {
        VecDotType::Q8_0 => quant::dequantize_row(DType::Q8_0, q, &mut out),
        VecDotType::Q8_K => quant::q8_k::dequantize(bytemuck::cast_slice(&q[..vdt.row_bytes(n)]), &mut out),
        _ => unreachable!(),
    }
    out
}

/// The scalar dot against the f64 dot of the dequantized rows: they differ only
/// by f32 rounding of the per-block scale products, bounded by `2e-6·Σ|w·a|`.
#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = rng(2323);
    for dtype in TYPES {
        let vdt = VecDotType::of(dtype);
        for n in [256usize, 768, 2048] {
            for _ in 0..10 {
                let w = random_weight(&mut rng, dtype, 1, n);
                let x = random_acts(&mut rng, n);
                let a = quantize_acts(vdt, &x);
                let ab: &[u8] = bytemuck::cast_slice(&a);
                let got = unsafe { quant::scalar::dot_fn(dtype)(n, w.as_ptr(), ab.as_ptr()) };
                let mut wd = vec![0f32; n];
                quant::dequantize_row(dtype, &w, &mut wd);
                let ad = dequant_acts(vdt, ab, n);
                let want: f64 = wd.iter().zip(&ad).map(|(&p, &q)| p as f64 * q as f64).sum();
                let mag: f64 = wd.iter().zip(&ad).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                assert!((got as f64 - want).abs() <= 2e-6 * mag + 1e-9, "{dtype} n={n}: {got} vs {want} (mag {mag})");
            }
        }
    }
}

/// Every ISA level's one-row dot equals scalar exactly.
#[test]
fn simd_dots_bit_identical_to_scalar() {
    let mut rng = rng(2324);
    for dtype in TYPES {
        let vdt = VecDotType::of(dtype);
        for n in [256usize, 512, 1792] {
            for _ in 0..20 {
                let w = random_weight(&mut rng, dtype, 1, n);
                let x = random_acts(&mut rng, n);
                let a = quantize_acts(vdt, &x);
                let ap = bytemuck::cast_slice::<u64, u8>(&a).as_ptr();
                let want = unsafe { quant::scalar::dot_fn(dtype)(n, w.as_ptr(), ap) };
                for isa in isa::available() {
                    let got = unsafe { quant::dot_fn(dtype, isa)(n, w.as_ptr(), ap) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} n={n} {isa}: {got} vs scalar {want}");
                }
            }
        }
    }
}

/// The four-row decode kernels (file layout and packed) equal scalar bit for
/// bit row by row, where a level has them.
#[test]
fn four_row_dots_bit_identical_to_scalar() {
    use shardlm_kernels::packed;
    let mut rng = rng(2325);
    for dtype in TYPES {
        let vdt = VecDotType::of(dtype);
        for n in [256usize, 768] {
            let w = random_weight(&mut rng, dtype, 4, n);
            let rb = dtype.bytes_for(n).unwrap();
            let x = random_acts(&mut rng, n);
            let a = quantize_acts(vdt, &x);
            let ap = bytemuck::cast_slice::<u64, u8>(&a).as_ptr();
            let want: Vec<f32> =
                (0..4).map(|r| unsafe { quant::scalar::dot_fn(dtype)(n, w.as_ptr().add(r * rb), ap) }).collect();
            for isa in isa::available() {
                let mut got = [f32::NAN; 4];
                if let Some(d4) = quant::dot4_fn(dtype, isa) {
                    unsafe { d4(n, w.as_ptr(), rb, ap, got.as_mut_ptr()) };
                    assert_eq!(
                        got.map(f32::to_bits).to_vec(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{dtype} n={n} {isa} dot4"
                    );
                }
                if packed::packable(dtype, 4, n) && packed::worth_packing(dtype, isa) {
                    let pw = packed::pack(dtype, 4, n, &w);
                    let d4 = packed::dot4_fn(dtype, isa).unwrap();
                    unsafe { d4(n, pw.as_ptr(), rb, ap, got.as_mut_ptr()) };
                    assert_eq!(
                        got.map(f32::to_bits).to_vec(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{dtype} n={n} {isa} packed dot4"
                    );
                }
            }
        }
    }
}

/// The GGUF write targets (llama.cpp's reference quantizers) round-trip with
/// the error their bit widths allow: relative RMS error on Gaussian-like rows
/// (with an all-zero block and a large outlier) under a per-type bound.
#[test]
fn quantizers_round_trip() {
    use rand::Rng;
    let mut rng = rng(2325);
    for (dtype, bound) in [(DType::Q5_0, 0.06), (DType::Q5_1, 0.05), (DType::IQ4_NL, 0.12), (DType::IQ4_XS, 0.12)] {
        let n = 4096;
        let mut x: Vec<f32> = (0..n).map(|_| (0..4).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>()).collect();
        x[256..512].iter_mut().for_each(|v| *v = 0.0);
        x[1000] = 25.0;
        let mut q = vec![0u8; dtype.bytes_for(n).unwrap()];
        quant::quantize_row(dtype, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        quant::dequantize_row(dtype, &q, &mut y);
        assert!(y[256..512].iter().all(|&v| v == 0.0), "{dtype}: zero block");
        let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        let rms: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        eprintln!("{dtype}: relative RMS error {:.4}", err / rms);
        assert!(err / rms < bound, "{dtype}: relative error {} over {bound}", err / rms);
    }
}
