//! A GPU measured for the planner (`--machines gpu` / `gpu:N`, and
//! `plan-probe` on a host whose ranks run `--device gpu`): its memory as the
//! adapter reports it, the bytes/s at which the real decode matmul streams
//! a weight far past its caches, the FLOP/s of a prompt chunk's matmul, and
//! the fixed cost of a layer's ~10 dispatches. The shard timings that
//! replace estimates on a CPU (`calibrate`) are CPU-only: a GPU machine
//! keeps these rates.

use super::hardware::Machine;
use anyhow::{Context, Result};
use kernels::DType;
use shardlm_gpu::{DeviceBuf, DeviceWeight, Gpu, Pass};
use std::time::Instant;

/// The stored type the GPU reads for `quant` (closest where it has none).
fn gpu_dtype(quant: &str) -> DType {
    match quant {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q4_k" => DType::Q4_K,
        "q6_k" => DType::Q6_K,
        "mxfp4" => DType::MXFP4,
        "nvfp4" => DType::NVFP4,
        "fp8" => DType::FP8,
        _ => DType::Q8_0,
    }
}

/// `rows × cols` of `dtype`: one quantized row repeated (timing only).
fn weight(gpu: &Gpu, dtype: DType, rows: usize, cols: usize) -> Result<DeviceWeight> {
    let row: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
    let mut one = vec![0u8; dtype.bytes_for(cols).context("whole blocks")?];
    match dtype {
        DType::F32 => one.copy_from_slice(bytemuck::cast_slice(&row)),
        DType::F16 => {
            one.copy_from_slice(bytemuck::cast_slice(&row.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>()))
        }
        DType::BF16 => {
            one.copy_from_slice(bytemuck::cast_slice(&row.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>()))
        }
        _ => kernels::quant::quantize_row(dtype, &row, &mut one).map_err(|e| anyhow::anyhow!("{e}"))?,
    }
    let bytes = one.repeat(rows);
    Ok(DeviceWeight::upload(gpu, "probe", dtype, (rows, cols), &bytes, None, 1.0)?)
}

/// Seconds of `reps` matmuls of `w` over `t` rows in one submission, the
/// best of three after a warm-up.
fn time(gpu: &Gpu, w: &DeviceWeight, t: usize, reps: usize, x: &DeviceBuf, y: &DeviceBuf) -> Result<f64> {
    let mut best = f64::INFINITY;
    for round in 0..4 {
        let start = Instant::now();
        let mut pass = Pass::new(gpu);
        for _ in 0..reps {
            pass.matmul(w, x, 0, t, y, 0);
        }
        pass.submit()?;
        gpu.read_f32(y, 0, 1)?;
        if round > 0 {
            best = best.min(start.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}

/// GPU `index` (or the first hardware one) for weights stored as `quant`.
pub fn gpu_machine(index: Option<usize>, quant: &str) -> Result<Machine> {
    let gpu = Gpu::open(index)?;
    let dtype = gpu_dtype(quant);
    let cols = 4096;
    let row_bytes = dtype.bytes_for(cols).context("whole blocks")?;
    // Decode: a weight far past the caches. A software adapter (llvmpipe)
    // is slow and has no such caches: a small one, and a small prefill.
    let (target, prefill_rows) = if gpu.info.software { (16usize << 20, 256) } else { (512 << 20, 2048) };
    let target =
        target.min(gpu.info.max_binding_bytes as usize).min(gpu.info.memory_bytes.unwrap_or(u64::MAX) as usize / 4);
    let rows = (target / row_bytes).max(64);
    let w = weight(&gpu, dtype, rows, cols)?;
    let x = gpu.buffer("probe.x", 256 * cols)?;
    gpu.write_f32(&x, 0, &vec![0.01; 256 * cols]);
    let y = gpu.buffer("probe.y", 256 * rows.max(2048))?;
    let one = time(&gpu, &w, 1, 1, &x, &y)?;
    let reps = ((0.2 / one.max(1e-6)) as usize).clamp(1, 64);
    let decode_bytes_per_s = (rows * row_bytes * reps) as f64 / time(&gpu, &w, 1, reps, &x, &y)?;
    // Prefill: 256 rows against a 2048 × 4096 weight (a prompt chunk's matmul).
    let pw = weight(&gpu, dtype, prefill_rows, cols)?;
    let prefill_flops = 2.0 * (256 * prefill_rows * cols) as f64 / time(&gpu, &pw, 256, 1, &x, &y)?;
    // A layer's ~10 dispatches: the cost of a tiny one, many in one submission.
    let tiny = weight(&gpu, dtype, 64, cols)?;
    let layer_overhead_s = 10.0 * time(&gpu, &tiny, 1, 100, &x, &y)? / 100.0;
    let mem = gpu.info.memory_bytes.context("the GPU does not report its memory (Metal is not read yet)")?;
    Ok(Machine {
        name: format!("gpu ({}, {quant} weights)", gpu.info.name),
        // Keep 8% for step buffers and other programs, as for a CPU host.
        mem_bytes: mem as f64 * 0.92,
        decode_bytes_per_s,
        prefill_flops,
        // Attention runs on the same units; no separate probe yet.
        attn_flops: prefill_flops * 0.5,
        layer_overhead_s,
    })
}
