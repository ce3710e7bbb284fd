//! Per-sequence KV cache: for each layer this shard owns, keys and values of every
//! past position, f32, laid out `[position, kv_head, head_dim]`.

/// The cache of one sequence. Capacity is fixed at creation so decode never allocates.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// One (k, v) pair per owned layer, each `capacity × kv_width`.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// Local KV heads × head_dim.
    pub kv_width: usize,
    pub capacity: usize,
    /// Positions filled so far (the next token's position).
    pub len: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> KvCache {
        let layers =
            (0..n_layers).map(|_| (vec![0f32; capacity * kv_width], vec![0f32; capacity * kv_width])).collect();
        KvCache { layers, kv_width, capacity, len: 0 }
    }

    /// Bytes held (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.capacity * self.kv_width * 4
    }

    /// Forgets positions from `len` on (for prefix reuse or retries).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}
