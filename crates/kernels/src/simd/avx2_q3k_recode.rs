//! Q3_K blocks into and out of code planes ([`crate::packed::q3k_planes`]) in
//! AVX2 code: the loader recodes every Q3_K block once, and the prefill GEMM
//! reads recoded rows back in the file layout once per call and block (the
//! byte loops take ~250 cycles a block, a tenth of a prefill's time there).
//!
//! The planes hold each sub-block's values in one word lane: between the
//! file's chunks (value `32c + l` at byte `l` of chunk `c`) and the planes'
//! (value `16·(l / 2) + 2c + l % 2`) lies a transpose of 16 × 8 words,
//! [`to_lanes`] and [`from_lanes`]: 32 shuffles a block. The activations
//! take [`to_lanes`] too (`super::avx2_q3k_rows`).

use std::arch::x86_64::*;

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn st(p: *mut u8, v: __m256i) {
    _mm256_storeu_si256(p as *mut __m256i, v)
}

/// `v` shifted left by `s` bits (right by `−s`) in 16-bit lanes, `s` a
/// constant after inlining. Callers mask so no bit crosses a byte.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn shift(v: __m256i, s: i32) -> __m256i {
    if s >= 0 {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(s))
    } else {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(-s))
    }
}

/// Eight 8 × 8 word transposes at once, one per 128-bit half: word `c` of
/// `r[s]` becomes word `s` of the result's vector `c` (in each half).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose_words(r: &[__m256i; 8]) -> [__m256i; 8] {
    let z = _mm256_setzero_si256();
    // Words of row pairs interleaved: a[2i] columns 0..4, a[2i + 1] 4..8.
    let mut a = [z; 8];
    for i in 0..4 {
        a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    // Four rows' words of two columns a vector: b[4i + 2h + k] holds
    // columns 4h + 2k and 4h + 2k + 1 of rows 4i..4i + 4.
    let mut b = [z; 8];
    for i in 0..2 {
        for h in 0..2 {
            b[4 * i + 2 * h] = _mm256_unpacklo_epi32(a[4 * i + h], a[4 * i + 2 + h]);
            b[4 * i + 2 * h + 1] = _mm256_unpackhi_epi32(a[4 * i + h], a[4 * i + 2 + h]);
        }
    }
    let mut t = [z; 8];
    for k in 0..4 {
        t[2 * k] = _mm256_unpacklo_epi64(b[k], b[4 + k]);
        t[2 * k + 1] = _mm256_unpackhi_epi64(b[k], b[4 + k]);
    }
    t
}

/// File-order chunks (byte `l` of `u[c]`: value `32c + l`) to the planes'
/// order (byte `l` of chunk `c`: value `16·(l / 2) + 2c + l % 2`): word
/// lane `s` of every result vector is sub-block `s`.
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn to_lanes(u: &[__m256i; 8]) -> [__m256i; 8] {
    // r[s]: sub-block s (its eight words) low, sub-block s + 8 high.
    let mut r = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        r[2 * k] = _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k]);
        r[2 * k + 1] = _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k]);
    }
    transpose_words(&r)
}

/// The inverse of [`to_lanes`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn from_lanes(t: &[__m256i; 8]) -> [__m256i; 8] {
    let r = transpose_words(t);
    let mut u = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        u[k] = _mm256_permute2x128_si256::<0x20>(r[2 * k], r[2 * k + 1]);
        u[4 + k] = _mm256_permute2x128_si256::<0x31>(r[2 * k], r[2 * k + 1]);
    }
    u
}

/// [`crate::packed::q3k_planes::encode`] of one block.
///
/// # Safety
/// AVX2; `src`, `dst`: 110 bytes each.
#[target_feature(enable = "avx2")]
pub unsafe fn encode(src: *const u8, dst: *mut u8) {
    let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let hm = ld(src);
    let q = [ld(src.add(32)), ld(src.add(64))];
    let mut u = [_mm256_setzero_si256(); 8];
    for (c, uc) in u.iter_mut().enumerate() {
        let (h, j) = (c / 4, c % 4);
        let lo = _mm256_and_si256(shift(q[h], -2 * j as i32), three);
        let hi = _mm256_and_si256(shift(hm, 2 - c as i32), four);
        *uc = _mm256_or_si256(lo, hi);
    }
    let u = to_lanes(&u);
    let low2_at6 = |v: __m256i| _mm256_slli_epi16::<6>(_mm256_and_si256(v, three));
    let b0 = _mm256_or_si256(_mm256_or_si256(u[0], _mm256_slli_epi16::<3>(u[1])), low2_at6(u[6]));
    let b1 = _mm256_or_si256(_mm256_or_si256(u[2], _mm256_slli_epi16::<3>(u[3])), low2_at6(u[7]));
    let tops = _mm256_or_si256(
        _mm256_slli_epi16::<4>(_mm256_and_si256(u[6], four)),
        _mm256_slli_epi16::<5>(_mm256_and_si256(u[7], four)),
    );
    let b2 = _mm256_or_si256(_mm256_or_si256(u[4], _mm256_slli_epi16::<3>(u[5])), tops);
    st(dst, b0);
    st(dst.add(32), b1);
    st(dst.add(64), b2);
    let packed = crate::packed::q3k_planes::pack_scales(&*(src.add(96) as *const [u8; 12]));
    std::ptr::copy_nonoverlapping(packed.as_ptr(), dst.add(96), 12);
    std::ptr::copy_nonoverlapping(src.add(108), dst.add(108), 2);
}

/// Byte pairs of the scales' windows: word `s % 8` of lane `s / 8` takes
/// bytes `2 + 6s / 8` and `3 + 6s / 8` of the 16 bytes from the block's 94.
#[repr(C, align(32))]
struct ScaleCtrl([u8; 32]);
static SCALE_CTRL: ScaleCtrl = {
    let mut t = [0u8; 32];
    let mut s = 0;
    while s < 16 {
        let at = 2 * (s % 8) + 16 * (s / 8);
        t[at] = (2 + 6 * s / 8) as u8;
        t[at + 1] = (3 + 6 * s / 8) as u8;
        s += 1;
    }
    ScaleCtrl(t)
};

/// Word `s`: `2^(10 − 6s % 8)`, which lifts scale `s` to the word's top.
#[repr(C, align(32))]
struct ScaleMul([u16; 16]);
static SCALE_MUL: ScaleMul = {
    let mut t = [0u16; 16];
    let mut s = 0;
    while s < 16 {
        t[s] = 1 << (10 - 6 * s % 8);
        s += 1;
    }
    ScaleMul(t)
};

/// The sixteen sub-block scales `code − 32` of a recoded block at `x` as
/// words (word `s`: sub-block `s`): a `vpshufb` of the bytes from 94 (two
/// bytes before the scales, so the load stays within the block), a
/// `vpmullw`, a `vpsrlw` and a `vpsubw`.
///
/// # Safety
/// AVX2; `x` a recoded block of 110 bytes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn plane_scales(x: *const u8) -> __m256i {
    let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(x.add(94) as *const __m128i));
    let w = _mm256_shuffle_epi8(b, _mm256_load_si256(SCALE_CTRL.0.as_ptr() as *const __m256i));
    let top = _mm256_mullo_epi16(w, _mm256_load_si256(SCALE_MUL.0.as_ptr() as *const __m256i));
    _mm256_sub_epi16(_mm256_srli_epi16::<10>(top), _mm256_set1_epi16(32))
}

/// The eight chunks' codes `u` (0..7) of a recoded block's planes.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn plane_codes(b0: __m256i, b1: __m256i, b2: __m256i) -> [__m256i; 8] {
    let (three, four, seven) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4), _mm256_set1_epi8(7));
    let top = |b: __m256i, hi: __m256i| {
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<6>(b), three), _mm256_and_si256(hi, four))
    };
    [
        _mm256_and_si256(b0, seven),
        _mm256_and_si256(_mm256_srli_epi16::<3>(b0), seven),
        _mm256_and_si256(b1, seven),
        _mm256_and_si256(_mm256_srli_epi16::<3>(b1), seven),
        _mm256_and_si256(b2, seven),
        _mm256_and_si256(_mm256_srli_epi16::<3>(b2), seven),
        top(b0, _mm256_srli_epi16::<4>(b2)),
        top(b1, _mm256_srli_epi16::<5>(b2)),
    ]
}

/// [`crate::packed::q3k_planes::decode`] of one block.
///
/// # Safety
/// As for [`encode`].
#[target_feature(enable = "avx2")]
pub unsafe fn decode(src: *const u8, dst: *mut u8) {
    let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let u = from_lanes(&plane_codes(ld(src), ld(src.add(32)), ld(src.add(64))));
    let mut hm = _mm256_setzero_si256();
    let mut q = [_mm256_setzero_si256(); 2];
    for (c, &uc) in u.iter().enumerate() {
        let (h, j) = (c / 4, c % 4);
        q[h] = _mm256_or_si256(q[h], shift(_mm256_and_si256(uc, three), 2 * j as i32));
        hm = _mm256_or_si256(hm, shift(_mm256_and_si256(uc, four), c as i32 - 2));
    }
    st(dst, hm);
    st(dst.add(32), q[0]);
    st(dst.add(64), q[1]);
    let sc = crate::packed::q3k_planes::unpack_scales(&*(src.add(96) as *const [u8; 12]));
    std::ptr::copy_nonoverlapping(sc.as_ptr(), dst.add(96), 12);
    std::ptr::copy_nonoverlapping(src.add(108), dst.add(108), 2);
}

#[cfg(test)]
mod tests {
    use crate::packed::q3k_planes;

    /// Both ways equal the byte loops on random blocks.
    #[test]
    fn vector_recoding_equals_scalar() {
        if !is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        let mut rng = super::super::XorShift(0x0DDB_1A5E_5BAD_5EED);
        for _ in 0..100 {
            let src: Vec<u8> = (0..q3k_planes::BLOCK_BYTES).map(|_| rng.next() as u8).collect();
            let (mut want, mut got) = (vec![0u8; 110], vec![0u8; 110]);
            q3k_planes::encode(&src, &mut want);
            unsafe { super::encode(src.as_ptr(), got.as_mut_ptr()) };
            assert_eq!(got, want, "encode");
            let mut back = vec![0u8; 110];
            unsafe { super::decode(want.as_ptr(), back.as_mut_ptr()) };
            assert_eq!(back, src, "decode");
        }
    }

    /// The planes kernels (four-row and row-range, one and three activation
    /// rows, a range not a multiple of four rows) equal the scalar dot of
    /// the file-layout rows bit for bit.
    #[test]
    fn planes_kernels_equal_scalar() {
        use crate::quant::{self, q8_k};
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") || !is_x86_feature_detected!("f16c") {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        let mut rng = super::super::XorShift(0xA5A5_5A5A_0F0F_F0F0);
        let scalar = quant::scalar::dot_fn(crate::DType::Q3_K);
        let rows = 7;
        for nb in [1usize, 3, 8] {
            let (n, rb) = (256 * nb, 110 * nb);
            let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
            for blk in w.chunks_exact_mut(110) {
                // A finite scale: f16 0.0–1.0.
                blk[108..110].copy_from_slice(&((rng.next() % 0x3C00) as u16).to_le_bytes());
            }
            let mut pw = vec![0u8; w.len()];
            for (s, d) in w.chunks_exact(110).zip(pw.chunks_exact_mut(110)) {
                q3k_planes::encode(s, d);
            }
            // One activation row, a tile, and more than a tile (17).
            for m in [1usize, 3, 17] {
                let x: Vec<f32> = (0..m * n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); m * nb];
                q8_k::quantize(&x, &mut a);
                let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
                let want = |r: usize, j: usize| unsafe { scalar(n, w[r * rb..].as_ptr(), ap.add(j * 292 * nb)) };
                let mut got = [0f32; 4];
                unsafe { super::super::avx2_q3k_rows::planes_dot4_q3_k(n, pw.as_ptr(), rb, ap, got.as_mut_ptr()) };
                for (r, g) in got.iter().enumerate() {
                    assert_eq!(g.to_bits(), want(r, 0).to_bits(), "dot4 row {r}, {nb} blocks: {g} vs {}", want(r, 0));
                }
                let mut y = vec![0f32; m * rows];
                unsafe {
                    super::super::avx2_q3k_rows::rows_q3_k(
                        n,
                        pw.as_ptr(),
                        rb,
                        rows,
                        ap,
                        292 * nb,
                        m,
                        y.as_mut_ptr(),
                        rows,
                    )
                };
                for j in 0..m {
                    for r in 0..rows {
                        let g = y[j * rows + r];
                        assert_eq!(
                            g.to_bits(),
                            want(r, j).to_bits(),
                            "rows: row {r}, act {j} of {m}, {nb} blocks: {g} vs {}",
                            want(r, j)
                        );
                    }
                }
            }
        }
    }
}
