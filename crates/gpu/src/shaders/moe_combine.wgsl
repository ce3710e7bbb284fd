// The MoE block's output for t tokens of width h: for element i (token
// i / h, column i % h), the weighted sum of the token's top_k expert rows
// d[pair, ..] held here (ids in first .. first + held), plus the shared
// expert's row s[t, ..] (flags bit 0) weighted by sigmoid(sg[t]) (bit 1:
// gated, else 1); written into y (bit 2: added to y, a residual add).

struct Params {
    n: u32,
    h: u32,
    top_k: u32,
    first: u32,
    held: u32,
    flags: u32,
    y_off: u32,
    _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> d: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read> s: array<f32>;
@group(0) @binding(5) var<storage, read> sg: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
    let tok = i / p.h;
    let c = i % p.h;
    var acc = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        let pair = tok * p.top_k + j;
        if (ids[pair] - p.first < p.held) {
            acc += wts[pair] * d[pair * p.h + c];
        }
    }
    if ((p.flags & 1u) != 0u) {
        var g = 1.0;
        if ((p.flags & 2u) != 0u) {
            g = 1.0 / (1.0 + exp(-sg[tok]));
        }
        acc += g * s[i];
    }
    let at = p.y_off + i;
    if ((p.flags & 4u) != 0u) {
        acc += y[at];
    }
    y[at] = acc;
}
