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
//! the disk tier's saves and loads act on the device.
//!
//! Speculative decoding's way back, on the device: a verify step keeps, per
//! slot and layer, the state before it and its fused projection rows
//! ([`UndoBufs`]); the next step of the slot (which `StatePool::begin_step`
//! marks with the accepted rows to replay) restores that state and runs
//! the conv and the delta rule over the first accepted rows again. Both
//! shaders take rows one at a time with the same arithmetic whatever the
//! step, and the matmul's rows do not depend on the batch, so the state
//! after a replay equals plain decoding's bit for bit.

use super::gpu_shard::{weight, Proj};
use crate::kv_cache::SeqKv;
use crate::linear_attn::GatedDeltaNet;
use crate::model::{AttendRows, SeqStep};
use crate::state_cache::{DeviceStates, StatePool, StateShape};
use crate::ModelError;
use shardlm_gpu::{DeltaArgs, DeviceBuf, DeviceWeight, Gpu, Pass};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One sequence's part of a step of the linear layers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeltaSeq {
    /// First row in the step, rows, state slot.
    pub row: usize,
    pub len: usize,
    pub slot: usize,
    /// Accepted rows of the slot's last verify step to replay first (0: none).
    pub replay: usize,
    /// A verify step: keep the way back.
    pub verify: bool,
}

/// Marks every owned linear layer's way back in the host pool as the host
/// layer does (takes the rows to replay; a verify step records its first
/// position and rows, any other forgets the last one) and returns each
/// sequence's part of the step.
pub(crate) fn plan_step(states: &mut StatePool, seqs: &[SeqStep<'_>]) -> Result<Vec<DeltaSeq>, ModelError> {
    let mut out = Vec::with_capacity(seqs.len());
    let mut row = 0;
    for s in seqs {
        let SeqKv::Paged { state: Some(slot), start, .. } = &s.cache else {
            return Err(ModelError::Unsupported("a linear-attention sequence without a state slot".into()));
        };
        let (len, slot, start) = (s.tokens.len(), *slot as usize, *start);
        let verify = s.attend_rows() == AttendRows::Verify && len > 1;
        let mut replay = 0;
        for li in 0..states.shapes.len() {
            if let Some(u) = states.undo_marks(li, slot) {
                replay = std::mem::take(&mut u.replay);
                match verify {
                    true => (u.start, u.rows) = (start, len),
                    false => u.rows = 0,
                }
            }
        }
        out.push(DeltaSeq { row, len, slot, replay, verify });
        row += len;
    }
    Ok(out)
}

/// A slot's way back in one layer: the state before its last verify step,
/// that step's fused projection rows (room for `cap` rows), and the (first
/// row, rows, slot) entry a replay runs the shaders with.
pub(crate) struct UndoBufs {
    before: DeviceBuf,
    rows: DeviceBuf,
    cap: usize,
    seq: DeviceBuf,
}

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

    /// (floats of a state slot, of a projection row): what a way back keeps.
    pub(crate) fn undo_shape(&self) -> (usize, usize) {
        (self.args.slot_len, self.args.x_stride)
    }

    /// Buffers for `rows` tokens (and as many sequences at most), sized for
    /// the widest of `layers`; `None` without linear layers.
    pub(crate) fn bufs<'a>(
        gpu: &Gpu,
        layers: impl Iterator<Item = &'a GpuDeltaNet> + Clone,
        rows: usize,
    ) -> Result<Option<DeltaBufs>, ModelError> {
        let widest = |f: fn(&GpuDeltaNet) -> usize| layers.clone().map(f).max();
        let Some(x) = widest(|l| l.args.x_stride) else { return Ok(None) };
        let (c, core) = (widest(|l| l.args.channels()), widest(|l| l.args.v_heads * l.args.dv));
        let (c, core) = (c.unwrap_or(0), core.unwrap_or(0));
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
    /// Records the fused input projections of `xn`'s `n` rows into `b.proj`.
    pub(crate) fn record_project(&self, pass: &mut Pass<'_>, b: &DeltaBufs, (xn, n): (&DeviceBuf, usize)) {
        self.proj.record(pass, xn, n, &b.proj);
    }

    /// Records the recurrence over `b.proj`'s `n` rows of `n_seq` sequences:
    /// the way back of speculative steps, conv + SiLU and the delta rule on
    /// the state slots `states`, the gated RMSNorm, into `b.core`.
    pub(crate) fn record_recur(
        &self,
        pass: &mut Pass<'_>,
        b: &DeltaBufs,
        (n, n_seq): (usize, usize),
        states: &DeviceBuf,
        undo: &[(DeltaSeq, Arc<UndoBufs>)],
    ) {
        let (a, s) = (&self.args, &self.shape);
        let (c, vw) = (a.channels(), a.v_heads * a.dv);
        // The way back: replay the accepted rows of the last verify step from
        // the state before it (outputs discarded), then keep this verify
        // step's state and rows.
        for (sq, u) in undo.iter().filter(|(sq, _)| sq.replay > 0) {
            pass.copy(&u.before, 0, states, sq.slot * a.slot_len, a.slot_len);
            pass.conv_silu(
                &u.rows,
                a.x_stride,
                (c, s.conv_kernel, a.slot_len),
                &self.conv,
                (&u.seq, 1),
                states,
                &b.conv,
            );
            pass.delta_rule(a, (&b.conv, &u.rows), (&self.neg_a, &self.dt_bias), (&u.seq, 1), states, &b.core);
        }
        for (sq, u) in undo.iter().filter(|(sq, _)| sq.verify) {
            pass.copy(states, sq.slot * a.slot_len, &u.before, 0, a.slot_len);
            pass.copy(&b.proj, sq.row * a.x_stride, &u.rows, 0, sq.len * a.x_stride);
        }
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
    }

    /// Records the output projection of `b.core` into `(dst, add)`.
    pub(crate) fn record_out(&self, pass: &mut Pass<'_>, b: &DeltaBufs, n: usize, (dst, add): (&DeviceBuf, bool)) {
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
    /// Per (layer, slot): the way back of its last verify step, made at the
    /// slot's first verify step.
    undo: Mutex<HashMap<(usize, usize), Arc<UndoBufs>>>,
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
        Ok(GpuStates { gpu, layers, scratch: Mutex::new(None), undo: Mutex::new(HashMap::new()) })
    }

    /// The way back of each sequence of `plan` that replays or verifies in
    /// linear layer `layer` (`x_stride`: its projection rows' width), made
    /// or grown for a verify step's rows; each replay's entry is written.
    pub(crate) fn undo_for(
        &self,
        layer: usize,
        plan: &[DeltaSeq],
        (slot_len, x_stride): (usize, usize),
    ) -> Result<Vec<(DeltaSeq, Arc<UndoBufs>)>, ModelError> {
        let mut map = self.undo.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for sq in plan.iter().filter(|sq| sq.replay > 0 || sq.verify) {
            let key = (layer, sq.slot);
            if sq.replay > 0 {
                let u = map.get(&key).ok_or_else(|| {
                    ModelError::Unsupported(format!("slot {} replays a verify step it did not keep", sq.slot))
                })?;
                self.gpu.write_u32(&u.seq, 0, &[0, sq.replay as u32, sq.slot as u32]);
                out.push((DeltaSeq { verify: false, ..*sq }, u.clone()));
            }
            if sq.verify {
                // A replay above still reads the old rows: a bigger set replaces
                // them in the map, the old one lives on in `out`.
                if map.get(&key).is_none_or(|u| u.cap < sq.len) {
                    let cap = sq.len.max(17).next_power_of_two();
                    let u = UndoBufs {
                        before: self.gpu.buffer("deltanet.undo_state", slot_len)?,
                        rows: self.gpu.buffer("deltanet.undo_rows", cap * x_stride)?,
                        cap,
                        seq: self.gpu.buffer("deltanet.undo_seq", 3)?,
                    };
                    map.insert(key, Arc::new(u));
                }
                out.push((DeltaSeq { replay: 0, ..*sq }, map[&key].clone()));
            }
        }
        Ok(out)
    }

    fn buf(&self, layer: usize) -> Result<&DeviceBuf, ModelError> {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::Unsupported(format!("owned layer {layer} has no recurrent state on the device")))
    }
}

impl DeviceStates for GpuStates {
    fn zero(&self, parts: &[(usize, usize, usize)]) -> Result<(), ModelError> {
        // Cleared on the device: nothing crosses the bus for a new sequence.
        let mut pass = Pass::new(&self.gpu);
        for &(layer, at, len) in parts {
            pass.zero(self.buf(layer)?, at, len);
        }
        Ok(pass.submit()?)
    }

    fn copy(&self, parts: &[(usize, usize, usize, usize)]) -> Result<(), ModelError> {
        let widest = parts.iter().map(|p| p.3).max().unwrap_or(0);
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.as_ref().is_none_or(|s| s.words() < widest) {
            *scratch = Some(self.gpu.buffer("deltanet.state_copy", widest)?);
        }
        let tmp = scratch.as_ref().expect("made above");
        // Copies run in recorded order, so one scratch serves every layer.
        let mut pass = Pass::new(&self.gpu);
        for &(layer, from, to, len) in parts {
            let buf = self.buf(layer)?;
            pass.copy(buf, from, tmp, 0, len);
            pass.copy(tmp, 0, buf, to, len);
        }
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
