// Q5_0 and Q5_1, split at upload: w0 holds each block's 32 high bits (one
// word: bit j is value j's fifth bit) then its 16 nibble bytes (value i low,
// value i + 16 high): 5 words; w1 its f16 d (Q5_0: two blocks a word) or
// f16 d and min (Q5_1: one word). Q5_0: value = d · (q − 16); Q5_1: d · q + m.
// MIN_WORD selects Q5_1 (1) or Q5_0 (0).

fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 32u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let qh = w0[gb * 5u];
        var s = 0.0;
        var xs = 0.0;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let word = w0[gb * 5u + 1u + j];
            for (var m = 0u; m < 4u; m = m + 1u) {
                let i = j * 4u + m;
                let byte = (word >> (8u * m)) & 0xffu;
                let lo = (byte & 15u) | (((qh >> i) & 1u) << 4u);
                let hi = (byte >> 4u) | (((qh >> (i + 16u)) & 1u) << 4u);
                let xi = xb + b * 32u + i;
                s = s + f32(lo) * x[xi] + f32(hi) * x[xi + 16u];
                xs = xs + x[xi] + x[xi + 16u];
            }
        }
        if (MIN_WORD == 1u) {
            let dm = unpack2x16float(w1[gb]);
            acc = acc + dm.x * s + dm.y * xs;
        } else {
            let d = f16_at(gb, w1[gb >> 1u]);
            acc = acc + d * (s - 16.0 * xs);
        }
    }
    return acc;
}
