// Invocations per row (the stride of partial_dot's loops) and rows per
// workgroup, set per weight type by the host (pass.rs, `matmul_shape`).
const WG: u32 = LANESu;
const ROWS: u32 = ROWSu;
var<workgroup> red: array<f32, 64>;

// The f16 at index `i` of an array of packed f16 pairs (low half first).
fn f16_at(i: u32, word: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

// Sums the WG partial sums of each row of the workgroup (invocation li is
// lane `lane` of its row): every invocation gets its row's total.
fn reduce_row(li: u32, lane: u32, acc: f32) -> f32 {
    red[li] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[li] = red[li] + red[li + s];
        }
        workgroupBarrier();
    }
    return red[li - lane];
}
