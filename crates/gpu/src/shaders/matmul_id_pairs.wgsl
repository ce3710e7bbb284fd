// The per-pair form of matmul_id.wgsl: a workgroup per (ROWS rows, pair).

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % WG;
    let row = (wg.x + wg.z * 32768u) * ROWS + li / WG;
    let pair = wg.y;
    // Expert of this pair within this part (wraps past `experts` when below `first`).
    var id = pair % p.top_k;
    if (p.heads == 0u) {
        id = ids[pair];
    }
    let local = id - p.first;
    pair_row(li, lane, local, row, pair, local < p.experts && row < p.n);
}
