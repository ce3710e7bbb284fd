// y[t, n] = out_scale · Σ_k x[t, k] · W[n, k] + bias[n]   (flags bit 0: bias)
// or y[t, n] += … (flags bit 1: accumulate, the residual add fused in)
//
// A workgroup of 64 invocations covers ROWS output rows of one token t, WG
// = 64 / ROWS invocations per row: each sums its share of the row
// (`partial_dot`, from the weight type's dot_*.wgsl, which dequantizes the
// stored blocks in registers; neighbouring invocations read neighbouring
// values or blocks), then a tree reduction in workgroup memory. Decode is
// latency-bound on a big GPU (a 2048-row matrix is only 2048 rows of work):
// float rows get 32 invocations (more loads in flight, shorter loops); block
// types keep 8, each taking whole blocks (on an H200, 32 made Q4_0/Q8_0
// decode 19% slower and their prefill 3× slower, bf16 decode 47% faster). Row groups past 32768 go in the z
// dimension (a dimension holds at most 65535 workgroups).
//
// Bindings: x is `t × k` f32 from `x_off`; w0 the type's codes (or values),
// w1 its block scales (a one-word dummy for float types); y is `t × y_stride`
// from `y_off` (a weight held in parts of rows writes its columns of y).

struct Params {
    n: u32,
    k: u32,
    t: u32,
    flags: u32,
    out_scale: f32,
    x_off: u32,
    y_off: u32,
    // Values per row of y (the whole matrix's rows; `n` is this part's).
    y_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w0: array<u32>;
@group(0) @binding(3) var<storage, read> w1: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

//COMMON
//DOT

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % WG;
    let row = (wg.x + wg.z * 32768u) * ROWS + li / WG;
    let t = wg.y;
    var acc = 0.0;
    if (row < p.n) {
        acc = partial_dot(row, p.x_off + t * p.k, lane);
    }
    let total = reduce_row(li, lane, acc);
    if (lane == 0u && row < p.n) {
        var v = total * p.out_scale;
        if ((p.flags & 1u) != 0u) {
            v = v + bias[row];
        }
        let at = p.y_off + t * p.y_stride + row;
        if ((p.flags & 2u) != 0u) {
            v = v + y[at];
        }
        y[at] = v;
    }
}
