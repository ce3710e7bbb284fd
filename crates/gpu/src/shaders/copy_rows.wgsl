// dst[dst_off + r · dst_stride + i] = src[src_off + r · src_stride + i]
// for `rows` rows of `len` values (a strided gather of row pieces).

struct Params {
    rows: u32,
    len: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.len) {
        return;
    }
    let r = i / p.len;
    let e = i % p.len;
    dst[p.dst_off + r * p.dst_stride + e] = src[p.src_off + r * p.src_stride + e];
}
