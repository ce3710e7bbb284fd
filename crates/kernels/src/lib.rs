//! shardlm-kernels: the numeric heart of shardlm.
//!
//! * [`DType`]: every weight storage type we read (float and GGUF block quants).
//! * [`quant`]: one file per block format: layout, reference dequantize, reference
//!   quantize (where we produce it) and the scalar dot product against 8-bit activations.
//! * [`matmul`]: `y = x · Wᵀ` over a weight stored in any [`DType`], multi-threaded on
//!   the persistent [`pool::ThreadPool`], dispatched at run time to the best ISA.
//! * [`ops`]: the small f32 steps (RMSNorm, rope, softmax, SiLU/GELU, attention).
//!
//! We write these ourselves because they *are* the product: speed on CPUs comes from
//! kernels that read quantized weights directly, and distribution needs kernels that
//! work on any row range of a weight (a tensor-parallel shard).
//!
//! Every SIMD kernel has a scalar reference and is tested against it. Set
//! `SHARDLM_ISA=scalar|avx2|avx512` to force a lower ISA level (see [`isa`]).

#![allow(clippy::needless_range_loop)]

pub mod dtype;
pub mod isa;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod simd;

pub use dtype::DType;
pub use matmul::{matmul, matmul_many, MatRef, MatmulScratch};
pub use pool::ThreadPool;

/// Errors from kernel-level helpers (bad sizes, unsupported conversions).
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("row of {elems} elements is not a multiple of the {dtype} block size {block}")]
    BadRowLength { dtype: DType, elems: usize, block: usize },
    #[error("expected {expected} bytes, got {actual}")]
    BadDataLength { expected: usize, actual: usize },
    #[error("cannot quantize to {0}: only q8_0 and q4_0 are produced at load time")]
    UnsupportedQuantizeTarget(DType),
}
