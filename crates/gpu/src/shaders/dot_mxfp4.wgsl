// MXFP4 (OCP MX), split at upload: w0 holds each block's 16 code bytes (4
// words; byte i: value i in its low nibble, value i + 16 in its high one),
// w1 the blocks' E8M0 exponents, four per word. Value = E2M1(q) · 2^(e−127).
//MINIFLOAT
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 32u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let d = exp2(f32(byte_at(gb, w1[gb >> 2u])) - 127.0);
        var s = 0.0;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let word = w0[gb * 4u + j];
            for (var m = 0u; m < 4u; m = m + 1u) {
                let byte = (word >> (8u * m)) & 0xffu;
                let i = xb + b * 32u + j * 4u + m;
                s = s + E2M1[byte & 15u] * x[i] + E2M1[byte >> 4u] * x[i + 16u];
            }
        }
        acc = acc + d * s;
    }
    return acc;
}
