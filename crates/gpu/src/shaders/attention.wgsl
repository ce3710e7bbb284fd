// Causal GQA attention over a paged KV pool (f32, or f16 two a word), one workgroup of 64 per
// (query head, token). Token t sits at position tok[2t] and its sequence's
// block table starts at tables[tok[2t + 1]]; it attends to positions
// 0..=pos (those inside its window when `window` > 0). Keys and values of
// position q live at pool row table[q / block] · block + q % block, each
// row `kv_heads × head_dim` f32.
//
// Positions go in tiles of 64: each invocation scores one position (its
// own dot over head_dim), the tile's max and sum come from a reduction,
// then each invocation accumulates its head_dim / 64 output dims over the
// tile with the online-softmax rescale. head_dim ≤ 64 · TILES (set by the
// host: 4, or more for latent attention's 576-wide rows). A sink (gpt-oss)
// starts the running max and sum at (sink, 1).

struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block: u32,
    scale: f32,
    window: u32,
    q_off: u32,
    // Values per token row of q (heads × head_dim, or a whole q‖k‖v row).
    q_stride: u32,
    // 1: a learned sink logit per head (sinks[head]) joins each softmax.
    has_sinks: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
//POOLS
@group(0) @binding(4) var<storage, read> tok: array<u32>;
@group(0) @binding(5) var<storage, read> tables: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<storage, read> sinks: array<f32>;

const TILES: u32 = TILESu;
var<workgroup> qs: array<f32, TILES * 64u>;
var<workgroup> w: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> where_: vec2<u32>;

const NEG: f32 = -3.0e38;

fn pool_row(ts: u32, pos: u32) -> u32 {
    return tables[ts + pos / p.block] * p.block + pos % p.block;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.x;
    let t = wg.y;
    // Through workgroup memory, so the loop bounds are uniform to the analysis.
    if (li == 0u) {
        where_ = vec2<u32>(tok[2u * t], tok[2u * t + 1u]);
    }
    let at_ = workgroupUniformLoad(&where_);
    let pos = at_.x;
    let ts = at_.y;
    let kvh = head / (p.heads / p.kv_heads);
    let hd = p.head_dim;
    let row_len = p.kv_heads * hd;
    let qb = p.q_off + t * p.q_stride + head * hd;
    for (var d = li; d < hd; d = d + 64u) {
        qs[d] = q[qb + d];
    }
    var first = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        first = pos + 1u - p.window;
    }
    workgroupBarrier();
    var m = NEG;
    var l = 0.0;
    if (p.has_sinks != 0u) {
        // The sink is one more logit in the denominator, with no value.
        m = sinks[head];
        l = 1.0;
    }
    var acc: array<f32, TILES>;
    for (var base = first; base <= pos; base = base + 64u) {
        let at = base + li;
        var s = NEG;
        if (at <= pos) {
            let kb = pool_row(ts, at) * row_len + kvh * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d = d + 1u) {
                dot = dot + qs[d] * kload(kb + d);
            }
            s = dot * p.scale;
        }
        red[li] = s;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k = k >> 1u) {
            if (li < k) {
                red[li] = max(red[li], red[li + k]);
            }
            workgroupBarrier();
        }
        let new_m = max(m, red[0]);
        workgroupBarrier();
        var e = 0.0;
        if (at <= pos) {
            e = exp(s - new_m);
        }
        w[li] = e;
        red[li] = e;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k = k >> 1u) {
            if (li < k) {
                red[li] = red[li] + red[li + k];
            }
            workgroupBarrier();
        }
        let corr = exp(m - new_m);
        l = l * corr + red[0];
        let n = min(64u, pos + 1u - base);
        for (var i = 0u; i < TILES; i = i + 1u) {
            let d = li + 64u * i;
            if (d < hd) {
                var a = acc[i] * corr;
                for (var j = 0u; j < n; j = j + 1u) {
                    a = a + w[j] * vload(pool_row(ts, base + j) * row_len + kvh * hd + d);
                }
                acc[i] = a;
            }
        }
        m = new_m;
        workgroupBarrier();
    }
    let ob = (t * p.heads + head) * hd;
    for (var i = 0u; i < TILES; i = i + 1u) {
        let d = li + 64u * i;
        if (d < hd) {
            out[ob + d] = acc[i] / l;
        }
    }
}
