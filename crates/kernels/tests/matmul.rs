//! matmul (every ISA level available, several thread counts) against the scalar
//! reference and the f64 reference.

mod common;

use common::*;
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::matmul::{matmul_f64_reference, matmul_isa, matmul_reference, MatmulScratch};
use shardlm_kernels::quant::VecDotType;
use shardlm_kernels::{DType, MatRef, ThreadPool};

/// Relative error of `got` against `want`, scaled by the magnitude of the products.
fn check_close(got: &[f32], want: &[f32], scale: &[f32], tol: f32, what: &str) {
    for (k, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (g - w).abs();
        assert!(err <= tol * s.max(1e-6), "{what}: element {k}: got {g}, want {w} (|err| {err}, scale {s})");
    }
}

/// Σ|x|·|w| per output: the natural magnitude to bound rounding errors by.
fn abs_scale(w: &MatRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let mut wa = vec![0f32; w.rows * w.cols];
    shardlm_kernels::quant::dequantize_row(w.dtype, w.data, &mut wa);
    wa.iter_mut().for_each(|v| *v = v.abs());
    let wabs = pack(DType::F32, &wa);
    let wm = MatRef::new(DType::F32, w.rows, w.cols, &wabs).unwrap();
    let mut y = vec![0f32; m * w.rows];
    matmul_f64_reference(wm, &xa, m, &mut y);
    y
}

/// The 8-bit activation quantization moves each x by at most half a step
/// (`amax_block/254`, plus f16 rounding of the scale), so
/// `|y − y_exact| ≤ Σ_k |w_k|·amax(block of k)/254·(1+ε)` plus float rounding.
fn check_quantization_error(w: &MatRef<'_>, x: &[f32], m: usize, got: &[f32], exact: &[f32], scale: &[f32]) {
    let blk = VecDotType::of(w.dtype).block_elems();
    let step: Vec<f32> = x
        .chunks(blk)
        .flat_map(|b| {
            let a = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            std::iter::repeat_n(if blk == 1 { 0.0 } else { a / 254.0 }, b.len())
        })
        .collect();
    let bound = abs_scale(w, &step, m);
    for k in 0..got.len() {
        let tol = bound[k] * 1.01 + 1e-3 * scale[k] + 1e-6;
        let err = (got[k] - exact[k]).abs();
        assert!(err <= tol, "{} quantization error at {k}: {} vs {} (tol {tol})", w.dtype, got[k], exact[k]);
    }
}

#[test]
fn matmul_matches_reference_every_isa() {
    let mut rng = rng(7);
    let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
    for dtype in DType::ALL {
        let cols = match dtype.block_elems() {
            256 => 512,
            64 => 192,
            _ => 96,
        };
        for &(rows, m) in &[(1usize, 1usize), (37, 1), (33, 3), (19, 17), (40, 64)] {
            let w = random_weight(&mut rng, dtype, rows, cols);
            let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
            let x = random_acts(&mut rng, m * cols);
            let mut want = vec![0f32; m * rows];
            matmul_reference(wm, &x, m, &mut want);
            let scale = abs_scale(&wm, &x, m);
            let mut exact = vec![0f32; m * rows];
            matmul_f64_reference(wm, &x, m, &mut exact);
            check_quantization_error(&wm, &x, m, &want, &exact, &scale);
            for isa in isa::available() {
                for pool in &pools {
                    let mut scratch = MatmulScratch::default();
                    let mut got = vec![f32::NAN; m * rows];
                    matmul_isa(isa, pool, wm, &x, m, &mut got, &mut scratch);
                    let what = format!("{dtype} {isa} rows={rows} m={m} threads={}", pool.n_threads());
                    // FP8's bf16 kernels round the activations: their derived bound.
                    let bf16 = dtype == DType::FP8 && shardlm_kernels::quant::fp8::bf16_activations(isa);
                    let tol = if bf16 { shardlm_kernels::quant::fp8::bf16_rel_bound(cols) } else { 2e-5 };
                    check_close(&got, &want, &scale, tol, &what);
                    // Like with like: at one ISA level the packed kernels run the
                    // file-layout kernels' arithmetic, so the bits agree.
                    let mut file = vec![f32::NAN; m * rows];
                    matmul_isa(isa, pool, wm, &x, m, &mut file, &mut scratch);
                    let differ = got.iter().zip(&file).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: {differ} outputs differ from the file layout at the same ISA");
                }
            }
        }
    }
    let _ = Isa::Scalar;
}

#[test]
fn rows_range_is_a_shard() {
    let mut rng = rng(3);
    let w = random_weight(&mut rng, DType::Q4_1, 50, 64);
    let wm = MatRef::new(DType::Q4_1, 50, 64, &w).unwrap();
    let x = random_acts(&mut rng, 2 * 64);
    let mut full = vec![0f32; 2 * 50];
    matmul_reference(wm, &x, 2, &mut full);
    let shard = wm.rows_range(10, 30);
    assert_eq!(shard.rows, 20);
    let mut part = vec![0f32; 2 * 20];
    matmul_reference(shard, &x, 2, &mut part);
    for i in 0..2 {
        assert_eq!(&part[i * 20..(i + 1) * 20], &full[i * 50 + 10..i * 50 + 30]);
    }
    assert!(MatRef::new(DType::Q4_0, 2, 33, &[0u8; 36]).is_err());
    assert!(MatRef::new(DType::Q4_0, 2, 32, &[0u8; 35]).is_err());
    assert_eq!(MatRef::new(DType::Q4_0, 2, 64, &[0u8; 72]).unwrap().row_bytes(), 36);
}

#[test]
fn matmul_many_matches_separate_calls() {
    use shardlm_kernels::matmul::matmul_many;
    let mut rng = rng(5);
    let cols = 256;
    let groups: [&[(DType, usize)]; 2] = [
        &[(DType::Q4_1, 40), (DType::Q5_1, 19), (DType::Q4_1, 3), (DType::Q4_1, 64)],
        &[(DType::Q4_1, 40), (DType::Q5_1, 19), (DType::Q8_0, 33), (DType::F32, 17)],
    ];
    for specs in groups {
        let ws: Vec<Vec<u8>> = specs.iter().map(|&(d, r)| random_weight(&mut rng, d, r, cols)).collect();
        let mats: Vec<MatRef<'_>> =
            specs.iter().zip(&ws).map(|(&(d, r), w)| MatRef::new(d, r, cols, w).unwrap()).collect();
        for m in [1, 5] {
            let x = random_acts(&mut rng, m * cols);
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut scratch = MatmulScratch::default();
                let mut outs: Vec<Vec<f32>> = specs.iter().map(|&(_, r)| vec![f32::NAN; m * r]).collect();
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_many(&pool, &mats, &x, m, &mut refs, &mut scratch);
                for (k, w) in mats.iter().enumerate() {
                    let mut want = vec![0f32; m * w.rows];
                    matmul_reference(*w, &x, m, &mut want);
                    let scale = abs_scale(w, &x, m);
                    check_close(&outs[k], &want, &scale, 2e-5, &format!("weight {k} m={m} threads={threads}"));
                }
            }
        }
    }
}

/// The packed four-row layout gives the same products as the file layout at
/// every ISA level (scalar unpacks rows), for decode (`m = 1`), tiles and odd `m`,
/// and inside `matmul_many` next to unpacked weights: bit for bit against the
/// file layout at the same level, within a tolerance against the reference.
#[test]
fn packed_matches_row_major_every_isa() {
    use shardlm_kernels::matmul::matmul_many_isa;
    use shardlm_kernels::packed;
    let mut rng = rng(11);
    let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
    const SHAPES: &[(usize, usize, usize)] = &[(4, 64, 1), (36, 576, 1), (68, 128, 2), (20, 192, 3), (40, 64, 70)];
    // The K-quants: whole super-blocks, rows in sixteens (Q4_K's groups);
    // m = 70 takes the prefill GEMM.
    const K_SHAPES: &[(usize, usize, usize)] = &[(16, 256, 1), (48, 512, 1), (64, 256, 2), (32, 768, 3), (48, 256, 70)];
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q2_K,
        DType::IQ4_XS,
        DType::Q3_K,
        // Recoded in place (the VBMI kernel's sign order).
        DType::IQ3_S,
    ];
    for dtype in types {
        let shapes = if dtype.block_elems() == 256 { K_SHAPES } else { SHAPES };
        for &(rows, cols, m) in shapes {
            // Whole groups of the process's layout (Q4_1 at AVX2: sixteens).
            let rows = rows.next_multiple_of(packed::group_rows(dtype));
            let w = random_weight(&mut rng, dtype, rows, cols);
            let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
            let pw = packed::pack(dtype, rows, cols, &w);
            let pm = MatRef::new_packed(dtype, rows, cols, &pw).unwrap();
            let x = random_acts(&mut rng, m * cols);
            let mut want = vec![0f32; m * rows];
            matmul_reference(wm, &x, m, &mut want);
            let mut via_packed_ref = vec![0f32; m * rows];
            matmul_reference(pm, &x, m, &mut via_packed_ref);
            assert_eq!(via_packed_ref, want, "{dtype}: reference over the packed rows");
            let scale = abs_scale(&wm, &x, m);
            for isa in isa::available() {
                for pool in &pools {
                    let mut scratch = MatmulScratch::default();
                    let mut got = vec![f32::NAN; m * rows];
                    matmul_isa(isa, pool, pm, &x, m, &mut got, &mut scratch);
                    let what = format!("packed {dtype} {isa} {rows}x{cols} m={m} threads={}", pool.n_threads());
                    // FP8's bf16 kernels round the activations: their derived bound.
                    let bf16 = dtype == DType::FP8 && shardlm_kernels::quant::fp8::bf16_activations(isa);
                    let tol = if bf16 { shardlm_kernels::quant::fp8::bf16_rel_bound(cols) } else { 2e-5 };
                    check_close(&got, &want, &scale, tol, &what);
                    // The sixteen-row transposed layout's kernels are the
                    // reference's arithmetic at every level and batch.
                    if packed::is_lanes16(dtype) {
                        let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                        assert_eq!(differ, 0, "{what}: {differ} outputs differ from the scalar reference");
                    }
                    // Like with like: at one ISA level the packed kernels run the
                    // file-layout kernels' arithmetic, so the bits agree (where
                    // the level has packed kernels for the type: MXFP4/NVFP4
                    // have AVX-512 ones; elsewhere the scalar one unpacks rows).
                    let mut file = vec![f32::NAN; m * rows];
                    matmul_isa(isa, pool, wm, &x, m, &mut file, &mut scratch);
                    let differ = got.iter().zip(&file).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    // Packed Q4_1 at AVX-512 runs the sixteen-row kernel instead
                    // (its own arithmetic, the same at every batch size: tests/rows16.rs);
                    // a recoded type's row kernel is its four-row kernel's arithmetic.
                    let rows16 = shardlm_kernels::dispatch::kernels(dtype, isa, true).rows16.is_some();
                    let own_sums =
                        rows16 && !matches!(packed::layout(dtype), shardlm_kernels::dispatch::Packing::Recoded(_));
                    // A recoded type's row kernel may instead be the scalar
                    // reference's arithmetic where the file layout's is not
                    // (Q4_K/Q5_K at AVX2: the file-layout dot sums in lanes).
                    let recoded = matches!(packed::layout(dtype), shardlm_kernels::dispatch::Packing::Recoded(_));
                    let as_reference = got.iter().zip(&want).all(|(p, q)| p.to_bits() == q.to_bits());
                    // A level whose packed kernels read another layout than
                    // this process packs runs the scalar ones (Q4_1 at AVX2
                    // under `SHARDLM_ISA=scalar`): the reference's arithmetic.
                    if packed::level_layout(dtype, isa) != packed::layout(dtype) {
                        assert!(as_reference, "{what}: a foreign layout's scalar kernels are the reference");
                    } else if (packed::unit_blocks(dtype).is_none() || packed::worth_packing(dtype, isa))
                        && !own_sums
                        && !(recoded && as_reference)
                    {
                        assert_eq!(differ, 0, "{what}: {differ} outputs differ from the file layout at the same ISA");
                    }
                    // Mixed with a row-major weight of the same activation type.
                    let mut a = vec![f32::NAN; m * rows];
                    let mut b = vec![f32::NAN; m * rows];
                    matmul_many_isa(isa, pool, &[wm, pm], &x, m, &mut [&mut a, &mut b], &mut scratch);
                    check_close(&b, &want, &scale, 2e-5, &format!("{what} (many)"));
                    check_close(&a, &want, &scale, 2e-5, &format!("{what} (many, row-major)"));
                }
            }
            // A group-aligned row range of a packed weight is a packed shard.
            let g = packed::group_rows(dtype);
            let shard = pm.rows_range(g, rows);
            let mut part = vec![0f32; m * (rows - g)];
            matmul_reference(shard, &x, m, &mut part);
            for i in 0..m {
                assert_eq!(&part[i * (rows - g)..(i + 1) * (rows - g)], &want[i * rows + g..(i + 1) * rows]);
            }
        }
    }
    assert!(MatRef::new_packed(DType::Q4_0, 6, 64, &[0u8; 6 * 36]).is_err());
    assert!(MatRef::new_packed(DType::Q5_0, 4, 64, &[0u8; 4 * 44]).is_err());
}

/// At the AVX-512 level a row's products do not depend on the batch it is in:
/// the tile kernels give each activation row the four-row kernel's exact
/// arithmetic, so row `i` of an `m = 5` product equals the `m = 1` product of
/// that row bit for bit (what makes a batched decode step compute what a lone
/// one does). Packed and file layouts alike.
#[test]
fn avx512_rows_are_batch_invariant() {
    use shardlm_kernels::packed;
    if !isa::available().contains(&Isa::Avx512) {
        eprintln!("skipping: no AVX-512 here");
        return;
    }
    let mut rng = rng(12);
    let pool = ThreadPool::new(2);
    let mut dtypes = vec![DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::MXFP4, DType::NVFP4];
    // FP8's fallback prefill tile is the AVX2 one; its bf16 tile is batch invariant.
    if shardlm_kernels::quant::fp8::bf16_activations(Isa::Avx512) {
        dtypes.push(DType::FP8);
    }
    for dtype in dtypes {
        let (rows, cols, m) = (36, 576, 5);
        let w = random_weight(&mut rng, dtype, rows, cols);
        let x = random_acts(&mut rng, m * cols);
        // FP8 has no packed layout; MXFP4's packed kernels need VBMI.
        let pw = (packed::packable(dtype, rows, cols) && packed::worth_packing(dtype, Isa::Avx512))
            .then(|| packed::pack(dtype, rows, cols, &w));
        let mut mats = vec![("file", MatRef::new(dtype, rows, cols, &w).unwrap())];
        if let Some(pw) = &pw {
            mats.push(("packed", MatRef::new_packed(dtype, rows, cols, pw).unwrap()));
        }
        for (what, mat) in mats {
            let mut scratch = MatmulScratch::default();
            let mut all = vec![f32::NAN; m * rows];
            matmul_isa(Isa::Avx512, &pool, mat, &x, m, &mut all, &mut scratch);
            for i in 0..m {
                let mut one = vec![f32::NAN; rows];
                matmul_isa(Isa::Avx512, &pool, mat, &x[i * cols..(i + 1) * cols], 1, &mut one, &mut scratch);
                let differ = one.iter().zip(&all[i * rows..]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{dtype} {what}: row {i} of a batch of {m} differs from it alone");
            }
        }
    }
}

/// `matmul_each` (one input per weight, one pool run) gives every weight the
/// bits `matmul` gives it alone, at every ISA level and thread count: weights of
/// every type (mixed activation types, packed and file layout, different
/// column counts), decode and batched rows, and more weights than one pool run
/// takes (they go in groups).
#[test]
fn matmul_each_equals_separate_calls_every_isa() {
    use shardlm_kernels::matmul::matmul_each_isa;
    use shardlm_kernels::packed;
    let mut rng = rng(13);
    let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
    // (dtype, rows, cols, packed)
    let mut specs: Vec<(DType, usize, usize, bool)> = DType::ALL
        .iter()
        .enumerate()
        .map(|(k, &d)| (d, [37, 64, 19, 4][k % 4], if d.block_elems() == 256 { 512 } else { 192 }, false))
        .collect();
    specs.extend([
        (DType::Q4_0, 36, 576, true),
        (DType::Q8_0, 8, 64, true),
        (DType::MXFP4, 36, 576, true),
        (DType::NVFP4, 8, 128, true),
    ]);
    // More than one run's worth: the MoE decode shape (many equal weights).
    specs.extend((0..24).map(|k| ([DType::MXFP4, DType::NVFP4, DType::Q4_0][k % 3], 48, 128, false)));
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|&(d, r, c, p)| {
            let w = random_weight(&mut rng, d, r, c);
            if p {
                packed::pack(d, r, c, &w)
            } else {
                w
            }
        })
        .collect();
    let mats: Vec<MatRef<'_>> = specs
        .iter()
        .zip(&data)
        .map(|(&(d, r, c, p), w)| match p {
            true => MatRef::new_packed(d, r, c, w).unwrap(),
            false => MatRef::new(d, r, c, w).unwrap(),
        })
        .collect();
    for m in [1, 3] {
        let xs: Vec<Vec<f32>> = mats.iter().map(|w| random_acts(&mut rng, m * w.cols)).collect();
        let ins: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        for isa in isa::available() {
            for pool in &pools {
                let mut scratch = MatmulScratch::default();
                let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_each_isa(isa, pool, &mats, &ins, m, &mut refs, &mut scratch);
                for (k, w) in mats.iter().enumerate() {
                    let mut alone = vec![f32::NAN; m * w.rows];
                    matmul_isa(isa, pool, *w, &xs[k], m, &mut alone, &mut scratch);
                    let differ = outs[k].iter().zip(&alone).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    let what = format!("weight {k} ({}) {isa} m={m} threads={}", w.dtype, pool.n_threads());
                    assert_eq!(differ, 0, "{what}: {differ} outputs differ from matmul alone");
                }
            }
        }
    }
}

/// The K-quant prefill GEMMs (`avx512_gemm_k`, `avx2_gemm_k`: Q8_K
/// activations in the lanes, at each level the CPU has; Q2_K..Q6_K, IQ4_XS
/// and the grid I-quants)
/// equal the scalar reference bit for bit: batch sizes around the
/// threshold and not a multiple of the 16 lanes, row counts that leave 8-, 4-
/// and 1-row tails, one to three super-blocks, one and two threads, mixed
/// K-quant weights in one call.
#[test]
fn kquant_prefill_gemm_matches_reference_exactly() {
    use shardlm_kernels::matmul::matmul_many_isa;
    use shardlm_kernels::packed;
    let isas: Vec<Isa> = isa::available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)).collect();
    let mut rng = rng(15);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    let types = [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ4_XS,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ1_S,
        DType::IQ1_M,
    ];
    for (dtype, &(rows, cols)) in types
        .into_iter()
        .flat_map(|d| [(37usize, 256usize), (16, 512), (45, 768), (8, 256)].iter().map(move |s| (d, s)))
    {
        let w = random_weight(&mut rng, dtype, rows, cols);
        let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
        // The lanes16 types packed as at load: the GEMM reads them back
        // through the group unpack (AVX-512 transposes).
        let pw = (packed::packable(dtype, rows, cols) && packed::worth_packing(dtype, Isa::Avx512))
            .then(|| packed::pack(dtype, rows, cols, &w));
        let pm = pw.as_ref().map(|pw| MatRef::new_packed(dtype, rows, cols, pw).unwrap());
        let other = if dtype == DType::Q6_K { DType::Q4_K } else { DType::Q6_K };
        let w2 = random_weight(&mut rng, other, 20, cols);
        let wm2 = MatRef::new(other, 20, cols, &w2).unwrap();
        // m = 4 and 5: the grid I-quants' AVX2 GEMM threshold (`MIN_M_GRID`).
        for m in [4usize, 5, 31, 32, 33, 47, 100] {
            let x = random_acts(&mut rng, m * cols);
            let mut want = vec![0f32; m * rows];
            matmul_reference(wm, &x, m, &mut want);
            let mut want2 = vec![0f32; m * 20];
            matmul_reference(wm2, &x, m, &mut want2);
            for (isa, pool) in isas.iter().flat_map(|&i| pools.iter().map(move |p| (i, p))) {
                let what = format!("{dtype} {isa} {rows}x{cols} m={m} threads={}", pool.n_threads());
                let mut scratch = MatmulScratch::default();
                let mut got = vec![f32::NAN; m * rows];
                matmul_isa(isa, pool, wm, &x, m, &mut got, &mut scratch);
                let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * 20]);
                matmul_many_isa(isa, pool, &[wm, wm2], &x, m, &mut [&mut a, &mut b], &mut scratch);
                assert_eq!(a, got, "{what}: first of two weights in one call");
                let takes_gemm =
                    |d: DType| shardlm_kernels::dispatch::kernels(d, isa, false).gemm.is_some_and(|g| m >= g.min_m);
                if !takes_gemm(dtype) {
                    // Below the threshold: the one-row kernels (another f32 order).
                    check_close(&got, &want, &abs_scale(&wm, &x, m), 2e-5, &what);
                    continue;
                }
                let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                assert_eq!(differ, 0, "{what}: {differ} outputs differ from the scalar reference");
                if takes_gemm(other) {
                    let differ = b.iter().zip(&want2).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: second weight ({other}) in one call");
                } else {
                    check_close(&b, &want2, &abs_scale(&wm2, &x, m), 2e-5, &what);
                }
                if let (Some(pm), Isa::Avx512) = (pm, isa) {
                    let mut p = vec![f32::NAN; m * rows];
                    matmul_isa(isa, pool, pm, &x, m, &mut p, &mut scratch);
                    let differ = p.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: packed weight");
                }
            }
        }
    }
}

/// The prefill GEMM of MXFP4, Q4_0, Q8_0, Q5_0, IQ4_NL, Q4_1 and Q5_1 (AVX-512, batches of at least
/// `avx512_gemm::MIN_M` rows, activations in the vector lanes) against the
/// scalar reference: batch sizes around the threshold and not a multiple of the
/// 16 lanes, row counts that leave 8-, 4- and 1-row tails, odd block counts,
/// file and packed layouts, one and two threads, and two weights in one call.
#[test]
fn prefill_gemm_matches_reference() {
    use shardlm_kernels::matmul::matmul_many_isa;
    use shardlm_kernels::packed;
    if !isa::available().contains(&Isa::Avx512) {
        eprintln!("skipping: no AVX-512 here");
        return;
    }
    let mut rng = rng(14);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    let types = [DType::MXFP4, DType::Q4_0, DType::Q8_0, DType::Q5_0, DType::IQ4_NL, DType::Q4_1, DType::Q5_1];
    for (dtype, &(rows, cols)) in
        types.into_iter().flat_map(|d| [(37usize, 96usize), (16, 64), (45, 576), (8, 32)].iter().map(move |s| (d, s)))
    {
        let w = random_weight(&mut rng, dtype, rows, cols);
        let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
        let pw = packed::packable(dtype, rows, cols).then(|| packed::pack(dtype, rows, cols, &w));
        for m in [31usize, 32, 33, 47, 100] {
            let x = random_acts(&mut rng, m * cols);
            let mut want = vec![0f32; m * rows];
            matmul_reference(wm, &x, m, &mut want);
            let scale = abs_scale(&wm, &x, m);
            let mut mats = vec![("file", wm)];
            if let Some(pw) = &pw {
                mats.push(("packed", MatRef::new_packed(dtype, rows, cols, pw).unwrap()));
            }
            for (layout, mat) in &mats {
                for pool in &pools {
                    let what = format!("{dtype} {layout} {rows}x{cols} m={m} threads={}", pool.n_threads());
                    let mut scratch = MatmulScratch::default();
                    let mut got = vec![f32::NAN; m * rows];
                    matmul_isa(Isa::Avx512, pool, *mat, &x, m, &mut got, &mut scratch);
                    check_close(&got, &want, &scale, 2e-5, &what);
                    let mut file = vec![f32::NAN; m * rows];
                    matmul_isa(Isa::Avx512, pool, wm, &x, m, &mut file, &mut scratch);
                    let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
                    matmul_many_isa(Isa::Avx512, pool, &[wm, *mat], &x, m, &mut [&mut a, &mut b], &mut scratch);
                    assert_eq!(a, file, "{what}: first of two weights in one call");
                    assert_eq!(b, got, "{what}: second of two weights in one call");
                }
            }
        }
    }
}

/// The AVX2 32-value prefill GEMM (`avx2_gemm_32`) equals the scalar
/// reference bit for bit for Q5_0, Q4_0 and Q8_0 (with −128 codes): batches
/// of 32 and more, row counts that leave partial row groups, one and two
/// threads, a mixed call with an IQ4_NL weight, and Q4_0/Q8_0 in their
/// packed four-row layout, which the GEMM reads back.
#[test]
fn avx2_gemm_32_matches_reference_exactly() {
    use shardlm_kernels::matmul::matmul_many_isa;
    if !isa::available().contains(&Isa::Avx2) {
        return;
    }
    let mut rng = rng(17);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    for dtype in [DType::Q5_0, DType::Q4_0, DType::Q8_0] {
        for &(rows, cols) in &[(37usize, 96usize), (8, 576), (21, 32)] {
            let mut w = random_weight(&mut rng, dtype, rows, cols);
            if dtype == DType::Q8_0 {
                // The first code of every row's first block: −128.
                for r in 0..rows {
                    w[r * cols / 32 * 34 + 2] = 0x80;
                }
            }
            let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
            let pw = shardlm_kernels::packed::packable(dtype, rows, cols)
                .then(|| shardlm_kernels::packed::pack(dtype, rows, cols, &w));
            let w2 = random_weight(&mut rng, DType::IQ4_NL, 9, cols);
            let wm2 = MatRef::new(DType::IQ4_NL, 9, cols, &w2).unwrap();
            for m in [32usize, 47, 100] {
                let x = random_acts(&mut rng, m * cols);
                let (mut want, mut want2) = (vec![0f32; m * rows], vec![0f32; m * 9]);
                matmul_reference(wm, &x, m, &mut want);
                matmul_reference(wm2, &x, m, &mut want2);
                for pool in &pools {
                    let what = format!("{dtype} avx2 {rows}x{cols} m={m} threads={}", pool.n_threads());
                    let (mut a, mut b) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * 9]);
                    let mut scratch = MatmulScratch::default();
                    matmul_many_isa(Isa::Avx2, pool, &[wm, wm2], &x, m, &mut [&mut a, &mut b], &mut scratch);
                    let differ = a.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: {differ} outputs differ from the scalar reference");
                    let differ = b.iter().zip(&want2).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: the IQ4_NL weight of the same call");
                    if let (Some(pw), false) = (&pw, dtype == DType::Q5_0) {
                        let pm = MatRef::new_packed(dtype, rows, cols, pw).unwrap();
                        let mut p = vec![f32::NAN; m * rows];
                        matmul_isa(Isa::Avx2, pool, pm, &x, m, &mut p, &mut scratch);
                        let differ = p.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                        assert_eq!(differ, 0, "{what}: {differ} outputs of the packed weight differ");
                    }
                }
            }
        }
    }
}

/// IQ4_NL's batches (the AVX2 4 × 2 tile, at AVX-512 too below the GEMM
/// threshold, and the AVX-512 and AVX2 lane GEMMs above it)
/// equal the scalar reference, and so the one-row decode kernel, bit for bit:
/// odd batch sizes (tile, one-row and lane tails), row counts that leave
/// partial row groups, one and two threads.
#[test]
fn iq4_nl_tile_matches_reference_exactly() {
    let isas: Vec<Isa> = isa::available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)).collect();
    let mut rng = rng(16);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    for &(rows, cols) in &[(37usize, 96usize), (8, 576), (5, 32)] {
        let w = random_weight(&mut rng, DType::IQ4_NL, rows, cols);
        let wm = MatRef::new(DType::IQ4_NL, rows, cols, &w).unwrap();
        for m in [1usize, 2, 5, 31, 32, 47, 100] {
            let x = random_acts(&mut rng, m * cols);
            let mut want = vec![0f32; m * rows];
            matmul_reference(wm, &x, m, &mut want);
            for (isa, pool) in isas.iter().flat_map(|&i| pools.iter().map(move |p| (i, p))) {
                let mut got = vec![f32::NAN; m * rows];
                matmul_isa(isa, pool, wm, &x, m, &mut got, &mut MatmulScratch::default());
                let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                let what = format!("IQ4_NL {isa} {rows}x{cols} m={m} threads={}", pool.n_threads());
                assert_eq!(differ, 0, "{what}: {differ} outputs differ from the scalar reference");
            }
        }
    }
}
