// NVFP4 (GGUF type 40), split at upload: w0 holds each block's 32 code
// bytes (8 words; in sub-block s, byte 8s + j: value 16s + j in its low
// nibble, 16s + j + 8 in its high one), w1 the four unsigned E4M3 sub-block
// scales in one word. Value = E2M1(q) · UE4M3(d[s]); the tensor's global
// scale is the matmul's out_scale.
//MINIFLOAT
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 64u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let scales = w1[gb];
        for (var s = 0u; s < 4u; s = s + 1u) {
            let d = e4m3_mag((scales >> (8u * s)) & 0x7fu);
            var ss = 0.0;
            for (var jw = 0u; jw < 2u; jw = jw + 1u) {
                let word = w0[gb * 8u + 2u * s + jw];
                for (var m = 0u; m < 4u; m = m + 1u) {
                    let byte = (word >> (8u * m)) & 0xffu;
                    let i = xb + b * 64u + 16u * s + jw * 4u + m;
                    ss = ss + E2M1[byte & 15u] * x[i] + E2M1[byte >> 4u] * x[i + 8u];
                }
            }
            acc = acc + d * ss;
        }
    }
    return acc;
}
