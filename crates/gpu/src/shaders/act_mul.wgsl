// out[i] = act(g) · u for i < n, where token row i / width of `gu` holds
// the gate's `width` values then the up projection's (g at column
// i % width, u at width + i % width): SiLU (act 0) or GELU's tanh
// approximation (act 1), computed as g · σ(2·√(2/π)·(g + 0.044715·g³)),
// or gpt-oss's clamped SwiGLU (act 2): (clamp(u, ±limit) + 1) · g' · σ(alpha · g'),
// g' = min(g, limit).

struct Params {
    n: u32,
    act: u32,
    width: u32,
    alpha: f32,
    limit: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
    let at = (i / p.width) * 2u * p.width + i % p.width;
    let g = gu[at];
    var a: f32;
    var u = gu[at + p.width];
    if (p.act == 0u) {
        a = g / (1.0 + exp(-g));
    } else if (p.act == 2u) {
        let gc = min(g, p.limit);
        a = gc / (1.0 + exp(-p.alpha * gc));
        u = clamp(u, -p.limit, p.limit) + 1.0;
    } else {
        let t = 0.7978846 * (g + 0.044715 * g * g * g);
        a = g / (1.0 + exp(-2.0 * t));
    }
    out[i] = a * u;
}
