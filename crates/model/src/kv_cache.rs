//! Per-sequence KV cache: for each layer this shard owns, keys and values of every
//! past position, laid out `[position, kv_head, head_dim]`.
//!
//! Element type ([`KvType`]): f16 by default (as llama.cpp's), which halves the
//! memory and the bytes attention streams per decoded token; values are rounded
//! to nearest even when stored ([`kernels::attention::f32_to_f16`]) and widened
//! exactly when read, so the only error is the storage rounding (relative ≤ 2⁻¹¹
//! for normal values). f32 is chosen automatically for float checkpoints (whose
//! compute is f32 end to end, and whose logits must stay within 1e-3 of
//! transformers), or forced with `SHARDLM_KV_TYPE=f16|f32`.

use half::f16;

/// The KV cache's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
}

impl KvType {
    pub fn parse(s: &str) -> Option<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Some(KvType::F16),
            "f32" => Some(KvType::F32),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
        }
    }

    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
}

/// One (k, v) pair per owned layer, each `capacity × kv_width`, of one type.
#[derive(Debug, Clone)]
pub enum KvLayers {
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    F32(Vec<(Vec<f32>, Vec<f32>)>),
}

/// The cache of one sequence. Capacity is fixed at creation so decode never allocates.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub layers: KvLayers,
    /// Local KV heads × head_dim.
    pub kv_width: usize,
    pub capacity: usize,
    /// Positions filled so far (the next token's position).
    pub len: usize,
}

impl KvCache {
    /// An f16 cache.
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> KvCache {
        KvCache::with_type(n_layers, kv_width, capacity, KvType::F16)
    }

    pub fn with_type(n_layers: usize, kv_width: usize, capacity: usize, ty: KvType) -> KvCache {
        let n = capacity * kv_width;
        let layers = match ty {
            KvType::F16 => KvLayers::F16((0..n_layers).map(|_| (vec![f16::ZERO; n], vec![f16::ZERO; n])).collect()),
            KvType::F32 => KvLayers::F32((0..n_layers).map(|_| (vec![0f32; n], vec![0f32; n])).collect()),
        };
        KvCache { layers, kv_width, capacity, len: 0 }
    }

    pub fn kv_type(&self) -> KvType {
        match self.layers {
            KvLayers::F16(_) => KvType::F16,
            KvLayers::F32(_) => KvType::F32,
        }
    }

    pub fn n_layers(&self) -> usize {
        match &self.layers {
            KvLayers::F16(l) => l.len(),
            KvLayers::F32(l) => l.len(),
        }
    }

    /// Bytes held (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.n_layers() * 2 * self.capacity * self.kv_width * self.kv_type().bytes()
    }

    /// Forgets positions from `len` on (for prefix reuse or retries).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
