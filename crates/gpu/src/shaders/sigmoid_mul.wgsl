// y[y_off + r · width + i] *= sigmoid(g[g_off + r · g_stride + i]) for
// `rows` rows of `width`: the gated attention's output gate (Qwen3-Next,
// Qwen3.5), the gate read in place from the fused q‖k‖v‖gate row. With
// `silu` set, · SiLU(g) instead (Gated DeltaNet's gated norm, z from the
// fused projection row).

struct Params {
    rows: u32,
    width: u32,
    y_off: u32,
    g_off: u32,
    g_stride: u32,
    silu: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.width) {
        return;
    }
    let r = i / p.width;
    let c = i % p.width;
    let at = p.y_off + r * p.width + c;
    let gv = g[p.g_off + r * p.g_stride + c];
    let f = select(1.0, gv, p.silu == 1u);
    y[at] = y[at] * f / (1.0 + exp(-gv));
}
