// Q4_1, split at upload: w0 holds each block's 16 code bytes (as Q4_0),
// w1 one word per block: its f16 scale d (low half) and minimum m (high
// half). Value = d · q + m.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 32u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let dm = unpack2x16float(w1[gb]);
        var s = 0.0;
        var xs = 0.0;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let word = w0[gb * 4u + j];
            for (var m = 0u; m < 4u; m = m + 1u) {
                let byte = (word >> (8u * m)) & 0xffu;
                let i = xb + b * 32u + j * 4u + m;
                s = s + f32(byte & 15u) * x[i] + f32(byte >> 4u) * x[i + 16u];
                xs = xs + x[i] + x[i + 16u];
            }
        }
        acc = acc + dm.x * s + dm.y * xs;
    }
    return acc;
}
