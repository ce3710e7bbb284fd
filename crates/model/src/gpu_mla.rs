//! Latent attention (MLA, DeepSeek V2/V3) on the GPU, absorbed as on the
//! CPU (`crate::mla`): the device pool holds one `r + rope` row per
//! position (the normalized latent, then the roped shared key); each head's
//! query is folded into latent space by `W_UK_hᵀ`, attention runs as
//! multi-query attention with the cache row as key and value, and each
//! head's latent output is lifted by `W_UV_h`.
//!
//! The per-head folds are one [`Pass::matmul_id`] each, the heads playing
//! the experts (pair = (token, head), matrix = head): `W_UK_hᵀ` (`r ×
//! nope`) and `W_UV_h` (`v × r`), f32 as the CPU holds them (they come from
//! `kv_b_proj`, split and transposed per head at load).

use super::gpu_shard::weight;
use crate::mla::Mla;
use crate::ModelError;
use kernels::DType;
use shardlm_gpu::{AttnArgs, DeviceBuf, DeviceWeight, Gpu, Pairs, Pass};

pub(crate) struct GpuMla {
    /// `q_a_proj`, its norm and width (`q_lora_rank`), when the query is low-rank.
    q_a: Option<(DeviceWeight, DeviceBuf, usize)>,
    q_b: DeviceWeight,
    kv_a: DeviceWeight,
    kv_a_norm: DeviceBuf,
    /// Per local head: `W_UK_hᵀ` (`r × nope`) and `W_UV_h` (`v × r`).
    w_uk_t: DeviceWeight,
    w_uv: DeviceWeight,
    pub(crate) o: DeviceWeight,
    heads: usize,
    r: usize,
    rope: usize,
    nope: usize,
    v: usize,
    scale: f32,
    eps: f32,
}

/// Step buffers of the MLA layers, shared by all of them.
pub(crate) struct MlaBufs {
    qa: DeviceBuf,
    q: DeviceBuf,
    kv: DeviceBuf,
    q_lat: DeviceBuf,
    out_lat: DeviceBuf,
    attn: DeviceBuf,
}

/// What a step's attention reads besides the layer: rope tables, each
/// row's pool slot, (position, table offset) and the block tables.
pub(crate) struct StepRows<'a> {
    pub cos: &'a DeviceBuf,
    pub sin: &'a DeviceBuf,
    pub interleaved: bool,
    pub slots: &'a DeviceBuf,
    pub tok: &'a DeviceBuf,
    pub tables: &'a DeviceBuf,
    pub block: usize,
    /// What the pool holds.
    pub kv: shardlm_gpu::KvElem,
}

/// Per head, the `a × b` matrix `m_h` (row-major, `heads` of them end to
/// end) transposed to `b × a`, as f32 bytes.
fn transpose_heads(m: &[f32], heads: usize, a: usize, b: usize) -> Vec<u8> {
    let mut out = vec![0f32; m.len()];
    for h in 0..heads {
        let (src, dst) = (&m[h * a * b..(h + 1) * a * b], &mut out[h * a * b..(h + 1) * a * b]);
        for i in 0..a {
            for j in 0..b {
                dst[j * a + i] = src[i * b + j];
            }
        }
    }
    bytemuck::cast_slice(&out).to_vec()
}

fn per_head(
    gpu: &Gpu,
    name: &str,
    bytes: &[u8],
    heads: usize,
    (rows, cols): (usize, usize),
) -> Result<DeviceWeight, ModelError> {
    let one = rows * cols * 4;
    let parts: Vec<Vec<_>> =
        (0..heads).map(|h| vec![(DType::F32, (rows, cols), &bytes[h * one..(h + 1) * one], None, 1.0)]).collect();
    DeviceWeight::upload_experts(gpu, name, &parts)?
        .ok_or_else(|| ModelError::Unsupported(format!("{name}: heads of different shapes")))
}

impl GpuMla {
    pub(crate) fn upload(gpu: &Gpu, m: &Mla) -> Result<GpuMla, ModelError> {
        let sp = &m.spec;
        let (heads, r, nope, v) = (m.n_heads, sp.kv_lora, sp.nope, sp.v_dim);
        let w = sp.cache_width();
        if w > shardlm_gpu::MAX_HEAD_DIM {
            return Err(ModelError::Unsupported(format!(
                "a latent row of {w} (at most {})",
                shardlm_gpu::MAX_HEAD_DIM
            )));
        }
        let q_a = match &m.q_a {
            Some((l, norm)) => {
                Some((weight(gpu, l)?, gpu.buffer_with("q_a_norm", bytemuck::cast_slice(norm))?, l.out_features()))
            }
            None => None,
        };
        let uk = transpose_heads(&m.w_uk, heads, nope, r);
        let uv = transpose_heads(&m.w_uv_t, heads, r, v);
        Ok(GpuMla {
            q_a,
            q_b: weight(gpu, &m.q_b)?,
            kv_a: weight(gpu, &m.kv_a)?,
            kv_a_norm: gpu.buffer_with("kv_a_norm", bytemuck::cast_slice(&m.kv_a_norm))?,
            w_uk_t: per_head(gpu, "mla.w_uk", &uk, heads, (r, nope))?,
            w_uv: per_head(gpu, "mla.w_uv", &uv, heads, (v, r))?,
            o: weight(gpu, &m.o)?,
            heads,
            r,
            rope: sp.rope,
            nope,
            v,
            scale: sp.scale,
            eps: m.eps,
        })
    }

    /// Values of one cache row.
    pub(crate) fn width(&self) -> usize {
        self.r + self.rope
    }

    pub(crate) fn bytes(&self) -> usize {
        let qa = self.q_a.as_ref().map_or(0, |(w, _, _)| w.bytes());
        qa + self.q_b.bytes() + self.kv_a.bytes() + self.w_uk_t.bytes() + self.w_uv.bytes() + self.o.bytes()
    }

    /// Step buffers for `rows` tokens, large enough for every layer in `layers`.
    pub(crate) fn bufs<'a>(
        gpu: &Gpu,
        layers: impl Iterator<Item = &'a GpuMla> + Clone,
        rows: usize,
    ) -> Result<Option<MlaBufs>, ModelError> {
        let max = |f: &dyn Fn(&GpuMla) -> usize| layers.clone().map(f).max();
        let Some(w) = max(&|m| m.width()) else { return Ok(None) };
        let hw = max(&|m| m.heads * m.width()).unwrap_or(1);
        Ok(Some(MlaBufs {
            qa: gpu.buffer("mla.qa", rows * max(&|m| m.q_a.as_ref().map_or(1, |q| q.2)).unwrap_or(1))?,
            q: gpu.buffer("mla.q", rows * max(&|m| m.heads * (m.nope + m.rope)).unwrap_or(1))?,
            kv: gpu.buffer("mla.kv", rows * w)?,
            q_lat: gpu.buffer("mla.q_lat", rows * hw)?,
            out_lat: gpu.buffer("mla.out_lat", rows * hw)?,
            attn: gpu.buffer("mla.attn", rows * max(&|m| m.heads * m.v).unwrap_or(1))?,
        }))
    }

    /// Records the projections over `n` normalized rows `xn`: each head's
    /// query (`b.q`, rope tail roped) and each row's latent (`b.kv`).
    pub(crate) fn record_project(
        &self,
        pass: &mut Pass<'_>,
        b: &MlaBufs,
        (xn, n): (&DeviceBuf, usize),
        s: &StepRows<'_>,
    ) {
        let (nh, r, nope, qk, w) = (self.heads, self.r, self.nope, self.nope + self.rope, self.width());
        match &self.q_a {
            Some((q_a, norm, ql)) => {
                pass.matmul(q_a, xn, 0, n, &b.qa, 0);
                pass.rms_norm_inplace(&b.qa, 0, norm, (*ql, n, self.eps));
                pass.matmul(&self.q_b, &b.qa, 0, n, &b.q, 0);
            }
            None => pass.matmul(&self.q_b, xn, 0, n, &b.q, 0),
        }
        pass.matmul(&self.kv_a, xn, 0, n, &b.kv, 0);
        // The latent's norm, then the shared key's rope and each q head's.
        pass.rms_norm_heads(&b.kv, 0, &self.kv_a_norm, (r, 1, n, self.eps), w);
        let half = self.rope / 2;
        pass.rope_heads(&b.kv, (r, w, w), (n, 1, half), (s.cos, s.sin), s.interleaved);
        pass.rope_heads(&b.q, (nope, nh * qk, qk), (n, nh, half), (s.cos, s.sin), s.interleaved);
    }

    /// Records the latents' store into `pool` (this layer's, `width()`
    /// values a row) and the absorbed attention into `b.attn`.
    pub(crate) fn record_attend(&self, pass: &mut Pass<'_>, b: &MlaBufs, n: usize, s: &StepRows<'_>, pool: &DeviceBuf) {
        let (nh, r, nope, qk, w) = (self.heads, self.r, self.nope, self.nope + self.rope, self.width());
        pass.kv_store(&b.kv, 0, (n, w, w), s.slots, pool, s.kv);
        // q_lat[t, h] = W_UK_hᵀ q_nope[t, h] ‖ q_rope[t, h].
        let heads = Pairs { t: n, top_k: nh, ids: None, first: 0, group: None };
        pass.matmul_id(&self.w_uk_t, (&b.q, true, qk), heads, &b.q_lat, (0, w));
        pass.copy_rows((&b.q, nope, qk), (&b.q_lat, r, w), (n * nh, self.rope));
        let (block, scale, kv) = (s.block, self.scale, s.kv);
        let args = AttnArgs { heads: nh, kv_heads: 1, head_dim: w, block, scale, window: None, kv };
        pass.attention(&b.q_lat, (0, nh * w), n, &args, (pool, pool), (s.tok, s.tables), None, &b.out_lat);
        // attn[t, h] = W_UV_h out_lat[t, h][..r].
        pass.matmul_id(&self.w_uv, (&b.out_lat, true, w), heads, &b.attn, (0, self.v));
    }

    /// Records the output projection of `b.attn` into `(y, accumulate)`.
    pub(crate) fn record_out(&self, pass: &mut Pass<'_>, b: &MlaBufs, n: usize, (y, accumulate): (&DeviceBuf, bool)) {
        match accumulate {
            true => pass.matmul_add(&self.o, &b.attn, 0, n, y, 0),
            false => pass.matmul(&self.o, &b.attn, 0, n, y, 0),
        }
    }
}
