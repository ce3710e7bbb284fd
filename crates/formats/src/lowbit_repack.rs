//! Byte conversions from the publishers' low-bit layouts to shardlm's blocks
//! (the kernels' [`DType::NVFP4`], [`DType::MXFP4`] and [`DType::FP8`]). Values
//! and scales are copied bit for bit; only their order changes (and FP8 scales
//! are repeated into every 64-value block they cover). Errors are plain strings;
//! [`crate::lowbit`] names the tensor.
//!
//! Publishers pack FP4 along K as `byte i = code(2i) | code(2i+1) << 4`; the GGUF
//! blocks hold, per 32 (MXFP4) or 16 (NVFP4 sub-block) values, element `j` in
//! the low nibble and `j + half` in the high nibble of byte `j`.

use crate::lowbit::{owned, RawTensor};
use crate::WeightTensor;
use kernels::quant::minifloat;
use kernels::DType;

/// Little-endian f32 values of `b`.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Code of element `k` of a publisher-packed row.
#[inline]
fn code(row: &[u8], k: usize) -> u8 {
    (row[k / 2] >> (4 * (k % 2))) & 15
}

fn check(t: &RawTensor, dtype: &str, shape: &[usize]) -> Result<(), String> {
    if t.dtype != dtype || t.shape != shape {
        return Err(format!("'{}' is {} {:?}, expected {dtype} {shape:?}", t.name, t.dtype, t.shape));
    }
    Ok(())
}

/// `[N, K/2]` codes and their `[N, K/16]` E4M3 scales (ModelOpt or
/// compressed-tensors) → NVFP4 blocks of 64 (K must be a multiple of 64).
pub fn nvfp4(name: &str, codes: &RawTensor, scales: &RawTensor) -> Result<WeightTensor, String> {
    let [n, half] = codes.shape[..] else { return Err(format!("expected a 2-D U8 weight, got {:?}", codes.shape)) };
    check(codes, "U8", &[n, half])?;
    let k = 2 * half;
    if !k.is_multiple_of(16) {
        return Err(format!("NVFP4 needs K a multiple of 16 (its scale block), got K = {k}"));
    }
    check(scales, "F8_E4M3", &[n, k / 16])?;
    let (cb, sb) = (codes.data.bytes(), scales.data.bytes());
    if !k.is_multiple_of(64) {
        // Rows are not whole 64-value blocks: decode to f32 (exact: an E2M1
        // code times an E4M3 scale), at 8× the bytes, for this tensor only.
        let mut out = Vec::with_capacity(n * k * 4);
        for r in 0..n {
            for c in 0..k {
                let s = sb[r * k / 16 + c / 16];
                if minifloat::e4m3_is_nan(s) {
                    return Err(format!("'{}' has a NaN scale (row {r})", scales.name));
                }
                let v = minifloat::E2M1[code(&cb[r * half..], c) as usize] * minifloat::e4m3_to_f32(s);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        return Ok(WeightTensor::new(name.to_string(), DType::F32, vec![n, k], owned(out)));
    }
    let mut out = Vec::with_capacity(n * k / 64 * 36);
    for r in 0..n {
        let row = &cb[r * half..(r + 1) * half];
        let srow = &sb[r * k / 16..(r + 1) * k / 16];
        for b in 0..k / 64 {
            out.extend_from_slice(&srow[4 * b..4 * b + 4]);
            for s in 0..4 {
                let e0 = 64 * b + 16 * s;
                for j in 0..8 {
                    out.push(code(row, e0 + j) | code(row, e0 + j + 8) << 4);
                }
            }
        }
    }
    Ok(WeightTensor::new(name.to_string(), DType::NVFP4, vec![n, k], owned(out)))
}

/// `[R, K/2]` codes with `[R, K/32]` E8M0 scales → MXFP4 blocks of 32.
fn mxfp4_rows(cb: &[u8], sb: &[u8], rows: usize, k: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * k / 32 * 17);
    for r in 0..rows {
        let row = &cb[r * k / 2..(r + 1) * k / 2];
        for b in 0..k / 32 {
            out.push(sb[r * k / 32 + b]);
            for j in 0..16 {
                out.push(code(row, 32 * b + j) | code(row, 32 * b + j + 16) << 4);
            }
        }
    }
    out
}

/// compressed-tensors MXFP4: `weight_packed` U8 [N, K/2], `weight_scale` U8 [N, K/32].
pub fn mxfp4(name: &str, codes: &RawTensor, scales: &RawTensor) -> Result<WeightTensor, String> {
    let [n, half] = codes.shape[..] else { return Err(format!("expected a 2-D U8 weight, got {:?}", codes.shape)) };
    check(codes, "U8", &[n, half])?;
    let k = 2 * half;
    if !k.is_multiple_of(32) {
        return Err(format!("MXFP4 needs K a multiple of 32, got K = {k}"));
    }
    check(scales, "U8", &[n, k / 32])?;
    let out = mxfp4_rows(codes.data.bytes(), scales.data.bytes(), n, k);
    Ok(WeightTensor::new(name.to_string(), DType::MXFP4, vec![n, k], owned(out)))
}

/// gpt-oss MXFP4: `X_blocks` U8 [.., R, K/32, 16] and `X_scales` U8 [.., R, K/32]
/// → MXFP4 tensor `X` of shape [.., R, K].
pub fn gpt_oss_mxfp4(base: &str, blocks: &RawTensor, scales: &RawTensor) -> Result<WeightTensor, String> {
    let s = &blocks.shape;
    if s.len() < 3 || s[s.len() - 1] != 16 {
        return Err(format!("expected U8 [.., rows, K/32, 16], got {} {s:?}", blocks.dtype));
    }
    check(blocks, "U8", s)?;
    check(scales, "U8", &s[..s.len() - 1])?;
    let k = 32 * s[s.len() - 2];
    let rows: usize = s[..s.len() - 2].iter().product();
    let out = mxfp4_rows(blocks.data.bytes(), scales.data.bytes(), rows, k);
    let mut shape = s[..s.len() - 2].to_vec();
    shape.push(k);
    Ok(WeightTensor::new(base.to_string(), DType::MXFP4, shape, owned(out)))
}

/// FP8 E4M3 `[N, K]` with an F32 scale per tensor (`[]`/`[1]`), per output row
/// (`[N, 1]`/`[N]`) or per `bn × bk` block (`[⌈N/bn⌉, ⌈K/bk⌉]`) → FP8 blocks of
/// 64 carrying their scale. A 64-value block must not straddle two scale blocks.
pub fn fp8(name: &str, w: &RawTensor, scale: &RawTensor, block: [usize; 2]) -> Result<WeightTensor, String> {
    let [n, k] = w.shape[..] else { return Err(format!("expected a 2-D F8_E4M3 weight, got {:?}", w.shape)) };
    if scale.dtype != "F32" {
        return Err(format!("scale '{}' is {}, expected F32", scale.name, scale.dtype));
    }
    let sv = f32s(scale.data.bytes());
    let [bn, bk] = block;
    let grid = [n.div_ceil(bn.max(1)), k.div_ceil(bk.max(1))];
    let ss = &scale.shape[..];
    // Scale index of (row, column).
    let at: Box<dyn Fn(usize, usize) -> usize> = if sv.len() == 1 && ss.len() <= 2 {
        Box::new(|_, _| 0)
    } else if ss == [n, 1] || ss == [n] {
        Box::new(|r, _| r)
    } else if ss == grid {
        if !bk.is_multiple_of(64) && k.is_multiple_of(64) {
            return Err(format!("block scales of {bn}×{bk}: the column block must be a multiple of 64"));
        }
        Box::new(move |r, c| (r / bn) * grid[1] + c / bk)
    } else {
        return Err(format!(
            "scale '{}' has shape {ss:?}: expected [1] (per tensor), [{n}, 1] (per channel) or {grid:?} ({bn}×{bk} blocks)",
            scale.name
        ));
    };
    let wb = w.data.bytes();
    if !k.is_multiple_of(64) {
        // Rows are not whole 64-value blocks: decode to f32 (code × its
        // scale), at 4× the bytes, for this tensor only.
        let mut out = Vec::with_capacity(n * k * 4);
        for r in 0..n {
            for c in 0..k {
                let (d, q) = (sv[at(r, c)], wb[r * k + c]);
                if !d.is_finite() || minifloat::e4m3_is_nan(q) {
                    return Err(format!("'{}' row {r}: scale {d} or a NaN code", w.name));
                }
                out.extend_from_slice(&(minifloat::e4m3_to_f32(q) * d).to_le_bytes());
            }
        }
        return Ok(WeightTensor::new(name.to_string(), DType::F32, vec![n, k], owned(out)));
    }
    let mut out = Vec::with_capacity(n * k / 64 * 68);
    for r in 0..n {
        for b in 0..k / 64 {
            let d = sv[at(r, 64 * b)];
            if !d.is_finite() {
                return Err(format!("scale '{}' holds {d} (for row {r})", scale.name));
            }
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&wb[r * k + 64 * b..r * k + 64 * b + 64]);
        }
    }
    Ok(WeightTensor::new(name.to_string(), DType::FP8, vec![n, k], owned(out)))
}
