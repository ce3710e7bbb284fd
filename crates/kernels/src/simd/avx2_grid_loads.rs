//! AVX2 decode dots for the grid I-quants (IQ3_S, IQ3_XXS, IQ2_XS) on CPUs
//! whose gathers are slow: the grid entries read by broadcast loads and put
//! together by blends, instead of `vpgatherdd` / `vpgatherdq`.
//!
//! Why: on the AMD EPYC (Zen 3) VM a `vpgatherdd` of eight dwords took about
//! 17 cycles (a loop of independent gathers), and the gather kernels in
//! [`super::avx2_lowk`] spent most of each super-block in them: IQ3_S took
//! 47 ns a super-block-row in L2 (eight gathers, ~140 of ~145 cycles), and
//! a 1.1B IQ3_S file decoded at 0.89× llama.cpp's AVX2 build (which builds
//! its entries from scalar loads). Here each entry is one `vpbroadcastd`
//! (`vpbroadcastq` for IQ2_XS's 8-byte rows) from the grid, a load with no
//! shuffle, its index read by `movzx`; a 32-value chunk's eight entries meet
//! in seven `vpblendd` (any vector pipe). IQ3_S's 64 nine-bit indices are
//! built in vectors once a block (the low bytes widened, the ninth bits from
//! a 256-entry table of word masks) and stored; IQ3_XXS's are its `qs` bytes,
//! IQ2_XS's the low nine bits of its words. The rest is the gather kernels':
//! the signs as byte masks that negate the activations, `vpmaddubsw`,
//! `vpmaddwd` with the sub-block scales.
//!
//! Measured (Zen 3 VM, `bench_kdot 256 2048`, minimum of alternating runs):
//! IQ3_S 42 → 31 ns, IQ3_XXS 50 → 38 ns a super-block-row. IQ3_S then built
//! block `i + 1`'s indices before block `i`'s lookups (two buffers), so the
//! lookups' `movzx` no longer wait on the stores just made: 33.6 → 27.5 ns
//! (minima of ten alternating runs), decode 11.4 → 12.5 tok/s (four pairs).
//!
//! Which CPUs take them: [`super::super::dispatch::Feature::SlowGather`].
//!
//! Numerics: each block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s, so every kernel equals scalar bit for bit.

use crate::quant::iq3_s;
use crate::quant::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};
use std::arch::x86_64::*;

/// Whether this CPU's `vpgatherdd` is slow enough that the IQ3_S dot does
/// better on broadcast loads: AMD's (and Hygon's) CPUs, which take the AVX2
/// kernels only up to Zen 3 (Zen 4 on has AVX-512). Measured on Zen 3 only;
/// Intel's AVX2 CPUs keep the gathers, as measured there before.
/// `SHARDLM_SLOW_GATHER=1` or `=0` overrides the guess.
pub fn slow_gather() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("SHARDLM_SLOW_GATHER").map(|v| v.trim().to_string()) {
        Ok(v) if v == "1" => true,
        Ok(v) if v == "0" => false,
        _ => {
            // SAFETY: cpuid leaf 0 exists on every x86-64 CPU.
            let r = __cpuid(0);
            let vendor = [r.ebx, r.edx, r.ecx].map(u32::to_le_bytes).concat();
            vendor == b"AuthenticAMD" || vendor == b"HygonGenuine"
        }
    })
}

/// `NINTH_BITS[h]`: word `k` = bit `k` of `h` moved to bit 8 (the ninth bit
/// of entry `k` of a chunk, from its `qh` byte `h`).
static NINTH_BITS: [[u16; 8]; 256] = {
    let mut t = [[0u16; 8]; 256];
    let mut h = 0;
    while h < 256 {
        let mut k = 0;
        while k < 8 {
            t[h][k] = (((h >> k) & 1) as u16) << 8;
            k += 1;
        }
        h += 1;
    }
    t
};

/// `vpshufb` controls: word `ib` of each 128-bit half in every word.
#[repr(C, align(32))]
struct WordCtrl([[u8; 32]; 8]);
static WORD_CTRL: WordCtrl = {
    let mut t = [[0u8; 32]; 8];
    let mut ib = 0;
    while ib < 8 {
        let mut b = 0;
        while b < 32 {
            t[ib][b] = (2 * ib + b % 2) as u8;
            b += 1;
        }
        ib += 1;
    }
    WordCtrl(t)
};

/// The 64 nine-bit grid indices of an IQ3_S block, in entry order.
#[repr(C, align(32))]
pub(super) struct Iq3sIndices([u16; 64]);

impl Default for Iq3sIndices {
    fn default() -> Self {
        Iq3sIndices([0; 64])
    }
}

impl Iq3sIndices {
    /// Index `16q + k` = `qs[16q + k] | bit k mod 8 of qh[2q + k / 8] << 8`:
    /// the low bytes widened, the ninth bits from [`NINTH_BITS`].
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn build(&mut self, x: &iq3_s::BlockIq3S) {
        for q in 0..4 {
            let lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(x.qs.as_ptr().add(16 * q) as *const __m128i));
            let hi = _mm256_loadu2_m128i(
                NINTH_BITS[x.qh[2 * q + 1] as usize].as_ptr() as *const __m128i,
                NINTH_BITS[x.qh[2 * q] as usize].as_ptr() as *const __m128i,
            );
            _mm256_store_si256(self.0.as_mut_ptr().add(16 * q) as *mut __m256i, _mm256_or_si256(lo, hi));
        }
    }

    /// The eight grid entries of 32-value chunk `ib`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn entries(&self, ib: usize) -> __m256i {
        entries_u16(self.0.as_ptr().add(8 * ib), IQ3S_GRID.as_ptr())
    }
}

/// [`WORD_CTRL`] of chunk `ib` (a load: the chunk loop is not unrolled).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn word_ctrl_at(ib: usize) -> __m256i {
    _mm256_load_si256(WORD_CTRL.0[ib].as_ptr() as *const __m256i)
}

/// `$name(ix, grid)`: the eight 4-byte grid entries `grid[ix[0..8]]` (indices
/// of type `$ity`, read as `$size ptr`) in lane order. Each index is read
/// with `movzx`, its entry by one `vpbroadcastd` from memory (a load, no
/// shuffle), and seven `vpblendd` (any vector pipe) put them together. In
/// asm, because LLVM rewrites it from intrinsics: blends of broadcast loads
/// became `vmovd` and `vpinsrd` (on the shuffle pipes), and indices stored
/// and read back became `vpextrw`, or all 64 broadcasts of a block were
/// hoisted and spilled (45–60 ns a super-block-row against 31).
macro_rules! chunk_entries {
    ($name:ident, $ity:ty, $size:literal) => {
        #[target_feature(enable = "avx2")]
        #[inline]
        unsafe fn $name(ix: *const $ity, grid: *const u32) -> __m256i {
            let v: __m256i;
            std::arch::asm!(
                concat!("movzx {t:e}, ", $size, " ptr [{ix}]"),
                "vpbroadcastd {v}, dword ptr [{g} + {t} * 4]",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o1}]"),
                "vpbroadcastd {a}, dword ptr [{g} + {t} * 4]",
                "vpblendd {v}, {v}, {a}, 0xAA",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o2}]"),
                "vpbroadcastd {a}, dword ptr [{g} + {t} * 4]",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o3}]"),
                "vpbroadcastd {b}, dword ptr [{g} + {t} * 4]",
                "vpblendd {a}, {a}, {b}, 0xAA",
                "vpblendd {v}, {v}, {a}, 0xCC",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o4}]"),
                "vpbroadcastd {a}, dword ptr [{g} + {t} * 4]",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o5}]"),
                "vpbroadcastd {b}, dword ptr [{g} + {t} * 4]",
                "vpblendd {a}, {a}, {b}, 0xAA",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o6}]"),
                "vpbroadcastd {b}, dword ptr [{g} + {t} * 4]",
                concat!("movzx {t:e}, ", $size, " ptr [{ix} + {o7}]"),
                "vpbroadcastd {c}, dword ptr [{g} + {t} * 4]",
                "vpblendd {b}, {b}, {c}, 0xAA",
                "vpblendd {a}, {a}, {b}, 0xCC",
                "vpblendd {v}, {v}, {a}, 0xF0",
                v = out(ymm_reg) v,
                a = out(ymm_reg) _,
                b = out(ymm_reg) _,
                c = out(ymm_reg) _,
                t = out(reg) _,
                ix = in(reg) ix,
                g = in(reg) grid,
                o1 = const std::mem::size_of::<$ity>(),
                o2 = const 2 * std::mem::size_of::<$ity>(),
                o3 = const 3 * std::mem::size_of::<$ity>(),
                o4 = const 4 * std::mem::size_of::<$ity>(),
                o5 = const 5 * std::mem::size_of::<$ity>(),
                o6 = const 6 * std::mem::size_of::<$ity>(),
                o7 = const 7 * std::mem::size_of::<$ity>(),
                options(pure, readonly, nostack, preserves_flags),
            );
            v
        }
    };
}
chunk_entries!(entries_u16, u16, "word");
chunk_entries!(entries_u8, u8, "byte");

/// The four 8-byte table rows `table[ix[k]]`, `k = 0..4` (dword indices),
/// in lane order: as [`entries_u16`], a `vpbroadcastq` each and three
/// `vpblendd` (IQ2_XS's grid rows, IQ1_S's and IQ1_M's code tables).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn rows4_u32(ix: *const u32, table: *const i64) -> __m256i {
    let v: __m256i;
    std::arch::asm!(
        "mov {t:e}, dword ptr [{ix}]",
        "vpbroadcastq {v}, qword ptr [{g} + {t} * 8]",
        "mov {t:e}, dword ptr [{ix} + 4]",
        "vpbroadcastq {a}, qword ptr [{g} + {t} * 8]",
        "vpblendd {v}, {v}, {a}, 0x0C",
        "mov {t:e}, dword ptr [{ix} + 8]",
        "vpbroadcastq {a}, qword ptr [{g} + {t} * 8]",
        "vpblendd {v}, {v}, {a}, 0x30",
        "mov {t:e}, dword ptr [{ix} + 12]",
        "vpbroadcastq {a}, qword ptr [{g} + {t} * 8]",
        "vpblendd {v}, {v}, {a}, 0xC0",
        v = out(ymm_reg) v,
        a = out(ymm_reg) _,
        t = out(reg) _,
        ix = in(reg) ix,
        g = in(reg) table,
        options(pure, readonly, nostack, preserves_flags),
    );
    v
}

/// Eight 4-byte IQ3_XXS grid entries of the index bytes at `qs`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn iq3_xxs_entries(qs: *const u8) -> __m256i {
    entries_u8(qs, IQ3XXS_GRID.as_ptr())
}

/// The entry points of the [`super::avx2_lowk`] kernels whose lookups take
/// broadcast loads here (their `LOADS` bodies).
macro_rules! loads_entry {
    ($(#[$doc:meta])* $name:ident, $body:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As for [`crate::quant::DotFn`]; needs AVX2, FMA, F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(n: usize, w: *const u8, a: *const u8) -> f32 {
            super::avx2_lowk::$body::<true>(n, w, a)
        }
    };
}
loads_entry!(
    /// IQ3_S: the 64 nine-bit indices of a block built and stored once
    /// ([`Iq3sIndices`]).
    dot_iq3_s,
    dot_iq3_s_body
);
loads_entry!(
    /// IQ3_XXS: an index is its `qs` byte.
    dot_iq3_xxs,
    dot_iq3_xxs_body
);
loads_entry!(
    /// IQ2_XS: an index is the low nine bits of a `qs` word.
    dot_iq2_xs,
    dot_iq2_xs_body
);
loads_entry!(
    /// IQ1_S: the grid rows plus one by 11-bit index.
    dot_iq1_s,
    dot_iq1_s_body
);
loads_entry!(
    /// IQ1_M: the codes `8·grid ± 1` plus 9 by 12-bit index.
    dot_iq1_m,
    dot_iq1_m_body
);

#[cfg(test)]
mod tests {
    use crate::quant::{quantize_act_fn, scalar, DotFn, VecDotType};
    use crate::{isa::Isa, DType};

    /// Both loads kernels equal scalar bit for bit on random blocks (any
    /// bytes are a valid block but for `d`, kept finite), as the gather
    /// kernels do.
    #[test]
    fn loads_kernels_equal_scalar_and_gathers() {
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") || !is_x86_feature_detected!("f16c") {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        let kernels: [(DType, usize, DotFn, DotFn); 5] = [
            (DType::IQ2_XS, 74, super::dot_iq2_xs, super::super::avx2_lowk::dot_iq2_xs),
            (DType::IQ1_S, 50, super::dot_iq1_s, super::super::avx2_lowk::dot_iq1_s),
            (DType::IQ1_M, 56, super::dot_iq1_m, super::super::avx2_lowk::dot_iq1_m),
            (DType::IQ3_S, 110, super::dot_iq3_s, super::super::avx2_lowk::dot_iq3_s),
            (DType::IQ3_XXS, 98, super::dot_iq3_xxs, super::super::avx2_lowk::dot_iq3_xxs),
        ];
        let mut rng = super::super::XorShift(0x51DE_CAFE_0123_4567);
        for (dtype, bytes, loads, gathers) in kernels {
            for n in [256usize, 512, 1792] {
                for _ in 0..20 {
                    let mut w: Vec<u8> = (0..n / 256 * bytes).map(|_| rng.next() as u8).collect();
                    for b in w.chunks_mut(bytes) {
                        let d = half::f16::from_f32(0.01 + (rng.next() % 100) as f32 * 1e-3);
                        b[..2].copy_from_slice(&d.to_le_bytes());
                    }
                    let x: Vec<f32> = (0..n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect();
                    let mut a = vec![0u8; VecDotType::Q8_K.row_bytes(n)];
                    quantize_act_fn(VecDotType::Q8_K, Isa::Scalar)(&x, &mut a);
                    let want = unsafe { scalar::dot_fn(dtype)(n, w.as_ptr(), a.as_ptr()) };
                    let got = unsafe { loads(n, w.as_ptr(), a.as_ptr()) };
                    let g = unsafe { gathers(n, w.as_ptr(), a.as_ptr()) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} n={n}: {got} vs scalar {want}");
                    assert_eq!(g.to_bits(), want.to_bits(), "{dtype} n={n}: gathers {g} vs scalar {want}");
                }
            }
        }
    }
}
