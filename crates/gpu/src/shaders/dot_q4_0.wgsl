// Q4_0, split at upload: w0 holds each block's 16 code bytes (4 words; byte
// i carries value i in its low nibble and value i + 16 in its high one), w1
// the blocks' f16 scales, two per word. Value = d · (q − 8).
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 32u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let d = f16_at(gb, w1[gb >> 1u]);
        var s = 0.0;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let word = w0[gb * 4u + j];
            for (var m = 0u; m < 4u; m = m + 1u) {
                let byte = (word >> (8u * m)) & 0xffu;
                let i = xb + b * 32u + j * 4u + m;
                s = s + (f32(byte & 15u) - 8.0) * x[i] + (f32(byte >> 4u) - 8.0) * x[i + 16u];
            }
        }
        acc = acc + d * s;
    }
    return acc;
}
