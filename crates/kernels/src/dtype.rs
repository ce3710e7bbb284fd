//! Storage types of weights and their block geometry.

use std::fmt;

/// A weight storage type. Quantized types store `block_elems()` values in
/// `block_bytes()` bytes; float types have a block of one element.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    /// OCP MXFP4: 32 E2M1 values + E8M0 scale (GGUF type 39).
    MXFP4,
    /// NVFP4: 64 E2M1 values + four E4M3 sub-block scales (GGUF type 40).
    NVFP4,
    /// FP8 E4M3: 64 values + an f32 scale (shardlm's own block, see `quant::fp8`).
    FP8,
    Q2_K,
    Q3_K,
    /// I-quants (lattice codebooks, see `quant::iq_grids`) and IQ4_NL/IQ4_XS.
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
    IQ4_NL,
    IQ4_XS,
}

impl DType {
    pub const ALL: [DType; 25] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::MXFP4,
        DType::NVFP4,
        DType::FP8,
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ1_S,
        DType::IQ1_M,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::MXFP4 | DType::IQ4_NL => 32,
            DType::NVFP4 | DType::FP8 => 64,
            DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q2_K | DType::Q3_K => 256,
            DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S | DType::IQ3_XXS | DType::IQ3_S => 256,
            DType::IQ1_S | DType::IQ1_M | DType::IQ4_XS => 256,
        }
    }

    /// Bytes per block (see FORMATS.md / ggml-common.h).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::MXFP4 => 17,
            DType::NVFP4 => 36,
            DType::FP8 => 68,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::IQ2_XXS => 66,
            DType::IQ2_XS => 74,
            DType::IQ2_S => 82,
            DType::IQ3_XXS => 98,
            DType::IQ3_S => 110,
            DType::IQ1_S => 50,
            DType::IQ1_M => 56,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
        }
    }

    /// Storage bits per weight, scales included (`8·block_bytes/block_elems`).
    pub fn bits_per_weight(self) -> f64 {
        8.0 * self.block_bytes() as f64 / self.block_elems() as f64
    }

    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of `elems` contiguous elements; `None` if `elems` is not a whole
    /// number of blocks.
    pub const fn bytes_for(self, elems: usize) -> Option<usize> {
        if !elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        Some(elems / self.block_elems() * self.block_bytes())
    }

    /// GGML type id as stored in GGUF tensor infos (`None` for FP8, which
    /// llama.cpp does not have).
    pub const fn ggml_id(self) -> Option<u32> {
        Some(match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
            DType::NVFP4 => 40,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::IQ2_XXS => 16,
            DType::IQ2_XS => 17,
            DType::IQ3_XXS => 18,
            DType::IQ1_S => 19,
            DType::IQ4_NL => 20,
            DType::IQ3_S => 21,
            DType::IQ2_S => 22,
            DType::IQ4_XS => 23,
            DType::IQ1_M => 29,
            DType::FP8 => return None,
        })
    }

    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_id() == Some(id))
    }

    /// Lower-case name as users type it (`q4_0`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::MXFP4 => "mxfp4",
            DType::NVFP4 => "nvfp4",
            DType::FP8 => "fp8",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::IQ2_XXS => "iq2_xxs",
            DType::IQ2_XS => "iq2_xs",
            DType::IQ2_S => "iq2_s",
            DType::IQ3_XXS => "iq3_xxs",
            DType::IQ3_S => "iq3_s",
            DType::IQ1_S => "iq1_s",
            DType::IQ1_M => "iq1_m",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        let l = s.to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| d.name() == l)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ids_round_trip() {
        for d in DType::ALL {
            if let Some(id) = d.ggml_id() {
                assert_eq!(DType::from_ggml_id(id), Some(d));
            }
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::from_ggml_id(99), None);
        assert_eq!(DType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(DType::Q4_0.bytes_for(33), None);
        assert_eq!(DType::from_ggml_id(39), Some(DType::MXFP4));
        assert_eq!(DType::from_ggml_id(40), Some(DType::NVFP4));
        assert_eq!(DType::NVFP4.bytes_for(128), Some(72));
        assert_eq!(DType::from_ggml_id(23), Some(DType::IQ4_XS));
        assert_eq!(DType::IQ1_M.bytes_for(512), Some(112));
    }
}
