//! The row-interleaved ("packed") weight layout of the batch-1 decode path.
//!
//! Why: a four-row decode kernel over the file's layout walks four separate row
//! streams and, per pair of blocks, gathers eight 2-byte scales from four places
//! with scalar inserts and joins two unaligned 16-byte quant runs per row. On
//! AVX2 those gathers cost as many instructions as the integer dot itself, and
//! Q4_0 decode ends up compute-bound well below the memory bandwidth. Repacking
//! once at load turns each group of four rows into one sequential stream where
//! every pair of blocks starts with the scales of all four rows (one vector
//! load) followed by each row's quants for both blocks (one vector load each).
//!
//! Layout, for a group of [`PACK_ROWS`] rows and block pair `p` (blocks `2p`,
//! `2p + 1`), with `H` the per-block header (`d`: 2 bytes for Q4_0/Q8_0; `d, m`:
//! 4 bytes for Q4_1) and `Q` the per-block quants (16 bytes for Q4_0/Q4_1, 32
//! for Q8_0):
//!
//! ```text
//! [H r0b0][H r0b1][H r1b0][H r1b1][H r2b0][H r2b1][H r3b0][H r3b1]
//! [Q r0b0][Q r0b1][Q r1b0][Q r1b1][Q r2b0][Q r2b1][Q r3b0][Q r3b1]
//! ```
//!
//! The pairs follow one another; a group of four rows takes exactly the bytes of
//! its four rows in the file, so row `r` (a multiple of 4) still starts at
//! `r · row_bytes` and any row range on a multiple of 4 is a valid packed matrix.
//! Only whole groups of rows with an even block count are packed ([`packable`]).

use crate::quant::{self, Dot4Fn, TileFn};
use crate::DType;

/// Rows per interleaved group.
pub const PACK_ROWS: usize = 4;

/// Header bytes per block (scales), or `None` if `dtype` has no packed form.
pub const fn head_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_0 | DType::Q8_0 => Some(2),
        DType::Q4_1 => Some(4),
        _ => None,
    }
}

/// Whether a `rows × cols` weight of `dtype` can be packed.
pub fn packable(dtype: DType, rows: usize, cols: usize) -> bool {
    head_bytes(dtype).is_some()
        && rows > 0
        && rows.is_multiple_of(PACK_ROWS)
        && cols.is_multiple_of(2 * dtype.block_elems())
}

/// Byte offset, inside a packed group, of block `b` of group row `r`:
/// `(header offset, quants offset)`.
#[inline]
fn offsets(dtype: DType, b: usize, r: usize) -> (usize, usize) {
    let h = head_bytes(dtype).expect("packable type");
    let qb = dtype.block_bytes() - h;
    let pair = 2 * PACK_ROWS * dtype.block_bytes();
    let base = b / 2 * pair;
    let slot = 2 * r + b % 2;
    (base + slot * h, base + 2 * PACK_ROWS * h + slot * qb)
}

/// Repacks a row-major `rows × cols` weight (the file layout) into the packed
/// layout. `src.len()` must be `rows · row_bytes`; the output has the same size.
pub fn pack(dtype: DType, rows: usize, cols: usize, src: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    pack_into(dtype, rows, cols, src, &mut out);
    out
}

/// [`pack`] into `out` (same length as `src`). Groups are independent, so a
/// weight can be packed a four-aligned run of rows at a time.
pub fn pack_into(dtype: DType, rows: usize, cols: usize, src: &[u8], out: &mut [u8]) {
    assert!(packable(dtype, rows, cols), "{dtype} {rows}×{cols} is not packable");
    let bb = dtype.block_bytes();
    let h = head_bytes(dtype).expect("packable type");
    let nb = cols / dtype.block_elems();
    let rb = nb * bb;
    assert_eq!(src.len(), rows * rb, "pack: weight bytes");
    assert_eq!(out.len(), src.len(), "pack: output bytes");
    for g in 0..rows / PACK_ROWS {
        let gsrc = &src[g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb];
        let gdst = &mut out[g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb];
        for r in 0..PACK_ROWS {
            for b in 0..nb {
                let blk = &gsrc[r * rb + b * bb..][..bb];
                let (ho, qo) = offsets(dtype, b, r);
                gdst[ho..ho + h].copy_from_slice(&blk[..h]);
                gdst[qo..qo + bb - h].copy_from_slice(&blk[h..]);
            }
        }
    }
}

/// Rebuilds row `r` (0..4) of one packed group in the file layout into `dst`
/// (`row_bytes` long). Inverse of [`pack`]; used by the scalar path and tests.
pub fn unpack_row(dtype: DType, cols: usize, group: &[u8], r: usize, dst: &mut [u8]) {
    let bb = dtype.block_bytes();
    let h = head_bytes(dtype).expect("packable type");
    for b in 0..cols / dtype.block_elems() {
        let (ho, qo) = offsets(dtype, b, r);
        dst[b * bb..b * bb + h].copy_from_slice(&group[ho..ho + h]);
        dst[b * bb + h..(b + 1) * bb].copy_from_slice(&group[qo..qo + bb - h]);
    }
}

thread_local! {
    /// One unpacked row for the scalar packed kernels.
    static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

macro_rules! scalar_dot4 {
    ($name:ident, $dtype:expr) => {
        /// Scalar packed four-row dot: unpacks each row and runs the scalar
        /// reference dot (see [`Dot4Fn`]; `w` is the packed group, `stride` unused).
        ///
        /// # Safety
        /// As for [`Dot4Fn`].
        unsafe fn $name(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
            let dtype: DType = $dtype;
            let rb = dtype.bytes_for(n).expect("whole blocks");
            let group = std::slice::from_raw_parts(w, PACK_ROWS * rb);
            let dot = quant::scalar::dot_fn(dtype);
            ROW.with(|row| {
                let mut row = row.borrow_mut();
                row.resize(rb, 0);
                for r in 0..PACK_ROWS {
                    unpack_row(dtype, n, group, r, &mut row);
                    *out.add(r) = dot(n, row.as_ptr(), a);
                }
            })
        }
    };
}

scalar_dot4!(scalar_dot4_q4_0, DType::Q4_0);
scalar_dot4!(scalar_dot4_q4_1, DType::Q4_1);
scalar_dot4!(scalar_dot4_q8_0, DType::Q8_0);

/// The four-row kernel over a packed group for `dtype` at `isa`. Always present
/// for packable types (the scalar one unpacks rows), `None` otherwise.
pub fn dot4_fn(dtype: DType, isa: crate::isa::Isa) -> Option<Dot4Fn> {
    head_bytes(dtype)?;
    #[cfg(target_arch = "x86_64")]
    if isa == crate::isa::Isa::Avx512 {
        if let Some(f) = crate::simd::avx512_packed::dot4_fn(dtype) {
            return Some(f);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, crate::isa::Isa::Avx2 | crate::isa::Isa::Avx512) {
        if let Some(f) = crate::simd::avx2_packed::dot4_fn(dtype) {
            return Some(f);
        }
    }
    let _ = isa;
    Some(match dtype {
        DType::Q4_0 => scalar_dot4_q4_0,
        DType::Q4_1 => scalar_dot4_q4_1,
        _ => scalar_dot4_q8_0,
    })
}

/// The 4 × 2 tile kernel over a packed group for `dtype` at `isa`, if any
/// (without one, `m > 1` runs the four-row kernel once per activation row).
pub fn tile_fn(dtype: DType, isa: crate::isa::Isa) -> Option<TileFn> {
    #[cfg(target_arch = "x86_64")]
    if isa == crate::isa::Isa::Avx512 {
        if let Some(f) = crate::simd::avx512_packed::tile_fn(dtype) {
            return Some(f);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, crate::isa::Isa::Avx2 | crate::isa::Isa::Avx512) {
        return crate::simd::avx2_packed::tile_fn(dtype);
    }
    let _ = (dtype, isa);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let (rows, cols) = (8, 128);
            let src: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap()).map(|i| (i * 31 % 251) as u8).collect();
            let packed = pack(dtype, rows, cols, &src);
            assert_ne!(packed, src);
            let rb = dtype.bytes_for(cols).unwrap();
            let mut row = vec![0u8; rb];
            for r in 0..rows {
                unpack_row(dtype, cols, &packed[r / 4 * 4 * rb..], r % 4, &mut row);
                assert_eq!(row, src[r * rb..(r + 1) * rb], "{dtype} row {r}");
            }
        }
        assert!(!packable(DType::Q4_0, 6, 64));
        assert!(!packable(DType::Q4_0, 8, 96));
        assert!(!packable(DType::Q4_K, 8, 512));
    }
}
