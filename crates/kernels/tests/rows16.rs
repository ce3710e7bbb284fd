//! The sixteen-row kernels. AVX-512 packed Q8_0 and Q4_0
//! (`simd::avx512_rows16`): through `matmul` at every batch size they equal
//! the sequential scalar dots (`quant::q8_0::vec_dot_sequential` and the
//! same in `q4_0`) bit for bit, so a row's result never
//! depends on how many activation rows share its call, which rows share its
//! vector, or the thread count. The transposed layout's kernels (AVX-512 and
//! AVX2, plain and AVX-VNNI) equal the scalar reference bit for bit, through
//! `matmul` and each one called directly.

mod common;

use common::*;
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::matmul::{matmul_isa, matmul_many_isa, MatmulScratch};
use shardlm_kernels::packed;
use shardlm_kernels::quant::q4_0;
use shardlm_kernels::quant::q8_0::{self, BlockQ8_0};
use shardlm_kernels::{dispatch, DType, MatRef, ThreadPool};

/// `want[i · rows + r]`: row `r` of `w` against activation row `i` of `x`, as
/// the sixteen-row kernel must sum it.
fn sequential_reference(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f32> {
    let nb = cols / 32;
    let mut out = vec![0f32; m * rows];
    for i in 0..m {
        let xi = &x[i * cols..(i + 1) * cols];
        for r in 0..rows {
            out[i * rows + r] = if dtype == DType::Q4_0 {
                let blocks: &[q4_0::BlockQ4_0] = bytemuck::cast_slice(w);
                let mut a = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); nb];
                q8_0::quantize_activations(xi, &mut a);
                q4_0::vec_dot_sequential(&blocks[r * nb..(r + 1) * nb], &a)
            } else {
                let blocks: &[BlockQ8_0] = bytemuck::cast_slice(w);
                let mut a = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); nb];
                q8_0::quantize_activations(xi, &mut a);
                q8_0::vec_dot_sequential(&blocks[r * nb..(r + 1) * nb], &a)
            };
        }
    }
    out
}

#[test]
fn packed_q8_0_q4_0_equal_the_sequential_dot_at_every_batch_size() {
    if !isa::available().contains(&Isa::Avx512) {
        eprintln!("no AVX-512 here: the sixteen-row kernel is not reachable");
        return;
    }
    if std::env::var("SHARDLM_ROWS16").as_deref() == Ok("0") {
        eprintln!("SHARDLM_ROWS16=0: the sixteen-row kernels are off");
        return;
    }
    // Weights take the process's layout (`packed::layout`, from SHARDLM_ISA): a
    // type whose AVX-512 layout differs from it (SHARDLM_ISA=avx2) cannot
    // reach the AVX-512 kernel here.
    let dtypes: Vec<DType> = [DType::Q8_0, DType::Q4_0]
        .into_iter()
        .filter(|&d| {
            let same = packed::layout(d) == packed::level_layout(d, Isa::Avx512);
            if !same {
                eprintln!("{d}: this process packs another level's layout; its AVX-512 kernel is not reachable");
            }
            same
        })
        .collect();
    for &dtype in &dtypes {
        assert!(
            dispatch::kernels(dtype, Isa::Avx512, true).rows16.is_some(),
            "packed {dtype} at AVX-512 should run the sixteen-row kernel"
        );
    }
    let mut rng = rng(16);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    // Row counts with 4-, 8- and 12-row tails; widths of one block pair up to a
    // SmolLM2 projection.
    let shapes = [(16usize, 64usize), (4, 128), (20, 192), (44, 576), (64, 256), (8, 1536)];
    for (dtype, &(rows, cols)) in dtypes.iter().flat_map(|&d| shapes.iter().map(move |s| (d, s))) {
        assert!(packed::packable(dtype, rows, cols));
        let w = random_weight(&mut rng, dtype, rows, cols);
        let pw = packed::pack(dtype, rows, cols, &w);
        let wm = MatRef::new_packed(dtype, rows, cols, &pw).unwrap();
        for m in [1usize, 2, 3, 4, 5, 7, 9, 33, 70] {
            let x = random_acts(&mut rng, m * cols);
            let want = sequential_reference(dtype, &w, rows, cols, &x, m);
            for pool in &pools {
                let what = format!("{dtype} {rows}x{cols} m={m} threads={}", pool.n_threads());
                let mut scratch = MatmulScratch::default();
                let mut got = vec![f32::NAN; m * rows];
                matmul_isa(Isa::Avx512, pool, wm, &x, m, &mut got, &mut scratch);
                let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                assert_eq!(differ, 0, "{what}: {differ} outputs differ from the sequential dot");
                // Next to another weight in one call, and as a four-aligned row shard.
                let mut twice = [vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]];
                let [t0, t1] = &mut twice;
                matmul_many_isa(Isa::Avx512, pool, &[wm, wm], &x, m, &mut [t0, t1], &mut scratch);
                assert_eq!(twice[0], got, "{what}: two weights in one call");
                assert_eq!(twice[1], got, "{what}: two weights in one call");
                if rows > 4 {
                    let shard = wm.rows_range(4, rows);
                    let mut s = vec![f32::NAN; m * (rows - 4)];
                    matmul_isa(Isa::Avx512, pool, shard, &x, m, &mut s, &mut scratch);
                    for i in 0..m {
                        assert_eq!(
                            s[i * (rows - 4)..(i + 1) * (rows - 4)],
                            got[i * rows + 4..(i + 1) * rows],
                            "{what}: shard"
                        );
                    }
                }
            }
        }
    }
}

/// The sixteen-row kernels of the transposed layout at every ISA level the CPU
/// has (AVX-512 and AVX2: `simd::avx512_rows16_nl`, `simd::avx2_rows16_nl`,
/// `simd::avx2_rows16_q5` and `simd::avx512_rows16_q5`, which take Q4_1 too):
/// through `matmul`, at every batch size (the streaming tiles and the
/// decoded-once scratch: 63 rows take every tile size), one and two threads, and as a sixteen-aligned row
/// shard, they equal the scalar reference bit for bit.
#[test]
fn lanes16_kernels_equal_the_reference_at_every_isa() {
    use shardlm_kernels::matmul::matmul_reference;
    let mut rng = rng(1616);
    let pools: Vec<ThreadPool> = [1, 2].into_iter().map(ThreadPool::new).collect();
    for dtype in [DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q5_0, DType::Q5_1, DType::Q4_1] {
        if !packed::is_lanes16(dtype) {
            continue;
        }
        let shapes: &[(usize, usize)] = if dtype.block_elems() == 256 {
            &[(16, 256), (48, 512), (32, 1280)]
        } else {
            &[(16, 32), (48, 576), (32, 1024)]
        };
        for &(rows, cols) in shapes {
            assert!(packed::packable(dtype, rows, cols));
            let w = random_weight(&mut rng, dtype, rows, cols);
            let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
            let pw = packed::pack(dtype, rows, cols, &w);
            let pm = MatRef::new_packed(dtype, rows, cols, &pw).unwrap();
            for m in [1usize, 2, 3, 5, 40, 63] {
                let x = random_acts(&mut rng, m * cols);
                let mut want = vec![0f32; m * rows];
                matmul_reference(wm, &x, m, &mut want);
                for isa in isa::available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
                    if packed::level_layout(dtype, isa) != packed::layout(dtype) {
                        continue;
                    }
                    assert!(packed::worth_packing(dtype, isa), "{dtype} packs at {isa}");
                    for pool in &pools {
                        let what = format!("{dtype} {isa} {rows}x{cols} m={m} threads={}", pool.n_threads());
                        let mut scratch = MatmulScratch::default();
                        let mut got = vec![f32::NAN; m * rows];
                        matmul_isa(isa, pool, pm, &x, m, &mut got, &mut scratch);
                        let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                        assert_eq!(differ, 0, "{what}: {differ} outputs differ from the scalar reference");
                        let shard = pm.rows_range(16, rows);
                        if rows > 16 {
                            let mut s = vec![f32::NAN; m * (rows - 16)];
                            matmul_isa(isa, pool, shard, &x, m, &mut s, &mut scratch);
                            for i in 0..m {
                                assert_eq!(
                                    s[i * (rows - 16)..(i + 1) * (rows - 16)],
                                    got[i * rows + 16..(i + 1) * rows]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Every sixteen-row kernel the dispatch table lists for a type, not only
/// the one it picks (an AVX-VNNI, VBMI or GFNI kernel shadows the plain one
/// on a CPU that has the feature): each one this CPU can run, called
/// directly on a packed weight, equals the scalar reference bit for bit.
#[test]
fn every_listed_rows16_kernel_equals_the_reference() {
    use shardlm_kernels::matmul::matmul_reference;
    use shardlm_kernels::quant;
    let mut rng = rng(1617);
    let mut ran = 0;
    for row in dispatch::TABLE.iter().filter(|r| packed::is_lanes16(r.dtype)) {
        let dtype = row.dtype;
        let (rows, cols) = (32usize, 2 * dtype.block_elems().max(256));
        let w = random_weight(&mut rng, dtype, rows, cols);
        let wm = MatRef::new(dtype, rows, cols, &w).unwrap();
        let pw = packed::pack(dtype, rows, cols, &w);
        for isa in isa::available().into_iter().filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
            // A level whose kernels read another layout (Q3_K at AVX2: code
            // planes, tested in the kernels crate) does not read these groups.
            if packed::level_layout(dtype, isa) != packed::layout(dtype) {
                continue;
            }
            for &(feature, kernel) in row.at(isa).packed_rows16 {
                if !feature.present() {
                    continue;
                }
                for m in [1usize, 2, 3, 6] {
                    let x = random_acts(&mut rng, m * cols);
                    let mut want = vec![0f32; m * rows];
                    matmul_reference(wm, &x, m, &mut want);
                    let a_stride = row.act.row_bytes(cols);
                    let mut a = vec![0u64; (m * a_stride).div_ceil(8)];
                    let ab: &mut [u8] = bytemuck::cast_slice_mut(&mut a);
                    for j in 0..m {
                        quant::quantize_act_fn(row.act, isa)(
                            &x[j * cols..(j + 1) * cols],
                            &mut ab[j * a_stride..(j + 1) * a_stride],
                        );
                    }
                    let mut got = vec![f32::NAN; m * rows];
                    // SAFETY: the feature is present at this ISA level; shapes as the kernel requires.
                    unsafe {
                        kernel(
                            cols,
                            pw.as_ptr(),
                            wm.row_bytes(),
                            rows,
                            ab.as_ptr(),
                            a_stride,
                            m,
                            got.as_mut_ptr(),
                            rows,
                        )
                    };
                    let differ = got.iter().zip(&want).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
                    assert_eq!(
                        differ, 0,
                        "{dtype} {isa} {feature:?} m={m}: {differ} outputs differ from the reference"
                    );
                    ran += 1;
                }
            }
        }
    }
    assert!(ran > 0 || !isa::available().contains(&Isa::Avx2));
}
