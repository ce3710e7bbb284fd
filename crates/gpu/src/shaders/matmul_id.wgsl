// The experts' matmul of a MoE layer: for each routed (token, slot) pair,
// y[pair, n] = out_scale · Σ_k x[row(pair), k] · W_e[n, k] + bias_e[n],
// e = ids[pair], where W stacks the experts' matrices (`n` rows each) and
// this part of it holds experts `first .. first + experts`. Pairs routed to
// another expert are left alone (the combine skips them by the same test).
// x's row is the token's (pair / top_k) or the pair's own (x_per_pair),
// rows `x_stride` apart. With `heads` set there is no ids buffer: pair p
// uses matrix p % top_k (latent attention's per-head folds, a "pair" being
// a (token, head)).
//
// Workgroups as matmul.wgsl: ROWS rows of one expert for one pair, WG
// invocations per row, the weight type's partial_dot.

struct Params {
    n: u32,
    k: u32,
    pairs: u32,
    flags: u32,
    out_scale: f32,
    x_off: u32,
    y_off: u32,
    y_stride: u32,
    top_k: u32,
    x_per_pair: u32,
    first: u32,
    experts: u32,
    x_stride: u32,
    heads: u32,
    _p2: u32,
    _p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w0: array<u32>;
@group(0) @binding(3) var<storage, read> w1: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> ids: array<u32>;

//COMMON

//DOT

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % WG;
    let row = (wg.x + wg.z * 32768u) * ROWS + li / WG;
    let pair = wg.y;
    // Expert of this pair within this part (wraps past `experts` when below `first`).
    var id = pair % p.top_k;
    if (p.heads == 0u) {
        id = ids[pair];
    }
    let local = id - p.first;
    let ours = local < p.experts && row < p.n;
    let xrow = select(pair / p.top_k, pair, p.x_per_pair != 0u);
    var acc = 0.0;
    if (ours) {
        acc = partial_dot(local * p.n + row, p.x_off + xrow * p.x_stride, lane);
    }
    let total = reduce_row(li, lane, acc);
    if (lane == 0u && ours) {
        var v = total * p.out_scale;
        if ((p.flags & 1u) != 0u) {
            v = v + bias[local * p.n + row];
        }
        y[p.y_off + pair * p.y_stride + row] = v;
    }
}
