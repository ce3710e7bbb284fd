//! Gated DeltaNet (Qwen3-Next, Qwen3.5) on the GPU (see `shardlm_gpu`'s
//! `pass_delta`): the input projections as one fused matmul (qkv ‖ z ‖ b,a
//! per token row), the causal conv1d and the gated delta rule over state
//! slots in device memory, the gated RMSNorm (RMSNorm(o)·w · SiLU(z) per
//! value head) and the output projection. Nothing comes back to the host in
//! the layer.
//!
//! The states: [`GpuStates`] holds, per owned linear layer, a buffer in the
//! host [`StatePool`]'s layout; the pool is attached to it at the first step
//! ([`StatePool::attach`]), so the scheduler's clears, snapshot copies and
//! the disk tier's saves and loads act on the device. Speculative decoding's
//! way back (replaying a verify step's accepted rows) is not on the device:
//! a verify step of a linear layer there is refused.

use super::gpu_shard::{weight, Proj};
use crate::linear_attn::GatedDeltaNet;
use crate::state_cache::{DeviceStates, StatePool, StateShape};
use crate::ModelError;
use shardlm_gpu::{DeltaArgs, DeviceBuf, DeviceWeight, Gpu, Pass};
use std::sync::{Arc, Mutex};

pub(crate) struct GpuDeltaNet {
    /// `[qkv (C) ‖ z (nv·dv) ‖ b, a (2·nv)]` per token row.
    proj: Proj,
    conv: DeviceBuf,
    neg_a: DeviceBuf,
    dt_bias: DeviceBuf,
    norm: DeviceBuf,
    out: DeviceWeight,
    shape: StateShape,
    args: DeltaArgs,
    eps: f32,
}

/// Step buffers of the linear layers, shared by all of them (`rows` tokens).
pub(crate) struct DeltaBufs {
    /// The fused projection's rows.
    proj: DeviceBuf,
    /// The conv output (`rows × C`) and the delta rule's (`rows × nv·dv`).
    conv: DeviceBuf,
    core: DeviceBuf,
    /// Per sequence: first row, rows, state slot.
    seqs: DeviceBuf,
}

fn floats(gpu: &Gpu, what: &str, v: &[f32]) -> Result<DeviceBuf, ModelError> {
    Ok(gpu.buffer_with(what, bytemuck::cast_slice(v))?)
}

impl GpuDeltaNet {
    pub(crate) fn upload(gpu: &Gpu, dn: &GatedDeltaNet) -> Result<GpuDeltaNet, ModelError> {
        let s = dn.shape;
        if s.dk > shardlm_gpu::MAX_DELTA_DK {
            return Err(ModelError::Unsupported(format!(
                "linear-attention key heads of {} (at most {})",
                s.dk,
                shardlm_gpu::MAX_DELTA_DK
            )));
        }
        let (c, vw) = (s.conv_channels, s.v_heads * s.dv);
        let args = DeltaArgs {
            k_heads: dn.key_heads,
            v_heads: s.v_heads,
            dk: s.dk,
            dv: s.dv,
            tiled: dn.tiled,
            slot_len: s.len(),
            conv_len: s.conv_len(),
            x_stride: c + vw + 2 * s.v_heads,
            ba_off: c + vw,
        };
        debug_assert_eq!(args.channels(), c);
        Ok(GpuDeltaNet {
            proj: Proj::upload(gpu, &dn.qkv.weight.name, &[&dn.qkv, &dn.z, &dn.ba])?,
            conv: floats(gpu, "conv1d", &dn.conv)?,
            neg_a: floats(gpu, "neg_a", &dn.neg_a)?,
            dt_bias: floats(gpu, "dt_bias", &dn.dt_bias)?,
            norm: floats(gpu, "norm", &dn.norm)?,
            out: weight(gpu, &dn.out)?,
            shape: s,
            args,
            eps: dn.eps,
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.proj.bytes() + self.out.bytes()
    }

    /// Buffers for `rows` tokens and `n_seq` sequences, sized for the widest
    /// of `layers`; `None` without linear layers.
    pub(crate) fn bufs<'a>(
        gpu: &Gpu,
        mut layers: impl Iterator<Item = &'a GpuDeltaNet> + Clone,
        rows: usize,
    ) -> Result<Option<DeltaBufs>, ModelError> {
        if layers.clone().next().is_none() {
            return Ok(None);
        }
        let widest = |f: fn(&GpuDeltaNet) -> usize| layers.clone().map(f).max().unwrap_or(0);
        let (x, c, core) =
            (widest(|l| l.args.x_stride), widest(|l| l.args.channels()), widest(|l| l.args.v_heads * l.args.dv));
        let _ = layers.next();
        Ok(Some(DeltaBufs {
            proj: gpu.buffer("deltanet.proj", rows * x)?,
            conv: gpu.buffer("deltanet.conv", rows * c)?,
            core: gpu.buffer("deltanet.core", rows * core)?,
            // At most one sequence a row.
            seqs: gpu.buffer("deltanet.seqs", rows * 3)?,
        }))
    }

    /// Writes the step's (first row, rows, slot) per sequence.
    pub(crate) fn write_seqs(gpu: &Gpu, b: &DeltaBufs, seqs: &[u32]) {
        gpu.write_u32(&b.seqs, 0, seqs);
    }

    /// Records the layer over the normalized rows `xn` (`n` of them, of
    /// `n_seq` sequences) into `dst` (added to it when `add`), reading and
    /// advancing `states` (this layer's slots).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        pass: &mut Pass<'_>,
        b: &DeltaBufs,
        (xn, n, n_seq): (&DeviceBuf, usize, usize),
        states: &DeviceBuf,
        (dst, add): (&DeviceBuf, bool),
    ) {
        let (a, s) = (&self.args, &self.shape);
        let (c, vw) = (a.channels(), a.v_heads * a.dv);
        self.proj.record(pass, xn, n, &b.proj);
        pass.conv_silu(
            &b.proj,
            a.x_stride,
            (c, s.conv_kernel, a.slot_len),
            &self.conv,
            (&b.seqs, n_seq),
            states,
            &b.conv,
        );
        pass.delta_rule(a, (&b.conv, &b.proj), (&self.neg_a, &self.dt_bias), (&b.seqs, n_seq), states, &b.core);
        // RMSNorm(o)·w per (token, value head), then · SiLU(z).
        pass.rms_norm_heads(&b.core, 0, &self.norm, (a.dv, a.v_heads, n, self.eps), vw);
        pass.silu_mul(&b.core, (n, vw), &b.proj, (c, a.x_stride));
        match add {
            true => pass.matmul_add(&self.out, &b.core, 0, n, dst, 0),
            false => pass.matmul(&self.out, &b.core, 0, n, dst, 0),
        }
    }
}

/// A [`StatePool`]'s values on the device: per owned layer a buffer of
/// `n_slots × shape.len()` floats (none for attention layers).
pub(crate) struct GpuStates {
    gpu: Arc<Gpu>,
    pub(crate) layers: Vec<Option<DeviceBuf>>,
    /// One slot of the widest layer: slot-to-slot copies go through it (a
    /// buffer cannot be both ends of one copy).
    scratch: Mutex<Option<DeviceBuf>>,
}

impl std::fmt::Debug for GpuStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuStates({} layers)", self.layers.iter().flatten().count())
    }
}

impl GpuStates {
    pub(crate) fn new(gpu: Arc<Gpu>, pool: &StatePool) -> Result<GpuStates, ModelError> {
        let layers = pool
            .shapes
            .iter()
            .map(|s| s.map(|s| gpu.buffer("deltanet.states", s.len() * pool.n_slots)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuStates { gpu, layers, scratch: Mutex::new(None) })
    }

    fn buf(&self, layer: usize) -> Result<&DeviceBuf, ModelError> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::Unsupported(format!("owned layer {layer} has no recurrent state on the device")))
    }
}

impl DeviceStates for GpuStates {
    fn zero(&self, layer: usize, at: usize, len: usize) -> Result<(), ModelError> {
        self.gpu.write_f32(self.buf(layer)?, at, &vec![0.0; len]);
        Ok(self.gpu.check()?)
    }

    fn copy(&self, layer: usize, from: usize, to: usize, len: usize) -> Result<(), ModelError> {
        let buf = self.buf(layer)?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.as_ref().is_none_or(|s| s.words() < len) {
            *scratch = Some(self.gpu.buffer("deltanet.state_copy", len)?);
        }
        let tmp = scratch.as_ref().expect("made above");
        let mut pass = Pass::new(&self.gpu);
        pass.copy(buf, from, tmp, 0, len);
        pass.copy(tmp, 0, buf, to, len);
        Ok(pass.submit()?)
    }

    fn read(&self, layer: usize, at: usize, len: usize) -> Result<Vec<f32>, ModelError> {
        Ok(self.gpu.read_f32(self.buf(layer)?, at, len)?)
    }

    fn write(&self, layer: usize, at: usize, values: &[f32]) -> Result<(), ModelError> {
        self.gpu.write_f32(self.buf(layer)?, at, values);
        Ok(self.gpu.check()?)
    }
}
