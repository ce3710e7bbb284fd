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
