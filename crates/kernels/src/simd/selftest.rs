//! Start-up self-check of the SIMD kernels against the scalar reference.
//!
//! [`crate::isa::active`] runs this once before handing out a SIMD level: a few
//! rows of every type through the one- and four-row dot kernels, the tiles,
//! the prefill GEMMs, the activation quantizers and the attention tile steps, on fixed pseudo-random data with edge values. A level
//! that disagrees with scalar is not used (a warning goes to stderr), so a kernel
//! bug on a CPU we could not test on degrades speed, not answers. It costs well
//! under a millisecond.

use crate::isa::Isa;
use crate::quant::{self, VecDotType};
use crate::DType;
use bytemuck::Zeroable;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// `rows × n` weights of `dtype`: random codes (with 0x00/0xFF/0x80 bytes) and
/// sane random scales, some negative.
fn weights(rng: &mut XorShift, dtype: DType, rows: usize, n: usize) -> Vec<u8> {
    if !dtype.is_quantized() {
        let v: Vec<f32> = (0..rows * n).map(|_| rng.unit()).collect();
        let mut out = vec![0u8; dtype.bytes_for(v.len()).unwrap_or(0)];
        quant::quantize_row(dtype, &v, &mut out).expect("float packing");
        return out;
    }
    let bytes = dtype.bytes_for(rows * n).unwrap_or(0);
    let mut out: Vec<u8> = (0..bytes)
        .map(|i| match i % 7 {
            0 => 0x00,
            3 => 0xFF,
            5 => 0x80,
            _ => rng.next() as u8,
        })
        .collect();
    let scale_fields: &[usize] = match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q6_K => &[208],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ4_NL
        | DType::IQ4_XS => &[0],
        _ => &[],
    };
    for blk in out.chunks_exact_mut(dtype.block_bytes()) {
        for &o in scale_fields {
            blk[o..o + 2].copy_from_slice(&f16_bytes(rng.unit() * 0.05));
        }
        fp_scales(rng, dtype, blk);
        if dtype == DType::IQ1_M {
            // The f16 scale lives in the top nibbles of bytes 49, 51, 53, 55.
            let bits = u16::from_le_bytes(f16_bytes(rng.unit() * 0.05));
            for i in 0..4 {
                blk[49 + 2 * i] = (blk[49 + 2 * i] & 0x0F) | ((((bits >> (4 * i)) & 15) as u8) << 4);
            }
        }
    }
    out
}

/// Valid scales (and no NaN codes) for the low-bit float formats, whose loaders
/// refuse NaN scales before any kernel runs.
fn fp_scales(rng: &mut XorShift, dtype: DType, blk: &mut [u8]) {
    match dtype {
        DType::MXFP4 => blk[0] = 118 + (rng.next() % 16) as u8,
        DType::NVFP4 => blk[..4].iter_mut().for_each(|d| *d = (rng.next() % 0x7F) as u8),
        DType::FP8 => {
            blk[..4].copy_from_slice(&(rng.unit() * 0.01).to_le_bytes());
            blk[4..].iter_mut().filter(|q| **q & 0x7F == 0x7F).for_each(|q| *q -= 1);
        }
        _ => {}
    }
}

/// Elements per test row: a few blocks of every type.
fn test_len(dtype: DType) -> usize {
    match dtype.block_elems() {
        256 => 512,
        64 => 192,
        _ => 96,
    }
}

fn acts(rng: &mut XorShift, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 53 {
            0 => 0.0,
            7 => 40.0,
            _ => rng.unit() * 3.0,
        })
        .collect()
}

/// Allowed |kernel − scalar| for one row: `1e-4·mag` (f32 rounding; `mag` is
/// about Σ|w·x|), or for FP8 kernels that round the activations to bf16 their
/// derived bound ([`quant::fp8::bf16_dot_bound`]).
fn tolerance(dtype: DType, isa: Isa, row: &[u8], x: &[f32], mag: f32) -> f32 {
    if dtype == DType::FP8 && quant::fp8::bf16_activations(isa) {
        quant::fp8::bf16_dot_bound(bytemuck::cast_slice(row), x).max(1e-4 * mag)
    } else {
        1e-4 * mag
    }
}

/// Checks every kernel `isa` provides against scalar. `Err` names the first
/// mismatch.
pub fn self_test(isa: Isa) -> Result<(), String> {
    let mut rng = XorShift(0x5EED_1234_ABCD_0001);
    // Activation quantizers must be bit-identical.
    for vdt in [VecDotType::Q8_0, VecDotType::Q8_1, VecDotType::Q8_K] {
        let x = acts(&mut rng, 512);
        let mut a = vec![0u64; vdt.row_bytes(512).div_ceil(8)];
        let mut b = a.clone();
        let len = vdt.row_bytes(512);
        quant::quantize_act_fn(vdt, Isa::Scalar)(&x, &mut bytemuck::cast_slice_mut(&mut a)[..len]);
        quant::quantize_act_fn(vdt, isa)(&x, &mut bytemuck::cast_slice_mut(&mut b)[..len]);
        if a != b {
            return Err(format!("{vdt:?} activation quantizer differs from scalar"));
        }
    }
    tiles(&mut rng, isa)?;
    packed(&mut rng, isa)?;
    rows16(&mut rng, isa)?;
    lanes16(&mut rng, isa)?;
    gemms(&mut rng, isa)?;
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        crate::attention::self_test_avx2(isa == Isa::Avx512, &mut || rng.unit())?;
        crate::kv_quant::self_test(isa, &mut || rng.next() as u8)?;
        crate::kv_int_dot::self_test(isa, &mut || rng.next() as u8)?;
    }
    for dtype in DType::ALL {
        let n = test_len(dtype);
        let n = if dtype.is_quantized() { n } else { n + 5 };
        let vdt = VecDotType::of(dtype);
        let w = weights(&mut rng, dtype, 4, n);
        let rb = dtype.bytes_for(n).unwrap_or(0);
        let x = acts(&mut rng, n);
        let len = vdt.row_bytes(n);
        let mut abuf = vec![0u64; len.div_ceil(8)];
        quant::quantize_act_fn(vdt, Isa::Scalar)(&x, &mut bytemuck::cast_slice_mut(&mut abuf)[..len]);
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        let scalar = quant::scalar::dot_fn(dtype);
        let fast = quant::dot_fn(dtype, isa);
        let dot4 = quant::dot4_fn(dtype, isa);
        let mut wd = vec![0f32; n];
        let mut four = [0f32; 4];
        if let Some(f) = dot4 {
            // SAFETY: four rows of `rb` bytes; `isa` is supported (checked by caller).
            unsafe { f(n, w.as_ptr(), rb, a, four.as_mut_ptr()) };
            // A file-layout row kernel runs the four-row kernel's arithmetic.
            if let Some(rows) = crate::dispatch::kernels(dtype, isa, false).rows16 {
                let mut by_rows = [f32::NAN; 4];
                // SAFETY: as above; one activation row, four outputs.
                unsafe { rows(n, w.as_ptr(), rb, 4, a, len, 1, by_rows.as_mut_ptr(), 4) };
                if by_rows.map(f32::to_bits) != four.map(f32::to_bits) {
                    return Err(format!("{dtype} row kernel at {isa}: {by_rows:?} vs four-row {four:?}"));
                }
            }
        }
        for r in 0..4 {
            let row = &w[r * rb..(r + 1) * rb];
            quant::dequantize_row(dtype, row, &mut wd);
            let mag: f32 = wd.iter().zip(&x).map(|(p, q)| (p * q).abs()).sum::<f32>() * 1.05 + 1e-3;
            // SAFETY: as above.
            let (want, got) = unsafe { (scalar(n, row.as_ptr(), a), fast(n, row.as_ptr(), a)) };
            let tol = tolerance(dtype, isa, row, &x, mag);
            if (want - got).abs() > tol || !got.is_finite() {
                return Err(format!("{dtype} dot at {isa}: {got} vs scalar {want}"));
            }
            if dot4.is_some() && ((want - four[r]).abs() > tol || !four[r].is_finite()) {
                return Err(format!("{dtype} four-row dot at {isa}: {} vs scalar {want}", four[r]));
            }
        }
    }
    Ok(())
}

/// Every prefill GEMM the dispatch table lists at `isa` against
/// `matmul_reference`: one batch just above its threshold (lanes and rows
/// with tails), one thread.
fn gemms(rng: &mut XorShift, isa: Isa) -> Result<(), String> {
    use crate::matmul::{matmul_isa, matmul_reference, MatRef, MatmulScratch};
    let pool = crate::ThreadPool::new(1);
    for dtype in DType::ALL {
        let Some(g) = crate::dispatch::pick(crate::dispatch::row(dtype).at(isa).gemm) else { continue };
        let (rows, n, m) = (19, test_len(dtype), g.min_m + 3);
        let w = weights(rng, dtype, rows, n);
        let wm = MatRef::new(dtype, rows, n, &w).map_err(|e| e.to_string())?;
        let x: Vec<f32> = (0..m).flat_map(|_| acts(rng, n)).collect();
        let (mut want, mut got) = (vec![0f32; m * rows], vec![f32::NAN; m * rows]);
        matmul_reference(wm, &x, m, &mut want);
        matmul_isa(isa, &pool, wm, &x, m, &mut got, &mut MatmulScratch::default());
        let mut wd = vec![0f32; n];
        for r in 0..rows {
            quant::dequantize_row(dtype, &w[r * wm.row_bytes()..(r + 1) * wm.row_bytes()], &mut wd);
            for i in 0..m {
                let xi = &x[i * n..(i + 1) * n];
                let mag: f32 = wd.iter().zip(xi).map(|(p, q)| (p * q).abs()).sum::<f32>() * 1.05 + 1e-3;
                let (a, b) = (want[i * rows + r], got[i * rows + r]);
                if (a - b).abs() > 1e-4 * mag || !b.is_finite() {
                    return Err(format!("{dtype} {} GEMM at {isa}: row {r} batch row {i}: {b} vs scalar {a}", g.name));
                }
            }
        }
    }
    Ok(())
}

/// The packed four-row kernels against the file-layout ones at the same level:
/// bit for bit (same arithmetic, other addressing), so packing never changes
/// answers.
fn packed(rng: &mut XorShift, isa: Isa) -> Result<(), String> {
    for dtype in DType::ALL {
        // Two super-blocks for the K-quants, else 192 values.
        let n = if dtype.block_elems() == 256 { 512 } else { 192 };
        if !crate::packed::packable(dtype, 4, n) {
            continue;
        }
        // MXFP4/NVFP4 packed kernels exist at AVX-512 only (elsewhere the scalar
        // one unpacks rows, other arithmetic, and the loader does not pack them).
        if crate::packed::unit_blocks(dtype).is_some() && !crate::packed::worth_packing(dtype, isa) {
            continue;
        }
        // A level whose packed kernels read another layout than this
        // process packs (Q3_K's AVX2 code planes under `SHARDLM_ISA=scalar`) runs the
        // scalar ones, the reference's arithmetic, not its file-layout dot's.
        if crate::packed::level_layout(dtype, isa) != crate::packed::layout(dtype) {
            continue;
        }
        let (Some(file4), Some(packed4)) = (quant::dot4_fn(dtype, isa), crate::packed::dot4_fn(dtype, isa)) else {
            continue;
        };
        let vdt = VecDotType::of(dtype);
        let w = weights(rng, dtype, 4, n);
        let pw = crate::packed::pack(dtype, 4, n, &w);
        let rb = dtype.bytes_for(n).unwrap_or(0);
        let len = vdt.row_bytes(n);
        let mut abuf = vec![0u64; len.div_ceil(8)];
        quant::quantize_act_fn(vdt, Isa::Scalar)(&acts(rng, n), &mut bytemuck::cast_slice_mut(&mut abuf)[..len]);
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        let (mut file, mut pack) = ([0f32; 4], [0f32; 4]);
        // SAFETY: four rows of `rb` bytes in each layout; `isa` is supported.
        unsafe {
            file4(n, w.as_ptr(), rb, a, file.as_mut_ptr());
            packed4(n, pw.as_ptr(), rb, a, pack.as_mut_ptr());
        }
        if file.map(f32::to_bits) != pack.map(f32::to_bits) {
            return Err(format!("{dtype} packed four-row dot at {isa}: {pack:?} vs file layout {file:?}"));
        }
        // A recoded type's row kernel (decode's) runs the same arithmetic.
        let rows_kernel = crate::dispatch::kernels(dtype, isa, true).rows16;
        if let (Some(rows_kernel), crate::dispatch::Packing::Recoded(_)) = (rows_kernel, crate::packed::layout(dtype)) {
            // SAFETY: as above; one activation row, four outputs.
            unsafe { rows_kernel(n, pw.as_ptr(), rb, 4, a, len, 1, pack.as_mut_ptr(), 4) };
            if file.map(f32::to_bits) != pack.map(f32::to_bits) {
                return Err(format!("{dtype} recoded row kernel at {isa}: {pack:?} vs file layout {file:?}"));
            }
        }
    }
    Ok(())
}

/// The sixteen-row kernels of the head/quants layout (12 rows × 3 activation
/// rows of a packed weight) against the sequential scalar dots, bit for bit.
fn rows16(rng: &mut XorShift, isa: Isa) -> Result<(), String> {
    use crate::quant::{q4_0, q8_0};
    for dtype in [DType::Q8_0, DType::Q4_0] {
        // In the transposed layout: [`lanes16`] checks it.
        if crate::packed::is_lanes16(dtype) {
            continue;
        }
        let Some(kernel) = crate::dispatch::kernels(dtype, isa, true).rows16 else { continue };
        let (rows, n, m) = (12, 192, 3);
        let nb = n / 32;
        let w = weights(rng, dtype, rows, n);
        let pw = crate::packed::pack(dtype, rows, n, &w);
        let xs: Vec<Vec<f32>> = (0..m).map(|_| acts(rng, n)).collect();
        let q0: Vec<q8_0::BlockQ8_0> = xs
            .iter()
            .flat_map(|x| {
                let mut a = vec![q8_0::BlockQ8_0::zeroed(); nb];
                q8_0::quantize_activations(x, &mut a);
                a
            })
            .collect();
        let (ap, stride) = (q0.as_ptr() as *const u8, nb * 34);
        let mut out = vec![f32::NAN; m * rows];
        // SAFETY: three packed groups of `rows` rows, `m` activation rows of
        // `stride` bytes, `m × rows` outputs; `isa` is supported.
        unsafe { kernel(n, pw.as_ptr(), dtype.bytes_for(n).unwrap_or(0), rows, ap, stride, m, out.as_mut_ptr(), rows) };
        for j in 0..m {
            for r in 0..rows {
                let (rs, js) = (r * nb..(r + 1) * nb, j * nb..(j + 1) * nb);
                let want = if dtype == DType::Q4_0 {
                    q4_0::vec_dot_sequential(&bytemuck::cast_slice::<u8, q4_0::BlockQ4_0>(&w)[rs], &q0[js])
                } else {
                    q8_0::vec_dot_sequential(&bytemuck::cast_slice::<u8, q8_0::BlockQ8_0>(&w)[rs], &q0[js])
                };
                if want.to_bits() != out[j * rows + r].to_bits() {
                    let got = out[j * rows + r];
                    return Err(format!("{dtype} sixteen-row kernel at {isa}: row {r} act {j}: {got} vs {want}"));
                }
            }
        }
    }
    Ok(())
}

/// The sixteen-row kernels of the transposed K-quant layout (32 rows × 5
/// activation rows: a four-row tile and a one-row tile) against the scalar
/// reference dot, bit for bit.
fn lanes16(rng: &mut XorShift, isa: Isa) -> Result<(), String> {
    for dtype in DType::ALL {
        if !crate::packed::is_lanes16(dtype) {
            continue;
        }
        let Some(kernel) = crate::dispatch::kernels(dtype, isa, true).rows16 else { continue };
        let (rows, n, m) = (32, 512, 5);
        let w = weights(rng, dtype, rows, n);
        let pw = crate::packed::pack(dtype, rows, n, &w);
        let rb = dtype.bytes_for(n).unwrap_or(0);
        let vdt = VecDotType::of(dtype);
        let len = vdt.row_bytes(n);
        let stride = len.div_ceil(8) * 8;
        let mut abuf = vec![0u64; m * stride / 8];
        for j in 0..m {
            let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[j * stride..j * stride + len];
            quant::quantize_act_fn(vdt, Isa::Scalar)(&acts(rng, n), dst);
        }
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        let mut out = vec![f32::NAN; m * rows];
        // SAFETY: `rows` packed rows of `rb` bytes, `m` activation rows of
        // `stride` bytes, `m × rows` outputs; `isa` is supported.
        unsafe { kernel(n, pw.as_ptr(), rb, rows, a, stride, m, out.as_mut_ptr(), rows) };
        let dot = quant::scalar::dot_fn(dtype);
        for j in 0..m {
            for r in 0..rows {
                // SAFETY: one row and one activation row of `n` values.
                let want = unsafe { dot(n, w[r * rb..].as_ptr(), a.add(j * stride)) };
                let got = out[j * rows + r];
                if want.to_bits() != got.to_bits() {
                    return Err(format!("{dtype} sixteen-row kernel at {isa}: row {r} act {j}: {got} vs {want}"));
                }
            }
        }
    }
    Ok(())
}

/// 4 × 2 tile kernels against the scalar dot of each (row, activation) pair.
fn tiles(rng: &mut XorShift, isa: Isa) -> Result<(), String> {
    for dtype in DType::ALL {
        let Some(tile) = quant::tile_fn(dtype, isa) else { continue };
        let n = test_len(dtype);
        let vdt = VecDotType::of(dtype);
        let w = weights(rng, dtype, 4, n);
        let rb = dtype.bytes_for(n).unwrap_or(0);
        let len = vdt.row_bytes(n);
        let stride = len.div_ceil(8) * 8;
        let mut abuf = vec![0u64; 2 * stride / 8];
        let xs = [acts(rng, n), acts(rng, n)];
        for (j, x) in xs.iter().enumerate() {
            let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut abuf)[j * stride..j * stride + len];
            quant::quantize_act_fn(vdt, Isa::Scalar)(x, dst);
        }
        let a = bytemuck::cast_slice::<u64, u8>(&abuf).as_ptr();
        let mut out = [0f32; 8];
        // SAFETY: 4 weight rows, 2 activation rows, 2 × 4 outputs; `isa` supported.
        unsafe { tile(n, w.as_ptr(), rb, a, stride, out.as_mut_ptr(), 4) };
        let mut wd = vec![0f32; n];
        for r in 0..4 {
            let row = &w[r * rb..(r + 1) * rb];
            quant::dequantize_row(dtype, row, &mut wd);
            for (j, x) in xs.iter().enumerate() {
                let mag: f32 = wd.iter().zip(x).map(|(p, q)| (p * q).abs()).sum::<f32>() * 1.05 + 1e-3;
                // SAFETY: as above.
                let want = unsafe { quant::scalar::dot_fn(dtype)(n, row.as_ptr(), a.add(j * stride)) };
                let got = out[j * 4 + r];
                if (want - got).abs() > tolerance(dtype, isa, row, x, mag) || !got.is_finite() {
                    return Err(format!("{dtype} tile at {isa}: row {r} act {j}: {got} vs scalar {want}"));
                }
            }
        }
    }
    Ok(())
}
