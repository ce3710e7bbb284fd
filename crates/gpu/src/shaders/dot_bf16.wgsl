// BF16 weights: two values per word; a bf16 is the high half of an f32.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    _ = w1[0];
    let base = row * p.k;
    var s = 0.0;
    for (var i = li; i < p.k; i = i + WG) {
        let e = base + i;
        let word = w0[e >> 1u];
        let bits = select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u);
        s = s + bitcast<f32>(bits) * x[xb + i];
    }
    return s;
}
