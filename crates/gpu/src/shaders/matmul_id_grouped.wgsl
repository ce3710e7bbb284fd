// matmul_id.wgsl with the pairs grouped by expert (moe_group.wgsl): a
// workgroup takes ROWS rows of one expert and runs them for every pair
// routed to it, one after another, so the expert's rows come from memory
// once and from cache for its later pairs (the per-pair form reads them
// once per pair: once per routed token in a prefill). Each (pair, row) is
// the same arithmetic as matmul_id's, so the outputs are the same bits.
// Grid: x (and z past 32768) the row tiles, y the experts of this part.

var<workgroup> span: vec2<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % WG;
    let row = (wg.x + wg.z * 32768u) * ROWS + li / WG;
    let local = wg.y;
    let e = p.first + local;
    // Through workgroup memory, so the loop bounds are uniform to the analysis.
    if (li == 0u) {
        span = vec2<u32>(ids[e], ids[e + 1u]);
    }
    let s = workgroupUniformLoad(&span);
    let live = row < p.n;
    for (var i = s.x; i < s.y; i = i + 1u) {
        pair_row(li, lane, local, row, ids[p.ne + 1u + i], live);
        // reduce_row's scratch is reused by the next pair.
        workgroupBarrier();
    }
}
