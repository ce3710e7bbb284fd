// Q8_0, split at upload: w0 holds each block's 32 int8 codes (8 words),
// w1 the blocks' f16 scales, two per word. Value = d · q.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 32u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let d = f16_at(gb, w1[gb >> 1u]);
        var s = 0.0;
        for (var j = 0u; j < 8u; j = j + 1u) {
            let word = bitcast<i32>(w0[gb * 8u + j]);
            let xi = xb + b * 32u + j * 4u;
            s = s + f32(extractBits(word, 0u, 8u)) * x[xi]
                  + f32(extractBits(word, 8u, 8u)) * x[xi + 1u]
                  + f32(extractBits(word, 16u, 8u)) * x[xi + 2u]
                  + f32(extractBits(word, 24u, 8u)) * x[xi + 3u];
        }
        acc = acc + d * s;
    }
    return acc;
}
