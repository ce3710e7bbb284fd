//! The sixteen-row transposed layout ("lanes16") of the K-quants' decode
//! kernels: every super-block of sixteen rows stored so that one 64-byte
//! vector holds the same four bytes of all sixteen rows.
//!
//! Why: at one activation row the K-quant kernels are compute bound on AMD
//! Zen 4 (issue 23: Q4_K decode stopped near 20 GB/s, ~40 vector ops per
//! 144-byte super-block and row, most of them per-row scale work and a
//! horizontal reduction). With lane `ℓ` = row `ℓ`, a `vpdpbusd` multiplies
//! four codes of each of sixteen rows by four activations broadcast from
//! memory, each sub-block's scale multiplies sixteen rows at once, and the
//! result needs no reduction: about a third of the instructions per byte,
//! with the same bytes. Transposing at load instead of in registers is what
//! makes it pay at `m = 1` (docs/ARCHITECTURE.md, "On AMD Zen 4 the one-row
//! case loses").
//!
//! Layout of one group (16 rows of `nb` super-blocks of `bb` bytes; the
//! group takes exactly its sixteen rows' bytes, so row `16g` still starts at
//! `16g · row_bytes` and any sixteen-aligned row range is a valid matrix):
//!
//! ```text
//! super-block b: [v0: bytes 0..4 of rows 0..16] [v1: bytes 4..8 of rows 0..16] …  (⌊bb/4⌋ × 64 bytes)
//!                [tail: bytes 4⌊bb/4⌋..bb of rows 0..16]                          (16 · (bb mod 4) bytes)
//! super-block b + 1: …
//! ```
//!
//! The kernel of each type reads the fields at their file offsets: a field at
//! byte `o` (a multiple of 4) of the block is vector `o / 4`. Q4_K: vector 0
//! holds `(d, dmin)` per lane, vectors 1–3 the three scale words, vectors
//! 4 + 8c … 11 + 8c chunk `c` of the codes.
//!
//! IQ4_NL (18-byte blocks: an f16 `d`, then 16 code bytes) stores each block
//! as its codes then its `d` (`head_last` = 2 in the dispatch table): vectors
//! 0–3 hold codes `4v..4v+4` of the sixteen rows and the 32-byte tail the
//! sixteen `d`, one f16 vector. Kept in file order the codes would straddle
//! the words, and every vector would need masking.
//!
//! Q5_0 and Q5_1 (`[d, (m,) qh, qs]`) store their scales last too, so vector
//! 0 holds the rows' `qh` words, vectors 1–4 the codes as IQ4_NL's and the
//! tail the scales; their `qh` is bit-sliced ([`slice_qh`], `sliced_qh` in
//! the dispatch table) so that a kernel finds the fifth bits of a code
//! vector with one shift ([`crate::simd::avx2_rows16_q5`]). Q4_1 (`[d, m,
//! qs]`, `head_last` = 4 at AVX2) is the same without the `qh` vector, its
//! tail split (`split_head`): the sixteen `d`, then the sixteen `m`, so its
//! kernel converts each with one `vcvtph2ps` from memory.

use crate::quant::{self, Rows16Fn};
use crate::DType;

use super::LANES16_ROWS as ROWS;

/// Byte offset, inside a group's super-block of `bb`-byte blocks, of byte
/// `k` of row `r`.
#[inline]
fn offset(bb: usize, r: usize, k: usize) -> usize {
    let words = bb / 4;
    if k < 4 * words {
        k / 4 * 4 * ROWS + r * 4 + k % 4
    } else {
        words * 4 * ROWS + r * (bb % 4) + (k - 4 * words)
    }
}

/// The largest block the layout takes (Q6_K: 210 bytes).
const MAX_BLOCK: usize = 256;

/// How a type's blocks are stored ([`crate::dispatch::Packing::Lanes16`]):
/// their first `head` bytes (the scales) after the rest, and with
/// `sliced_qh` the word that then comes first (Q5_0's and Q5_1's `qh`) in
/// [`slice_qh`]'s bit order. With `split_head` the last word (a 4-byte head:
/// Q4_1's f16 `d` and `m`) is stored as the sixteen rows' first halves, then
/// their second halves: sixteen `d`, then sixteen `m`, each one f16 vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Form {
    pub head: usize,
    pub sliced_qh: bool,
    pub split_head: bool,
}

impl Form {
    /// Blocks stored as they are in the file.
    pub const FILE: Form = Form { head: 0, sliced_qh: false, split_head: false };
}

/// The 64-byte vector `v` of a group's block, rows `r`'s word: where its two
/// halves go (`(first, second)` byte offsets), split as [`Form`] says.
#[inline]
fn word_halves(bb: usize, form: Form, r: usize, v: usize) -> (usize, usize) {
    let o = offset(bb, r, 4 * v);
    if form.split_head && 4 * v == bb - 4 {
        let base = 4 * v * ROWS;
        (base + 2 * r, base + 2 * ROWS + 2 * r)
    } else {
        (o, o + 2)
    }
}

/// A Q5 `qh` word (bit `j`: the fifth bit of value `j`) bit-sliced: byte
/// `k` holds at bit `i` the fifth bit of value `4i + k`, so byte `k` of a
/// code vector `v` finds its low nibble's bit at bit `v` and its high
/// nibble's (value `16 + 4v + k`) at bit `4 + v`.
pub fn slice_qh(qh: u32) -> u32 {
    (0..32).fold(0, |s, j| s | ((qh >> j) & 1) << (8 * (j % 4) + j / 4))
}

/// The inverse of [`slice_qh`].
pub fn unslice_qh(s: u32) -> u32 {
    (0..32).fold(0, |qh, j| qh | ((s >> (8 * (j % 4) + j / 4)) & 1) << j)
}

/// `block` (file layout, `bb` bytes) as stored under `form`, into `out`.
fn turn(form: Form, block: &[u8], out: &mut [u8]) {
    let (bb, head) = (block.len(), form.head);
    out[..bb - head].copy_from_slice(&block[head..]);
    out[bb - head..bb].copy_from_slice(&block[..head]);
    if form.sliced_qh {
        let qh = u32::from_le_bytes([out[0], out[1], out[2], out[3]]);
        out[..4].copy_from_slice(&slice_qh(qh).to_le_bytes());
    }
}

/// The inverse of [`turn`]: a stored block back in the file layout.
fn unturn(form: Form, stored: &mut [u8], out: &mut [u8]) {
    let (bb, head) = (stored.len(), form.head);
    if form.sliced_qh {
        let s = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
        stored[..4].copy_from_slice(&unslice_qh(s).to_le_bytes());
    }
    out[head..bb].copy_from_slice(&stored[..bb - head]);
    out[..head].copy_from_slice(&stored[bb - head..bb]);
}

/// Packs one group: `src` is sixteen rows of `nb` blocks of `bb` bytes in
/// the file layout, `dst` the same length. Each block is stored as
/// [`Form`] says.
pub(super) fn pack_group(bb: usize, form: Form, nb: usize, src: &[u8], dst: &mut [u8]) {
    assert!(bb <= MAX_BLOCK && form.head < bb && (!form.sliced_qh || bb >= form.head + 4));
    assert!(!form.split_head || (form.head == 4 && bb.is_multiple_of(4)));
    let rb = nb * bb;
    let mut turned = [0u8; MAX_BLOCK];
    for r in 0..ROWS {
        for b in 0..nb {
            let blk = &src[r * rb + b * bb..][..bb];
            let stored = if form == Form::FILE {
                blk
            } else {
                turn(form, blk, &mut turned[..bb]);
                &turned[..bb]
            };
            let out = &mut dst[b * ROWS * bb..][..ROWS * bb];
            for (v, word) in stored.chunks(4).enumerate() {
                if word.len() == 4 {
                    let (h0, h1) = word_halves(bb, form, r, v);
                    out[h0..h0 + 2].copy_from_slice(&word[..2]);
                    out[h1..h1 + 2].copy_from_slice(&word[2..]);
                } else {
                    let o = offset(bb, r, 4 * v);
                    out[o..o + word.len()].copy_from_slice(word);
                }
            }
        }
    }
}

/// Row `r` of one group back in the file layout (`dst`: `nb · bb` bytes).
/// The prefill GEMM reads packed rows through this, once per row and call,
/// so it copies words, not bytes.
pub(super) fn unpack_row(bb: usize, form: Form, nb: usize, group: &[u8], r: usize, dst: &mut [u8]) {
    let mut turned = [0u8; MAX_BLOCK];
    for b in 0..nb {
        let blk = &group[b * ROWS * bb..][..ROWS * bb];
        let out = &mut dst[b * bb..(b + 1) * bb];
        let stored = if form == Form::FILE { &mut *out } else { &mut turned[..bb] };
        for (v, word) in stored.chunks_mut(4).enumerate() {
            if word.len() == 4 {
                let (h0, h1) = word_halves(bb, form, r, v);
                word[..2].copy_from_slice(&blk[h0..h0 + 2]);
                word[2..].copy_from_slice(&blk[h1..h1 + 2]);
            } else {
                let o = offset(bb, r, 4 * v);
                word.copy_from_slice(&blk[o..o + word.len()]);
            }
        }
        if form != Form::FILE {
            unturn(form, &mut turned[..bb], out);
        }
    }
}

/// All sixteen rows of one group back in the file layout (`dst`: `16 · nb ·
/// bb` bytes, row after row): the prefill GEMM's read of a packed unit, by
/// register transposes on AVX-512 ([`crate::simd::avx512_unpack16`]).
pub(super) fn unpack_group(bb: usize, form: Form, nb: usize, group: &[u8], dst: &mut [u8]) {
    // The CPU's features, not `isa::active()`: the level's self-check runs
    // the GEMM that calls this (a lanes16 weight exists only where AVX-512
    // kernels read it, and both reads give the same bytes, tested).
    #[cfg(target_arch = "x86_64")]
    if form == Form::FILE && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F checked just above.
        unsafe { crate::simd::avx512_unpack16::unpack_group(bb, nb, group, dst) };
        return;
    }
    unpack_group_scalar(bb, form, nb, group, dst);
}

/// [`unpack_group`] one word move at a time: the reference of the SIMD ones.
pub(crate) fn unpack_group_scalar(bb: usize, form: Form, nb: usize, group: &[u8], dst: &mut [u8]) {
    let (rb, words) = (nb * bb, bb / 4);
    assert!(group.len() >= ROWS * rb && dst.len() >= ROWS * rb);
    if form != Form::FILE {
        for (r, row) in dst.chunks_exact_mut(rb).take(ROWS).enumerate() {
            unpack_row(bb, form, nb, group, r, row);
        }
        return;
    }
    for b in 0..nb {
        let blk = &group[b * ROWS * bb..][..ROWS * bb];
        for v in 0..words {
            let src = &blk[v * 4 * ROWS..][..4 * ROWS];
            for r in 0..ROWS {
                let o = r * rb + b * bb + 4 * v;
                dst[o..o + 4].copy_from_slice(&src[4 * r..4 * r + 4]);
            }
        }
        let tail = bb % 4;
        if tail > 0 {
            let src = &blk[words * 4 * ROWS..][..tail * ROWS];
            for r in 0..ROWS {
                let o = r * rb + b * bb + 4 * words;
                dst[o..o + tail].copy_from_slice(&src[tail * r..tail * (r + 1)]);
            }
        }
    }
}

thread_local! {
    /// One unpacked row for the scalar kernel.
    static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The scalar sixteen-row kernel of a lanes16 type: unpacks each row and runs
/// the scalar reference dot against each activation row (so its results are
/// the reference's, as the SIMD kernels' are).
///
/// # Safety
/// As for [`Rows16Fn`], `rows` a multiple of 16.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_rows16(
    dtype: DType,
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let dot = quant::scalar::dot_fn(dtype);
    ROW.with(|row| {
        let mut row = row.borrow_mut();
        row.resize(row_bytes, 0);
        for g in 0..rows / ROWS {
            let group = std::slice::from_raw_parts(w.add(g * ROWS * row_bytes), ROWS * row_bytes);
            for r in 0..ROWS {
                super::unpack_row(dtype, n, group, r, &mut row);
                for j in 0..m {
                    *y.add(j * y_stride + g * ROWS + r) = dot(n, row.as_ptr(), a.add(j * a_stride));
                }
            }
        }
    })
}

macro_rules! scalar_rows16_of {
    ($name:ident, $dtype:expr) => {
        /// The scalar sixteen-row kernel (see `scalar_rows16`).
        ///
        /// # Safety
        /// As for [`Rows16Fn`].
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $name(
            n: usize,
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            a: *const u8,
            a_stride: usize,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            scalar_rows16($dtype, n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
        }
    };
}

scalar_rows16_of!(scalar_rows16_q4_k, DType::Q4_K);
scalar_rows16_of!(scalar_rows16_q5_k, DType::Q5_K);
scalar_rows16_of!(scalar_rows16_q2_k, DType::Q2_K);
scalar_rows16_of!(scalar_rows16_iq4_xs, DType::IQ4_XS);
scalar_rows16_of!(scalar_rows16_q6_k, DType::Q6_K);
scalar_rows16_of!(scalar_rows16_q3_k, DType::Q3_K);
scalar_rows16_of!(scalar_rows16_iq4_nl, DType::IQ4_NL);
scalar_rows16_of!(scalar_rows16_q5_0, DType::Q5_0);
scalar_rows16_of!(scalar_rows16_q5_1, DType::Q5_1);
scalar_rows16_of!(scalar_rows16_q4_1, DType::Q4_1);

/// Checks the signatures against [`Rows16Fn`].
const _: [Rows16Fn; 10] = [
    scalar_rows16_q4_k,
    scalar_rows16_q5_k,
    scalar_rows16_q2_k,
    scalar_rows16_iq4_xs,
    scalar_rows16_q6_k,
    scalar_rows16_q3_k,
    scalar_rows16_iq4_nl,
    scalar_rows16_q5_0,
    scalar_rows16_q5_1,
    scalar_rows16_q4_1,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_a_permutation() {
        for bb in [84, 110, 136, 144, 176, 210] {
            let mut seen = vec![false; ROWS * bb];
            for r in 0..ROWS {
                for k in 0..bb {
                    let o = offset(bb, r, k);
                    assert!(!seen[o], "bb {bb}: row {r} byte {k} lands on a taken byte");
                    seen[o] = true;
                }
            }
        }
        // A field at byte 4v is vector v: lane r holds row r's four bytes.
        assert_eq!(offset(144, 3, 16), 4 * 64 + 12);
        assert_eq!(offset(210, 5, 209), 52 * 64 + 10 + 1);
    }

    /// The AVX-512 group read equals the scalar one at every block size of
    /// the lanes16 types (whole sixteen-word runs, short runs, 2-byte tails).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_unpack_equals_scalar() {
        if !crate::isa::Isa::Avx512.is_supported() {
            eprintln!("no AVX-512 here: the SIMD unpack is not reachable");
            return;
        }
        for (bb, nb) in [(84, 3), (110, 2), (136, 2), (144, 4), (176, 1), (210, 3), (18, 5)] {
            let src: Vec<u8> = (0..ROWS * nb * bb).map(|i| (i * 13 + i / 97) as u8).collect();
            let mut packed = vec![0u8; src.len()];
            pack_group(bb, Form::FILE, nb, &src, &mut packed);
            let (mut want, mut got) = (vec![0u8; src.len()], vec![0xAAu8; src.len()]);
            unpack_group_scalar(bb, Form::FILE, nb, &packed, &mut want);
            // SAFETY: AVX-512 F checked above.
            unsafe { crate::simd::avx512_unpack16::unpack_group(bb, nb, &packed, &mut got) };
            assert_eq!(want, src, "bb {bb}: scalar");
            assert_eq!(got, src, "bb {bb}: AVX-512");
        }
    }

    #[test]
    fn blocks_with_their_head_last_come_back_whole() {
        let cases = [
            (18, 2, false, 3),
            (144, 0, false, 2),
            (18, 0, false, 1),
            (34, 2, false, 2),
            (22, 2, true, 3),
            (24, 4, true, 2),
            (20, 4, false, 3),
        ];
        for (bb, head, sliced_qh, nb) in cases {
            // Q4_1's (20 bytes, a 4-byte head, no qh) with its head split.
            let form = Form { head, sliced_qh, split_head: bb == 20 };
            let src: Vec<u8> = (0..ROWS * nb * bb).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut packed = vec![0u8; src.len()];
            pack_group(bb, form, nb, &src, &mut packed);
            let mut rows = vec![0u8; src.len()];
            unpack_group(bb, form, nb, &packed, &mut rows);
            assert_eq!(rows, src, "bb {bb} {form:?}: group");
            for r in 0..ROWS {
                let mut row = vec![0u8; nb * bb];
                unpack_row(bb, form, nb, &packed, r, &mut row);
                assert_eq!(row, src[r * nb * bb..(r + 1) * nb * bb], "bb {bb} {form:?}: row {r}");
            }
            let (b, r) = (1, 5);
            let blk = &src[r * nb * bb + b * bb..][..bb];
            let g = &packed[b * ROWS * bb..];
            if bb == 20 {
                // Q4_1: codes 4v..4v+4 of row r are vector v's lane r; the
                // tail the sixteen d's, then the sixteen m's.
                assert_eq!(g[64 + 4 * r..64 + 4 * r + 4], blk[8..12]);
                assert_eq!(g[256 + 2 * r..256 + 2 * r + 2], blk[0..2]);
                assert_eq!(g[288 + 2 * r..288 + 2 * r + 2], blk[2..4]);
            }
            if bb == 18 && head == 2 {
                // Codes 4v..4v+4 of row r are vector v's lane r; the d's the tail.
                assert_eq!(g[64 + 4 * r..64 + 4 * r + 4], blk[6..10]);
                assert_eq!(g[256 + 2 * r..256 + 2 * r + 2], blk[0..2]);
            }
            if sliced_qh {
                // Vector 0 lane r: the row's qh, sliced; then the codes; the scales last.
                let qh = u32::from_le_bytes(blk[head..head + 4].try_into().unwrap());
                assert_eq!(g[4 * r..4 * r + 4], slice_qh(qh).to_le_bytes());
                assert_eq!(g[64 + 4 * r..64 + 4 * r + 4], blk[head + 4..head + 8]);
                assert_eq!(g[320 + head * r..320 + head * (r + 1)], blk[..head]);
            }
        }
    }

    #[test]
    fn sliced_qh_puts_each_vectors_bits_in_its_bytes() {
        for qh in [1u32, 0x8000_0000, 0xDEAD_BEEF, 0x1234_5678, u32::MAX] {
            let s = slice_qh(qh);
            assert_eq!(unslice_qh(s), qh);
            for j in 0..32 {
                // Value j = 4i + k: byte k, bit i.
                let (i, k) = (j / 4, j % 4);
                assert_eq!((s >> (8 * k + i)) & 1, (qh >> j) & 1, "qh {qh:#x} value {j}");
            }
        }
    }
}
