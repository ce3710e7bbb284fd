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
    let ours = local < p.experts && row < p.n;
    let xrow = select(pair / p.top_k, pair, p.x_per_pair != 0u);
    var acc = 0.0;
    if (ours) {
        acc = partial_dot(local * p.n + row, p.x_off + xrow * p.x_stride, lane);
    }
    let total = reduce_row(li, lane, acc);
    if (lane == 0u && ours) {
        var v = total * p.out_scale;
        if ((p.flags & 1u) != 0u) {
            v = v + bias[local * p.n + row];
        }
        y[p.y_off + pair * p.y_stride + row] = v;
    }
}
