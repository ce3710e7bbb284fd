// RMSNorm of `rows` rows of `width`: y = x / sqrt(mean(x²) + eps) · w.
// One workgroup per row (rows past 32768 in z). `w` has `width` values
// (a per-head norm runs with width = head_dim over rows = T · heads).
// INPLACE selects the variant that normalizes `y` where it stands.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    x_off: u32,
    y_off: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
//BINDINGS

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wg.x + wg.z * 32768u;
    let live = row < p.rows;
    let xs = p.x_off + row * p.width;
    let ys = p.y_off + row * p.width;
    var s = 0.0;
    if (live) {
        for (var i = li; i < p.width; i = i + 64u) {
            let v = src(xs + i);
            s = s + v * v;
        }
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (li < k) {
            red[li] = red[li] + red[li + k];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.width) + p.eps);
    if (live) {
        for (var i = li; i < p.width; i = i + 64u) {
            y[ys + i] = src(xs + i) * inv * w[i];
        }
    }
}
