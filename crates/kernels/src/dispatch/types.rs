//! The dispatch table's types: a row per weight type ([`Row`]), the kernels
//! it lists per ISA level ([`IsaKernels`]), packed layouts ([`Packing`]) and
//! prefill GEMMs ([`Gemm`]). The table itself is [`super::TABLE`].

use super::Choice;
use crate::isa::Isa;
use crate::matmul::MatRef;
use crate::quant::{Dot4Fn, DotFn, Rows16Fn, TileFn, VecDotType};
use crate::{DType, ThreadPool};

/// The prefill GEMM: `ys[k] = x · ws[k]ᵀ` for all `m` rows at once, `a` the
/// `m` quantized activation rows (`a_stride` bytes apart), `lanes` a reusable
/// buffer for the activations in the lane layout.
///
/// # Safety
/// The CPU has the kernel's ISA; shapes as `matmul` checks them; every weight
/// in `ws` picked this same GEMM.
pub type GemmFn = unsafe fn(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    a: &[u8],
    a_stride: usize,
    m: usize,
    ys: &mut [&mut [f32]],
    lanes: &mut Vec<u8>,
);

/// A prefill GEMM and the smallest batch it takes (below it the tiles keep
/// batches bit-identical to single-row decode).
#[derive(Clone, Copy)]
pub struct Gemm {
    /// Weights may share one GEMM call only if their GEMMs have the same name.
    pub name: &'static str,
    pub run: GemmFn,
    pub min_m: usize,
    /// Equals the scalar reference bit for bit, as the sixteen-row kernels
    /// do: it may then take a packed weight's large batches beside them, and
    /// a row's result still never depends on its batch.
    pub exact: bool,
}

/// One type's kernels at one ISA level (empty slots: no kernel of that shape).
#[derive(Clone, Copy)]
pub struct IsaKernels {
    pub dot: Choice<DotFn>,
    pub dot4: Choice<Dot4Fn>,
    pub tile: Choice<TileFn>,
    pub packed_dot4: Choice<Dot4Fn>,
    pub packed_tile: Choice<TileFn>,
    /// Packed only: a kernel over a whole row range (sixteen rows in the
    /// lanes, or IQ3_S's four-row groups), every batch size below the GEMM's;
    /// it replaces `packed_dot4` and `packed_tile`, and the GEMM as well for
    /// the Q8_0/Q8_1 types (their own summation order).
    pub packed_rows16: Choice<Rows16Fn>,
    /// The sixteen-row kernel runs packed weights' large batches too (it
    /// measured faster than the GEMM reading the packed rows back); the GEMM
    /// then serves only the file layout.
    pub rows16_all_m: bool,
    /// The sixteen-row kernel decodes its weights once a call (above some
    /// batch) and wants the whole batch in that call, not tiles of
    /// [`crate::matmul::ACT_TILE`] activation rows, each of which would decode
    /// the weights again (IQ4_XS at AVX-512; Q4_1, Q5_0, Q5_1, IQ4_NL and
    /// AVX2's IQ4_XS, whose decoded-once groups ran 3–8% faster at m = 256).
    pub rows16_whole_batch: bool,
    /// File layout: a kernel over a whole row range ([`Rows16Fn`]'s shape,
    /// four-row groups) for every batch below the GEMM's; it prepares the
    /// activations once a call where the four-row kernel did it once per
    /// four rows, and equals that kernel bit for bit.
    pub rows: Choice<Rows16Fn>,
    pub gemm: Choice<Gemm>,
    /// The packed layout this level's packed kernels read where it is not
    /// the row's own (Q3_K at AVX2: code planes instead of sixteen rows in
    /// the lanes); see [`crate::packed::layout`].
    pub packing: Option<Packing>,
}

/// No kernels (the scalar level, or a level a type has nothing for).
pub const NONE: IsaKernels = IsaKernels {
    dot: &[],
    dot4: &[],
    tile: &[],
    packed_dot4: &[],
    packed_tile: &[],
    packed_rows16: &[],
    rows16_all_m: false,
    rows16_whole_batch: false,
    rows: &[],
    gemm: &[],
    packing: None,
};

/// The interleaved four-row layout a type uses (see [`crate::packed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Stays in the file layout.
    None,
    /// Per block pair, the four rows' headers (`head` bytes per block), then
    /// their quants.
    HeadQuants { head: usize },
    /// Whole blocks, interleaved by units of `blocks` blocks.
    Units { blocks: usize },
    /// Sixteen rows transposed per super-block, lane = row
    /// ([`crate::packed::lanes16`]); read only by sixteen-row kernels.
    /// `head_last`: bytes at the start of each block (its scale) stored
    /// after the rest, so that codes behind a 2-byte scale (IQ4_NL) start on
    /// a word; 0 for the K-quants, whose fields are word-aligned already.
    /// `sliced_qh`: the word that then comes first is a Q5 `qh`, stored
    /// bit-sliced ([`crate::packed::lanes16::slice_qh`]). `split_head`: the
    /// last word's halves (Q4_1's `d` and `m`) stored as sixteen `d`, then
    /// sixteen `m` ([`crate::packed::lanes16::Form`]).
    Lanes16 { head_last: usize, sliced_qh: bool, split_head: bool },
    /// Each block recoded in place (same size, rows where they were) for a
    /// kernel that reads its fields in another order ([`crate::packed::Recoding`]).
    Recoded(crate::packed::Recoding),
}

/// One weight type: everything dispatch needs.
#[derive(Clone, Copy)]
pub struct Row {
    pub dtype: DType,
    /// What its activations are quantized to.
    pub act: VecDotType,
    pub packing: Packing,
    /// The scalar reference dot.
    pub scalar: DotFn,
    /// The scalar packed four-row dot (unpacks each row), for packed types.
    pub scalar_packed_dot4: Option<Dot4Fn>,
    /// The scalar sixteen-row kernel (unpacks each row), for lanes16 types.
    pub scalar_packed_rows16: Option<Rows16Fn>,
    pub avx2: IsaKernels,
    pub avx512: IsaKernels,
}

impl Row {
    /// The kernels listed for `isa` (x86 levels; scalar and NEON list none).
    pub fn at(&self, isa: Isa) -> &IsaKernels {
        match isa {
            Isa::Avx2 => &self.avx2,
            Isa::Avx512 => &self.avx512,
            Isa::Scalar | Isa::Neon => &NONE,
        }
    }
}
