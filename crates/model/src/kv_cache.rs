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

/// One (k, v) pair per owned layer, each `n_blocks × block × kv_width`, of one type.
#[derive(Debug, Clone)]
pub enum KvLayers {
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    F32(Vec<(Vec<f32>, Vec<f32>)>),
}

/// `n` zero f16 values from zeroed memory, so a large pool costs no resident
/// memory until its blocks are written (`vec![f16::ZERO; n]` writes every slot).
fn zeroed_f16(n: usize) -> Vec<f16> {
    let mut v = std::mem::ManuallyDrop::new(vec![0u16; n]);
    // SAFETY: f16 is a transparent u16 (same size and alignment) and 0 is +0.0.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut f16, v.len(), v.capacity()) }
}

/// Fixed-size blocks of KV storage for every layer this shard owns: block `b`
/// holds `block` consecutive positions of some sequence, `[row, kv_head,
/// head_dim]`, at the same offset in every layer. Sequences hold block tables
/// (`SeqKv::Paged`); which sequence owns which block is the caller's business
/// (the serving engine's block manager, decided on rank 0 and broadcast).
#[derive(Debug, Clone)]
pub struct KvPool {
    pub layers: KvLayers,
    /// Local KV heads × head_dim.
    pub kv_width: usize,
    /// Positions per block.
    pub block: usize,
    pub n_blocks: usize,
}

impl KvPool {
    pub fn new(n_layers: usize, kv_width: usize, block: usize, n_blocks: usize, ty: KvType) -> KvPool {
        let n = n_blocks * block * kv_width;
        let layers = match ty {
            KvType::F16 => KvLayers::F16((0..n_layers).map(|_| (zeroed_f16(n), zeroed_f16(n))).collect()),
            KvType::F32 => KvLayers::F32((0..n_layers).map(|_| (vec![0f32; n], vec![0f32; n])).collect()),
        };
        KvPool { layers, kv_width, block, n_blocks }
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
        self.n_layers() * 2 * self.n_blocks * self.block * self.kv_width * self.kv_type().bytes()
    }

    /// Bytes one block takes across the owned layers.
    pub fn block_bytes(&self) -> usize {
        self.n_layers() * 2 * self.block * self.kv_width * self.kv_type().bytes()
    }
}

/// The cache of one sequence, contiguous: a pool of one block of `capacity`
/// positions. Capacity is fixed at creation so decode never allocates.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub pool: KvPool,
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
        KvCache { pool: KvPool::new(n_layers, kv_width, capacity.max(1), 1, ty), capacity, len: 0 }
    }

    pub fn kv_type(&self) -> KvType {
        self.pool.kv_type()
    }

    pub fn n_layers(&self) -> usize {
        self.pool.n_layers()
    }

    /// Bytes held (for memory accounting).
    pub fn bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Forgets positions from `len` on (for prefix reuse or retries).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Where a sequence's KV lives during a forward step.
pub enum SeqKv<'a> {
    /// Its own contiguous cache; the step advances `len`.
    Own(&'a mut KvCache),
    /// Blocks of the pool given to `Model::forward_paged`: `table` covers
    /// positions `0..start + tokens`, `start` positions are already filled. The
    /// caller advances its own count.
    Paged { table: &'a [u32], start: usize },
}

impl SeqKv<'_> {
    /// Positions already in the cache (the first new token's position).
    pub fn start(&self) -> usize {
        match self {
            SeqKv::Own(c) => c.len,
            SeqKv::Paged { start, .. } => *start,
        }
    }
}
