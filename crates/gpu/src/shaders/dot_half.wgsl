// 16-bit float weights, two values per word, the lower index in the low
// half: F16 or BF16 (HALVES turns a word into its two values). Each
// invocation takes whole words; a row may start or end inside a word when
// k is odd.
fn partial_dot(row: u32, xb: u32, li: u32) -> f32 {
    _ = w1[0];
    let base = row * p.k;
    let end = base + p.k;
    let last = (end + 1u) >> 1u;
    var s = 0.0;
    for (var w = (base >> 1u) + li; w < last; w = w + WG) {
        let word = w0[w];
        let v = HALVES;
        let e = 2u * w;
        if (e >= base) {
            s = s + v.x * x[xb + e - base];
        }
        if (e + 1u < end) {
            s = s + v.y * x[xb + e + 1u - base];
        }
    }
    return s;
}
