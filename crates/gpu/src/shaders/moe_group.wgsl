// Groups a MoE layer's routed (token, slot) pairs by expert, so that the
// experts' matmul reads each expert's rows once for all its pairs
// (matmul_id_grouped.wgsl). From the pairs' expert ids writes
//   group[e]           = the first place of expert e's pairs (e ≤ ne: an
//                        exclusive prefix sum, group[ne] = pairs),
//   group[ne + 1 + i]  = the i-th pair in expert order,
// each expert's pairs in increasing order (deterministic). One workgroup:
// invocation li counts and then places the pairs of experts li, li + 256, …

struct Params {
    pairs: u32,
    ne: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> group: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var e = li; e < p.ne; e = e + 256u) {
        var n = 0u;
        for (var i = 0u; i < p.pairs; i = i + 1u) {
            n = n + select(0u, 1u, ids[i] == e);
        }
        group[e] = n;
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        var at = 0u;
        for (var e = 0u; e < p.ne; e = e + 1u) {
            let n = group[e];
            group[e] = at;
            at = at + n;
        }
        group[p.ne] = at;
    }
    storageBarrier();
    workgroupBarrier();
    for (var e = li; e < p.ne; e = e + 256u) {
        var at = group[e];
        for (var i = 0u; i < p.pairs; i = i + 1u) {
            if (ids[i] == e) {
                group[p.ne + 1u + at] = i;
                at = at + 1u;
            }
        }
    }
}
