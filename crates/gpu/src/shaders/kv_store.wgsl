// Writes the new tokens' rows (`row` values of each token row of `src_stride`
// in src, from src_off: the k or v part of a q‖k‖v row) into a paged
// pool: token j's row goes to pool row slots[j] (block · block_size +
// offset, which the host computes from the block table). An f16 pool packs
// two values a word (rows of even width): one invocation per pair.

struct Params {
    row: u32,
    t: u32,
    src_off: u32,
    src_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
//POOL

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    //STORE
}
