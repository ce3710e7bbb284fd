// RMSNorm of `rows` rows of `width`: y = x / sqrt(mean(x²) + eps) · w.
// One workgroup per row (rows past 32768 in z). `w` has `width` values.
// Row r starts at (r / group) · stride + (r % group) · width (from x_off /
// y_off): a per-head norm runs with width = head_dim over rows = T · heads,
// group = heads and stride = the token row's width (heads inside a wider
// q‖k‖v row); a plain norm has group 1 and stride = width.
// INPLACE selects the variant that normalizes `y` where it stands.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    x_off: u32,
    y_off: u32,
    group: u32,
    stride: u32,
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
    let at = (row / p.group) * p.stride + (row % p.group) * p.width;
    let xs = p.x_off + at;
    let ys = p.y_off + at;
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
