//! The row kernels' driver: every four-row group of a row range against `m`
//! activation rows, with the activations prepared once a call.
//!
//! Why: the register-lookup four-row kernels (IQ3_S, IQ3_XXS, the IQ2 types)
//! put each Q8_K block's activations in their grid's or sign order once per
//! block *and four rows*; over a decode matmul that repeats the same work
//! `rows / 4` times, a tenth of IQ3_S's kernel. Here each type supplies how
//! one block is prepared (`prepare`, a few 64-byte vectors) and its four-row
//! step over prepared blocks (`group`, not inlined so that its registers are
//! allocated as the four-row kernel's are); the loops are this file's.
//! Each output equals the type's four-row kernel bit for bit, so the row
//! kernel may stand beside it at any batch size.

/// One Q8_K block (its 256 codes at the pointer) into what `group` reads.
pub(super) type PrepareFn<P> = unsafe fn(qs: *const u8) -> P;

/// Four rows `stride` bytes apart at `w` against one activation row: `n`
/// values, the Q8_K row at `a` (for its scales), its prepared blocks at
/// `pre`; writes the four dots to `out`.
pub(super) type GroupFn<P> =
    unsafe fn(n: usize, w: *const u8, stride: usize, a: *const u8, pre: *const P, out: *mut f32);

/// A [`crate::quant::Rows16Fn`] over four-row groups (`rows` a multiple of
/// four): prepares the `m` activation rows' blocks, then runs `group` for
/// each group and each activation row in turn, so a group's weights stay in
/// L1 while the activation rows pass.
///
/// # Safety
/// As for [`crate::quant::Rows16Fn`]; `prepare` and `group` must be
/// runnable on this CPU.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn run<P: Copy>(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
    prepare: PrepareFn<P>,
    group: GroupFn<P>,
) {
    let nb = n / 256;
    let mut pre: Vec<P> = Vec::with_capacity(m * nb);
    for j in 0..m {
        for i in 0..nb {
            pre.push(prepare(super::avx2_lowk::q8k(a.add(j * a_stride), i).qs.as_ptr() as *const u8));
        }
    }
    for g in (0..rows).step_by(4) {
        for j in 0..m {
            let (aj, pj) = (a.add(j * a_stride), pre.as_ptr().add(j * nb));
            group(n, w.add(g * row_bytes), row_bytes, aj, pj, y.add(j * y_stride + g));
        }
    }
}

/// A public [`crate::quant::Rows16Fn`] entry point that runs [`run`] with a
/// type's `prepare` and `group` under the register-lookup kernels' target
/// features (AVX-512 F/BW/VL/VNNI, VBMI, BITALG, GFNI). Each row kernel is
/// this one call; the macro keeps the nine-parameter signature in one place.
macro_rules! row_kernel {
    ($(#[$doc:meta])* $name:ident, $prepare:expr, $group:expr) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
        pub unsafe fn $name(
            n: usize,
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            a: *const u8,
            a_stride: usize,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            super::prepared_rows::run(n, w, row_bytes, rows, a, a_stride, m, y, y_stride, $prepare, $group)
        }
    };
}
pub(super) use row_kernel;
