//! The MoE ops against plain host loops: routing (softmax and DeepSeek's
//! grouped sigmoid), the experts' matmul over (token, slot) pairs on a
//! stacked matrix (every weight type, experts in parts, expert-parallel
//! ranges), and the weighted combine with a gated shared expert.

use kernels::DType;
use shardlm_gpu::{Act, DeviceWeight, Pairs, Pass, RouteMode};

mod common;
use common::{assert_close, encode, gpu, random};

/// The host's routing (model::moe::Moe::route): ids best first, weights.
fn route_ref(logits: &[f32], ne: usize, k: usize, norm: bool, mode: RouteMode, bias: &[f32]) -> Vec<(u32, f32)> {
    let mut out = Vec::new();
    for row in logits.chunks_exact(ne) {
        let (p, mut sel, eps, scale): (Vec<f32>, Vec<f32>, f32, f32) = match mode {
            RouteMode::Softmax => {
                let m = row.iter().cloned().fold(f32::MIN, f32::max);
                let e: Vec<f32> = row.iter().map(|v| (v - m).exp()).collect();
                let s: f32 = e.iter().sum();
                let p: Vec<f32> = e.iter().map(|v| v / s).collect();
                (p.clone(), p, 0.0, 1.0)
            }
            RouteMode::SigmoidGrouped { n_group, topk_group, scale } => {
                let p: Vec<f32> = row.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
                let mut sel: Vec<f32> = p.iter().zip(bias).map(|(a, b)| a + b).collect();
                let size = ne / n_group;
                let mut g: Vec<(usize, f32)> = (0..n_group)
                    .map(|g| {
                        let mut v = sel[g * size..(g + 1) * size].to_vec();
                        v.sort_by(|a, b| b.total_cmp(a));
                        (g, v[0] + v.get(1).copied().unwrap_or(0.0))
                    })
                    .collect();
                g.sort_by(|a, b| b.1.total_cmp(&a.1));
                for &(g, _) in &g[topk_group..] {
                    sel[g * size..(g + 1) * size].fill(f32::NEG_INFINITY);
                }
                (p, sel, 1e-20, scale)
            }
        };
        let mut chosen = Vec::new();
        for _ in 0..k {
            let best = (0..ne).filter(|e| !chosen.contains(e)).fold(None, |b: Option<usize>, e| match b {
                Some(b) if sel[b] >= sel[e] => Some(b),
                _ => Some(e),
            });
            chosen.push(best.unwrap());
        }
        let total: f32 = chosen.iter().map(|&e| p[e]).sum::<f32>() + eps;
        for &e in &chosen {
            out.push((e as u32, p[e] / if norm { total } else { 1.0 } * scale));
            sel[e] = f32::NEG_INFINITY;
        }
    }
    out
}

#[test]
fn routing_matches_the_host() {
    let Some(gpu) = gpu() else { return };
    let (t, ne, k) = (7usize, 16usize, 4usize);
    let logits: Vec<f32> = random(t * ne, 3).iter().map(|v| v * 4.0).collect();
    let bias = random(ne, 4);
    let grouped = RouteMode::SigmoidGrouped { n_group: 4, topk_group: 2, scale: 2.5 };
    for (mode, norm) in [(RouteMode::Softmax, true), (RouteMode::Softmax, false), (grouped, true), (grouped, false)] {
        let want = route_ref(&logits, ne, k, norm, mode, &bias);
        let lb = gpu.buffer("logits", t * ne).unwrap();
        gpu.write_f32(&lb, 0, &logits);
        let (sel, ids, wts) =
            (gpu.buffer("sel", t * ne).unwrap(), gpu.buffer("ids", t * k).unwrap(), gpu.buffer("wts", t * k).unwrap());
        let bb = gpu.buffer("bias", ne).unwrap();
        gpu.write_f32(&bb, 0, &bias);
        let mut pass = Pass::new(&gpu);
        pass.moe_route(&lb, &sel, Some(&bb), (t, ne, k, norm), mode, &ids, &wts);
        pass.submit().unwrap();
        let got_ids: Vec<u32> = gpu.read_f32(&ids, 0, t * k).unwrap().iter().map(|v| v.to_bits()).collect();
        let want_ids: Vec<u32> = want.iter().map(|w| w.0).collect();
        assert_eq!(got_ids, want_ids, "{mode:?} norm={norm}: expert ids");
        let want_w: Vec<f32> = want.iter().map(|w| w.1).collect();
        assert_close(&gpu.read_f32(&wts, 0, t * k).unwrap(), &want_w, 1e-5, &format!("{mode:?} norm={norm}"));
    }
}

/// A whole routed block: gate‖up of the chosen experts per pair, SiLU,
/// down per pair, combined with a gated shared expert's rows and added to
/// the residual. The weight holds experts 2..5 of 6 (expert parallelism:
/// pairs routed to 0, 1 are skipped), in parts of whole experts.
#[test]
fn experts_matmul_and_combine_match_the_host() {
    let Some(mut gpu) = gpu() else { return };
    let (t, k, ne, f) = (3usize, 2usize, 6usize, 40usize);
    let (first, held) = (2usize, 3usize);
    let limit = gpu.info.max_binding_bytes;
    for (dtype, h) in [
        (DType::F32, 64usize),
        (DType::BF16, 64),
        (DType::Q8_0, 64),
        (DType::Q4_K, 256),
        (DType::MXFP4, 64),
        (DType::NVFP4, 128),
        (DType::FP8, 64),
    ] {
        // Expert e's rows: gate (f) then up (f), `h` wide; down: `h` rows, `f` wide (f32).
        let gu_w = random(held * 2 * f * h, 5);
        let (gu_bytes, gu_held) = encode(dtype, &gu_w, h);
        let down_w = random(held * h * f, 6);
        let (down_bytes, down_held) = encode(DType::F32, &down_w, f);
        let bias = random(held * 2 * f, 7);
        let row = dtype.bytes_for(h).unwrap();
        let parts: Vec<Vec<_>> = (0..held)
            .map(|e| {
                vec![(
                    dtype,
                    (2 * f, h),
                    &gu_bytes[e * 2 * f * row..(e + 1) * 2 * f * row],
                    Some(&bias[e * 2 * f..(e + 1) * 2 * f]),
                    1.0,
                )]
            })
            .collect();
        // Parts of whole experts: the limit fits one and a half.
        gpu.info.max_binding_bytes = (3 * f * row) as u64;
        let gu = DeviceWeight::upload_experts(&gpu, "gate_up_exps", &parts).unwrap().unwrap();
        gpu.info.max_binding_bytes = limit;
        let dparts: Vec<Vec<_>> = (0..held)
            .map(|e| vec![(DType::F32, (h, f), &down_bytes[e * h * f * 4..(e + 1) * h * f * 4], None, 1.0)])
            .collect();
        let down = DeviceWeight::upload_experts(&gpu, "down_exps", &dparts).unwrap().unwrap();
        let x = random(t * h, 8);
        let ids: Vec<u32> = vec![3, 0, 4, 2, 1, 5];
        assert!(ids.iter().all(|&e| (e as usize) < ne));
        let wts = random(t * k, 9);
        let shared = random(t * h, 10);
        let sgate = random(t, 11);
        let resid = random(t * h, 12);
        // Host: per pair held, gate‖up, SiLU, down; combine.
        let mut want = resid.clone();
        for p in 0..t * k {
            let tok = p / k;
            let Some(e) = (ids[p] as usize).checked_sub(first).filter(|&e| e < held) else { continue };
            let dot = |w: &[f32], r: usize, x: &[f32], n: usize| {
                (0..n).map(|c| w[r * n + c] as f64 * x[c] as f64).sum::<f64>() as f32
            };
            let xr = &x[tok * h..(tok + 1) * h];
            let a: Vec<f32> = (0..f)
                .map(|i| {
                    let g = dot(&gu_held, e * 2 * f + i, xr, h) + bias[e * 2 * f + i];
                    let u = dot(&gu_held, e * 2 * f + f + i, xr, h) + bias[e * 2 * f + f + i];
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for c in 0..h {
                want[tok * h + c] += wts[p] * dot(&down_held, e * h + c, &a, f);
            }
        }
        for i in 0..t * h {
            want[i] += shared[i] / (1.0 + (-sgate[i / h]).exp());
        }
        let up = |name: &str, v: &[f32]| {
            let b = gpu.buffer(name, v.len()).unwrap();
            gpu.write_f32(&b, 0, v);
            b
        };
        let (xb, wb, sb, sgb, yb) =
            (up("x", &x), up("wts", &wts), up("shared", &shared), up("sg", &sgate), up("y", &resid));
        let idb = gpu.buffer_with("ids", &ids).unwrap();
        let (gub, ab, db) = (
            gpu.buffer("gu", t * k * 2 * f).unwrap(),
            gpu.buffer("act", t * k * f).unwrap(),
            gpu.buffer("down", t * k * h).unwrap(),
        );
        let pairs = Pairs { t, top_k: k, ids: Some(&idb), first, group: None };
        let mut pass = Pass::new(&gpu);
        pass.matmul_id(&gu, (&xb, false, h), pairs, &gub, (0, 2 * f));
        pass.act_mul(&gub, &ab, (t * k, f), Act::Silu);
        pass.matmul_id(&down, (&ab, true, f), pairs, &db, (0, h));
        pass.moe_combine(&db, (&idb, &wb), (t, h, k), (first, held), Some((&sb, Some(&sgb))), (&yb, 0, true));
        pass.submit().unwrap();
        // Sums of up to 256 f32 products in two orders, then a second product.
        assert_close(&gpu.read_f32(&yb, 0, t * h).unwrap(), &want, 1e-4, &format!("{dtype:?} experts"));
        // Grouped by expert: every held pair's rows are the same bits (the
        // others are left alone, as before: compare those of held experts).
        let (ggu, gdown, groupb) = (
            gpu.buffer("gu_grouped", t * k * 2 * f).unwrap(),
            gpu.buffer("down_grouped", t * k * h).unwrap(),
            gpu.buffer("group", shardlm_gpu::group_words(t * k, ne)).unwrap(),
        );
        let mut pass = Pass::new(&gpu);
        pass.moe_group(&idb, (t * k, ne), &groupb);
        let grouped = Pairs { group: Some((&groupb, ne)), ..pairs };
        pass.matmul_id(&gu, (&xb, false, h), grouped, &ggu, (0, 2 * f));
        pass.matmul_id(&down, (&ab, true, f), grouped, &gdown, (0, h));
        pass.submit().unwrap();
        let (a_gu, b_gu) =
            (gpu.read_f32(&gub, 0, t * k * 2 * f).unwrap(), gpu.read_f32(&ggu, 0, t * k * 2 * f).unwrap());
        let (a_d, b_d) = (gpu.read_f32(&db, 0, t * k * h).unwrap(), gpu.read_f32(&gdown, 0, t * k * h).unwrap());
        for p in (0..t * k).filter(|&p| (ids[p] as usize).checked_sub(first).is_some_and(|e| e < held)) {
            let (g, d) = (p * 2 * f..(p + 1) * 2 * f, p * h..(p + 1) * h);
            assert_eq!(a_gu[g.clone()], b_gu[g], "{dtype:?}: grouped gate_up of pair {p}");
            assert_eq!(a_d[d.clone()], b_d[d], "{dtype:?}: grouped down of pair {p}");
        }
        // The grouping itself: each expert's first place, then the pairs in expert order.
        let words: Vec<u32> = gpu
            .read_f32(&groupb, 0, shardlm_gpu::group_words(t * k, ne))
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let mut order: Vec<u32> = (0..(t * k) as u32).collect();
        order.sort_by_key(|&p| ids[p as usize]);
        let firsts: Vec<u32> = (0..=ne as u32).map(|e| ids.iter().filter(|&&i| i < e).count() as u32).collect();
        assert_eq!(words, [firsts, order].concat(), "{dtype:?}: the grouping");
        assert!(gu.bytes() > 0 && gu.expert_rows == 2 * f);
    }
}
