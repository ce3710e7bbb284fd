//! The small float encodings of the low-bit formats (FORMATS.md §1 "Element
//! encodings"): E2M1 (FP4 values), E4M3 (FP8 values and NVFP4 scales) and E8M0
//! (MX scales). Decoders are exact; encoders round to nearest, ties to even,
//! and saturate to the largest finite value (what every publisher's quantizer does).

/// E2M1 codes 0..16 as floats: bit 3 sign, bits 2–1 exponent (bias 1), bit 0 mantissa.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// E2M1 codes doubled, as i8 (ggml's `kvalues_mxfp4`): integer dot products use
/// these and halve the block scale instead.
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Largest finite E4M3 magnitude (code 0x7E).
pub const E4M3_MAX: f32 = 448.0;

/// Whether an E4M3 byte is the NaN code (`S.1111.111`; E4M3 "fn" has no Inf).
#[inline(always)]
pub fn e4m3_is_nan(b: u8) -> bool {
    b & 0x7F == 0x7F
}

/// E4M3 → f32: `e = 0`: `m·2⁻⁹`; else `(1 + m/8)·2^(e−7)`; 0x7F/0xFF are NaN.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    if e4m3_is_nan(b) {
        return f32::NAN;
    }
    let mag = e4m3_magnitude(b & 0x7F);
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Magnitude of a sign-less E4M3 code 0..0x7E, built from bits (exact).
#[inline(always)]
const fn e4m3_magnitude(c: u8) -> f32 {
    let e = (c >> 3) as u32;
    let m = (c & 7) as u32;
    if e == 0 {
        // m · 2⁻⁹: m < 8 is exact in f32.
        m as f32 * (1.0 / 512.0)
    } else {
        // (1 + m/8)·2^(e−7) as f32 bits: biased exponent e − 7 + 127, mantissa m in the top 3 bits.
        f32::from_bits(((e + 120) << 23) | (m << 20))
    }
}

/// ggml's `ggml_ue4m3_to_fp32`: the NVFP4 block scale as GGUF stores it,
/// *halved* (it multiplies the doubled [`E2M1_X2`] codes). The sign bit is
/// ignored; 0x00 and 0x7F give 0. Our loaders refuse 0x7F/0xFF (NaN) before
/// any kernel sees them, so this only matters for hand-made blocks.
#[inline(always)]
pub fn ue4m3_half(b: u8) -> f32 {
    UE4M3_HALF[b as usize]
}

const fn ue4m3_half_calc(b: u8) -> f32 {
    let c = b & 0x7F;
    if b == 0x7F || c == 0 {
        return 0.0;
    }
    e4m3_magnitude(c) * 0.5
}

/// [`ue4m3_half`] for every byte (the dot kernels read four per 64 values).
static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = ue4m3_half_calc(b as u8);
        b += 1;
    }
    t
};

/// f32 → E4M3, round to nearest even, saturating to ±448; NaN → 0x7F.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    // 464 is halfway between 448 and the (NaN) next step 480: at and above it, saturate.
    if a >= 464.0 {
        return sign | 0x7E;
    }
    let code = if a < 1.0 / 64.0 {
        // Subnormal range (below 2⁻⁶): m = round(a·2⁹); m = 8 is the smallest normal, code 0x08.
        (a * 512.0).round_ties_even() as u8
    } else {
        // Round the f32 mantissa to 3 bits (ties to even); a carry moves into the exponent.
        let bits = a.to_bits();
        let r = bits + 0x7FFFF + ((bits >> 20) & 1);
        let e = (r >> 23) as i32 - 127 + 7;
        let m = (r >> 20) & 7;
        if e > 15 || (e == 15 && m == 7) {
            0x7E
        } else {
            ((e as u32) << 3 | m) as u8
        }
    };
    sign | code
}

/// E8M0 → f32: `2^(b−127)`; 0xFF is NaN.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0xFF => f32::NAN,
        0 => f32::from_bits(0x0040_0000), // 2⁻¹²⁷ (subnormal)
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(b−128)`, the MXFP4 scale for the doubled
/// codes. 0xFF (NaN) gives NaN here; the SIMD kernels never see it (refused at load).
#[inline(always)]
pub fn e8m0_half(b: u8) -> f32 {
    match b {
        0xFF => f32::NAN,
        0 | 1 => f32::from_bits(0x0020_0000 << b),
        _ => f32::from_bits((b as u32 - 1) << 23),
    }
}

/// f32 → E2M1 code, round to nearest (ties to the even code), saturating to ±6.
/// −0 and tiny negatives keep their sign bit; NaN → 0.
#[inline]
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let a = x.abs();
    // Midpoints between 0, .5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code (mantissa bit 0).
    let c = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    if x.is_sign_negative() {
        c | 8
    } else {
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_code() {
        for b in 0..=255u8 {
            if e4m3_is_nan(b) {
                assert!(e4m3_to_f32(b).is_nan());
                continue;
            }
            let v = e4m3_to_f32(b);
            assert_eq!(f32_to_e4m3(v), b, "code {b:#04x} = {v}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(f32_to_e4m3(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0); // below half the smallest subnormal
        assert_eq!(f32_to_e4m3(1.0625), 0x38); // tie between 1 and 1.125 → even (1)
        assert_eq!(f32_to_e4m3(1.1875), 0x3A); // tie between 1.125 and 1.25 → even (1.25)
    }

    #[test]
    fn e2m1_nearest() {
        for c in 0..16u8 {
            assert_eq!(f32_to_e2m1(E2M1[c as usize]), c);
            assert_eq!(E2M1[c as usize] * 2.0, E2M1_X2[c as usize] as f32);
        }
        assert_eq!(f32_to_e2m1(0.25), 0);
        assert_eq!(f32_to_e2m1(0.76), 2);
        assert_eq!(f32_to_e2m1(5.0), 6);
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(-100.0), 15);
    }

    #[test]
    fn e8m0_values() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert!(e8m0_to_f32(255).is_nan());
        for b in 0..255u8 {
            assert_eq!(e8m0_half(b), e8m0_to_f32(b) * 0.5, "{b}");
        }
        assert_eq!(ue4m3_half(0x7F), 0.0);
        assert_eq!(ue4m3_half(0x38), 0.5);
        assert_eq!(ue4m3_half(0xB8), 0.5);
    }
}
