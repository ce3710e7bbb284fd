//! AVX-512 read of a lanes16 group ([`crate::packed::lanes16`]) back into
//! the file layout: the prefill GEMM of the K-quants decodes whole file-
//! layout rows, and a packed weight reaches it through this.
//!
//! Why: the layout is a transpose (vector `v` of a super-block holds word `v`
//! of all sixteen rows), and undoing it one 4-byte word at a time took 13% of
//! a Q6_K prefill (`bench_matmul`, m = 256, one thread). Here sixteen vectors
//! (sixteen words of the sixteen rows) are transposed in registers with 64
//! shuffles and each row's 64 bytes leave in one store.

use std::arch::x86_64::*;

/// Rows of a group (the vector's sixteen dword lanes).
const ROWS: usize = crate::packed::LANES16_ROWS;

/// Transposes a 16 × 16 matrix of dwords held as sixteen row vectors: on
/// return `v[c]` lane `r` is the input's `v[r]` lane `c`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose16(v: &mut [__m512i; ROWS]) {
    // Within each 128-bit lane L: t[2i], t[2i+1] interleave rows 2i, 2i+1.
    let mut t = [_mm512_setzero_si512(); ROWS];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    // u[4i + k] lane L: column 4L + k of rows 4i..4i+4.
    let mut u = [_mm512_setzero_si512(); ROWS];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // Column 4L + k gathers lane L of u[k], u[4 + k], u[8 + k], u[12 + k]: a
    // 4 × 4 transpose of 128-bit lanes.
    for k in 0..4 {
        let s0 = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let s1 = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let s2 = _mm512_shuffle_i32x4::<0xEE>(u[k], u[4 + k]);
        let s3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + k], u[12 + k]);
        v[k] = _mm512_shuffle_i32x4::<0x88>(s0, s1);
        v[4 + k] = _mm512_shuffle_i32x4::<0xDD>(s0, s1);
        v[8 + k] = _mm512_shuffle_i32x4::<0x88>(s2, s3);
        v[12 + k] = _mm512_shuffle_i32x4::<0xDD>(s2, s3);
    }
}

/// All sixteen rows of one lanes16 group of `nb` blocks of `bb` bytes with no
/// turned head (`head_last` 0), back in the file layout: `dst` gets sixteen
/// rows of `nb · bb` bytes. Equals [`crate::packed::lanes16`]'s scalar
/// `unpack_group` byte for byte (tested).
///
/// # Safety
/// AVX-512 F CPU.
#[target_feature(enable = "avx512f")]
pub unsafe fn unpack_group(bb: usize, nb: usize, group: &[u8], dst: &mut [u8]) {
    let (rb, words, tail) = (nb * bb, bb / 4, bb % 4);
    assert!(group.len() >= ROWS * rb && dst.len() >= ROWS * rb);
    let (src, out) = (group.as_ptr(), dst.as_mut_ptr());
    for b in 0..nb {
        let blk = src.add(b * ROWS * bb);
        let mut v0 = 0;
        while v0 < words {
            let n = (words - v0).min(ROWS);
            // Masked loads (vectors past `n` read as zero and touch no memory):
            // a loop of `n` plain loads compiles to a memcpy into the stack.
            let mut v: [__m512i; ROWS] = std::array::from_fn(|i| {
                let k: __mmask16 = if i < n { !0 } else { 0 };
                _mm512_maskz_loadu_epi32(k, blk.wrapping_add((v0 + i) * 4 * ROWS) as *const i32)
            });
            transpose16(&mut v);
            // Row r's words v0..v0+n: n dwords of one store.
            let mask: __mmask16 = if n == ROWS { !0 } else { (1u16 << n) - 1 };
            for (r, x) in v.iter().enumerate() {
                _mm512_mask_storeu_epi32(out.add(r * rb + b * bb + 4 * v0) as *mut i32, mask, *x);
            }
            v0 += n;
        }
        // The last `bb mod 4` bytes of each row, stored row after row.
        let tails = blk.add(words * 4 * ROWS);
        // Q6_K and Q3_K have 2 (a copy of `tail` bytes would be a memmove call
        // per row: 4% of a Q6_K prefill).
        let to = out.add(b * bb + 4 * words);
        if tail == 2 {
            let pairs = (tails as *const [u16; ROWS]).read_unaligned();
            for (r, p) in pairs.into_iter().enumerate() {
                (to.add(r * rb) as *mut u16).write_unaligned(p);
            }
        } else if tail > 0 {
            copy_tails(tails, tail, to, rb);
        }
    }
}

/// Row `r`'s `tail` bytes from `tails + tail·r` to `to + r·rb` (tails other
/// than 2; none of today's types has one).
#[inline(never)]
unsafe fn copy_tails(tails: *const u8, tail: usize, to: *mut u8, rb: usize) {
    for r in 0..ROWS {
        std::ptr::copy_nonoverlapping(tails.add(tail * r), to.add(r * rb), tail);
    }
}
