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
//!
//! MXFP4 and NVFP4 keep their blocks whole and interleave the four rows by
//! *units* of [`unit_blocks`] blocks: unit `u` of rows 0, 1, 2, 3 follow one
//! another, so a four-row kernel that steps through the blocks reads one
//! sequential stream instead of four rows `row_bytes` apart. Their kernels
//! already take a block pair (MXFP4) or one 64-value block (NVFP4) of each row
//! per step, so only their addresses change:
//!
//! ```text
//! [r0 unit0][r1 unit0][r2 unit0][r3 unit0][r0 unit1][r1 unit1] …
//! ```
//!
//! Why: MoE experts have short rows (1024 inputs: 544 bytes of MXFP4), too
//! short for the hardware prefetcher to follow four strided streams, and each
//! decode step reads 24 different expert matrices per layer. On the AMD EPYC
//! VM of issue 9 the packed experts decode the qwen3moe benchmark model 1.36×
//! (MXFP4) and 1.16× (NVFP4) faster at one thread, 1.24× / 1.13× at two
//! (docs/PERFORMANCE.md). On the dense 1.1B model (rows of 2048–5632 inputs)
//! MXFP4 decode gains 10–13%, NVFP4 decode and both prefills stay within noise.

pub mod iq2_signs;
pub mod k45_lanes;
pub mod lanes16;
pub mod q3k_planes;
pub mod sign_order;
pub mod xxs_signs;

use crate::dispatch::Packing;
use crate::quant::{self, Dot4Fn, TileFn};
use crate::DType;

/// Rows per interleaved group.
pub const PACK_ROWS: usize = 4;
/// Rows per group of the transposed layout.
pub const LANES16_ROWS: usize = 16;

/// The packed layout of `dtype` weights in this process: the one the
/// requested ISA level's packed kernels read ([`level_layout`] at
/// [`crate::isa::requested`]). One layout per process, so a weight packed at
/// load and the kernels that read it agree; a kernel at another level (tests
/// run every level) that does not read it gets the scalar kernel, which
/// unpacks rows ([`crate::dispatch::kernels`]).
pub fn layout(dtype: DType) -> Packing {
    level_layout(dtype, crate::isa::requested())
}

/// The layout `isa`'s packed kernels for `dtype` read: the level's own
/// (`IsaKernels::packing`) or the row's.
pub fn level_layout(dtype: DType, isa: crate::isa::Isa) -> Packing {
    let row = crate::dispatch::row(dtype);
    row.at(isa).packing.unwrap_or(row.packing)
}

/// Header bytes per block (scales) of the head/quants layout, or `None` if
/// `dtype` does not use it (the dispatch table's `packing`).
pub fn head_bytes(dtype: DType) -> Option<usize> {
    match layout(dtype) {
        Packing::HeadQuants { head } => Some(head),
        _ => None,
    }
}

/// Blocks per interleaved unit of the whole-block layout (MXFP4: the block
/// pair its kernels take per step; NVFP4: one 64-value block), or `None` if
/// `dtype` does not use it.
pub fn unit_blocks(dtype: DType) -> Option<usize> {
    match layout(dtype) {
        Packing::Units { blocks } => Some(blocks),
        _ => None,
    }
}

/// A per-block recoding of the file layout (see [`Packing::Recoded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recoding {
    /// IQ3_S in the VBMI kernel's sign order ([`sign_order`]).
    Iq3sSignOrder,
    /// Q3_K as three planes of whole codes for the AVX2 kernel ([`q3k_planes`]).
    Q3kPlanes,
    /// Q4_K and Q5_K in sub-block lanes for the AVX2 kernels ([`k45_lanes`]).
    Q4kLanes,
    Q5kLanes,
    /// Q6_K as it lies in the file, copied for the AVX2 row-range kernel
    /// (`simd::avx2_q6k_rows`): the copy is the recoding.
    Q6kRows,
    /// IQ3_XXS with its signs as the VBMI kernel's masks ([`xxs_signs`]).
    Iq3xxsSignMasks,
    /// IQ2_XXS and IQ2_XS with their signs as masks ([`iq2_signs`]).
    Iq2xxsSignMasks,
    Iq2xsSignMasks,
}

/// The identity recoding's way both ways.
fn copy_block(src: &[u8], dst: &mut [u8]) {
    dst.copy_from_slice(src)
}

/// One block recoded (or decoded) from `src` to `dst`, in vector code.
type BlockWay = unsafe fn(*const u8, *mut u8);
/// The same in byte loops.
type ScalarWay = fn(&[u8], &mut [u8]);

impl Recoding {
    /// Bytes of the blocks it recodes.
    fn block_bytes(self) -> usize {
        match self {
            Recoding::Iq3sSignOrder => sign_order::BLOCK_BYTES,
            Recoding::Q3kPlanes => q3k_planes::BLOCK_BYTES,
            Recoding::Q4kLanes => k45_lanes::Q4K_BYTES,
            Recoding::Q5kLanes => k45_lanes::Q5K_BYTES,
            Recoding::Q6kRows => 210,
            Recoding::Iq3xxsSignMasks => xxs_signs::BLOCK_BYTES,
            Recoding::Iq2xxsSignMasks => iq2_signs::XXS_BYTES,
            Recoding::Iq2xsSignMasks => iq2_signs::XS_BYTES,
        }
    }

    /// The byte-loop `(encode, decode)`, for any CPU.
    fn scalar(self) -> (ScalarWay, ScalarWay) {
        match self {
            Recoding::Iq3sSignOrder => (sign_order::encode, sign_order::decode),
            Recoding::Q3kPlanes => (q3k_planes::encode, q3k_planes::decode),
            Recoding::Q4kLanes => (k45_lanes::encode_q4k, k45_lanes::decode_q4k),
            Recoding::Q5kLanes => (k45_lanes::encode_q5k, k45_lanes::decode_q5k),
            Recoding::Q6kRows => (copy_block, copy_block),
            Recoding::Iq3xxsSignMasks => (xxs_signs::encode, xxs_signs::decode),
            Recoding::Iq2xxsSignMasks => (iq2_signs::encode_xxs, iq2_signs::decode_xxs),
            Recoding::Iq2xsSignMasks => (iq2_signs::encode_xs, iq2_signs::decode_xs),
        }
    }

    /// The vector `(encode, decode)` where this CPU runs them (the VBMI
    /// types' where it packs them at all; the loader and the prefill GEMM's
    /// way back). The sign-mask recodings have a vector encode only: the GEMM
    /// reads them as they lie, and only the scalar kernels go back.
    fn vector(self) -> (Option<BlockWay>, Option<BlockWay>) {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::{
                avx2_k45_rows, avx2_q3k_recode, avx512_iq, avx512_iq3_vbmi, avx512_iq3s_recode, avx512_iq3s_vbmi,
            };
            let vbmi = avx512_iq3s_vbmi::has_vbmi_bitalg();
            let (e, d): (BlockWay, Option<BlockWay>) = match self {
                Recoding::Iq3sSignOrder if vbmi => (avx512_iq3s_recode::encode, Some(avx512_iq3s_recode::decode)),
                Recoding::Q3kPlanes if is_x86_feature_detected!("avx2") => {
                    (avx2_q3k_recode::encode, Some(avx2_q3k_recode::decode))
                }
                Recoding::Q4kLanes if is_x86_feature_detected!("avx2") => {
                    (avx2_k45_rows::encode_q4k, Some(avx2_k45_rows::decode_q4k))
                }
                Recoding::Q5kLanes if is_x86_feature_detected!("avx2") => {
                    (avx2_k45_rows::encode_q5k, Some(avx2_k45_rows::decode_q5k))
                }
                Recoding::Iq3xxsSignMasks if vbmi => (avx512_iq3_vbmi::encode_recoded, None),
                Recoding::Iq2xxsSignMasks if vbmi => (avx512_iq::encode_iq2_xxs, None),
                Recoding::Iq2xsSignMasks if vbmi => (avx512_iq::encode_iq2_xs, None),
                _ => return (None, None),
            };
            (Some(e), d)
        }
        #[cfg(not(target_arch = "x86_64"))]
        (None, None)
    }

    /// The whole file-layout blocks of `src` recoded into `dst` (same length).
    pub fn encode(self, src: &[u8], dst: &mut [u8]) {
        self.run(src, dst, true)
    }

    /// The inverse of [`Recoding::encode`].
    pub fn decode(self, src: &[u8], dst: &mut [u8]) {
        self.run(src, dst, false)
    }

    /// Every block, the way (vector or byte loops) picked once a call, not
    /// once a block.
    fn run(self, src: &[u8], dst: &mut [u8], encode: bool) {
        let bb = self.block_bytes();
        let blocks = src.chunks_exact(bb).zip(dst.chunks_exact_mut(bb));
        let (ve, vd) = self.vector();
        match if encode { ve } else { vd } {
            Some(way) => {
                for (s, d) in blocks {
                    // SAFETY: `vector` checked the CPU; both blocks are whole.
                    unsafe { way(s.as_ptr(), d.as_mut_ptr()) }
                }
            }
            None => {
                let (e, d) = self.scalar();
                let way = if encode { e } else { d };
                for (s, d) in blocks {
                    way(s, d)
                }
            }
        }
    }
}

/// The recoding `dtype` packs with, if any.
pub fn recoding(dtype: DType) -> Option<Recoding> {
    match layout(dtype) {
        Packing::Recoded(r) => Some(r),
        _ => None,
    }
}

/// Whether `dtype` uses the sixteen-row transposed layout ([`crate::packed::lanes16`]).
pub fn is_lanes16(dtype: DType) -> bool {
    matches!(layout(dtype), Packing::Lanes16 { .. })
}

/// How `dtype`'s blocks are stored in the lanes16 layout (see [`Packing::Lanes16`]).
fn lanes16_form(dtype: DType) -> lanes16::Form {
    match layout(dtype) {
        Packing::Lanes16 { head_last, sliced_qh, split_head } => {
            lanes16::Form { head: head_last, sliced_qh, split_head }
        }
        _ => lanes16::Form::FILE,
    }
}

/// Rows per packed group of `dtype`: [`LANES16_ROWS`] for the transposed
/// layout, [`PACK_ROWS`] for the interleaved ones. A packed row range (a
/// tensor-parallel slice, a thread's share) starts and ends on a multiple.
pub fn group_rows(dtype: DType) -> usize {
    if is_lanes16(dtype) {
        LANES16_ROWS
    } else {
        PACK_ROWS
    }
}

/// Blocks a packed row's length must be a multiple of, if `dtype` packs at all.
fn step_blocks(dtype: DType) -> Option<usize> {
    if head_bytes(dtype).is_some() {
        return Some(2);
    }
    if is_lanes16(dtype) || recoding(dtype).is_some() {
        return Some(1);
    }
    unit_blocks(dtype)
}

/// Whether a `rows × cols` weight of `dtype` can be packed.
pub fn packable(dtype: DType, rows: usize, cols: usize) -> bool {
    step_blocks(dtype).is_some_and(|k| cols.is_multiple_of(k * dtype.block_elems()))
        && rows > 0
        && rows.is_multiple_of(group_rows(dtype))
}

/// Whether packing a `dtype` weight pays at `isa`: the dispatch table lists
/// a packed four- or sixteen-row kernel for it there (otherwise only the
/// scalar kernel, which unpacks every row, could read it).
pub fn worth_packing(dtype: DType, isa: crate::isa::Isa) -> bool {
    let k = crate::dispatch::row(dtype).at(isa);
    level_layout(dtype, isa) == layout(dtype)
        && (crate::dispatch::pick(k.packed_dot4).is_some() || crate::dispatch::pick(k.packed_rows16).is_some())
}

/// Byte offset, inside a packed group, of block `b` of group row `r`:
/// `(header offset, quants offset)` (head/quants layout).
#[inline]
fn offsets(dtype: DType, b: usize, r: usize) -> (usize, usize) {
    let h = head_bytes(dtype).expect("packable type");
    let qb = dtype.block_bytes() - h;
    let pair = 2 * PACK_ROWS * dtype.block_bytes();
    let base = b / 2 * pair;
    let slot = 2 * r + b % 2;
    (base + slot * h, base + 2 * PACK_ROWS * h + slot * qb)
}

/// Byte offset, inside a packed group, of block `b` of group row `r`
/// (whole-block layout with units of `u` blocks of `bb` bytes).
#[inline]
fn unit_offset(bb: usize, u: usize, b: usize, r: usize) -> usize {
    (b / u * PACK_ROWS + r) * u * bb + b % u * bb
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
    let nb = cols / dtype.block_elems();
    let rb = nb * bb;
    assert_eq!(src.len(), rows * rb, "pack: weight bytes");
    assert_eq!(out.len(), src.len(), "pack: output bytes");
    if is_lanes16(dtype) {
        for g in 0..rows / LANES16_ROWS {
            let span = g * LANES16_ROWS * rb..(g + 1) * LANES16_ROWS * rb;
            lanes16::pack_group(bb, lanes16_form(dtype), nb, &src[span.clone()], &mut out[span]);
        }
        return;
    }
    if let Some(rc) = recoding(dtype) {
        rc.encode(src, out);
        return;
    }
    for g in 0..rows / PACK_ROWS {
        let gsrc = &src[g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb];
        let gdst = &mut out[g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb];
        for r in 0..PACK_ROWS {
            for b in 0..nb {
                let blk = &gsrc[r * rb + b * bb..][..bb];
                if let Some(u) = unit_blocks(dtype) {
                    let o = unit_offset(bb, u, b, r);
                    gdst[o..o + bb].copy_from_slice(blk);
                    continue;
                }
                let h = head_bytes(dtype).expect("packable type");
                let (ho, qo) = offsets(dtype, b, r);
                gdst[ho..ho + h].copy_from_slice(&blk[..h]);
                gdst[qo..qo + bb - h].copy_from_slice(&blk[h..]);
            }
        }
    }
}

/// Rebuilds row `r` (0..[`group_rows`]) of one packed group in the file
/// layout into `dst` (`row_bytes` long). Inverse of [`pack`]; used by the
/// scalar path and tests.
pub fn unpack_row(dtype: DType, cols: usize, group: &[u8], r: usize, dst: &mut [u8]) {
    let bb = dtype.block_bytes();
    if is_lanes16(dtype) {
        lanes16::unpack_row(bb, lanes16_form(dtype), cols / dtype.block_elems(), group, r, dst);
        return;
    }
    if let Some(rc) = recoding(dtype) {
        // Rows stay in place: row `r` of the group is `r · row_bytes` on.
        let rb = bb * (cols / dtype.block_elems());
        rc.decode(&group[r * rb..(r + 1) * rb], &mut dst[..rb]);
        return;
    }
    for b in 0..cols / dtype.block_elems() {
        if let Some(u) = unit_blocks(dtype) {
            let o = unit_offset(bb, u, b, r);
            dst[b * bb..(b + 1) * bb].copy_from_slice(&group[o..o + bb]);
            continue;
        }
        let h = head_bytes(dtype).expect("packable type");
        let (ho, qo) = offsets(dtype, b, r);
        dst[b * bb..b * bb + h].copy_from_slice(&group[ho..ho + h]);
        dst[b * bb + h..(b + 1) * bb].copy_from_slice(&group[qo..qo + bb - h]);
    }
}

/// All rows of one sixteen-row group of the transposed layout back in the
/// file layout (`dst`: sixteen rows).
pub fn unpack_group(dtype: DType, cols: usize, group: &[u8], dst: &mut [u8]) {
    assert!(is_lanes16(dtype), "{dtype} has no sixteen-row groups");
    lanes16::unpack_group(dtype.block_bytes(), lanes16_form(dtype), cols / dtype.block_elems(), group, dst);
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
        pub(crate) unsafe fn $name(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
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
scalar_dot4!(scalar_dot4_q8_0, DType::Q8_0);
scalar_dot4!(scalar_dot4_mxfp4, DType::MXFP4);
scalar_dot4!(scalar_dot4_nvfp4, DType::NVFP4);
scalar_dot4!(scalar_dot4_iq3_s, DType::IQ3_S);
scalar_dot4!(scalar_dot4_iq3_xxs, DType::IQ3_XXS);
scalar_dot4!(scalar_dot4_iq2_xxs, DType::IQ2_XXS);
scalar_dot4!(scalar_dot4_iq2_xs, DType::IQ2_XS);
scalar_dot4!(scalar_dot4_q3_k, DType::Q3_K);
scalar_dot4!(scalar_dot4_q4_k, DType::Q4_K);
scalar_dot4!(scalar_dot4_q5_k, DType::Q5_K);
scalar_dot4!(scalar_dot4_q6_k, DType::Q6_K);

/// The four-row kernel over a packed group for `dtype` at `isa`. Always present
/// for packable types (the scalar one unpacks rows), `None` otherwise.
pub fn dot4_fn(dtype: DType, isa: crate::isa::Isa) -> Option<Dot4Fn> {
    step_blocks(dtype)?;
    crate::dispatch::kernels(dtype, isa, true).dot4
}

/// The 4 × 2 tile kernel over a packed group for `dtype` at `isa`, if any
/// (without one, `m > 1` runs the four-row kernel once per activation row).
pub fn tile_fn(dtype: DType, isa: crate::isa::Isa) -> Option<TileFn> {
    crate::dispatch::kernels(dtype, isa, true).tile
}

/// `n` pseudo-random bytes (xorshift from `seed`), for the recodings' tests.
#[cfg(test)]
pub(crate) fn test_bytes(mut seed: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::MXFP4,
            DType::NVFP4,
            DType::Q4_K,
            DType::Q6_K,
            DType::Q2_K,
            DType::IQ3_S,
            DType::IQ3_XXS,
            DType::IQ2_XXS,
            DType::IQ2_XS,
            DType::Q3_K,
        ] {
            let (rows, cols) = (2 * group_rows(dtype), if dtype.block_elems() == 256 { 512 } else { 128 });
            let src: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap()).map(|i| (i * 31 % 251) as u8).collect();
            let packed = pack(dtype, rows, cols, &src);
            // The one identity recoding (Q6_K at AVX2) only copies.
            if recoding(dtype) != Some(Recoding::Q6kRows) {
                assert_ne!(packed, src);
            }
            let rb = dtype.bytes_for(cols).unwrap();
            let mut row = vec![0u8; rb];
            let g = group_rows(dtype);
            for r in 0..rows {
                unpack_row(dtype, cols, &packed[r / g * g * rb..], r % g, &mut row);
                assert_eq!(row, src[r * rb..(r + 1) * rb], "{dtype} row {r}");
            }
        }
        assert!(!packable(DType::Q4_0, 6, 64));
        assert!(!packable(DType::Q4_0, 8, 96));
        // Q4_K: sixteen-row groups, or recoded in place (AVX2) in groups of four.
        assert!(packable(DType::Q4_K, 32, 512));
        assert_eq!(packable(DType::Q4_K, 8, 512), !is_lanes16(DType::Q4_K));
        assert!(packable(DType::Q2_K, 16, 512));
        assert!(!packable(DType::Q2_K, 8, 512));
        // IQ2_XXS recodes each block in place; IQ2_S stays in the file layout.
        assert!(packable(DType::IQ2_XXS, 8, 512));
        assert!(!packable(DType::IQ2_S, 8, 512));
        // MXFP4 packs by block pairs, NVFP4 by blocks; FP8 stays in the file layout.
        assert!(!packable(DType::MXFP4, 8, 96));
        assert!(packable(DType::NVFP4, 8, 64));
        assert!(!packable(DType::FP8, 8, 128));
    }

    /// Every recoding's vector encode and decode, where this CPU has them,
    /// equal the byte loops on random blocks.
    #[test]
    fn vector_recodings_equal_scalar() {
        use Recoding::*;
        for rc in
            [Iq3sSignOrder, Q3kPlanes, Q4kLanes, Q5kLanes, Q6kRows, Iq3xxsSignMasks, Iq2xxsSignMasks, Iq2xsSignMasks]
        {
            let bb = rc.block_bytes();
            let (se, sd) = rc.scalar();
            let (ve, vd) = rc.vector();
            for round in 0..100u64 {
                let src = test_bytes(0x5851_F42D_4C95_7F2Du64 ^ round, bb);
                let (mut want, mut got) = (vec![0u8; bb], vec![0u8; bb]);
                se(&src, &mut want);
                if let Some(e) = ve {
                    // SAFETY: `vector` checked the CPU; both blocks are whole.
                    unsafe { e(src.as_ptr(), got.as_mut_ptr()) };
                    assert_eq!(got, want, "{rc:?} encode");
                }
                let (mut back_want, mut back) = (vec![0u8; bb], vec![0u8; bb]);
                sd(&want, &mut back_want);
                assert_eq!(back_want, src, "{rc:?} round trip");
                if let Some(d) = vd {
                    // SAFETY: as above.
                    unsafe { d(want.as_ptr(), back.as_mut_ptr()) };
                    assert_eq!(back, back_want, "{rc:?} decode");
                }
            }
        }
    }
}
