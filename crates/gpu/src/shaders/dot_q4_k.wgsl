// Q4_K, split at upload: w1 holds each super-block's first 16 bytes (f16 d,
// f16 dmin, 12 bytes of 6-bit sub-block scales and mins: 4 words), w0 its
// 128 code bytes (32 words). Super-blocks of 256 values in 4 chunks of 64:
// chunk j's low nibbles are values 64j..64j+31 (sub-block 2j), its high
// nibbles 64j+32.. (sub-block 2j+1). Value = d · sc · q − dmin · m.

fn b0(i: u32) -> u32 {
    return (w0[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn b1(i: u32) -> u32 {
    return (w1[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// Sub-block j's (scale, min) from the 12 scale bytes at byte sb of w1.
fn scale_min(sb: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(b1(sb + j) & 63u), f32(b1(sb + j + 4u) & 63u));
    }
    let sc = (b1(sb + j + 4u) & 15u) | ((b1(sb + j - 4u) >> 6u) << 4u);
    let m = (b1(sb + j + 4u) >> 4u) | ((b1(sb + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 256u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let dm = unpack2x16float(w1[gb * 4u]);
        let sb = gb * 16u + 4u;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let lo = scale_min(sb, 2u * j);
            let hi = scale_min(sb, 2u * j + 1u);
            let xo = xb + b * 256u + j * 64u;
            var s1 = 0.0;
            var s2 = 0.0;
            var x1 = 0.0;
            var x2 = 0.0;
            for (var l = 0u; l < 32u; l = l + 4u) {
                let word = w0[gb * 32u + j * 8u + l / 4u];
                for (var m = 0u; m < 4u; m = m + 1u) {
                    let q = (word >> (8u * m)) & 0xffu;
                    let xa = x[xo + l + m];
                    let xc = x[xo + 32u + l + m];
                    s1 = s1 + f32(q & 15u) * xa;
                    s2 = s2 + f32(q >> 4u) * xc;
                    x1 = x1 + xa;
                    x2 = x2 + xc;
                }
            }
            acc = acc + dm.x * (lo.x * s1 + hi.x * s2) - dm.y * (lo.y * x1 + hi.y * x2);
        }
    }
    return acc;
}
