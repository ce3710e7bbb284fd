// Q6_K, split at upload: w0 holds each super-block's 128 bytes of low
// nibbles (ql) then 64 bytes of high bit pairs (qh): 48 words; w1 its 16
// int8 sub-block scales then its f16 d, padded to 5 words. Two halves of
// 128 values; in half h, for l < 32, four values share ql/qh bytes:
// l, l+32, l+64, l+96 (scales 8h + l/16 + 0, 2, 4, 6). Value = d · sc · (q − 32).

fn b0(i: u32) -> u32 {
    return (w0[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// The int8 scale at byte i of w1, sign-extended.
fn s1(i: u32) -> f32 {
    return f32(bitcast<i32>(((w1[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) << 24u) >> 24u);
}

fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    let nb = p.k / 256u;
    var acc = 0.0;
    for (var b = li; b < nb; b = b + WG) {
        let gb = row * nb + b;
        let d = unpack2x16float(w1[gb * 5u + 4u]).x;
        let sb = gb * 20u;
        var s = 0.0;
        for (var h = 0u; h < 2u; h = h + 1u) {
            let ql = gb * 192u + h * 64u;
            let qh = gb * 192u + 128u + h * 32u;
            let xo = xb + b * 256u + h * 128u;
            for (var l = 0u; l < 32u; l = l + 1u) {
                let a = b0(ql + l);
                let c = b0(ql + l + 32u);
                let hb = b0(qh + l);
                let q1 = f32((a & 15u) | ((hb & 3u) << 4u)) - 32.0;
                let q2 = f32((c & 15u) | (((hb >> 2u) & 3u) << 4u)) - 32.0;
                let q3 = f32((a >> 4u) | (((hb >> 4u) & 3u) << 4u)) - 32.0;
                let q4 = f32((c >> 4u) | (((hb >> 6u) & 3u) << 4u)) - 32.0;
                let is = sb + h * 8u + l / 16u;
                s = s + s1(is) * q1 * x[xo + l] + s1(is + 2u) * q2 * x[xo + l + 32u]
                      + s1(is + 4u) * q3 * x[xo + l + 64u] + s1(is + 6u) * q4 * x[xo + l + 96u];
            }
        }
        acc = acc + d * s;
    }
    return acc;
}
