//! The one dispatch table: for every weight type, its activation type, its
//! packed layout, and per ISA level the kernel of each shape.
//!
//! Shapes (signatures in [`crate::quant`]):
//! * `dot`: one weight row × one activation row ([`DotFn`]);
//! * `dot4`: four weight rows × one activation row, file layout ([`Dot4Fn`]),
//!   the decode kernel where the type is not packed;
//! * `tile`: 4 weight rows × 2 activation rows, file layout ([`TileFn`]), for
//!   `1 < m <` the GEMM threshold (batch-invariant with `dot4`);
//! * `packed_dot4` / `packed_tile`: the same over the interleaved four-row
//!   layout of [`crate::packed`];
//! * `packed_rows16`: sixteen packed rows in the vector lanes
//!   ([`Rows16Fn`]), one kernel for every `m`; where present it replaces
//!   the packed four-row kernel and the tiles, and the GEMM too unless the
//!   type's activations are Q8_K (whose GEMMs give the same bits) and
//!   `rows16_all_m` is off. IQ3_S's recoded layout has a row kernel of
//!   that shape over four-row groups (activations prepared once a call);
//! * `gemm`: the prefill GEMM with activation rows in the vector lanes
//!   ([`Gemm`]), for `m ≥ gemm.min_m`.
//!
//! A kernel slot is a list of `(feature, kernel)` in order of preference; the
//! first whose extra CPU feature is present wins ([`Feature`]: AVX-512 VBMI,
//! the opt-in BF16 FP8 path). Every level lists its kernels explicitly: an
//! AVX-512 row that reuses an AVX2 kernel says so. Nothing inherits, so a type
//! with no fast kernel at a level is visible here and fails
//! `tests/dispatch.rs` instead of running scalar quietly.
//!
//! Adding a type: its block file in `quant/` (layout, reference dequantize and
//! scalar dot), its kernels in `simd/`, and one [`Row`] in [`TABLE`].

use crate::quant::{scalar, VecDotType};
use crate::DType;

#[cfg(target_arch = "x86_64")]
use crate::simd::{
    avx2, avx2_fp, avx2_grid_loads, avx2_iq4nl, avx2_k, avx2_k45_rows, avx2_kq4, avx2_lowk, avx2_packed, avx2_q3k_rows,
    avx2_q6k_rows, avx2_rows, avx2_rows16_k, avx2_rows16_nl, avx2_rows16_q5, avx2_tile, avx512, avx512_fp, avx512_fp4,
    avx512_fp4_vbmi, avx512_fp8_bf16, avx512_iq, avx512_iq2_vbmi, avx512_iq3_vbmi, avx512_iq3s_vbmi, avx512_lowk,
    avx512_packed, avx512_rows16, avx512_rows16_k, avx512_rows16_nl, avx512_rows16_q3k, avx512_rows16_q5,
    avx512_rows16_xs,
};

mod feature;
#[cfg(target_arch = "x86_64")]
mod gemms;
pub use feature::{pick, Choice, Feature};
#[cfg(target_arch = "x86_64")]
use gemms::{GEMM_32_AVX2, GEMM_K, GEMM_K_AVX2, GEMM_K_AVX2_GRID, GEMM_Q8_0};

mod types;
pub use types::{Gemm, GemmFn, IsaKernels, Packing, Row, NONE};

/// `IsaKernels { .. }` on x86-64, [`NONE`] elsewhere (the `simd` module only
/// exists there).
#[cfg(target_arch = "x86_64")]
macro_rules! x86 {
    ($($t:tt)*) => { IsaKernels { $($t)* } };
}
#[cfg(not(target_arch = "x86_64"))]
macro_rules! x86 {
    ($($t:tt)*) => {
        NONE
    };
}

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
use Feature::{AvxVnni, Base, Bf16, Gfni, SlowGather, Vbmi, VbmiBitalg, VbmiGfni};

/// Every weight type, one row each.
pub static TABLE: &[Row] = &[
    Row {
        dtype: DType::F32,
        act: VecDotType::F32,
        packing: Packing::None,
        scalar: scalar::dot_f32,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        avx2: x86! { dot: &[(Base, avx2::dot_f32)], ..NONE },
        avx512: x86! { dot: &[(Base, avx512::dot_f32)], ..NONE },
    },
    Row {
        dtype: DType::F16,
        act: VecDotType::F32,
        packing: Packing::None,
        scalar: scalar::dot_f16,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        avx2: x86! { dot: &[(Base, avx2::dot_f16)], ..NONE },
        avx512: x86! { dot: &[(Base, avx512::dot_f16)], ..NONE },
    },
    Row {
        dtype: DType::BF16,
        act: VecDotType::F32,
        packing: Packing::None,
        scalar: scalar::dot_bf16,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        avx2: x86! { dot: &[(Base, avx2::dot_bf16)], ..NONE },
        avx512: x86! { dot: &[(Base, avx512::dot_bf16)], ..NONE },
    },
    Row {
        dtype: DType::Q4_0,
        act: VecDotType::Q8_0,
        packing: Packing::HeadQuants { head: 2 },
        scalar: scalar::dot_q4_0,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q4_0),
        scalar_packed_rows16: None,
        avx2: x86! {
            dot: &[(Base, avx2::dot_q4_0)],
            dot4: &[(Base, avx2_rows::dot4_q4_0)],
            tile: &[(Base, avx2_tile::tile_q4_0)],
            packed_dot4: &[(Base, avx2_packed::dot4_q4_0)],
            packed_tile: &[(Base, avx2_packed::tile_q4_0)],
            gemm: GEMM_32_AVX2,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512::dot_q4_0)],
            dot4: &[(Base, avx512::dot4_q4_0)],
            tile: &[(Base, avx512::tile_q4_0)],
            packed_dot4: &[(Base, avx512_packed::dot4_q4_0)],
            packed_tile: &[(Base, avx512_packed::tile_q4_0)],
            // Packed: every batch size, as Q4_1 and Q8_0.
            packed_rows16: &[(Base, avx512_rows16::rows16_q4_0)],
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q4_1,
        act: VecDotType::Q8_1,
        // Packed: sixteen rows in the lanes, the codes first (as Q5_1 without
        // its `qh`), the `d`s then the `m`s; one kernel for every batch size
        // that equals the scalar reference (the default model's prefill stays
        // batch-invariant). The file layout (rows not a multiple of 16) keeps
        // the row kernels and tiles.
        packing: Packing::Lanes16 { head_last: 4, sliced_qh: false, split_head: true },
        scalar: scalar::dot_q4_1,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q4_1),
        avx2: x86! {
            dot: &[(Base, avx2::dot_q4_1)],
            dot4: &[(Base, avx2_rows::dot4_q4_1)],
            tile: &[(Base, avx2_tile::tile_q4_1)],
            packed_rows16: &[(AvxVnni, avx2_rows16_q5::rows16_q4_1_vnni), (Base, avx2_rows16_q5::rows16_q4_1)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512::dot_q4_1)],
            dot4: &[(Base, avx512::dot4_q4_1)],
            tile: &[(Base, avx512::tile_q4_1)],
            packed_rows16: &[(Base, avx512_rows16_q5::rows16_q4_1)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q5_0,
        act: VecDotType::Q8_0,
        // Sixteen rows transposed, the scales last and qh bit-sliced.
        packing: Packing::Lanes16 { head_last: 2, sliced_qh: true, split_head: false },
        scalar: scalar::dot_q5_0,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q5_0),
        // Packed: the sixteen-row kernel for every batch size (faster than
        // the GEMM, which keeps the file layout's batches).
        avx2: x86! {
            dot: &[(Base, avx2::dot_q5_0)],
            packed_rows16: &[(AvxVnni, avx2_rows16_q5::rows16_q5_0_vnni), (Base, avx2_rows16_q5::rows16_q5_0)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            gemm: GEMM_32_AVX2,
            ..NONE
        },
        // Packed as at AVX2: the 512-bit sixteen-row kernel for every batch
        // size. A file-layout weight (rows not a multiple of 16) keeps the
        // AVX2 dot and the lane GEMM.
        avx512: x86! {
            dot: &[(Base, avx2::dot_q5_0)],
            packed_rows16: &[(Base, avx512_rows16_q5::rows16_q5_0)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q5_1,
        act: VecDotType::Q8_1,
        packing: Packing::Lanes16 { head_last: 4, sliced_qh: true, split_head: false },
        scalar: scalar::dot_q5_1,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q5_1),
        // Packed: the sixteen-row kernel for every batch size (no AVX2 GEMM).
        avx2: x86! {
            dot: &[(Base, avx2::dot_q5_1)],
            packed_rows16: &[(AvxVnni, avx2_rows16_q5::rows16_q5_1_vnni), (Base, avx2_rows16_q5::rows16_q5_1)],
            rows16_whole_batch: true,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx2::dot_q5_1)],
            packed_rows16: &[(Base, avx512_rows16_q5::rows16_q5_1)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q8_0,
        act: VecDotType::Q8_0,
        packing: Packing::HeadQuants { head: 2 },
        scalar: scalar::dot_q8_0,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q8_0),
        scalar_packed_rows16: None,
        avx2: x86! {
            dot: &[(Base, avx2::dot_q8_0)],
            dot4: &[(Base, avx2_rows::dot4_q8_0)],
            packed_dot4: &[(Base, avx2_packed::dot4_q8_0)],
            gemm: GEMM_32_AVX2,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512::dot_q8_0)],
            dot4: &[(Base, avx512::dot4_q8_0)],
            tile: &[(Base, avx512::tile_q8_0)],
            packed_dot4: &[(Base, avx512_packed::dot4_q8_0)],
            packed_tile: &[(Base, avx512_packed::tile_q8_0)],
            // Packed: every batch size, as Q4_1 (the lane GEMM keeps the
            // file layout's large batches).
            packed_rows16: &[(Base, avx512_rows16::rows16_q8_0)],
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q4_K,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed: lane = row, one stream for every batch size.
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_q4_k,
        // The AVX2 layout's (sub-block lanes) scalar kernel.
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q4_k),
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q4_k),
        // Packed in sub-block lanes (`crate::packed::k45_lanes`): a
        // row-range kernel below the GEMM's batches, one stream a row.
        avx2: x86! {
            dot: &[(Base, avx2_k::dot_q4_k)],
            packed_dot4: &[(Base, avx2_k45_rows::dot4_q4_k)],
            packed_rows16: &[(Base, avx2_k45_rows::rows_q4_k)],
            gemm: GEMM_K_AVX2,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q4kLanes)),
            ..NONE
        },
        // AVX-512 packs as AVX2 and decodes with its kernels: on AMD Zen 5
        // their one stream a row ran Q4_K_M decode 1.3x the sixteen-row
        // kernel (`simd::avx512_rows16_k::rows16_q4_k`, kept for the
        // scalar-level layout's tests), whose sixteen streams a group
        // overlapped compute and memory poorly. The file layout takes the
        // AVX2 dot too (the self-check holds packed and file results equal).
        // Batches from the GEMM's size run the AVX-512 GEMM, which reads the
        // rows unpacked.
        avx512: x86! {
            dot: &[(Base, avx2_k::dot_q4_k)],
            packed_dot4: &[(Base, avx2_k45_rows::dot4_q4_k)],
            packed_rows16: &[(Base, avx2_k45_rows::rows_q4_k)],
            gemm: GEMM_K,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q4kLanes)),
            ..NONE
        },
    },
    Row {
        dtype: DType::Q5_K,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed, as Q4_K.
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_q5_k,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q5_k),
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q5_k),
        // Sub-block lanes, as Q4_K.
        avx2: x86! {
            dot: &[(Base, avx2_k::dot_q5_k)],
            packed_dot4: &[(Base, avx2_k45_rows::dot4_q5_k)],
            packed_rows16: &[(Base, avx2_k45_rows::rows_q5_k)],
            gemm: GEMM_K_AVX2,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q5kLanes)),
            ..NONE
        },
        // As Q4_K (Zen 5: decode 1.18x at one thread, level or better at two).
        avx512: x86! {
            dot: &[(Base, avx2_k::dot_q5_k)],
            packed_dot4: &[(Base, avx2_k45_rows::dot4_q5_k)],
            packed_rows16: &[(Base, avx2_k45_rows::rows_q5_k)],
            gemm: GEMM_K,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q5kLanes)),
            ..NONE
        },
    },
    Row {
        dtype: DType::Q6_K,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed, as Q4_K (the 210-byte blocks end in a
        // two-byte tail, which the layout places after the words).
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_q6_k,
        // The AVX2 layout's (the file's, copied) scalar kernel.
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q6_k),
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q6_k),
        // The file layout, copied at load: a row-range kernel that decodes
        // each block once for a batch (`simd::avx2_q6k_rows`).
        avx2: x86! {
            dot: &[(Base, avx2_k::dot_q6_k)],
            packed_dot4: &[(Base, avx2_q6k_rows::dot4_q6_k)],
            packed_rows16: &[(Base, avx2_q6k_rows::rows_q6_k)],
            gemm: GEMM_K_AVX2,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q6kRows)),
            ..NONE
        },
        // As Q4_K: the AVX2 layout and row kernel (1.1-1.2x the sixteen-row
        // kernel's decode on Zen 5), the AVX-512 GEMM for large batches.
        avx512: x86! {
            dot: &[(Base, avx2_k::dot_q6_k)],
            packed_dot4: &[(Base, avx2_q6k_rows::dot4_q6_k)],
            packed_rows16: &[(Base, avx2_q6k_rows::rows_q6_k)],
            gemm: GEMM_K,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q6kRows)),
            ..NONE
        },
    },
    Row {
        dtype: DType::MXFP4,
        act: VecDotType::Q8_0,
        packing: Packing::Units { blocks: 2 },
        scalar: scalar::dot_mxfp4,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_mxfp4),
        scalar_packed_rows16: None,
        avx2: x86! {
            dot: &[(Base, avx2_fp::dot_mxfp4)],
            tile: &[(Base, avx2_fp::tile_mxfp4)],
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_fp::dot_mxfp4)],
            dot4: &[(Vbmi, avx512_fp4_vbmi::dot4_mxfp4), (Base, avx512_fp4::dot4_mxfp4)],
            tile: &[(Vbmi, avx512_fp4_vbmi::tile_mxfp4), (Base, avx512_fp4::tile_mxfp4)],
            // Without VBMI MXFP4 stays in the file layout.
            packed_dot4: &[(Vbmi, avx512_fp4_vbmi::dot4_mxfp4_packed)],
            packed_tile: &[(Vbmi, avx512_fp4_vbmi::tile_mxfp4_packed)],
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::NVFP4,
        act: VecDotType::Q8_0,
        packing: Packing::Units { blocks: 1 },
        scalar: scalar::dot_nvfp4,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_nvfp4),
        scalar_packed_rows16: None,
        avx2: x86! {
            dot: &[(Base, avx2_fp::dot_nvfp4)],
            tile: &[(Base, avx2_fp::tile_nvfp4)],
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_fp::dot_nvfp4)],
            dot4: &[(Base, avx512_fp4::dot4_nvfp4)],
            tile: &[(Base, avx512_fp4::tile_nvfp4)],
            packed_dot4: &[(Base, avx512_fp4::dot4_nvfp4_packed)],
            packed_tile: &[(Base, avx512_fp4::tile_nvfp4_packed)],
            ..NONE
        },
    },
    Row {
        dtype: DType::FP8,
        act: VecDotType::F32,
        // Its packed four-row kernel measured 0.86× the file-layout one.
        packing: Packing::None,
        scalar: scalar::dot_fp8,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        avx2: x86! {
            dot: &[(Base, avx2_fp::dot_fp8)],
            tile: &[(Base, avx2_fp::tile_fp8)],
            ..NONE
        },
        avx512: x86! {
            dot: &[(Bf16, avx512_fp8_bf16::dot_fp8), (Base, avx512_fp::dot_fp8)],
            dot4: &[(Bf16, avx512_fp8_bf16::dot4_fp8), (Base, avx512_fp::dot4_fp8)],
            // Without BF16 the AVX2 tile.
            tile: &[(Bf16, avx512_fp8_bf16::tile_fp8), (Base, avx2_fp::tile_fp8)],
            ..NONE
        },
    },
    Row {
        dtype: DType::Q2_K,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed, as Q4_K.
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_q2_k,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q2_k),
        // File layout: the one-row dot (its four-row kernel spilled, 16 ymm
        // registers, and ran 0.7x this one). Packed: the sixteen-row kernel
        // for decode and small batches.
        avx2: x86! {
            dot: &[(Base, avx2_kq4::dot_q2_k)],
            packed_rows16: &[(AvxVnni, avx2_rows16_k::rows16_q2_k_vnni), (Base, avx2_rows16_k::rows16_q2_k)],
            gemm: GEMM_K_AVX2,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_lowk::dot_q2_k)],
            dot4: &[(Base, avx512_lowk::dot4_q2_k)],
            packed_rows16: &[(Base, avx512_rows16_k::rows16_q2_k)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::Q3_K,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed, as Q4_K (a two-byte tail, as Q6_K).
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_q3_k,
        // The AVX2 layout's (code planes) scalar kernel.
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_q3_k),
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_q3_k),
        // No sixteen-row kernel (an AVX-VNNI one measured level with the
        // four-row kernel here): packed as three planes of whole codes, each
        // sub-block in one word lane (`crate::packed::q3k_planes`), read by a
        // row-range kernel below the GEMM's batches (the activations
        // transposed once a call) and a four-row one.
        avx2: x86! {
            dot: &[(Base, avx2_kq4::dot_q3_k)],
            dot4: &[(Base, avx2_kq4::dot4_q3_k)],
            packed_dot4: &[(Base, avx2_q3k_rows::planes_dot4_q3_k)],
            packed_rows16: &[(Base, avx2_q3k_rows::rows_q3_k)],
            gemm: GEMM_K_AVX2,
            packing: Some(Packing::Recoded(crate::packed::Recoding::Q3kPlanes)),
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_lowk::dot_q3_k)],
            dot4: &[(Base, avx512_lowk::dot4_q3_k)],
            packed_rows16: &[(Gfni, avx512_rows16_q3k::rows16_q3_k_gfni), (Base, avx512_rows16_k::rows16_q3_k)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ2_XXS,
        act: VecDotType::Q8_K,
        // The signs recoded as the VBMI kernel's masks where it reads them.
        packing: Packing::Recoded(crate::packed::Recoding::Iq2xxsSignMasks),
        scalar: scalar::dot_iq2_xxs,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_iq2_xxs),
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (decoded once a call).
        avx2: x86! { dot: &[(Base, avx2_lowk::dot_iq2_xxs)], gemm: GEMM_K_AVX2_GRID, ..NONE },
        avx512: x86! {
            dot: &[(Vbmi, avx512_iq::dot_iq2_xxs), (Base, avx2_lowk::dot_iq2_xxs)],
            dot4: &[(VbmiBitalg, avx512_iq2_vbmi::dot4_iq2_xxs)],
            rows: &[(VbmiBitalg, avx512_iq2_vbmi::rows_iq2_xxs)],
            packed_dot4: &[(VbmiBitalg, avx512_iq2_vbmi::packed_dot4_iq2_xxs)],
            packed_rows16: &[(VbmiBitalg, avx512_iq2_vbmi::packed_rows_iq2_xxs)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ2_XS,
        act: VecDotType::Q8_K,
        // The signs recoded as the VBMI kernel's masks where it reads them.
        packing: Packing::Recoded(crate::packed::Recoding::Iq2xsSignMasks),
        scalar: scalar::dot_iq2_xs,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_iq2_xs),
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (decoded once a call).
        avx2: x86! {
            dot: &[(SlowGather, avx2_grid_loads::dot_iq2_xs), (Base, avx2_lowk::dot_iq2_xs)],
            gemm: GEMM_K_AVX2_GRID,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_iq::dot_iq2_xs)],
            dot4: &[(VbmiBitalg, avx512_iq2_vbmi::dot4_iq2_xs)],
            rows: &[(VbmiBitalg, avx512_iq2_vbmi::rows_iq2_xs)],
            packed_dot4: &[(VbmiBitalg, avx512_iq2_vbmi::packed_dot4_iq2_xs)],
            packed_rows16: &[(VbmiBitalg, avx512_iq2_vbmi::packed_rows_iq2_xs)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ2_S,
        act: VecDotType::Q8_K,
        packing: Packing::None,
        scalar: scalar::dot_iq2_s,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (decoded once a call).
        avx2: x86! { dot: &[(Base, avx2_lowk::dot_iq2_s)], gemm: GEMM_K_AVX2_GRID, ..NONE },
        // Gathers, the 10-bit indices built in vectors: 1.34x the AVX2 kernel.
        avx512: x86! {
            dot: &[(Base, avx512_iq::dot_iq2_s)],
            dot4: &[(VbmiBitalg, avx512_iq2_vbmi::dot4_iq2_s)],
            rows: &[(VbmiBitalg, avx512_iq2_vbmi::rows_iq2_s)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ3_XXS,
        act: VecDotType::Q8_K,
        // The signs recoded as the VBMI kernel's masks where it reads them.
        packing: Packing::Recoded(crate::packed::Recoding::Iq3xxsSignMasks),
        scalar: scalar::dot_iq3_xxs,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_iq3_xxs),
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (decoded once a call).
        avx2: x86! {
            dot: &[(SlowGather, avx2_grid_loads::dot_iq3_xxs), (Base, avx2_lowk::dot_iq3_xxs)],
            gemm: GEMM_K_AVX2_GRID,
            ..NONE
        },
        // The grid in registers (VBMI, GFNI; four rows in the grid's order with
        // BITALG); a 512-bit gather version measured level with the AVX2 kernel.
        avx512: x86! {
            dot: &[(VbmiGfni, avx512_iq3_vbmi::dot_iq3_xxs), (Base, avx2_lowk::dot_iq3_xxs)],
            dot4: &[(VbmiBitalg, avx512_iq3_vbmi::dot4_iq3_xxs)],
            rows: &[(VbmiBitalg, avx512_iq3_vbmi::rows_iq3_xxs)],
            packed_dot4: &[(VbmiBitalg, avx512_iq3_vbmi::packed_dot4_iq3_xxs)],
            // Decode: the activations prepared once a call.
            packed_rows16: &[(VbmiBitalg, avx512_iq3_vbmi::packed_rows_iq3_xxs)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ3_S,
        act: VecDotType::Q8_K,
        // Recoded in the sign order where the VBMI kernel reads it.
        packing: Packing::Recoded(crate::packed::Recoding::Iq3sSignOrder),
        scalar: scalar::dot_iq3_s,
        scalar_packed_dot4: Some(crate::packed::scalar_dot4_iq3_s),
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (decoded once a call).
        avx2: x86! {
            dot: &[(SlowGather, avx2_grid_loads::dot_iq3_s), (Base, avx2_lowk::dot_iq3_s)],
            gemm: GEMM_K_AVX2_GRID,
            ..NONE
        },
        // Decode: the grid in registers with VBMI and BITALG, else gathers.
        avx512: x86! {
            dot: &[(VbmiBitalg, avx512_iq3s_vbmi::dot_iq3_s), (Base, avx512_iq::dot_iq3_s)],
            dot4: &[(VbmiBitalg, avx512_iq3s_vbmi::dot4_iq3_s)],
            packed_dot4: &[(VbmiBitalg, avx512_iq3s_vbmi::packed_dot4_iq3_s)],
            // Below the GEMM's batch: the activations prepared once a call.
            packed_rows16: &[(VbmiBitalg, avx512_iq3s_vbmi::packed_rows_iq3_s)],
            gemm: GEMM_K,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ1_S,
        act: VecDotType::Q8_K,
        packing: Packing::None,
        scalar: scalar::dot_iq1_s,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (8·grid ± 1).
        avx2: x86! { dot: &[(SlowGather, avx2_grid_loads::dot_iq1_s), (Base, avx2_lowk::dot_iq1_s)], gemm: GEMM_K_AVX2_GRID, ..NONE },
        avx512: x86! { dot: &[(Base, avx512_iq::dot_iq1_s)], gemm: GEMM_K, ..NONE },
    },
    Row {
        dtype: DType::IQ1_M,
        act: VecDotType::Q8_K,
        packing: Packing::None,
        scalar: scalar::dot_iq1_m,
        scalar_packed_dot4: None,
        scalar_packed_rows16: None,
        // Prefill: the K-quant lane GEMMs over `codes()` (8·grid ± 1).
        avx2: x86! { dot: &[(SlowGather, avx2_grid_loads::dot_iq1_m), (Base, avx2_lowk::dot_iq1_m)], gemm: GEMM_K_AVX2_GRID, ..NONE },
        avx512: x86! { dot: &[(Base, avx512_iq::dot_iq1_m)], gemm: GEMM_K, ..NONE },
    },
    Row {
        dtype: DType::IQ4_NL,
        act: VecDotType::Q8_0,
        // Sixteen rows transposed, each block's codes first and its d last
        // (so the codes start on a word).
        packing: Packing::Lanes16 { head_last: 2, sliced_qh: false, split_head: false },
        scalar: scalar::dot_iq4_nl,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_iq4_nl),
        // Packed (every batch size): the sixteen-row kernel; the file layout
        // (rows not in sixteens) keeps the one-row dot, the tile and the GEMM.
        avx2: x86! {
            dot: &[(Base, avx2_lowk::dot_iq4_nl)],
            tile: &[(Base, avx2_iq4nl::tile_iq4_nl)],
            packed_rows16: &[(AvxVnni, avx2_rows16_nl::rows16_iq4_nl_vnni), (Base, avx2_rows16_nl::rows16_iq4_nl)],
            rows16_whole_batch: true,
            rows16_all_m: true,
            gemm: GEMM_32_AVX2,
            ..NONE
        },
        // No 512-bit one-row dot: the AVX2 one. Packed (every batch size):
        // the sixteen-row kernel.
        avx512: x86! {
            dot: &[(Base, avx2_lowk::dot_iq4_nl)],
            tile: &[(Base, avx2_iq4nl::tile_iq4_nl)],
            packed_rows16: &[(Base, avx512_rows16_nl::rows16_iq4_nl)],
            rows16_whole_batch: true,
            gemm: GEMM_Q8_0,
            ..NONE
        },
    },
    Row {
        dtype: DType::IQ4_XS,
        act: VecDotType::Q8_K,
        // Sixteen rows transposed, as Q4_K.
        packing: Packing::Lanes16 { head_last: 0, sliced_qh: false, split_head: false },
        scalar: scalar::dot_iq4_xs,
        scalar_packed_dot4: None,
        scalar_packed_rows16: Some(crate::packed::lanes16::scalar_rows16_iq4_xs),
        // Packed: the sixteen-row kernel for every batch size; the file
        // layout (rows not in sixteens) keeps the one-row dot and the GEMM.
        avx2: x86! {
            dot: &[(Base, avx2_lowk::dot_iq4_xs)],
            packed_rows16: &[(AvxVnni, avx2_rows16_k::rows16_iq4_xs_vnni), (Base, avx2_rows16_k::rows16_iq4_xs)],
            rows16_whole_batch: true,
            // Over its decoded-once super-blocks it ran a 1.1B layer's m = 256
            // product 1.3x faster than the GEMM.
            rows16_all_m: true,
            rows: &[],
            gemm: GEMM_K_AVX2,
            ..NONE
        },
        avx512: x86! {
            dot: &[(Base, avx512_lowk::dot_iq4_xs)],
            dot4: &[(Base, avx512_lowk::dot4_iq4_xs)],
            packed_rows16: &[(Base, avx512_rows16_xs::rows16_iq4_xs)],
            rows16_all_m: true,
            rows16_whole_batch: true,
            gemm: GEMM_K,
            ..NONE
        },
    },
];

mod resolve;
pub use resolve::{kernels, quantize_act, row, Kernels};
