//! The start-up check of the SIMD attention block steps against the scalar
//! ones (moved out of `attention.rs` to keep that file to the tiling).

use super::*;

/// Start-up check of the AVX2 block steps against the scalar ones (called by
/// [`crate::simd::selftest`] before AVX2 is handed out, so it must not consult
/// [`isa::active`]): two tiles (a decode tile of a GQA group of 3, and 2 tokens ×
/// 3 heads over a window) at head_dim 64 on fixed data, and the f16 store.
pub(crate) fn self_test_avx2(avx512: bool, unit: &mut dyn FnMut() -> f32) -> Result<(), String> {
    let (nkv, d, ctx) = (2, 64, 75);
    let kv: Vec<f32> = (0..2 * ctx * nkv * d).map(|_| unit()).collect();
    let mut h = vec![f16::ZERO; kv.len()];
    // SAFETY: only called for CPUs with AVX2+F16C; both hold `kv.len()` values.
    unsafe { avx2_attn::f32_to_f16(kv.as_ptr(), h.as_mut_ptr() as *mut u16, kv.len()) };
    if let Some(i) = (0..kv.len()).find(|&i| h[i] != f16::from_f32(kv[i])) {
        return Err(format!("f16 store of {} differs from half", kv[i]));
    }
    let (k, v) = h.split_at(ctx * nkv * d);
    let q: Vec<f32> = (0..2 * 6 * d).map(|_| 2.0 * unit()).collect();
    for (n_new, window) in [(1, None), (2, Some(40))] {
        let sh = AttnShape {
            n_new,
            start_pos: ctx - n_new,
            n_heads: 6,
            n_kv_heads: nkv,
            head_dim: d,
            window,
            scale: 0.125,
            sinks: None,
            prefill: false,
        };
        let tiling = Tiling::new(&sh, 1);
        let job = tiling.job(tiling.jobs() - 1, &sh);
        let (mut a, mut b) = (Scratch::default(), Scratch::default());
        a.fit(d);
        b.fit(d);
        let kv = KvView::contiguous(k, v, nkv * d);
        run_tile(false, false, &q, &kv, &sh, &job, &mut a);
        run_tile(true, avx512, &q, &kv, &sh, &job, &mut b);
        for r in 0..job.toks * job.heads {
            let (want, got) = (&a.o[r * d..(r + 1) * d], &b.o[r * d..(r + 1) * d]);
            let mag = want.iter().fold(a.l[r], |m, x| m.max(x.abs()));
            let bad = (a.m[r] - b.m[r]).abs() > 1e-5 * a.m[r].abs().max(1.0)
                || (a.l[r] - b.l[r]).abs() > 1e-4 * a.l[r]
                || want.iter().zip(got).any(|(x, y)| (x - y).abs() > 1e-4 * mag || !y.is_finite());
            if bad {
                return Err(format!("attention tile (n_new {n_new}, window {window:?}) row {r} differs from scalar"));
            }
        }
    }
    Ok(())
}
