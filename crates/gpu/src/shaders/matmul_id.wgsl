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
// invocations per row, the weight type's partial_dot. The main is that
// per-pair form (matmul_id_pairs.wgsl) or the grouped one
// (matmul_id_grouped.wgsl, whose `ids` binding holds moe_group's output).

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
    // Experts of the grouping (grouped form).
    ne: u32,
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

// One (pair, row) of a workgroup's rows: the pair's input row times row
// `row` of expert `local` (of this part), scaled and biased, into the
// pair's output row. Every invocation of the workgroup calls it (the row
// reduction has barriers); `live` says whether this invocation's row is one.
fn pair_row(li: u32, lane: u32, local: u32, row: u32, pair: u32, live: bool) {
    let xrow = select(pair / p.top_k, pair, p.x_per_pair != 0u);
    var acc = 0.0;
    if (live) {
        acc = partial_dot(local * p.n + row, p.x_off + xrow * p.x_stride, lane);
    }
    let total = reduce_row(li, lane, acc);
    if (lane == 0u && live) {
        var v = total * p.out_scale;
        if ((p.flags & 1u) != 0u) {
            v = v + bias[local * p.n + row];
        }
        y[p.y_off + pair * p.y_stride + row] = v;
    }
}

//MAIN
