//! Resolving [`super::TABLE`] for one weight: its row, the kernels it runs
//! with at an ISA level and layout, and the activation quantizer.

use super::{pick, Gemm, Packing, TABLE};
use crate::isa::Isa;
use crate::quant::{Dot4Fn, DotFn, QuantizeActFn, Rows16Fn, TileFn, VecDotType};
#[cfg(target_arch = "x86_64")]
use crate::simd::avx2;
use crate::DType;

/// The row of `dtype`. Every [`DType`] has one (`tests/dispatch.rs`).
pub fn row(dtype: DType) -> &'static super::Row {
    TABLE.iter().find(|r| r.dtype == dtype).unwrap_or_else(|| panic!("{dtype} has no dispatch row"))
}

/// The kernels one weight runs with, resolved for an ISA level and layout.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// Always present (scalar where the level has none).
    pub dot: DotFn,
    pub dot4: Option<Dot4Fn>,
    pub tile: Option<TileFn>,
    /// Packed weights with a sixteen-row kernel: it runs every batch size.
    pub rows16: Option<Rows16Fn>,
    /// `rows16` takes the whole batch in one call (see
    /// [`super::IsaKernels::rows16_whole_batch`]).
    pub rows16_whole_batch: bool,
    pub gemm: Option<Gemm>,
}

/// The kernels for a `dtype` weight at `isa` (supported by this CPU), in the
/// packed layout if `packed`. A packed weight always gets a four-row kernel:
/// the scalar one that unpacks rows where the level has none.
pub fn kernels(dtype: DType, isa: Isa, packed: bool) -> Kernels {
    let row = row(dtype);
    let layout = crate::packed::layout(dtype);
    // A level whose packed kernels read another layout than the weights are
    // in has none for them: the scalar ones (which unpack rows) run.
    let k = if packed && crate::packed::level_layout(dtype, isa) != layout { &super::NONE } else { row.at(isa) };
    let dot = pick(row.at(isa).dot).unwrap_or(row.scalar);
    let gemm = pick(row.at(isa).gemm);
    if packed && matches!(layout, Packing::Lanes16 { .. }) {
        // Only sixteen-row kernels read this layout (the scalar one unpacks
        // rows); they equal the scalar reference bit for bit, as the exact
        // GEMMs (the K-quants', the AVX2 32-value one) do, so those keep the
        // large batches unless the level's sixteen-row kernel is the faster
        // one there (`rows16_all_m`). The AVX-512 Q8_0 lane GEMM sums in
        // another order: beside it the sixteen-row kernel takes every batch
        // size, so a row's result never depends on its batch.
        let fast16 = pick(k.packed_rows16);
        let rows16 = fast16.or(row.scalar_packed_rows16);
        let gemm = gemm.filter(|g| g.exact && !(fast16.is_some() && k.rows16_all_m));
        let rows16_whole_batch = fast16.is_some() && k.rows16_whole_batch;
        return Kernels { dot, dot4: None, tile: None, rows16, rows16_whole_batch, gemm };
    }
    if packed {
        let dot4 = pick(k.packed_dot4).or(row.scalar_packed_dot4);
        let rows16 = if rows16_enabled() { pick(k.packed_rows16) } else { None };
        let rows16_whole_batch = rows16.is_some() && k.rows16_whole_batch;
        // The sixteen-row kernels of the Q8_0/Q8_1 types take every batch
        // size (their own summation order): no GEMM beside them. A Q8_K
        // type's row kernel equals the scalar reference, as its (exact) GEMM
        // does, so the GEMM keeps the large batches unless `rows16_all_m`.
        let gemm = gemm.filter(|g| rows16.is_none() || (g.exact && !k.rows16_all_m));
        Kernels { dot, dot4, tile: pick(k.packed_tile), rows16, rows16_whole_batch, gemm }
    } else {
        // A file-layout row kernel runs the batches below the GEMM's.
        let rows = if rows16_enabled() { pick(k.rows) } else { None };
        Kernels { dot, dot4: pick(k.dot4), tile: pick(k.tile), rows16: rows, rows16_whole_batch: false, gemm }
    }
}

/// `SHARDLM_ROWS16=0` turns the sixteen-row kernels off (the four-row kernels
/// and tiles run packed weights again), for A/B measurements.
fn rows16_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SHARDLM_ROWS16").map_or(true, |v| v != "0"))
}

/// The activation quantizer for `vdt` at `isa`. All levels produce
/// bit-identical output; `VecDotType::F32` copies the floats.
pub fn quantize_act(vdt: VecDotType, isa: Isa) -> QuantizeActFn {
    use crate::quant::{q8_0, q8_1, q8_k};
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        match vdt {
            VecDotType::Q8_0 => return avx2::quantize_act_q8_0,
            VecDotType::Q8_1 => return avx2::quantize_act_q8_1,
            VecDotType::Q8_K => return avx2::quantize_act_q8_k,
            VecDotType::F32 => {}
        }
    }
    let _ = isa;
    match vdt {
        VecDotType::F32 => |src, dst| dst.copy_from_slice(bytemuck::cast_slice(src)),
        VecDotType::Q8_0 => |src, dst| q8_0::quantize_activations(src, bytemuck::cast_slice_mut(dst)),
        VecDotType::Q8_1 => |src, dst| q8_1::quantize(src, bytemuck::cast_slice_mut(dst)),
        VecDotType::Q8_K => |src, dst| q8_k::quantize(src, bytemuck::cast_slice_mut(dst)),
    }
}
