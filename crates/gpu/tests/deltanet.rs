//! Gated DeltaNet's shaders against the host reference: the causal conv1d
//! with its state, and the gated delta rule (the `kernels` crate's scalar
//! recurrent kernel), over two sequences of one step in state slots that
//! already hold values (a decode row, and a five-row chunk), with grouped
//! and tiled value heads and widths that are not multiples of the
//! workgroup; then `silu_mul` (the gated norm's `· SiLU(z)`).

mod common;
use common::{assert_close, gpu, random};
use kernels::delta_rule::{self, ChunkScratch, HeadInputs};
use shardlm_gpu::{DeltaArgs, Pass};

/// Host reference of one step: the conv over `[state ‖ rows]` with SiLU,
/// then per value head the L2-normalized q, k (q · 1/√dk), β, g and the
/// recurrent kernel. Returns the core output rows; advances `states`.
fn reference(
    a: &DeltaArgs,
    k: usize,
    (x, w, neg_a, dt): (&[f32], &[f32], &[f32], &[f32]),
    seqs: &[(usize, usize, usize)],
    states: &mut [f32],
) -> Vec<f32> {
    let c = a.channels();
    let (hist, kq, vw) = (k - 1, a.k_heads * a.dk, a.v_heads * a.dv);
    let n: usize = seqs.iter().map(|s| s.1).sum();
    let mut y = vec![0f32; n * c];
    let mut core = vec![0f32; n * vw];
    for &(row, len, slot) in seqs {
        let base = slot * a.slot_len;
        for ch in 0..c {
            let inputs: Vec<f32> = (0..hist + len)
                .map(|u| if u < hist { states[base + u * c + ch] } else { x[(row + u - hist) * a.x_stride + ch] })
                .collect();
            for t in 0..len {
                let mut acc = 0f32;
                for j in 0..k {
                    acc += w[j * c + ch] * inputs[t + j];
                }
                y[(row + t) * c + ch] = acc / (1.0 + (-acc).exp());
            }
            for u in 0..hist {
                states[base + u * c + ch] = inputs[len + u];
            }
        }
        let r = a.v_heads / a.k_heads;
        for h in 0..a.v_heads {
            let kh = if a.tiled { h % a.k_heads } else { h / r };
            let (mut q, mut kk, mut v, mut g, mut beta) = (vec![], vec![], vec![], vec![], vec![]);
            for t in row..row + len {
                q.extend_from_slice(&y[t * c + kh * a.dk..t * c + (kh + 1) * a.dk]);
                kk.extend_from_slice(&y[t * c + kq + kh * a.dk..t * c + kq + (kh + 1) * a.dk]);
                v.extend_from_slice(&y[t * c + 2 * kq + h * a.dv..t * c + 2 * kq + (h + 1) * a.dv]);
                let (bv, av) = (x[t * a.x_stride + a.ba_off + h], x[t * a.x_stride + a.ba_off + a.v_heads + h]);
                beta.push(1.0 / (1.0 + (-bv).exp()));
                let sp = if av + dt[h] > 20.0 { av + dt[h] } else { (av + dt[h]).exp().ln_1p() };
                g.push(neg_a[h] * sp);
            }
            delta_rule::l2norm_rows(&mut q, a.dk, 1e-6);
            delta_rule::l2norm_rows(&mut kk, a.dk, 1e-6);
            q.iter_mut().for_each(|v| *v /= (a.dk as f32).sqrt());
            let s0 = base + a.conv_len + h * a.dk * a.dv;
            let st = &mut states[s0..s0 + a.dk * a.dv];
            let mut o = vec![0f32; len * a.dv];
            let inp = HeadInputs { q: &q, k: &kk, v: &v, g: &g, beta: &beta };
            delta_rule::recurrent_scalar(st, &inp, a.dk, a.dv, &mut o, &mut ChunkScratch::default());
            for t in 0..len {
                core[(row + t) * vw + h * a.dv..(row + t) * vw + (h + 1) * a.dv]
                    .copy_from_slice(&o[t * a.dv..(t + 1) * a.dv]);
            }
        }
    }
    core
}

#[test]
fn conv_and_delta_rule_match_the_host() {
    let Some(gpu) = gpu() else { return };
    for tiled in [false, true] {
        let (nk, nv, dk, dv, k) = (2usize, 4usize, 48usize, 80usize, 4usize);
        let c = 2 * nk * dk + nv * dv;
        let conv_len = (k - 1) * c;
        let slot_len = conv_len + nv * dk * dv;
        let x_stride = c + nv * dv + 2 * nv;
        let a =
            DeltaArgs { k_heads: nk, v_heads: nv, dk, dv, tiled, slot_len, conv_len, x_stride, ba_off: c + nv * dv };
        // Sequence 0: five rows into slot 2; sequence 1: one row into slot 0.
        let seqs = [(0usize, 5usize, 2usize), (5, 1, 0)];
        let n = 6;
        let x: Vec<f32> = random(n * x_stride, 1).iter().map(|v| 2.0 * v).collect();
        let w = random(k * c, 2);
        let neg_a: Vec<f32> = random(nv, 3).iter().map(|v| -(v.abs() + 0.1)).collect();
        let dt = random(nv, 4);
        let mut states: Vec<f32> = random(3 * slot_len, 5).iter().map(|v| 0.3 * v).collect();
        let (xb, wb, nab, dtb) = (
            gpu.buffer_with("x", bytemuck::cast_slice(&x)).unwrap(),
            gpu.buffer_with("w", bytemuck::cast_slice(&w)).unwrap(),
            gpu.buffer_with("neg_a", bytemuck::cast_slice(&neg_a)).unwrap(),
            gpu.buffer_with("dt", bytemuck::cast_slice(&dt)).unwrap(),
        );
        let sb = gpu.buffer_with("states", bytemuck::cast_slice(&states)).unwrap();
        let words: Vec<u32> = seqs.iter().flat_map(|&(r, l, s)| [r as u32, l as u32, s as u32]).collect();
        let seq_b = gpu.buffer_with("seqs", &words).unwrap();
        let (yb, core_b) = (gpu.buffer("y", n * c).unwrap(), gpu.buffer("core", n * nv * dv).unwrap());
        let mut pass = Pass::new(&gpu);
        pass.conv_silu(&xb, x_stride, (c, k, slot_len), &wb, (&seq_b, 2), &sb, &yb);
        pass.delta_rule(&a, (&yb, &xb), (&nab, &dtb), (&seq_b, 2), &sb, &core_b);
        pass.submit().unwrap();
        let want = reference(&a, k, (&x, &w, &neg_a, &dt), &seqs, &mut states);
        let what = if tiled { "tiled" } else { "grouped" };
        assert_close(&gpu.read_f32(&core_b, 0, n * nv * dv).unwrap(), &want, 1e-4, &format!("{what}: outputs"));
        assert_close(&gpu.read_f32(&sb, 0, 3 * slot_len).unwrap(), &states, 1e-4, &format!("{what}: states"));
    }
}

#[test]
fn silu_mul_reads_a_strided_gate() {
    let Some(gpu) = gpu() else { return };
    let (rows, width, g_off, g_stride) = (3usize, 70usize, 5usize, 100usize);
    let y = random(rows * width, 6);
    let g: Vec<f32> = random(rows * g_stride, 7).iter().map(|v| 4.0 * v).collect();
    let want: Vec<f32> = (0..rows * width)
        .map(|i| {
            let z = g[g_off + (i / width) * g_stride + i % width];
            y[i] * z / (1.0 + (-z).exp())
        })
        .collect();
    let (yb, gb) = (
        gpu.buffer_with("y", bytemuck::cast_slice(&y)).unwrap(),
        gpu.buffer_with("g", bytemuck::cast_slice(&g)).unwrap(),
    );
    let mut pass = Pass::new(&gpu);
    pass.silu_mul(&yb, (rows, width), &gb, (g_off, g_stride));
    pass.submit().unwrap();
    assert_close(&gpu.read_f32(&yb, 0, rows * width).unwrap(), &want, 1e-6, "silu_mul");
}
