//! The ops of a Gated DeltaNet layer (Qwen3-Next, Qwen3.5) on the device:
//! the causal conv1d and the gated delta rule over per-sequence state slots
//! that live in a device buffer, so a step's linear layers read nothing back.
//!
//! A state buffer holds `slots × slot_len` floats per layer in the host
//! pool's layout (each slot: the conv state, `(K − 1) × C` oldest first,
//! then per value head a `dk × dv` recurrent state), so a slot moves to and
//! from the host (snapshots on disk, preemption) as the same floats. Both
//! shaders take each sequence's rows in order, one token at a time: the
//! recurrent form, whose bits do not depend on how a prompt is chunked
//! (the host's chunked prefill differs from it by rounding only).

use crate::pass::words8;
use crate::{DeviceBuf, Pass};

/// The widest key head [`Pass::delta_rule`] takes (its q and k rows sit in
/// workgroup memory).
pub const MAX_DELTA_DK: usize = 512;

/// One linear layer's shape and where its inputs sit ([`Pass::delta_rule`]).
#[derive(Debug, Clone, Copy)]
pub struct DeltaArgs {
    /// Key heads and value heads of this rank, their widths.
    pub k_heads: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
    /// Value heads in llama.cpp's tiled order (key head `h mod nk`), else grouped (`h / r`).
    pub tiled: bool,
    /// Floats of one state slot, and of its conv state (the recurrent states follow).
    pub slot_len: usize,
    pub conv_len: usize,
    /// Each row of the fused projection: its width and where `b` then `a` start.
    pub x_stride: usize,
    pub ba_off: usize,
}

impl DeltaArgs {
    /// Conv channels: q and k of the key heads, v of the value heads.
    pub fn channels(&self) -> usize {
        2 * self.k_heads * self.dk + self.v_heads * self.dv
    }
}

impl Pass<'_> {
    /// Causal depthwise conv1d (`k` taps, tap-major `w` of `k × c`) + SiLU
    /// of every sequence's rows (`seqs`: first row, rows, state slot per
    /// sequence; the inputs are the first `c` values of rows of `x_stride`
    /// in `x`) into `y` (rows of `c`), advancing each slot's conv state.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_silu(
        &mut self,
        x: &DeviceBuf,
        x_stride: usize,
        (c, k, slot_len): (usize, usize, usize),
        w: &DeviceBuf,
        (seqs, n_seq): (&DeviceBuf, usize),
        states: &DeviceBuf,
        y: &DeviceBuf,
    ) {
        let p = words8([c as u32, k as u32, n_seq as u32, x_stride as u32, slot_len as u32, 0, 0, 0]);
        let src = || include_str!("shaders/conv_silu.wgsl").to_string();
        let bufs = [&seqs.buf, &x.buf, &w.buf, &states.buf, &y.buf];
        self.dispatch("conv_silu", src, &p, &bufs, [c.div_ceil(64) as u32, n_seq as u32, 1]);
    }

    /// The gated delta rule of every (value head, sequence) over the conv
    /// output `y` (rows of [`DeltaArgs::channels`]) and the `b`, `a` of the
    /// fused projection rows `x`, from and into the state slots; outputs
    /// into `core` (rows of `v_heads · dv`). `neg_a` = −exp(A_log) and
    /// `dt_bias` per value head.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_rule(
        &mut self,
        a: &DeltaArgs,
        (y, x): (&DeviceBuf, &DeviceBuf),
        (neg_a, dt_bias): (&DeviceBuf, &DeviceBuf),
        (seqs, n_seq): (&DeviceBuf, usize),
        states: &DeviceBuf,
        core: &DeviceBuf,
    ) {
        assert!(a.dk <= MAX_DELTA_DK && a.v_heads.is_multiple_of(a.k_heads.max(1)), "checked when the layer uploads");
        let scale = 1.0 / (a.dk as f32).sqrt();
        let p = [
            a.dk as u32,
            a.dv as u32,
            a.v_heads as u32,
            a.k_heads as u32,
            a.tiled as u32,
            a.channels() as u32,
            a.x_stride as u32,
            a.ba_off as u32,
            a.slot_len as u32,
            a.conv_len as u32,
            scale.to_bits(),
            n_seq as u32,
        ];
        let src = || include_str!("shaders/delta_rule.wgsl").to_string();
        let bufs = [&seqs.buf, &y.buf, &x.buf, &neg_a.buf, &dt_bias.buf, &states.buf, &core.buf];
        self.dispatch("delta_rule", src, &p, &bufs, [a.v_heads as u32, n_seq as u32, 1]);
    }

    /// `y[r, i] *= SiLU(g[g_off + r · g_stride + i])` for `rows` rows of
    /// `width` contiguous values of `y` (the gated norm's `· SiLU(z)`).
    pub fn silu_mul(&mut self, y: &DeviceBuf, rw: (usize, usize), g: &DeviceBuf, gs: (usize, usize)) {
        self.gate_mul(y, rw, g, gs, true);
    }
}
