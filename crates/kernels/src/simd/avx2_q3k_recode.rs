//! Q3_K blocks into and out of code planes ([`crate::packed::q3k_planes`]) in
//! AVX2 code: the loader recodes every Q3_K block once, and the prefill GEMM
//! reads recoded rows back in the file layout once per call and block (the
//! byte loops take ~250 cycles a block, a tenth of a prefill's time there).

use std::arch::x86_64::*;

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn st(p: *mut u8, v: __m256i) {
    _mm256_storeu_si256(p as *mut __m256i, v)
}

/// `v` shifted left by `s` bits (right by `−s`) in 16-bit lanes, `s` a
/// constant after inlining. Callers mask so no bit crosses a byte.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn shift(v: __m256i, s: i32) -> __m256i {
    if s >= 0 {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(s))
    } else {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(-s))
    }
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
    std::ptr::copy_nonoverlapping(src.add(96), dst.add(96), 14);
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
    let u = plane_codes(ld(src), ld(src.add(32)), ld(src.add(64)));
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
    std::ptr::copy_nonoverlapping(src.add(96), dst.add(96), 14);
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

    /// The planes kernel equals the scalar dot of the file-layout rows bit
    /// for bit, whichever layout this process packs Q3_K in.
    #[test]
    fn planes_dot4_equals_scalar() {
        use crate::quant::{self, q8_k};
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") || !is_x86_feature_detected!("f16c") {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        let mut rng = super::super::XorShift(0xA5A5_5A5A_0F0F_F0F0);
        let scalar = quant::scalar::dot_fn(crate::DType::Q3_K);
        for nb in [1usize, 3, 8] {
            let (n, rb) = (256 * nb, 110 * nb);
            let mut w: Vec<u8> = (0..4 * rb).map(|_| rng.next() as u8).collect();
            for blk in w.chunks_exact_mut(110) {
                // A finite scale: f16 0.0–1.0.
                blk[108..110].copy_from_slice(&((rng.next() % 0x3C00) as u16).to_le_bytes());
            }
            let mut pw = vec![0u8; w.len()];
            for (s, d) in w.chunks_exact(110).zip(pw.chunks_exact_mut(110)) {
                q3k_planes::encode(s, d);
            }
            let x: Vec<f32> = (0..n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); nb];
            q8_k::quantize(&x, &mut a);
            let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
            let mut got = [0f32; 4];
            unsafe { super::super::avx2_kq4::planes_dot4_q3_k(n, pw.as_ptr(), rb, ap, got.as_mut_ptr()) };
            for (r, g) in got.iter().enumerate() {
                let want = unsafe { scalar(n, w[r * rb..].as_ptr(), ap) };
                assert_eq!(g.to_bits(), want.to_bits(), "row {r}, {nb} blocks: {g} vs {want}");
            }
        }
    }
}
