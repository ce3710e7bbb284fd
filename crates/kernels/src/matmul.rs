//! `y = x · Wᵀ` over a weight in any [`DType`].
//!
//! Numeric choice (same as llama.cpp): for quantized weights the activations are
//! quantized once per call to the weight's vec-dot type (Q8_0 for Q4_0/Q5_0/Q8_0,
//! Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants) and dot products run on integers.
//! Float weights (F32/F16/BF16) are widened to f32 and multiplied in f32.
//!
//! Work split: output rows are cut into units of [`ROW_GRAIN`] rows that the pool
//! threads take in runs from a shared counter ([`next_grab`]); one pool run can cover several weights ([`matmul_many`],
//! [`matmul_each`]). For `m > 1` each thread walks its rows in
//! chunks of about [`W_CHUNK_BYTES`] and, for each chunk, every activation row
//! of a tile of [`ACT_TILE`] rows, so a weight row is read from memory once per
//! activation tile and then served from cache.

use crate::dispatch::Kernels;
use crate::isa::{self, Isa};
use crate::quant::{self, VecDotType};
use crate::{DType, KernelError, ThreadPool};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Output rows per unit of work split between threads (keeps each thread's slice
/// of `y` on its own cache lines and suits multi-row kernels).
pub const ROW_GRAIN: usize = 16;
/// Activation rows per tile for `m > 1`.
pub const ACT_TILE: usize = 64;
/// Weight bytes per row chunk for `m > 1` (fits in L1/L2 while the tile runs).
pub const W_CHUNK_BYTES: usize = 24 * 1024;

/// A row-major weight matrix: `rows` output features, each a contiguous run of
/// `cols` input features stored as `dtype`. Shape in PyTorch order `[rows, cols]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// Rows are in the interleaved four-row layout of [`crate::packed`].
    pub packed: bool,
}

impl<'a> MatRef<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        let row = dtype.bytes_for(cols).ok_or(KernelError::BadRowLength {
            dtype,
            elems: cols,
            block: dtype.block_elems(),
        })?;
        let expected = row * rows;
        if data.len() != expected {
            return Err(KernelError::BadDataLength { expected, actual: data.len() });
        }
        Ok(MatRef { dtype, rows, cols, data, packed: false })
    }

    /// A weight in the packed four-row layout ([`crate::packed::pack`] output).
    pub fn new_packed(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        if !crate::packed::packable(dtype, rows, cols) {
            return Err(KernelError::NotPackable { dtype, rows, cols });
        }
        Ok(MatRef { packed: true, ..MatRef::new(dtype, rows, cols, data)? })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_elems() * self.dtype.block_bytes()
    }

    /// The contiguous rows `start..end` (a tensor-parallel shard of output features).
    pub fn rows_range(&self, start: usize, end: usize) -> MatRef<'a> {
        assert!(start <= end && end <= self.rows, "rows_range {start}..{end} of {} rows", self.rows);
        let g = if self.packed { crate::packed::group_rows(self.dtype) } else { 1 };
        assert!(start.is_multiple_of(g) && end.is_multiple_of(g), "packed rows_range {start}..{end}");
        let rb = self.row_bytes();
        MatRef { rows: end - start, data: &self.data[start * rb..end * rb], ..*self }
    }

    /// Rows `r0..r1` in the file layout, row after row (unpacked into `buf`
    /// for a packed weight; a whole sixteen-row group of the transposed
    /// layout at a time where the range allows).
    pub fn rows_file<'b>(&self, r0: usize, r1: usize, buf: &'b mut Vec<u8>) -> &'b [u8]
    where
        'a: 'b,
    {
        let rb = self.row_bytes();
        if !self.packed {
            return &self.data[r0 * rb..r1 * rb];
        }
        buf.resize((r1 - r0) * rb, 0);
        let g = crate::packed::group_rows(self.dtype);
        let mut r = r0;
        let mut row = Vec::new();
        while r < r1 {
            let out = &mut buf[(r - r0) * rb..];
            if crate::packed::is_lanes16(self.dtype) && r.is_multiple_of(g) && r + g <= r1 {
                crate::packed::unpack_group(self.dtype, self.cols, &self.data[r * rb..(r + g) * rb], out);
                r += g;
                continue;
            }
            out[..rb].copy_from_slice(self.row(r, &mut row));
            r += 1;
        }
        buf
    }

    /// Bytes of row `r` in the file layout (unpacked into `buf` for a packed weight).
    pub fn row<'b>(&self, r: usize, buf: &'b mut Vec<u8>) -> &'b [u8]
    where
        'a: 'b,
    {
        let rb = self.row_bytes();
        if !self.packed {
            return &self.data[r * rb..(r + 1) * rb];
        }
        let g = crate::packed::group_rows(self.dtype);
        buf.resize(rb, 0);
        crate::packed::unpack_row(self.dtype, self.cols, &self.data[r / g * g * rb..], r % g, buf);
        buf
    }
}

/// Buffers reused across calls (quantized activations) so the hot loop does not
/// allocate. One per thread of control that calls [`matmul`].
#[derive(Default)]
pub struct MatmulScratch {
    /// Quantized activations; u64 storage keeps it 8-aligned (Q8_K needs 4).
    act: Vec<u64>,
    /// The activations in the lane layout of the MXFP4 prefill GEMM.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    lanes: Vec<u8>,
}

impl MatmulScratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Zeroed-on-growth buffer of at least `len` bytes.
    fn bytes(&mut self, len: usize) -> &mut [u8] {
        grow_bytes(&mut self.act, len)
    }
}

/// `v` grown (zeroed) to at least `len` bytes, as bytes.
fn grow_bytes(v: &mut Vec<u64>, len: usize) -> &mut [u8] {
    let words = len.div_ceil(8);
    if v.len() < words {
        v.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut(v)[..len]
}

/// A raw pointer shared with pool workers; users guarantee disjoint writes.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    #[inline(always)]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Row range of thread `t` of `nt` over `rows` rows, in units of `grain`.
#[inline]
pub(crate) fn split_range(rows: usize, t: usize, nt: usize, grain: usize) -> (usize, usize) {
    let units = rows.div_ceil(grain);
    let a = (units * t / nt * grain).min(rows);
    let b = (units * (t + 1) / nt * grain).min(rows);
    (a, b)
}

fn check_shapes(w: &MatRef<'_>, x: &[f32], m: usize, y: &[f32]) {
    assert!(
        w.cols.is_multiple_of(w.dtype.block_elems()),
        "{} cols is not a whole number of {} blocks",
        w.cols,
        w.dtype
    );
    assert!(w.data.len() >= w.rows * w.row_bytes(), "weight data too short");
    assert_eq!(x.len(), m * w.cols, "x must be m × cols");
    assert_eq!(y.len(), m * w.rows, "y must be m × rows");
}

/// `y[i, r] = Σ_k x[i, k] · W[r, k]` for `i < m`, `r < w.rows`.
///
/// * `x`: `m × w.cols`, row-major f32.
/// * `y`: `m × w.rows`, row-major f32 (overwritten).
///
/// Work is split across `pool` by output rows (and, for large `m`, by tiles).
pub fn matmul(pool: &ThreadPool, w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32], scratch: &mut MatmulScratch) {
    matmul_isa(isa::active(), pool, w, x, m, y, scratch)
}

/// [`matmul`] with an explicit ISA level (lowered to what the CPU supports), so
/// tests and benchmarks can compare levels in one process.
pub fn matmul_isa(
    isa: Isa,
    pool: &ThreadPool,
    w: MatRef<'_>,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    matmul_many_isa(isa, pool, &[w], x, m, &mut [y], scratch)
}

/// Several weights applied to the same input (`ys[k] = x · ws[k]ᵀ`), e.g. the
/// q/k/v or gate/up projections: the activations are quantized once and all
/// output rows are split across the pool in one `run`, which saves a pool
/// round-trip per extra weight at batch 1. Every weight must have `x`'s column
/// count; weights of different activation types are handled one after another.
pub fn matmul_many(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    matmul_many_isa(isa::active(), pool, ws, x, m, ys, scratch)
}

/// Most weights one pool run covers (more are done in groups of this many).
/// MoE decode puts every chosen expert's gate and up projection in one run:
/// `2·top_k` weights plus the shared expert's two and its gate.
const MANY_MAX: usize = 32;

/// [`matmul_many`] with an explicit ISA level.
pub fn matmul_many_isa(
    isa: Isa,
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(ws.len(), ys.len(), "one output per weight");
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_shapes(w, x, m, y);
    }
    if m == 0 || ws.is_empty() {
        return;
    }
    let vdt = VecDotType::of(ws[0].dtype);
    if ws.iter().any(|w| VecDotType::of(w.dtype) != vdt) {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul_many_isa(isa, pool, std::slice::from_ref(w), x, m, &mut [&mut **y], scratch);
        }
        return;
    }
    let isa = isa::clamp(isa);
    let cols = ws[0].cols;
    let a: &[u8] = if vdt == VecDotType::F32 {
        bytemuck::cast_slice(x)
    } else {
        let buf = grow_bytes(&mut scratch.act, m * vdt.row_bytes(cols));
        quantize_rows(isa, pool, vdt, x, cols, m, buf);
        buf
    };
    let a_stride = a.len() / m;
    if let Some(g) = shared_gemm(isa, ws, m) {
        // SAFETY: the table lists this GEMM for every weight at `isa` (clamped
        // to the CPU); shapes checked above.
        unsafe { (g.run)(pool, ws, a, a_stride, m, ys, &mut scratch.lanes) };
        return;
    }
    let own_gemm = |w: &MatRef<'_>| crate::dispatch::kernels(w.dtype, isa, w.packed).gemm.filter(|g| m >= g.min_m);
    if ws.iter().any(|w| own_gemm(w).is_some()) {
        // Mixed: some weights take a GEMM at this batch and others do not (a
        // packed weight with a sixteen-row kernel next to a file-layout one of
        // its type). Each runs what it runs alone, so its result does not
        // depend on the call it is in.
        let (mut rest_w, mut rest_y) = (Vec::new(), Vec::new());
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            match own_gemm(w) {
                // SAFETY: as above, for this one weight.
                Some(g) => unsafe {
                    (g.run)(pool, std::slice::from_ref(w), a, a_stride, m, &mut [&mut **y], &mut scratch.lanes)
                },
                None => {
                    rest_w.push(*w);
                    rest_y.push(&mut **y);
                }
            }
        }
        run_parts(pool, rest_w.iter().zip(rest_y).map(|(w, y)| Part::new(isa, *w, a, a_stride, y)), m);
        return;
    }
    run_parts(pool, ws.iter().zip(ys.iter_mut()).map(|(w, y)| Part::new(isa, *w, a, a_stride, y)), m);
}

/// The prefill GEMM all of `ws` share at `isa` for a batch of `m`, if any:
/// each one's table entry names it and takes this batch (the grid I-quants
/// take the AVX2 GEMM from fewer rows than the K-quants).
fn shared_gemm(isa: Isa, ws: &[MatRef<'_>], m: usize) -> Option<crate::dispatch::Gemm> {
    let g = crate::dispatch::kernels(ws[0].dtype, isa, ws[0].packed).gemm?;
    let takes = |w: &MatRef<'_>| {
        crate::dispatch::kernels(w.dtype, isa, w.packed).gemm.is_some_and(|h| h.name == g.name && m >= h.min_m)
    };
    ws.iter().all(takes).then_some(g)
}

/// Each weight applied to its own input, `ys[k] = xs[k] · ws[k]ᵀ` (`xs[k]`:
/// `m × ws[k].cols`, `ys[k]`: `m × ws[k].rows`), all output rows split across
/// the pool in one `run`. MoE decode uses it for the chosen experts' down
/// projections, each reading its own expert's activations: one pool run
/// instead of one per expert. Each input is quantized once, to its weight's
/// vec-dot type, exactly as [`matmul`] would, so `ys[k]` equals
/// `matmul(ws[k], xs[k])` bit for bit.
pub fn matmul_each(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    xs: &[&[f32]],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    matmul_each_isa(isa::active(), pool, ws, xs, m, ys, scratch)
}

/// [`matmul_each`] with an explicit ISA level.
pub fn matmul_each_isa(
    isa: Isa,
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    xs: &[&[f32]],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut MatmulScratch,
) {
    assert_eq!(ws.len(), xs.len(), "one input per weight");
    assert_eq!(ws.len(), ys.len(), "one output per weight");
    for ((w, x), y) in ws.iter().zip(xs).zip(ys.iter()) {
        check_shapes(w, x, m, y);
    }
    if m == 0 || ws.is_empty() {
        return;
    }
    let isa = isa::clamp(isa);
    // Bytes of weight k's quantized input in the scratch buffer (none for
    // float weights, which read `xs[k]` itself), rounded up to 8 so every
    // region starts aligned (Q8_K needs 4).
    let region = |w: &MatRef<'_>| match VecDotType::of(w.dtype) {
        VecDotType::F32 => 0,
        vdt => (m * vdt.row_bytes(w.cols)).next_multiple_of(8),
    };
    let buf = scratch.bytes(ws.iter().map(region).sum());
    let mut off = 0;
    for (w, x) in ws.iter().zip(xs) {
        let vdt = VecDotType::of(w.dtype);
        if vdt != VecDotType::F32 {
            quantize_rows(isa, pool, vdt, x, w.cols, m, &mut buf[off..off + m * vdt.row_bytes(w.cols)]);
        }
        off += region(w);
    }
    let buf: &[u8] = buf;
    let mut off = 0;
    let parts = ws.iter().zip(xs).zip(ys.iter_mut()).map(|((w, x), y)| {
        let a: &[u8] = match VecDotType::of(w.dtype) {
            VecDotType::F32 => bytemuck::cast_slice(x),
            vdt => &buf[off..off + m * vdt.row_bytes(w.cols)],
        };
        off += region(w);
        Part::new(isa, *w, a, a.len() / m, y)
    });
    run_parts(pool, parts, m);
}

/// Quantizes the `m` rows of `x` (`m × cols`) to `vdt` into `dst` (`m` rows of
/// `vdt.row_bytes(cols)`), rows split across the pool when there are several.
fn quantize_rows(isa: Isa, pool: &ThreadPool, vdt: VecDotType, x: &[f32], cols: usize, m: usize, dst: &mut [u8]) {
    let arb = vdt.row_bytes(cols);
    let q = quant::quantize_act_fn(vdt, isa);
    if m >= 4 && pool.n_threads() > 1 {
        let bp = SyncPtr(dst.as_mut_ptr());
        pool.run(|t, nt| {
            let (i0, i1) = split_range(m, t, nt, 1);
            for i in i0..i1 {
                // SAFETY: rows i0..i1 of the buffer belong to this thread only.
                let dst = unsafe { std::slice::from_raw_parts_mut(bp.get().add(i * arb), arb) };
                q(&x[i * cols..(i + 1) * cols], dst);
            }
        });
    } else {
        for i in 0..m {
            q(&x[i * cols..(i + 1) * cols], &mut dst[i * arb..(i + 1) * arb]);
        }
    }
}

/// One weight's share of a pool run: the weight, its kernels, its `m`
/// activation rows (`a_stride` bytes apart, in its vec-dot type) and its
/// `m × w.rows` outputs.
#[derive(Clone, Copy)]
struct Part<'a> {
    w: MatRef<'a>,
    kern: Kernels,
    a: &'a [u8],
    a_stride: usize,
    y: SyncPtr<f32>,
}

impl<'a> Part<'a> {
    fn new(isa: Isa, w: MatRef<'a>, a: &'a [u8], a_stride: usize, y: &mut [f32]) -> Part<'a> {
        let kern = crate::dispatch::kernels(w.dtype, isa, w.packed);
        Part { w, kern, a, a_stride, y: SyncPtr(y.as_mut_ptr()) }
    }
}

/// Runs `parts` in pool runs of up to [`MANY_MAX`] weights each.
fn run_parts<'a>(pool: &ThreadPool, parts: impl Iterator<Item = Part<'a>>, m: usize) {
    let mut group: [Option<Part<'a>>; MANY_MAX] = [None; MANY_MAX];
    let mut n = 0;
    for p in parts {
        group[n] = Some(p);
        n += 1;
        if n == MANY_MAX {
            run_group(pool, &group[..n], m);
            n = 0;
        }
    }
    if n > 0 {
        run_group(pool, &group[..n], m);
    }
}

/// Most units one decode (`m = 1`) grab takes: 128 rows, the grab a lone
/// 1024-row projection had, so a run over many weights (MoE decode: every
/// chosen expert's down projection) keeps that grain and its tail stays short.
const DECODE_GRAB_MAX: usize = 8;

/// The next run of units `u0..u1` (of [`ROW_GRAIN`] rows) a thread takes from
/// the shared counter `next`, or `None` when all `total` are taken: about a
/// quarter of a thread's share, at decode at most [`DECODE_GRAB_MAX`] units.
#[inline]
fn next_grab(next: &AtomicUsize, total: usize, n_threads: usize, m: usize) -> Option<(usize, usize)> {
    let even = (total / (n_threads * 4)).max(1);
    let grab = if m == 1 { even.min(DECODE_GRAB_MAX) } else { even };
    let u0 = next.fetch_add(grab, Ordering::Relaxed);
    (u0 < total).then(|| (u0, (u0 + grab).min(total)))
}

/// One pool run over every output row of `parts` (all `Some`).
fn run_group(pool: &ThreadPool, parts: &[Option<Part<'_>>], m: usize) {
    let mut units = [0usize; MANY_MAX];
    for (u, p) in units.iter_mut().zip(parts) {
        *u = p.as_ref().expect("filled part").w.rows.div_ceil(ROW_GRAIN);
    }
    let units = &units[..parts.len()];
    let total: usize = units.iter().sum();
    if total == 0 {
        return;
    }
    // Units are handed out dynamically, so a thread that starts late or runs
    // slow simply takes fewer.
    let next = AtomicUsize::new(0);
    let nt = pool.n_threads();
    pool.run(|_, _| {
        while let Some((u0, u1)) = next_grab(&next, total, nt, m) {
            let mut base = 0;
            for (p, &n) in parts.iter().zip(units) {
                let (lo, hi) = (u0.max(base), u1.min(base + n));
                if lo < hi {
                    let p = p.as_ref().expect("filled part");
                    let (r0, r1) = ((lo - base) * ROW_GRAIN, ((hi - base) * ROW_GRAIN).min(p.w.rows));
                    // SAFETY: units are handed out once, so only this thread writes
                    // y[i, r0..r1] of this part; shapes were checked, and the kernels
                    // match the CPU (clamped ISA).
                    unsafe { rows_kernel(p.kern, &p.w, r0, r1, p.a, p.a_stride, m, p.y.get()) };
                }
                base += n;
            }
        }
    });
}

/// Computes `y[i, r]` for `r in r0..r1`, all `i < m`.
///
/// A packed weight has a whole number of four-row groups and `r0`, `r1` are
/// multiples of 4 (units of [`ROW_GRAIN`], chunks of 4), so only the four-row
/// and tile kernels run on it.
///
/// # Safety
/// `y` must be valid for `m × w.rows` writes with no other writer of these rows;
/// `a` holds `m` activation rows of `a_stride` bytes for the kernels.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_kernel(
    k: Kernels,
    w: &MatRef<'_>,
    r0: usize,
    r1: usize,
    a: &[u8],
    a_stride: usize,
    m: usize,
    y: *mut f32,
) {
    let rb = w.row_bytes();
    let wp = w.data.as_ptr();
    let n = w.cols;
    // y[i, c0..c1] for one activation row at `ap`, output row at `yi`.
    let row_run = |ap: *const u8, yi: *mut f32, c0: usize, c1: usize| {
        let mut r = c0;
        if let Some(d4) = k.dot4 {
            while r + 4 <= c1 {
                d4(n, wp.add(r * rb), rb, ap, yi.add(r));
                r += 4;
            }
        }
        while r < c1 {
            *yi.add(r) = (k.dot)(n, wp.add(r * rb), ap);
            r += 1;
        }
    };
    if let Some(rows16) = k.rows16 {
        // The range's four-row groups by the row kernel (a packed range is
        // four-aligned; a file-layout one may end in one to three rows, which
        // the one-row kernel takes, as in `row_run`), a tile of activation
        // rows at a time so they stay in cache while the range's rows stream
        // past.
        let r4 = r0 + (r1 - r0) / 4 * 4;
        let tile = if k.rows16_whole_batch { m } else { ACT_TILE };
        let mut i0 = 0;
        while i0 < m {
            let i1 = (i0 + tile).min(m);
            let (ap, yp) = (a.as_ptr().add(i0 * a_stride), y.add(i0 * w.rows + r0));
            if r4 > r0 {
                rows16(n, wp.add(r0 * rb), rb, r4 - r0, ap, a_stride, i1 - i0, yp, w.rows);
            }
            for i in i0..i1 {
                for r in r4..r1 {
                    *y.add(i * w.rows + r) = (k.dot)(n, wp.add(r * rb), a.as_ptr().add(i * a_stride));
                }
            }
            i0 = i1;
        }
        return;
    }
    if m == 1 {
        row_run(a.as_ptr(), y, r0, r1);
        return;
    }
    let chunk = (W_CHUNK_BYTES / rb.max(1)).clamp(4, 256) / 4 * 4;
    let mut i0 = 0;
    while i0 < m {
        let i1 = (i0 + ACT_TILE).min(m);
        let mut c0 = r0;
        while c0 < r1 {
            let c1 = (c0 + chunk).min(r1);
            let mut i = i0;
            if let Some(tile) = k.tile {
                // Pairs of activation rows against groups of four weight rows.
                let c4 = c0 + (c1 - c0) / 4 * 4;
                while i + 2 <= i1 {
                    let ap = a.as_ptr().add(i * a_stride);
                    let yi = y.add(i * w.rows);
                    let mut r = c0;
                    while r < c4 {
                        tile(n, wp.add(r * rb), rb, ap, a_stride, yi.add(r), w.rows);
                        r += 4;
                    }
                    row_run(ap, yi, c4, c1);
                    row_run(ap.add(a_stride), yi.add(w.rows), c4, c1);
                    i += 2;
                }
            }
            for i in i..i1 {
                row_run(a.as_ptr().add(i * a_stride), y.add(i * w.rows), c0, c1);
            }
            c0 = c1;
        }
        i0 = i1;
    }
}

/// Single-threaded scalar reference with the same numerics as [`matmul`]
/// (including activation quantization). SIMD paths are tested against it.
pub fn matmul_reference(w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    check_shapes(&w, x, m, y);
    let cols = w.cols;
    let vdt = VecDotType::of(w.dtype);
    let arb = vdt.row_bytes(cols);
    let mut act = vec![0u64; (m * arb).div_ceil(8)];
    let act: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut act)[..m * arb];
    let q = quant::quantize_act_fn(vdt, Isa::Scalar);
    for i in 0..m {
        q(&x[i * cols..(i + 1) * cols], &mut act[i * arb..(i + 1) * arb]);
    }
    let dot = quant::scalar::dot_fn(w.dtype);
    let mut buf = Vec::new();
    for r in 0..w.rows {
        let row = w.row(r, &mut buf);
        for i in 0..m {
            // SAFETY: the row and activation slices hold exactly `cols` elements.
            y[i * w.rows + r] = unsafe { dot(cols, row.as_ptr(), act[i * arb..].as_ptr()) };
        }
    }
}

/// Exact reference: dequantize the weight and accumulate in f64, with no
/// activation quantization. Used to bound the error of the fast path.
pub fn matmul_f64_reference(w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    check_shapes(&w, x, m, y);
    let cols = w.cols;
    let mut wr = vec![0f32; cols];
    let mut buf = Vec::new();
    for r in 0..w.rows {
        quant::dequantize_row(w.dtype, w.row(r, &mut buf), &mut wr);
        for i in 0..m {
            let xi = &x[i * cols..(i + 1) * cols];
            let s: f64 = xi.iter().zip(&wr).map(|(&a, &b)| a as f64 * b as f64).sum();
            y[i * w.rows + r] = s as f32;
        }
    }
}
