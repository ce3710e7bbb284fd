//! The FP8 kernels at the AVX-512 level come in two variants, both tested here
//! against the scalar reference whatever dispatch picks (`SHARDLM_BF16`):
//!
//! * bf16 (AVX-512 BF16 + VBMI): exact weights, activations rounded to bf16,
//!   held to the bound derived in `simd::avx512_fp8_bf16`
//!   ([`fp8::bf16_dot_bound`]);
//! * the exact fallback (f16 bit moves, f32 FMAs; AVX2 tile), within f32
//!   rounding (`1e-5·Σ|w·a|`, as the other kernels' tests).
//!
//! Every code (±0, the subnormals, the largest normal 448; NaN codes never
//! reach a kernel, the loader refuses them) is checked one by one and exactly:
//! with one-hot activations of bf16-exact values both variants must give
//! `d·E4M3(q)·a` to the bit.

mod common;

use common::*;
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::quant::fp8::{self, BlockFp8};
use shardlm_kernels::quant::minifloat::e4m3_to_f32;
use shardlm_kernels::DType;

type Dot = unsafe fn(usize, *const u8, *const u8) -> f32;
type Dot4 = unsafe fn(usize, *const u8, usize, *const u8, *mut f32);
type Tile = unsafe fn(usize, *const u8, usize, *const u8, usize, *mut f32, usize);

struct Variant {
    name: &'static str,
    bf16: bool,
    dot: Dot,
    dot4: Dot4,
    tile: Tile,
}

#[cfg(target_arch = "x86_64")]
fn variants() -> Vec<Variant> {
    use shardlm_kernels::simd::{avx2_fp, avx512_fp, avx512_fp8_bf16 as bf};
    if !isa::available().contains(&Isa::Avx512) {
        eprintln!("skipping: no AVX-512 here");
        return Vec::new();
    }
    let mut v = vec![Variant {
        name: "fallback",
        bf16: false,
        dot: avx512_fp::dot_fp8,
        dot4: avx512_fp::dot4_fp8,
        tile: avx2_fp::tile_fp8,
    }];
    if is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512vbmi") {
        v.push(Variant { name: "bf16", bf16: true, dot: bf::dot_fp8, dot4: bf::dot4_fp8, tile: bf::tile_fp8 });
    } else {
        eprintln!("no AVX-512 BF16 + VBMI here: bf16 variant not tested");
    }
    v
}

#[cfg(not(target_arch = "x86_64"))]
fn variants() -> Vec<Variant> {
    Vec::new()
}

fn block(d: f32, qs: &[u8]) -> BlockFp8 {
    let mut b = BlockFp8 { d: d.to_le_bytes(), qs: [0; 64] };
    b.qs.copy_from_slice(qs);
    b
}

/// Four one-block rows holding all 256 codes (NaN codes 0x7F/0xFF replaced by
/// ±448), each against one-hot activations: `dot`, `dot4` and `tile` must
/// return `d·E4M3(q)·a` exactly (bf16-exact `a`, power-of-two `d`).
#[test]
fn every_code_exact() {
    let scales = [1.0f32, -0.5, 2f32.powi(-20), 8.0];
    let rows: Vec<BlockFp8> = (0..4)
        .map(|r| {
            let qs: Vec<u8> =
                (0..64).map(|k| (64 * r + k) as u8).map(|q| if q & 0x7F == 0x7F { q - 1 } else { q }).collect();
            block(scales[r], &qs)
        })
        .collect();
    let w: &[u8] = bytemuck::cast_slice(&rows);
    for v in variants() {
        for k in 0..64 {
            for val in [1.0f32, -3.0, 2f32.powi(-60)] {
                // Two activation rows (tile): one-hot at k and at 63 − k.
                let mut a = vec![0f32; 128];
                a[k] = val;
                a[64 + 63 - k] = val;
                let ap = a.as_ptr() as *const u8;
                let mut four = [f32::NAN; 4];
                let mut tile = [f32::NAN; 8];
                unsafe {
                    (v.dot4)(64, w.as_ptr(), 68, ap, four.as_mut_ptr());
                    (v.tile)(64, w.as_ptr(), 68, ap, 256, tile.as_mut_ptr(), 4);
                }
                for r in 0..4 {
                    let one = unsafe { (v.dot)(64, w[68 * r..].as_ptr(), ap) };
                    let want = |k: usize| scales[r] * e4m3_to_f32(rows[r].qs[k]) * val;
                    let code = rows[r].qs[k];
                    for (what, got, want) in
                        [("dot", one, want(k)), ("dot4", four[r], want(k)), ("tile", tile[r], want(k))]
                    {
                        assert_eq!(got, want, "{} {what}: code {code:#04x}, a = {val}, row {r}", v.name);
                    }
                    assert_eq!(tile[4 + r], want(63 - k), "{} tile act 1: code {:#04x}", v.name, rows[r].qs[63 - k]);
                }
            }
        }
    }
}

/// Random rows (random codes with the extremes, scales from tiny to large,
/// some zero or negative) and activations (with zeros, ±4 ties, large values,
/// and here also denormal and tiny ones) against the scalar dot; for bf16 the
/// tile's rows equal `dot4`'s bit for bit (batch invariance).
#[test]
fn random_rows_within_bound() {
    let mut rng = rng(41);
    for v in variants() {
        for n in [64, 128, 576, 2048] {
            for _ in 0..8 {
                let rb = DType::FP8.bytes_for(n).unwrap();
                let w = random_weight(&mut rng, DType::FP8, 4, n);
                let mut a = vec![0f32; 2 * n + 16];
                a[..n].copy_from_slice(&random_acts(&mut rng, n));
                a[n + 16..].copy_from_slice(&random_acts(&mut rng, n));
                for (i, x) in a.iter_mut().enumerate() {
                    match i % 97 {
                        5 => *x = 1e-39,
                        11 => *x = -3e-30,
                        17 => *x = 2.5e4,
                        _ => {}
                    }
                }
                let acts = [&a[..n], &a[n + 16..]];
                let ap = a.as_ptr() as *const u8;
                let mut four = [f32::NAN; 4];
                let mut tile = [f32::NAN; 8];
                unsafe {
                    (v.dot4)(n, w.as_ptr(), rb, ap, four.as_mut_ptr());
                    (v.tile)(n, w.as_ptr(), rb, ap, 4 * (n + 16), tile.as_mut_ptr(), 4);
                }
                for r in 0..4 {
                    let row = &w[r * rb..(r + 1) * rb];
                    let blocks: &[BlockFp8] = bytemuck::cast_slice(row);
                    let one = unsafe { (v.dot)(n, row.as_ptr(), ap) };
                    let mut wd = vec![0f32; n];
                    shardlm_kernels::quant::dequantize_row(DType::FP8, row, &mut wd);
                    for (j, x) in acts.iter().enumerate() {
                        let want = fp8::vec_dot(blocks, x);
                        let mag: f32 = wd.iter().zip(*x).map(|(p, q)| (p * q).abs()).sum();
                        let tol = if v.bf16 { fp8::bf16_dot_bound(blocks, x) } else { 1e-5 * mag + 1e-6 };
                        let mut got = vec![tile[4 * j + r]];
                        if j == 0 {
                            got.extend([one, four[r]]);
                        }
                        for g in got {
                            assert!((g - want).abs() <= tol, "{} n={n} r={r} j={j}: {g} vs {want} (tol {tol})", v.name);
                        }
                    }
                    if v.bf16 {
                        assert_eq!(four[r].to_bits(), tile[r].to_bits(), "bf16 n={n} r={r}: dot4 vs tile");
                    }
                }
            }
        }
    }
}

/// The bf16 variant really rounds the activations, and its error stays inside
/// the bound at its worst: every activation just below a bf16 rounding tie
/// (`1 + 2⁻⁸ − 2⁻²³` rounds down by almost 2⁻⁸), all weights 1.0.
#[test]
fn bf16_rounding_is_within_bound() {
    let Some(v) = variants().into_iter().find(|v| v.bf16) else { return };
    let n = 2048;
    let rows: Vec<BlockFp8> = (0..n / 64).map(|_| block(1.0, &[0x38; 64])).collect();
    let a = vec![1.0 + 2f32.powi(-8) - 2f32.powi(-23); n];
    let want = fp8::vec_dot(&rows, &a);
    let got = unsafe { (v.dot)(n, bytemuck::cast_slice(&rows).as_ptr(), a.as_ptr() as *const u8) };
    let bound = fp8::bf16_dot_bound(&rows, &a);
    let err = (got - want).abs();
    assert_eq!(got, n as f32, "activations round to 1.0");
    assert!(err > 0.5 * bound && err <= bound, "error {err} vs bound {bound}");
}
