//! One step's ops, recorded into one command encoder and submitted at once.
//!
//! Each op is a dispatch: its parameters go into a 256-byte slot of the
//! device's parameter buffer (written through the queue, so they land
//! before the submission that reads them), its buffers into a bind group.
//! wgpu orders the dispatches' reads after earlier writes.

use crate::device::{PARAM_SLOT, PARAM_SLOTS};
use crate::kv::{attention_pools, kv_store_invocations, kv_store_source};
use crate::{DeviceBuf, DeviceWeight, Gpu, GpuError, KvElem};
use kernels::DType;

/// The gated activation of an MLP ([`Pass::act_mul`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    Silu,
    GeluTanh,
    /// gpt-oss: `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`.
    ClampedSwiglu {
        alpha: f32,
        limit: f32,
    },
}

/// The widest attention head [`Pass::attention`] takes (latent attention's
/// rows are `kv_lora_rank + rope`, 576 in DeepSeek V3).
pub const MAX_HEAD_DIM: usize = 1024;

/// The shape of one layer's attention ([`Pass::attention`]).
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Positions per KV block.
    pub block: usize,
    pub scale: f32,
    /// Sliding window: a token at position p sees `p + 1 − window ..= p`.
    pub window: Option<usize>,
    /// What the pool holds.
    pub kv: KvElem,
}

/// A learned sink logit per query head (gpt-oss), `heads` values.
pub type Sinks<'a> = Option<&'a DeviceBuf>;

const MATMUL: &str = include_str!("shaders/matmul.wgsl");
/// (invocations per row, rows per workgroup) of the matmul for `dtype`:
/// 64 invocations a workgroup either way (matmul.wgsl).
pub(crate) fn matmul_shape(dtype: DType) -> (usize, usize) {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => (32, 2),
        _ => (8, 8),
    }
}
pub(crate) const MATMUL_ID: &str = include_str!("shaders/matmul_id.wgsl");
const HALF: &str = include_str!("shaders/dot_half.wgsl");

/// The weight type's `partial_dot` (dequantizing its stored blocks).
fn dot_source(dtype: DType) -> String {
    match dtype {
        DType::F32 => include_str!("shaders/dot_f32.wgsl").into(),
        DType::F16 => HALF.replace("HALVES", "unpack2x16float(word)"),
        DType::BF16 => HALF.replace("HALVES", "vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u))"),
        DType::Q8_0 => include_str!("shaders/dot_q8_0.wgsl").into(),
        DType::Q4_0 => include_str!("shaders/dot_q4_0.wgsl").into(),
        DType::Q4_1 => include_str!("shaders/dot_q4_1.wgsl").into(),
        DType::Q5_0 | DType::Q5_1 => {
            let min_word = if dtype == DType::Q5_1 { "1u" } else { "0u" };
            include_str!("shaders/dot_q5.wgsl").replace("MIN_WORD", min_word)
        }
        DType::Q4_K => include_str!("shaders/dot_q4_k.wgsl").into(),
        DType::Q6_K => include_str!("shaders/dot_q6_k.wgsl").into(),
        DType::MXFP4 | DType::NVFP4 | DType::FP8 => {
            let dot = match dtype {
                DType::MXFP4 => include_str!("shaders/dot_mxfp4.wgsl"),
                DType::NVFP4 => include_str!("shaders/dot_nvfp4.wgsl"),
                _ => include_str!("shaders/dot_fp8.wgsl"),
            };
            dot.replace("//MINIFLOAT", include_str!("shaders/minifloat.wgsl"))
        }
        other => unreachable!("DeviceWeight::upload refuses {other:?}"),
    }
}

/// A matmul shader (`main`: matmul.wgsl or matmul_id.wgsl) for `dtype`.
pub(crate) fn matmul_source(main: &str, dtype: DType) -> String {
    let (lanes, rows) = matmul_shape(dtype);
    main.replace("//COMMON", include_str!("shaders/matmul_common.wgsl"))
        .replace("//DOT", &dot_source(dtype))
        .replace("LANESu", &format!("{lanes}u"))
        .replace("ROWSu", &format!("{rows}u"))
}

fn rms_norm_source(inplace: bool) -> String {
    let bindings = if inplace {
        "@group(0) @binding(2) var<storage, read_write> y: array<f32>;\nfn src(i: u32) -> f32 { return y[i]; }"
    } else {
        "@group(0) @binding(2) var<storage, read> x: array<f32>;\n\
         @group(0) @binding(3) var<storage, read_write> y: array<f32>;\nfn src(i: u32) -> f32 { return x[i]; }"
    };
    include_str!("shaders/rms_norm.wgsl").replace("//BINDINGS", bindings)
}

/// Eight parameter words (32 bytes), as the shaders' `Params` structs.
pub(crate) fn words8(w: [u32; 8]) -> [u32; 8] {
    w
}

/// Workgroups for one per row, rows past 32768 in z: `(x, y = t, z)`.
pub(crate) fn row_grid(rows: usize, t: usize) -> [u32; 3] {
    [rows.min(32768) as u32, t as u32, rows.div_ceil(32768) as u32]
}

/// Workgroups of 256 for `n` elements, spilling into y past 65535.
pub(crate) fn flat_grid(n: usize) -> [u32; 3] {
    let g = n.div_ceil(256).max(1);
    [g.min(65535) as u32, g.div_ceil(65535) as u32, 1]
}

/// Records ops on `gpu`; [`Pass::submit`] runs them.
///
/// Per-dispatch cost is what limits decode on a fast GPU (a 1.1B model's
/// step is ~380 dispatches and ~0.2 ms of weight traffic on an H200), so
/// consecutive dispatches share one compute pass (wgpu still orders each
/// dispatch's reads after earlier writes), the parameters of all of them go
/// up in one write, and bind groups are reused across steps (a step of the
/// same shape binds the same buffers at the same parameter slots).
pub struct Pass<'g> {
    pub(crate) gpu: &'g Gpu,
    enc: wgpu::CommandEncoder,
    cpass: Option<wgpu::ComputePass<'static>>,
    /// This submission's parameter slots, written at submit (or flush).
    params: Vec<u8>,
}

impl<'g> Pass<'g> {
    pub fn new(gpu: &'g Gpu) -> Pass<'g> {
        Pass { gpu, enc: gpu.device.create_command_encoder(&Default::default()), cpass: None, params: Vec::new() }
    }

    /// Ends the open compute pass (before a copy, or to finish).
    fn end_compute(&mut self) {
        self.cpass = None;
    }

    /// Writes the parameter slots and submits what was recorded so far.
    fn submit_now(&mut self) {
        self.end_compute();
        if !self.params.is_empty() {
            self.gpu.queue.write_buffer(&self.gpu.params, 0, &self.params);
            self.params.clear();
        }
        let enc = std::mem::replace(&mut self.enc, self.gpu.device.create_command_encoder(&Default::default()));
        self.gpu.queue.submit([enc.finish()]);
    }

    pub(crate) fn dispatch(
        &mut self,
        key: &str,
        source: impl FnOnce() -> String,
        params: &[u32],
        bufs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) {
        if groups.contains(&0) {
            return;
        }
        if self.params.len() as u64 == PARAM_SLOTS * PARAM_SLOT {
            // Out of slots: the next writes land after this submission.
            self.submit_now();
        }
        let offset = self.params.len() as u64;
        self.params.extend_from_slice(bytemuck::cast_slice(params));
        self.params.resize((offset + PARAM_SLOT) as usize, 0);
        let gpu = self.gpu;
        let pipeline = gpu.pipeline(key, source);
        let bind = gpu.bind_group(key, &pipeline, offset, (params.len() * 4) as u64, bufs);
        if self.cpass.is_none() {
            let cp = self.enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            self.cpass = Some(cp.forget_lifetime());
        }
        let cp = self.cpass.as_mut().expect("opened above");
        cp.set_pipeline(&pipeline);
        cp.set_bind_group(0, &*bind, &[]);
        cp.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if let Some(profile) = &gpu.profile {
            let t0 = std::time::Instant::now();
            self.submit_now();
            gpu.wait();
            let dt = t0.elapsed().as_secs_f64();
            let label = format!("{key} {groups:?}");
            let mut p = profile.lock().unwrap_or_else(|e| e.into_inner());
            let e = p.entry(label).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += dt;
        }
    }

    /// `y[y_off + t·n ..] = x[x_off + t·k ..] · Wᵀ (· out_scale) + bias` for `t` rows.
    pub fn matmul(&mut self, w: &DeviceWeight, x: &DeviceBuf, x_off: usize, t: usize, y: &DeviceBuf, y_off: usize) {
        self.matmul_into(w, x, x_off, t, (y, y_off, w.rows), false);
    }

    /// [`Pass::matmul`] into columns `y_off ..` of token rows of `y_stride`
    /// values (one projection of a fused q‖k‖v or gate‖up row).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_cols(
        &mut self,
        w: &DeviceWeight,
        x: &DeviceBuf,
        x_off: usize,
        t: usize,
        y: &DeviceBuf,
        (y_off, y_stride): (usize, usize),
    ) {
        self.matmul_into(w, x, x_off, t, (y, y_off, y_stride), false);
    }

    /// [`Pass::matmul`] adding to `y` instead of overwriting it (a residual add in one dispatch).
    pub fn matmul_add(&mut self, w: &DeviceWeight, x: &DeviceBuf, x_off: usize, t: usize, y: &DeviceBuf, y_off: usize) {
        self.matmul_into(w, x, x_off, t, (y, y_off, w.rows), true);
    }

    fn matmul_into(
        &mut self,
        w: &DeviceWeight,
        x: &DeviceBuf,
        x_off: usize,
        t: usize,
        (y, y_off, y_stride): (&DeviceBuf, usize, usize),
        accumulate: bool,
    ) {
        debug_assert!(x_off + t * w.cols <= x.words && y_off + (t.max(1) - 1) * y_stride + w.rows <= y.words);
        let key = format!("matmul_{:?}", w.dtype);
        for part in &w.parts {
            let p = words8([
                part.rows as u32,
                w.cols as u32,
                t as u32,
                part.bias.is_some() as u32 | (accumulate as u32) << 1,
                w.out_scale.to_bits(),
                x_off as u32,
                (y_off + part.row0) as u32,
                y_stride as u32,
            ]);
            let dummy = &self.gpu.dummy;
            let w1 = part.w1.as_ref().map_or(dummy, |b| &b.buf);
            let bias = part.bias.as_ref().map_or(dummy, |b| &b.buf);
            let bufs = [&x.buf, &part.w0.buf, w1, bias, &y.buf];
            // ROWS rows a workgroup (matmul.wgsl).
            let rows = matmul_shape(w.dtype).1;
            self.dispatch(&key, || matmul_source(MATMUL, w.dtype), &p, &bufs, row_grid(part.rows.div_ceil(rows), t));
        }
    }

    /// RMSNorm of `rows` rows of `width` from `x` into `y`, weight `w` (`width` values).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &mut self,
        x: &DeviceBuf,
        x_off: usize,
        w: &DeviceBuf,
        (width, rows, eps): (usize, usize, f32),
        y: &DeviceBuf,
        y_off: usize,
    ) {
        let p = words8([width as u32, rows as u32, eps.to_bits(), x_off as u32, y_off as u32, 1, width as u32, 0]);
        self.dispatch("rms_norm", || rms_norm_source(false), &p, &[&w.buf, &x.buf, &y.buf], row_grid(rows, 1));
    }

    /// RMSNorm in place of `rows` contiguous rows of `width`.
    pub fn rms_norm_inplace(
        &mut self,
        y: &DeviceBuf,
        y_off: usize,
        w: &DeviceBuf,
        (width, rows, eps): (usize, usize, f32),
    ) {
        self.rms_norm_heads(y, y_off, w, (width, 1, rows, eps), width);
    }

    /// Per-head RMSNorm in place (q/k norms): `heads` rows of `width` =
    /// head_dim at the start of each of `t` token rows of `stride` values.
    pub fn rms_norm_heads(
        &mut self,
        y: &DeviceBuf,
        y_off: usize,
        w: &DeviceBuf,
        (width, heads, t, eps): (usize, usize, usize, f32),
        stride: usize,
    ) {
        let rows = heads * t;
        let p = words8([
            width as u32,
            rows as u32,
            eps.to_bits(),
            y_off as u32,
            y_off as u32,
            heads as u32,
            stride as u32,
            0,
        ]);
        self.dispatch("rms_norm_inplace", || rms_norm_source(true), &p, &[&w.buf, &y.buf], row_grid(rows, 1));
    }

    /// Rotary embedding in place on `t × heads × head_dim` values of `x`,
    /// tables `cos`/`sin` of `t × half`; `interleaved` rotates adjacent pairs.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &mut self,
        x: &DeviceBuf,
        x_off: usize,
        (t, heads, head_dim, half): (usize, usize, usize, usize),
        cos: &DeviceBuf,
        sin: &DeviceBuf,
        interleaved: bool,
    ) {
        self.rope_rows(x, (x_off, heads * head_dim), (t, heads, head_dim, half), cos, sin, interleaved);
    }

    /// [`Pass::rope`] on the first `heads` heads of each token row of
    /// `stride` values from `x_off` (q and k side by side in a q‖k‖v row).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_rows(
        &mut self,
        x: &DeviceBuf,
        (x_off, stride): (usize, usize),
        (t, heads, head_dim, half): (usize, usize, usize, usize),
        cos: &DeviceBuf,
        sin: &DeviceBuf,
        interleaved: bool,
    ) {
        self.rope_heads(x, (x_off, stride, head_dim), (t, heads, half), (cos, sin), interleaved);
    }

    /// [`Pass::rope`] on `heads` heads `head_stride` apart from `x_off` in
    /// each token row of `stride` values, rotating each head's first
    /// `2·half` values (latent attention: the rope tail of each q head at
    /// `x_off = nope`, `head_stride = nope + rope`).
    pub fn rope_heads(
        &mut self,
        x: &DeviceBuf,
        (x_off, stride, head_stride): (usize, usize, usize),
        (t, heads, half): (usize, usize, usize),
        (cos, sin): (&DeviceBuf, &DeviceBuf),
        interleaved: bool,
    ) {
        let p = words8([
            heads as u32,
            head_stride as u32,
            half as u32,
            interleaved as u32,
            x_off as u32,
            stride as u32,
            0,
            0,
        ]);
        let src = || include_str!("shaders/rope.wgsl").to_string();
        self.dispatch("rope", src, &p, &[&cos.buf, &sin.buf, &x.buf], [heads as u32, t as u32, 1]);
    }

    /// Copies `len` values of each of `rows` rows: from `src` rows of
    /// `src_stride` at `src_off` to `dst` rows of `dst_stride` at `dst_off`.
    pub fn copy_rows(
        &mut self,
        (src, src_off, src_stride): (&DeviceBuf, usize, usize),
        (dst, dst_off, dst_stride): (&DeviceBuf, usize, usize),
        (rows, len): (usize, usize),
    ) {
        let p = words8([
            rows as u32,
            len as u32,
            src_off as u32,
            src_stride as u32,
            dst_off as u32,
            dst_stride as u32,
            0,
            0,
        ]);
        let s = || include_str!("shaders/copy_rows.wgsl").to_string();
        self.dispatch("copy_rows", s, &p, &[&src.buf, &dst.buf], flat_grid(rows * len));
    }

    /// `out = act(gate) · up` for `t` token rows of `gu`, each the gate's
    /// `width` values then the up projection's; `out` is `t × width`.
    pub fn act_mul(&mut self, gu: &DeviceBuf, out: &DeviceBuf, (t, width): (usize, usize), act: Act) {
        let n = t * width;
        let (code, alpha, limit) = match act {
            Act::Silu => (0, 0.0f32, 0.0f32),
            Act::GeluTanh => (1, 0.0, 0.0),
            Act::ClampedSwiglu { alpha, limit } => (2, alpha, limit),
        };
        let p = words8([n as u32, code, width as u32, alpha.to_bits(), limit.to_bits(), 0, 0, 0]);
        let src = || include_str!("shaders/act_mul.wgsl").to_string();
        self.dispatch("act_mul", src, &p, &[&gu.buf, &out.buf], flat_grid(n));
    }

    /// `y[r, i] *= sigmoid(g[g_off + r · g_stride + i])` for `rows` rows of
    /// `width` contiguous values of `y`.
    pub fn sigmoid_mul(&mut self, y: &DeviceBuf, (rows, width): (usize, usize), g: &DeviceBuf, gs: (usize, usize)) {
        self.gate_mul(y, (rows, width), g, gs, false);
    }

    /// `y ·= sigmoid(g)`, or `· SiLU(g)` with `silu` (sigmoid_mul.wgsl).
    pub(crate) fn gate_mul(
        &mut self,
        y: &DeviceBuf,
        (rows, width): (usize, usize),
        g: &DeviceBuf,
        (g_off, g_stride): (usize, usize),
        silu: bool,
    ) {
        let p = words8([rows as u32, width as u32, 0, g_off as u32, g_stride as u32, silu as u32, 0, 0]);
        let s = || include_str!("shaders/sigmoid_mul.wgsl").to_string();
        self.dispatch("sigmoid_mul", s, &p, &[&g.buf, &y.buf], flat_grid(rows * width));
    }

    /// `x += o` over `n` values.
    pub fn add(&mut self, x: &DeviceBuf, o: &DeviceBuf, n: usize) {
        let p = [n as u32, 0, 0, 0];
        let src = || include_str!("shaders/add.wgsl").to_string();
        self.dispatch("add", src, &p, &[&o.buf, &x.buf], flat_grid(n));
    }

    /// Stores `row` values of each of `t` token rows of `src` (rows of
    /// `stride` values from `src_off`) at pool rows `slots`, as `kv`
    /// ([`KvElem::fits_row`] holds for `row`).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &mut self,
        src: &DeviceBuf,
        src_off: usize,
        (t, row, stride): (usize, usize, usize),
        slots: &DeviceBuf,
        pool: &DeviceBuf,
        kv: KvElem,
    ) {
        assert!(kv.fits_row(row), "{} KV rows of {row} values (checked when the model loads)", kv.name());
        let p = [row as u32, t as u32, src_off as u32, stride as u32];
        let key = format!("kv_store_{}", kv.name());
        let n = kv_store_invocations(kv, t, row);
        self.dispatch(&key, || kv_store_source(kv), &p, &[&src.buf, &slots.buf, &pool.buf], flat_grid(n));
    }

    /// Causal attention of `t` query rows (`heads × head_dim` each, at
    /// `q_off` of token rows of `q_stride` values) over the paged pools;
    /// `tok` holds (position, table offset) per row and `tables` the block
    /// tables; `sinks` a sink logit per head. Output rows (`heads × head_dim`) into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        q: &DeviceBuf,
        (q_off, q_stride): (usize, usize),
        t: usize,
        a: &AttnArgs,
        (kpool, vpool): (&DeviceBuf, &DeviceBuf),
        (tok, tables): (&DeviceBuf, &DeviceBuf),
        sinks: Sinks<'_>,
        out: &DeviceBuf,
    ) {
        assert!(a.head_dim <= MAX_HEAD_DIM && a.heads.is_multiple_of(a.kv_heads), "checked when the model loads");
        // Output dims per invocation: 4 (head_dim ≤ 256) or more.
        let tiles = a.head_dim.div_ceil(64).max(4);
        let p = [
            a.heads as u32,
            a.kv_heads as u32,
            a.head_dim as u32,
            a.block as u32,
            a.scale.to_bits(),
            a.window.unwrap_or(0) as u32,
            q_off as u32,
            q_stride as u32,
            sinks.is_some() as u32,
            0,
            0,
            0,
        ];
        let s = || {
            include_str!("shaders/attention.wgsl")
                .replace("TILESu", &format!("{tiles}u"))
                .replace("//POOLS", &attention_pools(a.kv))
        };
        let sinks = sinks.map_or(&self.gpu.dummy, |b| &b.buf);
        let bufs = [&q.buf, &kpool.buf, &vpool.buf, &tok.buf, &tables.buf, &out.buf, sinks];
        let key = format!("attention_{tiles}_{}", a.kv.name());
        self.dispatch(&key, s, &p, &bufs, [a.heads as u32, t as u32, 1]);
    }

    /// Submits what was recorded so far and goes on recording: the device
    /// starts on it while the host records the rest (a step's layers).
    pub fn flush(&mut self) {
        self.submit_now();
    }

    /// Copies `words` words from `src` to `dst`.
    pub fn copy(&mut self, src: &DeviceBuf, src_off: usize, dst: &DeviceBuf, dst_off: usize, words: usize) {
        if words > 0 {
            self.end_compute();
            self.enc.copy_buffer_to_buffer(
                &src.buf,
                (src_off * 4) as u64,
                &dst.buf,
                (dst_off * 4) as u64,
                (words * 4) as u64,
            );
        }
    }

    /// Zeroes `words` words of `buf` from `off` (on the device: nothing is uploaded).
    pub fn zero(&mut self, buf: &DeviceBuf, off: usize, words: usize) {
        if words > 0 {
            self.end_compute();
            self.enc.clear_buffer(&buf.buf, (off * 4) as u64, Some((words * 4) as u64));
        }
    }

    /// Submits the recorded ops (results are read with [`Gpu::read_f32`]).
    pub fn submit(mut self) -> Result<(), GpuError> {
        self.submit_now();
        self.gpu.check()
    }
}
