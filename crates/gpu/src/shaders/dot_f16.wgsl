// F16 weights: two values per word, the lower index in the low half.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    _ = w1[0];
    let base = row * p.k;
    var s = 0.0;
    for (var i = li; i < p.k; i = i + WG) {
        let e = base + i;
        s = s + f16_at(e, w0[e >> 1u]) * x[xb + i];
    }
    return s;
}
