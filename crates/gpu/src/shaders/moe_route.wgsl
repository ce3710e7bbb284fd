// MoE routing, one invocation per token: router logits (t × ne, turned into
// probabilities in place) → the top_k experts and their weights, as the
// host's `Moe::route`:
// - mode 0 (softmax): softmax over all experts, the top_k largest;
// - mode 1 (DeepSeek's grouped sigmoid): sigmoid scores; choosing uses the
//   scores plus the correction bias, only within the topk_group best of
//   n_group groups (a group's score: the sum of its two best); weights are
//   the unbiased scores, × scale.
// Ties go to the lower index (expert or group). With norm, weights are
// rescaled to sum to one (+1e-20 in mode 1, as transformers).
// Outputs: ids[t · top_k + j], wts[t · top_k + j], best first.

struct Params {
    t: u32,
    ne: u32,
    top_k: u32,
    mode: u32,
    norm: u32,
    n_group: u32,
    topk_group: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> probs: array<f32>;
@group(0) @binding(2) var<storage, read_write> sel: array<f32>;
@group(0) @binding(3) var<storage, read> score_bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;
@group(0) @binding(5) var<storage, read_write> wts: array<f32>;

const NEG_INF: f32 = -3.4028235e38;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let tok = gid.x;
    if (tok >= p.t) {
        return;
    }
    let b = tok * p.ne;
    var eps = 0.0;
    var scale = 1.0;
    if (p.mode == 0u) {
        var mx = NEG_INF;
        for (var e = 0u; e < p.ne; e++) {
            mx = max(mx, probs[b + e]);
        }
        var sum = 0.0;
        for (var e = 0u; e < p.ne; e++) {
            let v = exp(probs[b + e] - mx);
            probs[b + e] = v;
            sum += v;
        }
        for (var e = 0u; e < p.ne; e++) {
            probs[b + e] = probs[b + e] / sum;
            sel[b + e] = probs[b + e];
        }
    } else {
        eps = 1e-20;
        scale = p.scale;
        for (var e = 0u; e < p.ne; e++) {
            let v = 1.0 / (1.0 + exp(-probs[b + e]));
            probs[b + e] = v;
            sel[b + e] = v + score_bias[e];
        }
        if (p.topk_group < p.n_group) {
            let size = p.ne / p.n_group;
            var kept = 0u;
            for (var j = 0u; j < p.topk_group; j++) {
                var best = p.n_group;
                var best_score = NEG_INF;
                for (var g = 0u; g < p.n_group; g++) {
                    if ((kept & (1u << g)) != 0u) {
                        continue;
                    }
                    var a = NEG_INF;
                    var c = NEG_INF;
                    for (var e = g * size; e < (g + 1u) * size; e++) {
                        let v = sel[b + e];
                        if (v > a) {
                            c = a;
                            a = v;
                        } else if (v > c) {
                            c = v;
                        }
                    }
                    let score = select(a, a + c, size >= 2u);
                    if (best == p.n_group || score > best_score) {
                        best = g;
                        best_score = score;
                    }
                }
                kept |= 1u << best;
            }
            for (var e = 0u; e < p.ne; e++) {
                if ((kept & (1u << (e / size))) == 0u) {
                    sel[b + e] = NEG_INF;
                }
            }
        }
    }
    let o = tok * p.top_k;
    var total = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        var best = p.ne;
        for (var e = 0u; e < p.ne; e++) {
            var taken = false;
            for (var i = 0u; i < j; i++) {
                taken = taken || ids[o + i] == e;
            }
            if (!taken && (best == p.ne || sel[b + e] > sel[b + best])) {
                best = e;
            }
        }
        ids[o + j] = best;
        wts[o + j] = probs[b + best];
        total += probs[b + best];
    }
    let norm = select(1.0, total + eps, p.norm != 0u);
    for (var j = 0u; j < p.top_k; j++) {
        wts[o + j] = wts[o + j] / norm * scale;
    }
}
