//! Run-time ISA selection. `SHARDLM_ISA=scalar|avx2|avx512` forces a level at or
//! below what the CPU supports, so CI can exercise every path on one machine.

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

/// The best level this CPU supports, ignoring `SHARDLM_ISA`.
pub fn detected() -> Isa {
    todo!("kernels helper")
}

/// The level kernels use: `detected()` lowered by `SHARDLM_ISA` if set. Cached.
pub fn active() -> Isa {
    todo!("kernels helper")
}
