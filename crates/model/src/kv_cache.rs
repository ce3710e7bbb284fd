//! Per-sequence KV cache: for each layer this shard owns, keys and values of every
//! past position, f16 (as llama.cpp's default), laid out `[position, kv_head, head_dim]`.
//!
//! f16 halves the memory and the bytes attention streams per decoded token; values
//! are rounded to nearest even when stored ([`kernels::attention::f32_to_f16`]) and
//! widened exactly when read, so the only error is the storage rounding
//! (relative ≤ 2⁻¹¹ for normal values).

use half::f16;

/// The cache of one sequence. Capacity is fixed at creation so decode never allocates.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// One (k, v) pair per owned layer, each `capacity × kv_width`.
    pub layers: Vec<(Vec<f16>, Vec<f16>)>,
    /// Local KV heads × head_dim.
    pub kv_width: usize,
    pub capacity: usize,
    /// Positions filled so far (the next token's position).
    pub len: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> KvCache {
        let n = capacity * kv_width;
        let layers = (0..n_layers).map(|_| (vec![f16::ZERO; n], vec![f16::ZERO; n])).collect();
        KvCache { layers, kv_width, capacity, len: 0 }
    }

    /// Bytes held (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.capacity * self.kv_width * std::mem::size_of::<f16>()
    }

    /// Forgets positions from `len` on (for prefix reuse or retries).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
