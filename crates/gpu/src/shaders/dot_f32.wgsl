// F32 weights: one word per value.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    _ = w1[0];
    let base = row * p.k;
    var s = 0.0;
    for (var i = li; i < p.k; i = i + WG) {
        s = s + bitcast<f32>(w0[base + i]) * x[xb + i];
    }
    return s;
}
