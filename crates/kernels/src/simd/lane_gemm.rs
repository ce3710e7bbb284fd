//! The driver the lane GEMMs share ([`super::avx512_gemm`],
//! [`super::avx512_gemm_k`], [`super::avx2_gemm_k`], [`super::avx2_gemm_32`]):
//! the activations laid out once per call, group by group, then units of
//! weight rows handed to the threads one at a time (an atomic counter over
//! every weight of the call, so a short weight's tail does not idle a core).

use crate::matmul::{MatRef, SyncPtr};
use crate::ThreadPool;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The shape of one GEMM call's work.
pub(super) struct Split {
    /// Activation groups (the lanes' rows) and each group's bytes.
    pub groups: usize,
    pub group_bytes: usize,
    /// Weight rows per unit of work.
    pub unit_rows: usize,
}

/// Fills `act` with `split.groups` groups (`fill(g, dst)`, the groups shared
/// among the threads), then calls `unit(w, r0, r1, act, y)` for every
/// `split.unit_rows` rows `r0..r1` of every weight `w = ws[k]`, `y` the start
/// of `ys[k]`; `unit` writes only rows `r0..r1` of its `y`.
pub(super) fn drive(
    pool: &ThreadPool,
    ws: &[MatRef<'_>],
    ys: &mut [&mut [f32]],
    act: &mut Vec<u8>,
    split: Split,
    fill: impl Fn(usize, &mut [u8]) + Sync,
    unit: impl Fn(&MatRef<'_>, usize, usize, &[u8], *mut f32) + Sync,
) {
    let Split { groups, group_bytes, unit_rows } = split;
    act.clear();
    act.resize(groups * group_bytes, 0);
    let base = SyncPtr(act.as_mut_ptr());
    pool.run(|t, nt| {
        for g in (t..groups).step_by(nt) {
            // SAFETY: group g's bytes belong to this thread only.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.get().add(g * group_bytes), group_bytes) };
            fill(g, dst);
        }
    });
    let act: &[u8] = act;
    let units: Vec<usize> = ws.iter().map(|w| w.rows.div_ceil(unit_rows)).collect();
    let total: usize = units.iter().sum();
    let outs: Vec<SyncPtr<f32>> = ys.iter_mut().map(|y| SyncPtr(y.as_mut_ptr())).collect();
    let next = AtomicUsize::new(0);
    pool.run(|_, _| loop {
        let mut u = next.fetch_add(1, Ordering::Relaxed);
        if u >= total {
            break;
        }
        let mut k = 0;
        while u >= units[k] {
            u -= units[k];
            k += 1;
        }
        let w = &ws[k];
        let (r0, r1) = (u * unit_rows, ((u + 1) * unit_rows).min(w.rows));
        // Each unit is taken once, so its rows of `ys[k]` have one writer.
        unit(w, r0, r1, act, outs[k].get());
    });
}

/// Writes lane `i < lanes` of the 8-lane `v` to `y[i · ys]` (the AVX2
/// GEMMs' output: lane = activation row, `ys` a row of `y` apart).
///
/// # Safety
/// AVX2 CPU; `y[i · ys]` writable for `i < lanes ≤ 8`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn store_lanes8(v: __m256, lanes: usize, y: *mut f32, ys: usize) {
    let mut t = [0f32; 8];
    _mm256_storeu_ps(t.as_mut_ptr(), v);
    for (i, &x) in t.iter().enumerate().take(lanes) {
        *y.add(i * ys) = x;
    }
}

/// The AVX2 GEMMs' walk over one unit: for every group of 8 activation rows
/// (`group_bytes` of `act` each), the unit's `n` weight rows four at a time
/// (`four(k, ag)`: rows `k..k + 4` against the group at `ag`), the rest one
/// at a time (`one(k, ag)`), each tile's lanes stored to `y` (rows `r0 +
/// k..` of a `rows`-row output, `m` activation rows).
///
/// # Safety
/// AVX2 CPU; `act` holds `⌈m / 8⌉` groups; `y` as [`store_lanes8`] needs
/// for every row and activation row written.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn tiles8(
    m: usize,
    n: usize,
    rows: usize,
    r0: usize,
    act: &[u8],
    group_bytes: usize,
    y: *mut f32,
    four: impl Fn(usize, *const u8) -> [__m256; 4],
    one: impl Fn(usize, *const u8) -> [__m256; 1],
) {
    for g in 0..m.div_ceil(8) {
        let lanes = (m - g * 8).min(8);
        let ag = act.as_ptr().add(g * group_bytes);
        let yg = y.add(g * 8 * rows);
        let mut k = 0;
        while k + 4 <= n {
            for (j, v) in four(k, ag).into_iter().enumerate() {
                store_lanes8(v, lanes, yg.add(r0 + k + j), rows);
            }
            k += 4;
        }
        while k < n {
            store_lanes8(one(k, ag)[0], lanes, yg.add(r0 + k), rows);
            k += 1;
        }
    }
}
