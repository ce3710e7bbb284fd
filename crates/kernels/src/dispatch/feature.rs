//! The optional CPU features a dispatch slot's kernels may need beyond
//! their ISA level, and the pick among a slot's candidates.

#[cfg(target_arch = "x86_64")]
use crate::simd::{
    avx2_grid_loads, avx2_rows16_nl, avx512_fp4_vbmi, avx512_fp8_bf16, avx512_iq3s_vbmi, avx512_rows16_q3k,
};

/// An optional CPU feature beyond the ISA level a kernel needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Nothing beyond the level.
    Base,
    /// AVX-512 VBMI (`vpermb`); `SHARDLM_VBMI=0` turns it off.
    Vbmi,
    /// The BF16 FP8 kernels (`SHARDLM_BF16=1` and AVX-512 BF16).
    Bf16,
    /// GFNI (`vgf2p8affineqb`); `SHARDLM_GFNI=0` turns it off.
    Gfni,
    /// Both VBMI and GFNI (either switch turns it off).
    VbmiGfni,
    /// AVX-512 VBMI and BITALG (`vpshufbitqmb`), and GFNI; `SHARDLM_VBMI=0`,
    /// `SHARDLM_GFNI=0` or `SHARDLM_BITALG=0` turns it off.
    VbmiBitalg,
    /// AVX-VNNI (`vpdpbusd` on 256-bit vectors, without AVX-512: Intel's
    /// Alder Lake and later clients, Sierra Forest); `SHARDLM_AVXVNNI=0`
    /// turns it off.
    AvxVnni,
    /// A CPU whose `vpgatherdd` is slow (AMD's, at AVX2: about 17 cycles for
    /// eight dwords on Zen 3), so table lookups go through broadcast loads;
    /// `SHARDLM_SLOW_GATHER=0` or `=1` overrides the vendor's guess.
    SlowGather,
}

impl Feature {
    /// Whether this CPU (and the environment switches) allow it.
    pub fn present(self) -> bool {
        match self {
            Feature::Base => true,
            #[cfg(target_arch = "x86_64")]
            Feature::Vbmi => avx512_fp4_vbmi::has_vbmi(),
            #[cfg(target_arch = "x86_64")]
            Feature::Bf16 => avx512_fp8_bf16::has_bf16(),
            #[cfg(target_arch = "x86_64")]
            Feature::Gfni => avx512_rows16_q3k::has_gfni(),
            #[cfg(target_arch = "x86_64")]
            Feature::VbmiGfni => avx512_fp4_vbmi::has_vbmi() && avx512_rows16_q3k::has_gfni(),
            #[cfg(target_arch = "x86_64")]
            Feature::VbmiBitalg => avx512_iq3s_vbmi::has_vbmi_bitalg(),
            #[cfg(target_arch = "x86_64")]
            Feature::AvxVnni => avx2_rows16_nl::has_avxvnni(),
            #[cfg(target_arch = "x86_64")]
            Feature::SlowGather => avx2_grid_loads::slow_gather(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Kernel candidates in order of preference.
pub type Choice<F> = &'static [(Feature, F)];

/// The first candidate whose feature is present.
pub fn pick<F: Copy>(c: Choice<F>) -> Option<F> {
    c.iter().find(|(f, _)| f.present()).map(|&(_, k)| k)
}
