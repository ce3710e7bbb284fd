// The gated delta rule of Gated DeltaNet, one workgroup per (value head h,
// sequence s), the sequence's rows in order (the recurrent form: a prompt
// split into any chunks gives the same bits).
//
// Per row: q, k of the head's key head (grouped: h / r, tiled: h mod nk)
// from the conv output `y` (rows of C = 2·nk·dk + nv·dv: q heads, k heads,
// v heads), L2-normalized (q then · 1/√dk); v the head's dv values;
// β = sigmoid(b_h), g = −exp(A_log)_h · softplus(a_h + dt_bias_h) with b, a
// at `ba_off` of the fused projection row (rows of `x_stride`). With the
// state S (dk × dv, row-major, in the slot after its conv state) and
// e = exp(g) (0 below −64), as the host's recurrent kernel:
//   d_j = β (v_j − e · (Sᵀk)_j),  o_j = e · (Sᵀq)_j + (q·k) d_j,
//   S_ij ← e · S_ij + k_i d_j.
// Each invocation owns columns j = li, li + 64, ...; q and k sit in
// workgroup memory (dk ≤ 512, `shardlm_gpu::MAX_DELTA_DK`).

struct Params {
    dk: u32,
    dv: u32,
    nv: u32,
    nk: u32,
    tiled: u32,
    c: u32,
    x_stride: u32,
    ba_off: u32,
    slot_len: u32,
    conv_len: u32,
    scale: f32,
    n_seq: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> seqs: array<u32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read> neg_a: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(6) var<storage, read_write> states: array<f32>;
@group(0) @binding(7) var<storage, read_write> core: array<f32>;

var<workgroup> qs: array<f32, 512>;
var<workgroup> ks: array<f32, 512>;
var<workgroup> red: array<vec3<f32>, 64>;

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let s = wg.y;
    let row0 = seqs[3u * s];
    let len = seqs[3u * s + 1u];
    let base = seqs[3u * s + 2u] * p.slot_len + p.conv_len + h * p.dk * p.dv;
    let r = p.nv / p.nk;
    let kh = select(h / r, h % p.nk, p.tiled == 1u);
    let kq = p.nk * p.dk;
    for (var t = 0u; t < len; t = t + 1u) {
        let row = row0 + t;
        var sq = 0.0;
        var sk = 0.0;
        for (var i = li; i < p.dk; i = i + 64u) {
            let qv = y[row * p.c + kh * p.dk + i];
            let kv = y[row * p.c + kq + kh * p.dk + i];
            qs[i] = qv;
            ks[i] = kv;
            sq = sq + qv * qv;
            sk = sk + kv * kv;
        }
        red[li] = vec3<f32>(sq, sk, 0.0);
        workgroupBarrier();
        for (var m = 32u; m > 0u; m = m >> 1u) {
            if (li < m) {
                red[li] = red[li] + red[li + m];
            }
            workgroupBarrier();
        }
        let iq = 1.0 / sqrt(red[0].x + 1e-6);
        let ik = 1.0 / sqrt(red[0].y + 1e-6);
        workgroupBarrier();
        var qk = 0.0;
        for (var i = li; i < p.dk; i = i + 64u) {
            let qv = qs[i] * iq * p.scale;
            let kv = ks[i] * ik;
            qs[i] = qv;
            ks[i] = kv;
            qk = qk + qv * kv;
        }
        red[li] = vec3<f32>(qk, 0.0, 0.0);
        workgroupBarrier();
        for (var m = 32u; m > 0u; m = m >> 1u) {
            if (li < m) {
                red[li] = red[li] + red[li + m];
            }
            workgroupBarrier();
        }
        let dot_qk = red[0].x;
        let b = x[row * p.x_stride + p.ba_off + h];
        let a = x[row * p.x_stride + p.ba_off + p.nv + h];
        let beta = 1.0 / (1.0 + exp(-b));
        let g = neg_a[h] * softplus(a + dt_bias[h]);
        let e = select(exp(g), 0.0, g < -64.0);
        for (var j = li; j < p.dv; j = j + 64u) {
            var mem = 0.0;
            var oq = 0.0;
            for (var i = 0u; i < p.dk; i = i + 1u) {
                let sv = states[base + i * p.dv + j];
                mem = mem + ks[i] * sv;
                oq = oq + qs[i] * sv;
            }
            let v = y[row * p.c + 2u * kq + h * p.dv + j];
            let d = beta * (v - e * mem);
            core[row * p.nv * p.dv + h * p.dv + j] = e * oq + dot_qk * d;
            for (var i = 0u; i < p.dk; i = i + 1u) {
                let at = base + i * p.dv + j;
                states[at] = e * states[at] + ks[i] * d;
            }
        }
        // The next row overwrites qs, ks.
        workgroupBarrier();
    }
}
