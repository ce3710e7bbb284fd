// Writes the new tokens' rows into a paged pool of Q8_0 or Q4_0 blocks
// (Q4u: 1 for Q4_0), in the host pool's byte layout (see kv.rs): token j's
// row (`row` values of src rows of `src_stride`, from src_off) becomes
// row / 32 blocks of BLOCK_BYTES bytes at pool row slots[j]. One invocation
// per (token, pair of blocks): a pair is whole words (17 or 9) and a row an
// even number of blocks, so no two invocations write one word.

struct Params {
    row: u32,
    t: u32,
    src_off: u32,
    src_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> pool: array<u32>;

const BB: u32 = BLOCK_BYTESu;
const Q4: u32 = Q4u;

var<private> w: array<u32, 17>;

fn put8(b: u32, v: u32) {
    w[b >> 2u] = w[b >> 2u] | ((v & 0xffu) << ((b & 3u) * 8u));
}

fn put16(b: u32, v: u32) {
    put8(b, v);
    put8(b + 1u, v >> 8u);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let pairs = p.row / 64u;
    if (i >= pairs * p.t) {
        return;
    }
    let j = i / pairs;
    let k = i % pairs;
    let pw = BB / 2u;
    for (var x = 0u; x < 17u; x = x + 1u) {
        w[x] = 0u;
    }
    for (var blk = 0u; blk < 2u; blk = blk + 1u) {
        let s = p.src_off + j * p.src_stride + (2u * k + blk) * 32u;
        let bo = blk * BB;
        if (Q4 == 0u) {
            var amax = 0.0;
            for (var v = 0u; v < 32u; v = v + 1u) {
                amax = max(amax, abs(src[s + v]));
            }
            let id = select(0.0, 127.0 / amax, amax != 0.0);
            put16(bo, pack2x16float(vec2<f32>(amax / 127.0, 0.0)));
            for (var v = 0u; v < 32u; v = v + 1u) {
                put8(bo + 2u + v, bitcast<u32>(i32(round(src[s + v] * id))));
            }
        } else {
            var amax = 0.0;
            var mx = 0.0;
            for (var v = 0u; v < 32u; v = v + 1u) {
                let x = src[s + v];
                if (amax < abs(x)) {
                    amax = abs(x);
                    mx = x;
                }
            }
            let d = mx / -8.0;
            let id = select(0.0, 1.0 / d, d != 0.0);
            put16(bo, pack2x16float(vec2<f32>(d, 0.0)));
            for (var v = 0u; v < 16u; v = v + 1u) {
                let x0 = min(15u, u32(src[s + v] * id + 8.5));
                let x1 = min(15u, u32(src[s + 16u + v] * id + 8.5));
                put8(bo + 2u + v, x0 | (x1 << 4u));
            }
        }
    }
    let base = slots[j] * pairs * pw + k * pw;
    for (var x = 0u; x < pw; x = x + 1u) {
        pool[base + x] = w[x];
    }
}
