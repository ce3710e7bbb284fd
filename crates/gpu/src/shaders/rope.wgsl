// Rotary embedding in place on `x` (`heads × head_dim` of each token row of
// `stride` values, from x_off, heads `head_dim` apart: q and k heads side
// by side in a q‖k‖v row; latent attention's rope tails, `nope + rope` apart) with
// per-token tables cos/sin (`t × half`): the first 2·half dims of each head
// rotate, as halves (neox, style 0) or as adjacent pairs (style 1).
// One workgroup per (head, token).

struct Params {
    heads: u32,
    head_dim: u32,
    half: u32,
    style: u32,
    x_off: u32,
    stride: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> cs: array<f32>;
@group(0) @binding(2) var<storage, read> sn: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.x;
    let t = wg.y;
    let base = p.x_off + t * p.stride + head * p.head_dim;
    for (var i = li; i < p.half; i = i + 64u) {
        let c = cs[t * p.half + i];
        let s = sn[t * p.half + i];
        var ia = base + i;
        var ib = base + i + p.half;
        if (p.style == 1u) {
            ia = base + 2u * i;
            ib = ia + 1u;
        }
        let a = x[ia];
        let b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = b * c + a * s;
    }
}
