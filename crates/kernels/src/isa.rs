//! Run-time ISA selection. `SHARDLM_ISA=scalar|avx2|avx512` forces a level at or
//! below what the CPU supports, so CI can exercise every path on one machine.

use std::sync::OnceLock;

/// Instruction-set level a kernel may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (+ F16C).
    Avx2,
    /// AVX-512 F/BW/VL with VNNI.
    Avx512,
    /// aarch64 NEON (with dotprod where present).
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// Whether kernels of this level may run on this CPU.
    pub fn is_supported(self) -> bool {
        available().contains(&self)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Isa::Avx512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return Isa::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        return Isa::Neon;
    }
    #[allow(unreachable_code)]
    Isa::Scalar
}

/// The best level this CPU supports, ignoring `SHARDLM_ISA`.
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

/// Every level usable on this CPU, lowest first (always starts with `Scalar`).
pub fn available() -> Vec<Isa> {
    match detected() {
        Isa::Scalar => vec![Isa::Scalar],
        Isa::Avx2 => vec![Isa::Scalar, Isa::Avx2],
        Isa::Avx512 => vec![Isa::Scalar, Isa::Avx2, Isa::Avx512],
        Isa::Neon => vec![Isa::Scalar, Isa::Neon],
    }
}

/// `requested` lowered to something this CPU supports: itself if available, the
/// detected level if the request is a higher x86 level, else scalar.
pub fn clamp(requested: Isa) -> Isa {
    let det = detected();
    if requested.is_supported() {
        requested
    } else if matches!(det, Isa::Avx2 | Isa::Avx512) && matches!(requested, Isa::Avx2 | Isa::Avx512) {
        det
    } else {
        Isa::Scalar
    }
}

/// The level kernels use: `detected()` lowered by `SHARDLM_ISA` if set. Cached.
///
/// A SIMD level is only handed out after its kernels passed a quick self-check
/// against the scalar reference ([`crate::simd::selftest`]); a level that fails
/// is skipped (with a warning on stderr) in favour of the next lower one.
pub fn active() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| self_checked(requested()))
}

/// `detected()` lowered by `SHARDLM_ISA` if set, before the self-check: the
/// level whose packed layouts weights take ([`crate::packed::layout`]; the
/// self-check packs weights itself, so it cannot ask [`active`]). Cached.
pub fn requested() -> Isa {
    static REQUESTED: OnceLock<Isa> = OnceLock::new();
    *REQUESTED.get_or_init(|| match std::env::var("SHARDLM_ISA").ok().as_deref().and_then(Isa::parse) {
        Some(req) => clamp(req),
        None => detected(),
    })
}

/// `isa`, or the highest level below it whose kernels pass the self-check.
#[cfg(target_arch = "x86_64")]
fn self_checked(mut isa: Isa) -> Isa {
    while isa != Isa::Scalar {
        match crate::simd::selftest::self_test(isa) {
            Ok(()) => break,
            Err(e) => {
                let lower = if isa == Isa::Avx512 { Isa::Avx2 } else { Isa::Scalar };
                eprintln!("shardlm-kernels: {isa} kernels failed their self-check ({e}); using {lower}");
                isa = lower;
            }
        }
    }
    isa
}

#[cfg(not(target_arch = "x86_64"))]
fn self_checked(isa: Isa) -> Isa {
    isa
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_never_exceeds_detected() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
            assert!(clamp(isa).is_supported());
        }
        assert_eq!(clamp(Isa::Scalar), Isa::Scalar);
        assert!(active().is_supported());
        assert_eq!(available()[0], Isa::Scalar);
        assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512));
    }
}
