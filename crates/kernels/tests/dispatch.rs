//! The dispatch table (`shardlm_kernels::dispatch`) is complete: one row per
//! type, and every type has a fast kernel of each shape it is expected to have
//! at every ISA level this CPU has. A missing kernel fails here instead of
//! running scalar quietly; the gaps we know of are listed in [`KNOWN_GAPS`],
//! and a listed gap that got filled fails too, so the list stays true.

use shardlm_kernels::dispatch::{self, pick, TABLE};
use shardlm_kernels::isa::{self, Isa};
use shardlm_kernels::DType;

/// Kernel shapes a type is expected to have at an x86 level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One row × one activation row.
    Dot,
    /// Decode: four rows at once, file or packed layout.
    Decode4,
    /// Small batches (`1 < m <` the GEMM threshold): a 4 × 2 tile.
    Tile,
    /// Prefill: the lane GEMM or the sixteen-row kernel (AVX-512); at AVX2 the
    /// tile is the prefill kernel.
    Prefill,
}

/// `(type, level, shape, why)` for every kernel we know is missing.
const KNOWN_GAPS: &[(DType, Isa, Shape, &str)] = &[
    (DType::Q8_0, Isa::Avx2, Shape::Tile, "no AVX2 Q8_0 tile"),
    (DType::MXFP4, Isa::Avx2, Shape::Decode4, "AVX2 decode runs the one-row kernel"),
    (DType::NVFP4, Isa::Avx2, Shape::Decode4, "AVX2 decode runs the one-row kernel"),
    (DType::NVFP4, Isa::Avx512, Shape::Prefill, "lane GEMM not yet for NVFP4 (tiles)"),
    (DType::FP8, Isa::Avx2, Shape::Decode4, "AVX2 decode runs the one-row kernel"),
    (DType::FP8, Isa::Avx512, Shape::Prefill, "f32 activations: tiles, no lane GEMM"),
    (DType::IQ2_XXS, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ2_XXS, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ2_XXS, Isa::Avx512, Shape::Decode4, "four-row kernel only with VBMI, BITALG and GFNI"),
    (DType::IQ2_XXS, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ2_XS, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ2_XS, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ2_XS, Isa::Avx512, Shape::Decode4, "four-row kernel only with VBMI, BITALG and GFNI"),
    (DType::IQ2_XS, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ2_S, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ2_S, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ2_S, Isa::Avx512, Shape::Decode4, "four-row kernel only with VBMI, BITALG and GFNI"),
    (DType::IQ2_S, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ3_XXS, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ3_XXS, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ3_XXS, Isa::Avx512, Shape::Decode4, "four-row kernel only with VBMI, BITALG and GFNI"),
    (DType::IQ3_XXS, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ3_S, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ3_S, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ3_S, Isa::Avx512, Shape::Decode4, "four-row kernel only with VBMI, BITALG and GFNI"),
    (DType::IQ3_S, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ1_S, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ1_S, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ1_S, Isa::Avx512, Shape::Decode4, "one-row kernel only"),
    (DType::IQ1_S, Isa::Avx512, Shape::Tile, "one-row kernel only"),
    (DType::IQ1_M, Isa::Avx2, Shape::Decode4, "one-row kernel only"),
    (DType::IQ1_M, Isa::Avx2, Shape::Tile, "one-row kernel only"),
    (DType::IQ1_M, Isa::Avx512, Shape::Decode4, "one-row kernel only"),
    (DType::IQ1_M, Isa::Avx512, Shape::Tile, "one-row kernel only"),
];

/// The shapes `dtype` must have at an x86 level: float weights a dot only,
/// block types every shape.
fn expected(dtype: DType) -> &'static [Shape] {
    if dtype.is_quantized() {
        &[Shape::Dot, Shape::Decode4, Shape::Tile, Shape::Prefill]
    } else {
        &[Shape::Dot]
    }
}

/// Whether a slot lists a kernel that needs nothing beyond its level.
fn base<T>(listed: &[(dispatch::Feature, T)]) -> bool {
    listed.iter().any(|(f, _)| *f == dispatch::Feature::Base)
}

fn has(dtype: DType, isa: Isa, shape: Shape) -> bool {
    let k = dispatch::row(dtype).at(isa);
    // The sixteen-row kernel runs every batch size of a packed weight; one
    // that needs a feature beyond the level (an AVX-VNNI one at AVX2) does not
    // fill a gap of the level, so the gaps are the same on every CPU.
    let rows16 = base(k.packed_rows16);
    let tile = pick(k.tile).is_some() || pick(k.packed_tile).is_some() || rows16;
    match shape {
        Shape::Dot => pick(k.dot).is_some(),
        // The same for a four-row kernel (IQ3_S's at AVX-512 needs VBMI and BITALG).
        Shape::Decode4 => base(k.dot4) || base(k.packed_dot4) || rows16,
        Shape::Tile => tile,
        Shape::Prefill if isa == Isa::Avx512 => pick(k.gemm).is_some() || rows16,
        Shape::Prefill => pick(k.gemm).is_some() || tile,
    }
}

#[test]
fn one_row_per_type() {
    for dtype in DType::ALL {
        let n = TABLE.iter().filter(|r| r.dtype == dtype).count();
        assert_eq!(n, 1, "{dtype} has {n} dispatch rows");
    }
    assert_eq!(TABLE.len(), DType::ALL.len(), "a row for a type DType::ALL lacks");
}

#[test]
fn every_type_has_its_fast_kernels() {
    let mut missing = Vec::new();
    let mut stale = Vec::new();
    for isa in isa::available().into_iter().filter(|&i| matches!(i, Isa::Avx2 | Isa::Avx512)) {
        for dtype in DType::ALL {
            for &shape in expected(dtype) {
                let known = KNOWN_GAPS.iter().any(|&(d, i, s, _)| (d, i, s) == (dtype, isa, shape));
                match (has(dtype, isa, shape), known) {
                    (false, false) => missing.push(format!("{dtype} {shape:?} at {isa}")),
                    (true, true) => stale.push(format!("{dtype} {shape:?} at {isa}")),
                    _ => {}
                }
            }
        }
    }
    assert!(missing.is_empty(), "no fast kernel (add one, or list the gap): {missing:?}");
    assert!(stale.is_empty(), "listed as a gap but now has a kernel (drop it from KNOWN_GAPS): {stale:?}");
}

/// A packed weight always gets a four-row kernel, or a sixteen-row one in the
/// transposed layout (the scalar ones unpack rows), and packing is only
/// chosen where a fast packed kernel exists.
#[test]
fn packed_types_resolve() {
    use dispatch::Packing;
    for dtype in DType::ALL {
        let row = dispatch::row(dtype);
        // Every layout some level packs in (a level may read its own).
        let layouts: Vec<Packing> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .map(|i| shardlm_kernels::packed::level_layout(dtype, i))
            .collect();
        let any_lanes16 = layouts.iter().any(|l| matches!(l, Packing::Lanes16 { .. }));
        let any_rows = layouts.iter().any(|l| !matches!(l, Packing::Lanes16 { .. } | Packing::None));
        assert_eq!(any_rows, row.scalar_packed_dot4.is_some(), "{dtype}: packing and its scalar kernel");
        assert_eq!(any_lanes16, row.scalar_packed_rows16.is_some(), "{dtype}: lanes16 and its scalar kernel");
        // This process's layout (the requested level's).
        let layout = shardlm_kernels::packed::layout(dtype);
        let lanes16 = matches!(layout, Packing::Lanes16 { .. });
        let packs = layout != Packing::None;
        for isa in isa::available() {
            let k = dispatch::kernels(dtype, isa, true);
            if lanes16 {
                assert!(k.rows16.is_some() && k.dot4.is_none(), "{dtype} packed at {isa}");
            } else if packs {
                assert!(k.dot4.is_some(), "{dtype} packed at {isa}");
            } else {
                assert!(!shardlm_kernels::packed::worth_packing(dtype, isa), "{dtype} packs at {isa} without a layout");
            }
        }
    }
}
