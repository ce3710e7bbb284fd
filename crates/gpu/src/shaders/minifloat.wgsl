// E2M1 (FP4) values by code: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
var<private> E2M1: array<f32, 16> = array<f32, 16>(
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);

// E4M3 magnitude of the low 7 bits (bias 7; exponent 0 is subnormal,
// m/8 · 2^-6). NaN codes (0x7F) are refused when the model loads.
fn e4m3_mag(b: u32) -> f32 {
    let e = (b >> 3u) & 15u;
    let m = f32(b & 7u);
    if (e == 0u) {
        return m * 0.001953125;
    }
    return (8.0 + m) * exp2(f32(e) - 10.0);
}

// The byte at index `i` of an array of packed bytes.
fn byte_at(i: u32, word: u32) -> u32 {
    return (word >> (8u * (i & 3u))) & 0xffu;
}
