//! The GPU compute backend: weights in device buffers in their stored
//! format, activations and the paged KV pool on the device, and the ops a
//! decoder layer needs as WGSL compute shaders.
//!
//! # Why wgpu and WGSL
//! One kernel source for Vulkan (Linux, Windows: AMD, NVIDIA, Intel) and
//! Metal (macOS): wgpu translates WGSL to SPIR-V and MSL through naga. CubeCL
//! was the other candidate (Rust-embedded kernels on the same wgpu runtime,
//! plus CUDA/ROCm): it brings a large compiler dependency and an IR of its
//! own for what is, here, a dozen small shaders; WGSL is what wgpu, Dawn and
//! browsers run, and a shader file can be read and profiled on its own.
//!
//! # Layout rules
//! - **Weights are never widened.** Float weights upload as they are stored
//!   (f32, f16 pairs, bf16 pairs). Block formats are split at upload into
//!   their code bytes and their scales (Q8_0: 32 int8 per block and an f16
//!   scale; Q4_0/Q4_1: 16 bytes of nibbles and f16 scale/min; Q5_0/Q5_1: the
//!   same plus a word of fifth bits; Q4_K: 128 code
//!   bytes and d, dmin, 12 scale bytes per 256; Q6_K: 192 code bytes and 16
//!   int8 scales, d; MXFP4: 16 nibble bytes and an E8M0 exponent per 32,
//!   exponents packed four a word; NVFP4: 32 nibble bytes and four UE4M3
//!   scales per 64; FP8: 64 E4M3 bytes and an f32 scale per 64): the same
//!   bytes, aligned to the 4-byte words shaders read, dequantized in registers.
//! - **Activations stay f32 on the device**; only the step's inputs (token
//!   embeddings, rope tables, KV slots) go up and only the logits come back.
//! - Every shader has a host reference in `tests/` (the `kernels` crate's
//!   scalar code or a plain loop), checked on whatever adapter the machine
//!   has: in CI that is Mesa's llvmpipe (software Vulkan), which says nothing
//!   about speed.
//!
//! [`Gpu`] owns the device; [`DeviceWeight`] a matrix in its stored format;
//! [`Pass`] records one step's ops into one submission.

mod device;
mod error;
mod kv;
mod pass;
mod pass_delta;
mod pass_moe;
mod weights;

pub use device::{AdapterReport, DeviceBuf, Gpu};
pub use error::GpuError;
pub use kv::KvElem;
pub use pass::{Act, AttnArgs, Pass, Sinks, MAX_HEAD_DIM};
pub use pass_delta::{DeltaArgs, MAX_DELTA_DK};
pub use pass_moe::{group_words, Pairs, RouteMode};
pub use weights::{DeviceWeight, StackPart};

/// The weight types the matmul shader reads.
pub const WEIGHT_TYPES: [kernels::DType; 13] = [
    kernels::DType::F32,
    kernels::DType::F16,
    kernels::DType::BF16,
    kernels::DType::Q8_0,
    kernels::DType::Q4_0,
    kernels::DType::Q4_1,
    kernels::DType::Q5_0,
    kernels::DType::Q5_1,
    kernels::DType::Q4_K,
    kernels::DType::Q6_K,
    kernels::DType::MXFP4,
    kernels::DType::NVFP4,
    kernels::DType::FP8,
];

/// Whether the matmul shader reads `dtype`.
pub fn supports(dtype: kernels::DType) -> bool {
    WEIGHT_TYPES.contains(&dtype)
}
