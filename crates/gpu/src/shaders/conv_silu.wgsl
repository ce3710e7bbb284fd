// Gated DeltaNet's causal depthwise conv1d + SiLU over each sequence's new
// rows, continuing from (and then advancing) the sequence's conv state.
//
// One invocation per (channel, sequence): the sequence's rows in order, so
// a prompt split into any chunks gives the same bits. For sequence s
// (`seqs[3s..]`: first row, rows, state slot) and channel ch, input u of
// the concatenation [state rows ‖ new rows] is the state's row u (u < K−1,
// oldest first) or the new row u − (K−1) (`x`, rows of `x_stride` values,
// the conv channels first). Output row t: SiLU(Σ_j w[j·C + ch] · input(t + j)),
// summed from j = 0 as the host does. The state then keeps the last K − 1
// inputs, written in place in increasing order (row u reads input len + u,
// not yet overwritten).

struct Params {
    c: u32,
    k: u32,
    n_seq: u32,
    x_stride: u32,
    slot_len: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> seqs: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> states: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

fn input(u: u32, hist: u32, base: u32, row: u32, ch: u32) -> f32 {
    if (u < hist) {
        return states[base + u * p.c + ch];
    }
    return x[(row + u - hist) * p.x_stride + ch];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let ch = gid.x;
    let s = wg.y;
    if (ch >= p.c || s >= p.n_seq) {
        return;
    }
    let row = seqs[3u * s];
    let len = seqs[3u * s + 1u];
    let base = seqs[3u * s + 2u] * p.slot_len;
    let hist = p.k - 1u;
    for (var t = 0u; t < len; t = t + 1u) {
        var acc = 0.0;
        for (var j = 0u; j < p.k; j = j + 1u) {
            acc = acc + w[j * p.c + ch] * input(t + j, hist, base, row, ch);
        }
        y[(row + t) * p.c + ch] = acc / (1.0 + exp(-acc));
    }
    for (var u = 0u; u < hist; u = u + 1u) {
        states[base + u * p.c + ch] = input(len + u, hist, base, row, ch);
    }
}
