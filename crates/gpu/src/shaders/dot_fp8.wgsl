// FP8 E4M3 in shardlm's 64-value block, split at upload: w0 holds each
// block's 64 code bytes (16 words), w1 its f32 scale. Value = d · E4M3(q).
//MINIFLOAT
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 64u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let d = bitcast<f32>(w1[gb]);
        var s = 0.0;
        for (var j = 0u; j < 16u; j = j + 1u) {
            let word = w0[gb * 16u + j];
            for (var m = 0u; m < 4u; m = m + 1u) {
                let byte = (word >> (8u * m)) & 0xffu;
                let v = select(1.0, -1.0, (byte & 0x80u) != 0u) * e4m3_mag(byte & 0x7fu);
                s = s + v * x[xb + b * 64u + j * 4u + m];
            }
        }
        acc = acc + d * s;
    }
    return acc;
}
