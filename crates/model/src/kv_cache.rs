//! Per-sequence KV cache: for each layer this shard owns, keys and values of every
//! past position, laid out `[position, kv_head, head_dim]`.
//!
//! Element type ([`KvType`]): f16 by default (as llama.cpp's), which halves the
//! memory and the bytes attention streams per decoded token; values are rounded
//! to nearest even when stored ([`kernels::attention::f32_to_f16`]) and widened
//! exactly when read, so the only error is the storage rounding (relative ≤ 2⁻¹¹
//! for normal values). f32 is chosen automatically for float checkpoints (whose
//! compute is f32 end to end, and whose logits must stay within 1e-3 of
//! transformers), or forced with `SHARDLM_KV_TYPE=f16|f32|q8_0|q4_0` / `--kv-type`.
//!
//! Q8_0 and Q4_0 (GGUF block layouts, as llama.cpp's `--cache-type-k/v`) store
//! each head's `head_dim` values in blocks of 32 with one f16 scale: 34 and 18
//! bytes per 32 values (0.53× and 0.28× of f16). They need `head_dim % 32 == 0`
//! ([`KvType::check_head_dim`]). Measured logit error: docs/LONGCTX.md.

use half::f16;
use kernels::quant::q4_0::BlockQ4_0;
use kernels::quant::q8_0::BlockQ8_0;

/// The KV cache's element type.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0];

    pub fn parse(s: &str) -> Option<KvType> {
        let s = s.to_ascii_lowercase();
        KvType::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Values per stored element (a quantized block holds 32).
    pub fn block_values(self) -> usize {
        match self {
            KvType::F16 | KvType::F32 => 1,
            KvType::Q8_0 | KvType::Q4_0 => 32,
        }
    }

    /// Bytes per stored element (one value, or one block of [`KvType::block_values`]).
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
            KvType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            KvType::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
        }
    }

    /// Bytes of `values` stored values (a whole number of blocks for the
    /// quantized types: a K or V row is whole heads of whole blocks).
    pub fn bytes_for(self, values: usize) -> usize {
        values.div_ceil(self.block_values()) * self.block_bytes()
    }

    /// Whether heads of `head_dim` values can be stored: the quantized types
    /// need whole blocks per head.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), crate::ModelError> {
        if head_dim.is_multiple_of(self.block_values()) {
            return Ok(());
        }
        Err(crate::ModelError::Unsupported(format!(
            "a {} KV cache needs head_dim to be a multiple of {} (this model's is {head_dim}); use --kv-type f16",
            self.name(),
            self.block_values()
        )))
    }
}

/// One (k, v) pair per owned layer, each `n_blocks × block × kv_width` values
/// (`kv_width / 32` blocks per row for the quantized types), of one type.
#[derive(Debug, Clone)]
pub enum KvLayers {
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    F32(Vec<(Vec<f32>, Vec<f32>)>),
    Q8_0(Vec<(Vec<BlockQ8_0>, Vec<BlockQ8_0>)>),
    Q4_0(Vec<(Vec<BlockQ4_0>, Vec<BlockQ4_0>)>),
}

/// Element types whose all-zero bit pattern is a valid value (+0.0, or a block
/// with scale 0 and codes 0).
///
/// # Safety
/// Implement only for such types.
unsafe trait ZeroBits: Copy {}
// SAFETY: +0.0 for the floats; zero scale and codes for the blocks (both Pod).
unsafe impl ZeroBits for f16 {}
unsafe impl ZeroBits for f32 {}
unsafe impl ZeroBits for BlockQ8_0 {}
unsafe impl ZeroBits for BlockQ4_0 {}

/// `n` zero elements from zeroed memory, so a large pool costs no resident
/// memory until its blocks are written (`vec![x; n]` writes every slot).
fn zeroed<T: ZeroBits>(n: usize) -> Vec<T> {
    let layout = std::alloc::Layout::array::<T>(n).expect("KV pool size overflows");
    if layout.size() == 0 {
        return Vec::new();
    }
    // SAFETY: non-zero size; the memory is allocated with `T`'s layout for
    // exactly `n` elements, and zero bits are a valid `T` (`ZeroBits`).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}

fn layer_pairs<T: ZeroBits>(n_layers: usize, n: usize, n_v: usize) -> Vec<(Vec<T>, Vec<T>)> {
    (0..n_layers).map(|_| (zeroed(n), zeroed(n_v))).collect()
}

/// Fixed-size blocks of KV storage for every layer this shard owns: block `b`
/// holds `block` consecutive positions of some sequence, `[row, kv_head,
/// head_dim]`, at the same offset in every layer. Sequences hold block tables
/// (`SeqKv::Paged`); which sequence owns which block is the caller's business
/// (the serving engine's block manager, decided on rank 0 and broadcast).
#[derive(Debug)]
pub struct KvPool {
    pub layers: KvLayers,
    /// Values of one K row: local KV heads × head_dim, or for multi-head
    /// latent attention the latent ‖ rope key ([`KvPool::keys_only`]).
    pub kv_width: usize,
    /// Values of one V row: `kv_width`, or 0 for a keys-only pool (MLA reads
    /// its values from the latent part of the K row).
    pub v_width: usize,
    /// Positions per block.
    pub block: usize,
    pub n_blocks: usize,
    /// Slots of linear-attention state (hybrid models, [`crate::state_cache`]);
    /// `None` for models without linear-attention layers.
    pub states: Option<crate::state_cache::StatePool>,
    /// Contiguous caches only ([`KvCache::with_rings`]): `ring[l] > 0` makes
    /// layer `l` (a sliding-window layer) hold only its last `ring[l]`
    /// positions, position `p` at slot `p % ring[l]`; empty or 0: the layer
    /// holds every position.
    pub ring: Vec<usize>,
    /// Paged pools only ([`KvPool::set_window_layers`]): layers marked here
    /// (sliding-window layers) keep their own `n_window_blocks` blocks,
    /// addressed through each sequence's window table
    /// ([`SeqKv::Paged`]`::window`), not the full table; empty: none.
    pub window_layers: Vec<bool>,
    pub n_window_blocks: usize,
}

impl KvPool {
    /// A pool for rows of `kv_width` values. For the quantized types
    /// `kv_width` must be whole blocks of 32 (the model checks `head_dim` at
    /// load, [`KvType::check_head_dim`]); a partial block is rounded up.
    pub fn new(n_layers: usize, kv_width: usize, block: usize, n_blocks: usize, ty: KvType) -> KvPool {
        KvPool::with_widths(n_layers, kv_width, kv_width, block, n_blocks, ty)
    }

    /// A pool of K rows only (the V arrays are empty): multi-head latent
    /// attention caches one row of `kv_lora_rank + qk_rope_head_dim` values
    /// per position and layer, the normalized latent then the roped key
    /// (`crate::mla`).
    pub fn keys_only(n_layers: usize, kv_width: usize, block: usize, n_blocks: usize, ty: KvType) -> KvPool {
        KvPool::with_widths(n_layers, kv_width, 0, block, n_blocks, ty)
    }

    fn with_widths(
        n_layers: usize,
        kv_width: usize,
        v_width: usize,
        block: usize,
        n_blocks: usize,
        ty: KvType,
    ) -> KvPool {
        let n = n_blocks * block * kv_width.div_ceil(ty.block_values());
        let n_v = n_blocks * block * v_width.div_ceil(ty.block_values());
        let layers = match ty {
            KvType::F16 => KvLayers::F16(layer_pairs(n_layers, n, n_v)),
            KvType::F32 => KvLayers::F32(layer_pairs(n_layers, n, n_v)),
            KvType::Q8_0 => KvLayers::Q8_0(layer_pairs(n_layers, n, n_v)),
            KvType::Q4_0 => KvLayers::Q4_0(layer_pairs(n_layers, n, n_v)),
        };
        KvPool {
            layers,
            kv_width,
            v_width,
            block,
            n_blocks,
            ring: Vec::new(),
            states: None,
            window_layers: Vec::new(),
            n_window_blocks: 0,
        }
    }

    /// Gives the layers where `windowed` is true storage of their own:
    /// `n_window_blocks` blocks (of [`KvPool::block`] positions) instead of
    /// `n_blocks`, the sliding-window block group of a paged pool
    /// (docs/ARCHITECTURE.md, "Sliding-window layers in the paged pool").
    /// Layers without K/V storage ([`KvPool::drop_layers`]) stay empty.
    pub fn set_window_layers(&mut self, windowed: &[bool], n_window_blocks: usize) {
        let keep = self.kv_mask();
        let row = |w: usize| w.div_ceil(self.kv_type().block_values());
        let (n, n_v) =
            (n_window_blocks * self.block * row(self.kv_width), n_window_blocks * self.block * row(self.v_width));
        fn w<T: ZeroBits>(l: &mut [(Vec<T>, Vec<T>)], win: &[bool], keep: &[bool], n: usize, n_v: usize) {
            for ((pair, &on), &k) in l.iter_mut().zip(win).zip(keep) {
                if on && k {
                    *pair = (zeroed(n), zeroed(n_v));
                }
            }
        }
        match &mut self.layers {
            KvLayers::F16(l) => w(l, windowed, &keep, n, n_v),
            KvLayers::F32(l) => w(l, windowed, &keep, n, n_v),
            KvLayers::Q8_0(l) => w(l, windowed, &keep, n, n_v),
            KvLayers::Q4_0(l) => w(l, windowed, &keep, n, n_v),
        }
        self.window_layers = windowed.iter().zip(&keep).map(|(&w, &k)| w && k).collect();
        self.n_window_blocks = n_window_blocks;
    }

    /// Whether layer `layer` reads and writes through the window table.
    pub fn is_window_layer(&self, layer: usize) -> bool {
        self.window_layers.get(layer).copied().unwrap_or(false)
    }

    /// Layer `layer`'s ring size in positions (0: not a ring).
    pub fn ring_of(&self, layer: usize) -> usize {
        self.ring.get(layer).copied().unwrap_or(0)
    }

    pub fn kv_type(&self) -> KvType {
        match self.layers {
            KvLayers::F16(_) => KvType::F16,
            KvLayers::F32(_) => KvType::F32,
            KvLayers::Q8_0(_) => KvType::Q8_0,
            KvLayers::Q4_0(_) => KvType::Q4_0,
        }
    }

    pub fn n_layers(&self) -> usize {
        match &self.layers {
            KvLayers::F16(l) => l.len(),
            KvLayers::F32(l) => l.len(),
            KvLayers::Q8_0(l) => l.len(),
            KvLayers::Q4_0(l) => l.len(),
        }
    }

    /// Bytes of one position's K (or V) row in one layer.
    pub fn row_bytes(&self) -> usize {
        self.kv_type().bytes_for(self.kv_width)
    }

    /// Bytes held (for memory accounting): ring layers hold their ring only;
    /// state slots included.
    pub fn bytes(&self) -> usize {
        let states = self.states.as_ref().map_or(0, |s| s.bytes());
        if self.ring.iter().all(|&r| r == 0) {
            return self.n_blocks * self.block_bytes() + self.n_window_blocks * self.window_block_bytes() + states;
        }
        let full = self.n_blocks * self.block;
        let v_row = self.kv_type().bytes_for(self.v_width);
        let positions: usize =
            (0..self.n_layers()).map(|l| if self.ring_of(l) > 0 { self.ring_of(l) } else { full }).sum();
        positions * (self.row_bytes() + v_row) + states
    }

    /// Bytes one block takes across the owned layers (K and V rows; K only
    /// for a keys-only pool; layers without KV, [`KvPool::drop_layers`], none).
    pub fn block_bytes(&self) -> usize {
        let v_row = self.kv_type().bytes_for(self.v_width);
        let full = self.kv_layers() - self.window_layers.iter().filter(|&&w| w).count();
        full * self.block * (self.row_bytes() + v_row)
    }

    /// Bytes one block of the sliding-window group takes across its layers
    /// (0 without a window group).
    pub fn window_block_bytes(&self) -> usize {
        let v_row = self.kv_type().bytes_for(self.v_width);
        self.window_layers.iter().filter(|&&w| w).count() * self.block * (self.row_bytes() + v_row)
    }

    /// Owned layers that keep K/V rows.
    pub fn kv_layers(&self) -> usize {
        self.kv_mask().iter().filter(|&&k| k).count()
    }

    fn kv_mask(&self) -> Vec<bool> {
        fn m<T>(l: &[(Vec<T>, Vec<T>)]) -> Vec<bool> {
            l.iter().map(|(k, _)| !k.is_empty()).collect()
        }
        let mask = match &self.layers {
            KvLayers::F16(l) => m(l),
            KvLayers::F32(l) => m(l),
            KvLayers::Q8_0(l) => m(l),
            KvLayers::Q4_0(l) => m(l),
        };
        if self.n_blocks * self.block * self.kv_width == 0 {
            return vec![true; mask.len()];
        }
        mask
    }

    /// Frees the K/V storage of the owned layers where `keep` is false (a
    /// hybrid model's linear-attention layers keep a state instead).
    pub fn drop_layers(&mut self, keep: &[bool]) {
        fn d<T>(l: &mut [(Vec<T>, Vec<T>)], keep: &[bool]) {
            for (pair, &k) in l.iter_mut().zip(keep) {
                if !k {
                    *pair = (Vec::new(), Vec::new());
                }
            }
        }
        match &mut self.layers {
            KvLayers::F16(l) => d(l, keep),
            KvLayers::F32(l) => d(l, keep),
            KvLayers::Q8_0(l) => d(l, keep),
            KvLayers::Q4_0(l) => d(l, keep),
        }
    }
}

/// The cache of one sequence, contiguous: a pool of one block of `capacity`
/// positions (a sliding-window layer: of its ring, [`KvPool::ring`]).
/// Capacity is fixed at creation so decode never allocates.
#[derive(Debug)]
pub struct KvCache {
    pub pool: KvPool,
    pub capacity: usize,
    /// Positions filled so far (the next token's position).
    pub len: usize,
    /// One slot of linear-attention state (hybrid models); `None` otherwise.
    pub states: Option<crate::state_cache::StatePool>,
    /// One past the newest position ever written since the cache was last
    /// emptied: ring layers hold positions `written − ring ..  written`, so a
    /// [`KvCache::truncate`] back past a window's reach is caught
    /// ([`KvCache::ring_holds`]).
    pub written: usize,
}

impl KvCache {
    /// An f16 cache.
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> KvCache {
        KvCache::with_type(n_layers, kv_width, capacity, KvType::F16)
    }

    pub fn with_type(n_layers: usize, kv_width: usize, capacity: usize, ty: KvType) -> KvCache {
        KvCache {
            pool: KvPool::new(n_layers, kv_width, capacity.max(1), 1, ty),
            capacity,
            len: 0,
            written: 0,
            states: None,
        }
    }

    /// A cache of K rows only ([`KvPool::keys_only`], multi-head latent attention).
    pub fn keys_only(n_layers: usize, kv_width: usize, capacity: usize, ty: KvType) -> KvCache {
        KvCache {
            pool: KvPool::keys_only(n_layers, kv_width, capacity.max(1), 1, ty),
            capacity,
            len: 0,
            written: 0,
            states: None,
        }
    }

    /// A cache whose layer `l` holds only a ring of `rings[l]` positions when
    /// that is non-zero and below `capacity` (sliding-window layers), every
    /// position otherwise.
    pub fn with_rings(kv_width: usize, capacity: usize, ty: KvType, rings: &[usize]) -> KvCache {
        let capacity = capacity.max(1);
        let rings: Vec<usize> = rings.iter().map(|&r| if r > 0 && r < capacity { r } else { 0 }).collect();
        let rows = |n: usize| n * kv_width.div_ceil(ty.block_values());
        fn pairs<T: ZeroBits>(sizes: &[usize]) -> Vec<(Vec<T>, Vec<T>)> {
            sizes.iter().map(|&n| (zeroed(n), zeroed(n))).collect()
        }
        let sizes: Vec<usize> = rings.iter().map(|&r| rows(if r > 0 { r } else { capacity })).collect();
        let layers = match ty {
            KvType::F16 => KvLayers::F16(pairs(&sizes)),
            KvType::F32 => KvLayers::F32(pairs(&sizes)),
            KvType::Q8_0 => KvLayers::Q8_0(pairs(&sizes)),
            KvType::Q4_0 => KvLayers::Q4_0(pairs(&sizes)),
        };
        let pool = KvPool {
            layers,
            kv_width,
            v_width: kv_width,
            block: capacity,
            n_blocks: 1,
            ring: rings,
            states: None,
            window_layers: Vec::new(),
            n_window_blocks: 0,
        };
        KvCache { pool, capacity, len: 0, written: 0, states: None }
    }

    /// Whether every ring layer still holds the `window − 1` positions before
    /// `len` that the next token attends to (`window[l]`: layer `l`'s).
    pub fn ring_holds(&self, window: impl Fn(usize) -> usize) -> bool {
        (0..self.pool.ring.len()).all(|l| {
            let ring = self.pool.ring_of(l);
            ring == 0 || self.len == 0 || self.len + ring >= self.written + window(l).saturating_sub(1).min(self.len)
        })
    }

    pub fn kv_type(&self) -> KvType {
        self.pool.kv_type()
    }

    pub fn n_layers(&self) -> usize {
        self.pool.n_layers()
    }

    /// Bytes held (for memory accounting), the state slot included.
    pub fn bytes(&self) -> usize {
        self.pool.bytes() + self.states.as_ref().map_or(0, |s| s.bytes())
    }

    /// Makes room for `capacity` positions, keeping the ones filled in place
    /// (rows are position-major in the one block of a contiguous cache, so
    /// the arrays only lengthen). Returns false, changing nothing, for a
    /// cache with ring layers (sliding windows lay positions out modulo the
    /// ring) or a smaller `capacity`.
    pub fn grow(&mut self, capacity: usize) -> bool {
        let pool = &mut self.pool;
        if pool.ring.iter().any(|&r| r > 0) || pool.n_blocks != 1 || capacity < pool.block {
            return pool.block == capacity;
        }
        fn lengthen<T: ZeroBits>(l: &mut [(Vec<T>, Vec<T>)], per_k: usize, per_v: usize, capacity: usize) {
            for (k, v) in l.iter_mut() {
                // Layers without storage (dropped, keys-only V) stay empty.
                for (a, per) in [(k, per_k), (v, per_v)] {
                    if !a.is_empty() {
                        a.extend(zeroed::<T>(capacity * per - a.len()));
                    }
                }
            }
        }
        let bv = pool.kv_type().block_values();
        let (per_k, per_v) = (pool.kv_width.div_ceil(bv), pool.v_width.div_ceil(bv));
        match &mut pool.layers {
            KvLayers::F16(l) => lengthen(l, per_k, per_v, capacity),
            KvLayers::F32(l) => lengthen(l, per_k, per_v, capacity),
            KvLayers::Q8_0(l) => lengthen(l, per_k, per_v, capacity),
            KvLayers::Q4_0(l) => lengthen(l, per_k, per_v, capacity),
        }
        pool.block = capacity;
        self.capacity = capacity;
        true
    }

    /// Forgets positions from `len` on (for prefix reuse or retries). A
    /// linear-attention state cannot be rewound: the next step must then start
    /// at 0 or where the state stopped ([`crate::StatePool::begin_step`]).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        if self.len == 0 {
            self.written = 0;
        }
    }
}

/// Where a sequence's KV lives during a forward step.
pub enum SeqKv<'a> {
    /// Its own contiguous cache; the step advances `len`.
    Own(&'a mut KvCache),
    /// Blocks of the pool given to `Model::forward_paged`: `table` covers
    /// positions `0..start + tokens`, `start` positions are already filled. The
    /// caller advances its own count. `state`: the sequence's slot in the
    /// pool's linear-attention states (hybrid models; `None` otherwise).
    /// `window`: its blocks in the pool's sliding-window group (empty when
    /// the pool has none, [`KvPool::set_window_layers`]).
    Paged { table: &'a [u32], start: usize, state: Option<u32>, window: WindowBlocks<'a> },
}

/// A sequence's blocks in a paged pool's sliding-window group: `blocks[i]`
/// holds positions `(first + i) × block ..` of the window layers. Blocks
/// before `first` fell out of every window and were given back; the blocks
/// must cover what the step's queries attend to (positions `start + 1 − w`
/// on) and the new positions.
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowBlocks<'a> {
    pub first: usize,
    pub blocks: &'a [u32],
}

impl WindowBlocks<'_> {
    /// The logical table for positions `0..positions` (`block` per entry) in
    /// `out`: entries before `first` repeat the first held block, a valid id
    /// the attention never reads (those positions are outside the window).
    pub fn logical_table(&self, positions: usize, block: usize, out: &mut Vec<u32>) {
        out.clear();
        let pad = self.blocks.first().copied().unwrap_or(0);
        out.extend(
            (0..positions.div_ceil(block))
                .map(|i| i.checked_sub(self.first).and_then(|j| self.blocks.get(j).copied()).unwrap_or(pad)),
        );
    }
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
