//! Causal (optionally sliding-window) attention of one sequence's new tokens
//! against its KV cache (f16, f32, Q8_0 or Q4_0: [`KvElem`]): tiled, with an
//! online (flash-attention) softmax, optionally with attention sinks.
//!
//! # Sinks (gpt-oss)
//! A sink is a learned logit per query head that joins the softmax denominator
//! but carries no value: `o = Σ_j e^(s_j − M) v_j / (Σ_j e^(s_j − M) + e^(sink − M))`.
//! It is applied once, when a row is finalized (in [`write_rows`] or [`merge`]),
//! from the row's running `(m, l, o)`: `M = max(m, sink)`, so the block loops
//! and their SIMD kernels are the same with or without sinks.
//!
//! # Work split
//! A *tile* is one KV head × up to [`RMAX`] query rows: all query heads of that
//! head's GQA group (or a slice of them, if the group is larger than [`RMAX`]) for
//! a run of consecutive new tokens. A tile streams over its keys in blocks of
//! [`KB`]: each K and V block is widened from f16 once and serves every row of the
//! tile. Per block: scores `S = (scale·Q)·Kᵀ`, per row the keys outside that
//! token's causal/window range are skipped, the running max `m`, sum `l` and
//! output `o` are rescaled, and `o += P·V`.
//!
//! Tiles are handed out dynamically (an atomic counter), KV head by KV head and
//! within one the tiles of the last tokens (most keys) first, which balances
//! causal prefill.
//!
//! Decode (one new token) is one tile of every head (all KV heads, if
//! `n_heads ≤ RMAX`), its key range split into pieces ("flash-decoding"): each
//! piece reads whole cache rows front to back (one stream of K and one of V per
//! thread) and leaves its unnormalized `(m, l, o)`, which the caller merges. On
//! AVX-512 with an f16 cache it reads the rows in place ([`direct`]: widened in
//! registers, no f32 block).
//!
//! Prefill tiles on AVX-512 with float keys put the query rows in the SIMD lanes
//! ([`crate::simd::avx512_lanes`]): a register-tiled `Qᵀ`-times-keys score
//! step without horizontal sums, and a vertical online softmax.
//!
//! # Numerics
//! K and V are f16 (the default cache format), f32, or Q8_0/Q4_0 blocks
//! ([`KvElem`], [`crate::kv_quant`]), widened to f32 (exactly for the float
//! types, `q·d` for the quantized ones); all arithmetic is f32, except the
//! scores against Q8_0/Q4_0 keys: there each query row is quantized to int8
//! (blocks of 32, as Q8_0) and dotted with the key codes in integers
//! ([`crate::kv_int_dot`]; bit-identical at every ISA level). The softmax
//! exp is a polynomial (relative error < 2.5e-7, see `exp_sub_sum`). [`attention_reference`] is the plain two-pass version, for tests.

use crate::isa::{self, Isa};
use crate::kv_int_dot::QuantQuery;
use crate::ops::SendPtr;
#[cfg(target_arch = "x86_64")]
use crate::simd::avx2_attn;
use crate::ThreadPool;
use half::f16;
use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod direct;
#[cfg(target_arch = "x86_64")]
mod selftest;
mod steps;
#[cfg(target_arch = "x86_64")]
pub(crate) use selftest::self_test_avx2;

use steps::{exp_sub_sum, lanes_block, prefetch, pv, scale, scores, widen};

/// Keys per block (a multiple of 4, the score kernel's key step).
pub const KB: usize = 32;
/// Most query rows in a tile. Each K/V block is widened once per tile, so larger
/// tiles re-read the cache less in prefill: 64 ran a 512-token chunk at depth
/// 1536 (SmolLM2 shape) ~18% faster than 16. It bounds the per-thread scratch
/// (`2·RMAX·d + RMAX·KB` floats besides the K/V blocks: 40 KiB at d = 64).
pub const RMAX: usize = 64;

/// An element type of the KV cache: f16 (the default, as llama.cpp's), f32 (for
/// float checkpoints, so their logits stay within 1e-3 of transformers), or a
/// quantized block of [`KvElem::VALUES`] values (Q8_0, Q4_0: [`crate::kv_quant`]).
/// Blocks of keys are widened to f32 once per tile whatever the type.
///
/// Strides and offsets into a cache slice count *elements*: a cache row of `w`
/// values is `w / VALUES` elements, so a head's `head_dim` values must be a
/// whole number of elements (`head_dim % VALUES == 0`, checked by [`attention`]).
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Values one element holds: 1 for f16/f32, 32 for a Q8_0/Q4_0 block.
    const VALUES: usize;
    /// Stores `src` (`dst.len() · VALUES` values) into `dst` (f16: rounding to
    /// nearest even; quantized: one scale per block).
    fn store(src: &[f32], dst: &mut [Self]);
    /// [`widen`]'s job for this type: `n` rows at `src[j·stride..]` (`stride` in
    /// elements) of `d` values into `dst` (`n_pad × d` f32, rows past `n` zeroed).
    fn widen(simd: bool, src: &[Self], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]);
    /// Brings the next block's rows into cache (a hint).
    fn prefetch(simd: bool, src: &[Self], stride: usize, n: usize, d: usize);
    /// Whether keys of this type are scored by [`KvElem::int_scores`] (the
    /// query rows quantized to int8 once per tile, integer dot products against
    /// the stored codes: [`crate::kv_int_dot`]) instead of widening K to f32.
    const INT_SCORES: bool = false;
    /// `s[r·s_stride + j]` = query row `r` · key `j` for `j < n` (key `j` at
    /// `k[j·stride ..]`, `stride` in elements) at ISA level `isa`. Only called
    /// when [`KvElem::INT_SCORES`]; the default does nothing.
    fn int_scores(isa: Isa, q: &QuantQuery, k: &[Self], stride: usize, n: usize, s: &mut [f32], s_stride: usize) {
        let _ = (isa, q, k, stride, n, s, s_stride);
    }
    /// Whether decode at the AVX-512 level reads this type's K and V rows in
    /// place ([`KvElem::direct_scores`], [`KvElem::direct_pv`]: each row widened
    /// in registers right before its FMAs) instead of through a widened block.
    const DIRECT: bool = false;
    /// Whether decode at the AVX-512 level runs P·V from this type's value
    /// rows in place ([`KvElem::direct_pv`]); the keys may still be scored
    /// another way (Q8_0: integer dot products).
    const DIRECT_PV: bool = Self::DIRECT;
    /// `s[r·s_stride + j]` = query row `r` (`q`: `rows × d`) · key `j` for
    /// `j < n`, reading key `j` at `k[j·stride ..]` in place, at ISA level `isa`
    /// (AVX-512, else a scalar loop). Only called when [`KvElem::DIRECT`].
    #[allow(clippy::too_many_arguments)]
    fn direct_scores(
        isa: Isa,
        q: &[f32],
        rows: usize,
        k: &[Self],
        stride: usize,
        n: usize,
        d: usize,
        s: &mut [f32],
        s_stride: usize,
    ) {
        let _ = (isa, q, rows, k, stride, n, d, s, s_stride);
    }
    /// `o[r] += Σ_{j<n} p[r·p_stride + j] · v[j]` (`o`: `rows × d`), reading
    /// value `j` at `v[j·stride ..]` in place. Only called when [`KvElem::DIRECT_PV`].
    #[allow(clippy::too_many_arguments)]
    fn direct_pv(
        isa: Isa,
        p: &[f32],
        p_stride: usize,
        rows: usize,
        v: &[Self],
        stride: usize,
        n: usize,
        d: usize,
        o: &mut [f32],
    ) {
        let _ = (isa, p, p_stride, rows, v, stride, n, d, o);
    }
}

impl KvElem for f16 {
    const VALUES: usize = 1;
    fn store(src: &[f32], dst: &mut [f16]) {
        f32_to_f16(src, dst)
    }
    fn widen(simd: bool, src: &[f16], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]) {
        widen(simd, src, stride, n, n_pad, d, dst)
    }
    fn prefetch(simd: bool, src: &[f16], stride: usize, n: usize, d: usize) {
        prefetch(simd, src, stride, n, d)
    }
    const DIRECT: bool = true;
    fn direct_scores(
        isa: Isa,
        q: &[f32],
        rows: usize,
        k: &[f16],
        stride: usize,
        n: usize,
        d: usize,
        s: &mut [f32],
        s_stride: usize,
    ) {
        direct::scores(isa, q, rows, k, stride, n, d, s, s_stride)
    }
    fn direct_pv(
        isa: Isa,
        p: &[f32],
        p_stride: usize,
        rows: usize,
        v: &[f16],
        stride: usize,
        n: usize,
        d: usize,
        o: &mut [f32],
    ) {
        direct::pv(isa, p, p_stride, rows, v, stride, n, d, o)
    }
}

impl KvElem for f32 {
    const VALUES: usize = 1;
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn widen(_simd: bool, src: &[f32], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]) {
        assert!(n == 0 || src.len() >= (n - 1) * stride + d);
        for j in 0..n {
            dst[j * d..(j + 1) * d].copy_from_slice(&src[j * stride..][..d]);
        }
        dst[n * d..n_pad * d].fill(0.0);
    }
    fn prefetch(_simd: bool, _src: &[f32], _stride: usize, _n: usize, _d: usize) {}
}

/// The geometry of one [`attention`] call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape<'a> {
    /// New tokens; token `i` sits at position `start_pos + i`.
    pub n_new: usize,
    pub start_pos: usize,
    pub n_heads: usize,
    /// Divides `n_heads`; query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window: position `p` sees keys `p + 1 − w ..= p` (`None`: all of `0..=p`).
    pub window: Option<usize>,
    /// Multiplies every score (usually `1/√head_dim`).
    pub scale: f32,
    /// Attention sinks: one logit per query head (`n_heads` values, compared
    /// with the *scaled* scores), added to the softmax denominator only.
    pub sinks: Option<&'a [f32]>,
    /// The new rows are prompt rows: they run as a prefill chunk even when
    /// there is only one, so a prompt row's bits never depend on where the
    /// prompt was cut (a prefix-cache resume, a chunk boundary). `false`: one
    /// new row is a decode step (keys split across threads, cache read in place).
    pub prefill: bool,
}

impl AttnShape<'_> {
    /// One new row computed as a decode step (see [`AttnShape::prefill`]).
    pub fn decode(&self) -> bool {
        self.n_new == 1 && !self.prefill
    }

    /// Cache positions new token `i` attends to.
    pub fn keys(&self, i: usize) -> Range<usize> {
        let p = self.start_pos + i;
        let lo = self.window.map_or(0, |w| (p + 1).saturating_sub(w.max(1)));
        lo..p + 1
    }

    fn check<T: KvElem>(&self, q: usize, kv: &KvView<'_, T>, out: usize) {
        assert!(self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads), "attention: bad head counts");
        assert!(self.head_dim.is_multiple_of(T::VALUES), "attention: head_dim not a whole number of cache blocks");
        let rows = self.n_new * self.n_heads * self.head_dim;
        assert!(q >= rows && out >= rows, "attention: q/out too short");
        assert!(self.sinks.is_none_or(|s| s.len() == self.n_heads), "attention: one sink per query head");
        kv.check(self.start_pos + self.n_new, self.stride::<T>());
    }

    /// Elements of type `T` per cache row (`n_kv_heads · head_dim / T::VALUES`).
    pub fn stride<T: KvElem>(&self) -> usize {
        self.n_kv_heads * self.head_dim / T::VALUES
    }
}

/// Where one layer's keys and values live: a pool of fixed-size blocks and the
/// sequence's block table. Position `p` is row `p % block` of block
/// `table[p / block]`, and a block is `block × n_kv_heads × head_dim` values, so
/// K of block `b` starts at `k[b · block · stride]` (`stride` = elements per row,
/// `n_kv_heads·head_dim / T::VALUES`).
/// A contiguous cache is the one-block case ([`KvView::contiguous`]).
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
    /// Block ids in position order.
    pub table: &'a [u32],
    /// Positions per block.
    pub block: usize,
}

/// The table of a contiguous cache: its single block 0.
const ONE_BLOCK: [u32; 1] = [0];

impl<'a, T: KvElem> KvView<'a, T> {
    /// A `n_ctx × stride` cache in one piece (`stride` in elements).
    pub fn contiguous(k: &'a [T], v: &'a [T], stride: usize) -> KvView<'a, T> {
        KvView { k, v, table: &ONE_BLOCK, block: (k.len() / stride.max(1)).max(1) }
    }

    /// K and V from position `p` on, and how many rows follow contiguously
    /// (to the end of `p`'s block).
    #[inline]
    fn rows(&self, p: usize, stride: usize) -> (&'a [T], &'a [T], usize) {
        let (b, r) = (p / self.block, p % self.block);
        let at = (self.table[b] as usize * self.block + r) * stride;
        (&self.k[at..], &self.v[at..], self.block - r)
    }

    /// Position `p`'s key and value rows (`stride` elements each).
    pub fn row(&self, p: usize, stride: usize) -> (&'a [T], &'a [T]) {
        let (k, v, _) = self.rows(p, stride);
        (&k[..stride], &v[..stride])
    }

    fn check(&self, positions: usize, stride: usize) {
        let blocks = positions.div_ceil(self.block);
        assert!(self.table.len() >= blocks, "attention: block table shorter than the context");
        let pool_blocks = self.k.len().min(self.v.len()) / (self.block * stride).max(1);
        assert!(
            self.table[..blocks].iter().all(|&b| (b as usize) < pool_blocks),
            "attention: block id out of the pool"
        );
    }
}

/// Writes `src` into `dst` as f16, rounding to nearest even (the KV cache store).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    if matches!(isa::active(), Isa::Avx2 | Isa::Avx512) {
        // SAFETY: AVX2+F16C checked; both hold at least `n` elements; f16 is a u16.
        unsafe { avx2_attn::f32_to_f16(src.as_ptr(), dst.as_mut_ptr() as *mut u16, n) };
        return;
    }
    for (d, &s) in dst[..n].iter_mut().zip(&src[..n]) {
        *d = f16::from_f32(s);
    }
}

/// Plain reference: per (token, head), f32 scores over the widened keys (one
/// row at a time, scalar code), a two-pass softmax, then the weighted sum of
/// values. Same contract as [`attention`].
pub fn attention_reference<T: KvElem>(q: &[f32], k: &[T], v: &[T], sh: &AttnShape, out: &mut [f32]) {
    attention_reference_paged(q, &KvView::contiguous(k, v, sh.stride::<T>()), sh, out)
}

/// [`attention_reference`] reading through a block table.
pub fn attention_reference_paged<T: KvElem>(q: &[f32], kv: &KvView<'_, T>, sh: &AttnShape, out: &mut [f32]) {
    sh.check(q.len(), kv, out.len());
    let (nh, d) = (sh.n_heads, sh.head_dim);
    let (group, stride) = (nh / sh.n_kv_heads, sh.stride::<T>());
    // One widened key or value row of one head.
    let row = |src: &[T], h: usize| {
        let mut x = vec![0f32; d];
        T::widen(false, &src[(h / group) * d / T::VALUES..], stride, 1, 1, d, &mut x);
        x
    };
    for i in 0..sh.n_new {
        let keys = sh.keys(i);
        for h in 0..nh {
            let qh = &q[(i * nh + h) * d..][..d];
            let s: Vec<f32> = keys
                .clone()
                .map(|p| {
                    let kp = row(kv.row(p, stride).0, h);
                    qh.iter().zip(&kp).map(|(&a, &b)| a * b).sum::<f32>() * sh.scale
                })
                .collect();
            let sink = sh.sinks.map(|s| s[h]);
            let max = s.iter().copied().chain(sink).fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |x| (x - max).exp());
            let o = &mut out[(i * nh + h) * d..][..d];
            o.fill(0.0);
            for (p, &w) in keys.clone().zip(&e) {
                for (od, vd) in o.iter_mut().zip(row(kv.row(p, stride).1, h)) {
                    *od += w / sum * vd;
                }
            }
        }
    }
}

/// How an [`attention`] call is cut into jobs.
#[derive(Debug, Clone, Copy)]
struct Tiling {
    /// Query heads per KV head.
    group: usize,
    /// Heads per tile, and tiles per group.
    heads: usize,
    head_tiles: usize,
    /// Tokens per tile, and token tiles.
    toks: usize,
    tok_tiles: usize,
    /// Key-range pieces per tile (1 = no split).
    splits: usize,
    /// Tiles per token/head tile (one per KV head, or 1 for a decode tile of
    /// every head), and KV heads per tile (1, or all of them).
    kv_tiles: usize,
    kvn: usize,
}

impl Tiling {
    fn new(sh: &AttnShape, threads: usize) -> Tiling {
        let group = sh.n_heads / sh.n_kv_heads;
        if sh.decode() && sh.n_heads <= RMAX {
            // Decode: one tile of every head, its keys cut into pieces. A piece
            // reads whole cache rows (all KV heads) front to back, so each thread
            // streams one run of K and one of V, instead of one head's 2·d bytes
            // out of each row (which the hardware prefetchers fetch whole anyway).
            // Pieces of at least two blocks, several per thread (dynamic balance).
            let keys = sh.keys(0).len();
            let splits = if threads <= 1 { 1 } else { (4 * threads).min(keys / (2 * KB)).max(1) };
            let (toks, tok_tiles, head_tiles, kv_tiles) = (1, 1, 1, 1);
            return Tiling {
                group,
                heads: sh.n_heads,
                head_tiles,
                toks,
                tok_tiles,
                splits,
                kv_tiles,
                kvn: sh.n_kv_heads,
            };
        }
        let heads = group.min(RMAX);
        let head_tiles = group.div_ceil(heads);
        let toks = (RMAX / heads).clamp(1, sh.n_new.max(1));
        let tok_tiles = sh.n_new.div_ceil(toks);
        let tiles = sh.n_kv_heads * head_tiles * tok_tiles;
        // Split keys only when tiles alone cannot feed every thread twice, and
        // keep each piece at least two blocks long.
        let max_keys = sh.keys(sh.n_new.saturating_sub(1)).len();
        // Only decode (one new token) splits: a prefill row's result must not
        // depend on how many tokens share its chunk, so that a prompt resumed
        // from the prefix cache computes exactly what a cold run computed.
        let splits = if threads <= 1 || tiles >= 2 * threads || !sh.decode() {
            1
        } else {
            (2 * threads).div_ceil(tiles).min(max_keys / (2 * KB)).max(1)
        };
        Tiling { group, heads, head_tiles, toks, tok_tiles, splits, kv_tiles: sh.n_kv_heads, kvn: 1 }
    }

    fn jobs(&self) -> usize {
        self.kv_tiles * self.head_tiles * self.tok_tiles * self.splits
    }

    /// Job `j` → (tile, first token, tokens, first head, heads, split).
    fn job(&self, j: usize, sh: &AttnShape) -> Job {
        let (tile, split) = (j / self.splits, j % self.splits);
        // KV head major, so that tiles run close together in time share their keys
        // in cache; within a head, the last token tiles first.
        let (ht, rest) = (tile % self.head_tiles, tile / self.head_tiles);
        let (kvh, tt) = (rest / self.tok_tiles * self.kvn, self.tok_tiles - 1 - rest % self.tok_tiles);
        let t0 = tt * self.toks;
        let h0 = kvh * self.group + ht * self.heads;
        let toks = self.toks.min(sh.n_new - t0);
        let heads = self.heads.min((kvh + self.kvn) * self.group - h0);
        // This piece's share of the tile's keys, in whole blocks.
        let all = sh.keys(t0).start..sh.keys(t0 + toks - 1).end;
        let piece = all.len().div_ceil(self.splits).div_ceil(KB) * KB;
        let lo = (all.start + split * piece).min(all.end);
        Job { tile, kvh, kvn: self.kvn, t0, toks, h0, heads, keys: lo..(lo + piece).min(all.end) }
    }
}

/// One unit of work: the rows (token `t0 + r / heads`, head `h0 + r % heads`) of a
/// tile, over the cache positions `keys`. The rows belong to KV heads
/// `kvh .. kvh + kvn`, in equal runs (`kvn > 1`: one token, whole GQA groups).
#[derive(Debug, Clone)]
struct Job {
    tile: usize,
    kvh: usize,
    kvn: usize,
    t0: usize,
    toks: usize,
    h0: usize,
    heads: usize,
    keys: Range<usize>,
}

/// Per-thread tile state (f32): scaled queries (and their int8 form for
/// [`KvElem::INT_SCORES`] types), widened K/V blocks, scores/probs, running
/// max/sum and unnormalized outputs.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    /// Per KV head of the job.
    q8: Vec<QuantQuery>,
    k: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
    lanes: Lanes,
}

/// Per-thread state of a row-lane tile ([`crate::simd::avx512_lanes`]): the
/// scaled queries transposed (`d × rp`), the transposed scores/probabilities
/// of a block (`KB × rp`), and each row's key range.
#[derive(Default)]
struct Lanes {
    qt: Vec<f32>,
    st: Vec<f32>,
    ks: Vec<i32>,
    ke: Vec<i32>,
}

impl Scratch {
    fn fit(&mut self, d: usize) {
        for (b, n) in [(&mut self.q, RMAX * d), (&mut self.k, KB * d), (&mut self.v, KB * d), (&mut self.o, RMAX * d)] {
            if b.len() < n {
                b.resize(n, 0.0);
            }
        }
        for (b, n) in [(&mut self.s, RMAX * KB), (&mut self.m, RMAX), (&mut self.l, RMAX)] {
            if b.len() < n {
                b.resize(n, 0.0);
            }
        }
        let lt = &mut self.lanes;
        for (b, n) in [(&mut lt.qt, RMAX * d), (&mut lt.st, RMAX * KB.next_multiple_of(16))] {
            if b.len() < n {
                b.resize(n, 0.0);
            }
        }
        for b in [&mut lt.ks, &mut lt.ke] {
            if b.len() < RMAX {
                b.resize(RMAX, 0);
            }
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The caller's split-K partials: per job, `m[RMAX]`, `l[RMAX]`, `o[RMAX × d]`.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Causal attention of `sh.n_new` new tokens against the cache.
///
/// * `q`: `n_new × n_heads × head_dim` (f32);
/// * `k`, `v`: the cache, `n_ctx × n_kv_heads × head_dim` f16, positions
///   `0..start_pos + n_new` valid;
/// * `out`: `n_new × n_heads × head_dim`.
///
/// Uses AVX2 when active and `head_dim % 8 == 0`, else scalar code (same tiling).
pub fn attention<T: KvElem>(pool: &ThreadPool, q: &[f32], k: &[T], v: &[T], sh: &AttnShape, out: &mut [f32]) {
    attention_paged(pool, q, &KvView::contiguous(k, v, sh.stride::<T>()), sh, out)
}

/// [`attention`] over a paged cache: the same tiles, each key block cut short
/// at the end of a cache block.
pub fn attention_paged<T: KvElem>(pool: &ThreadPool, q: &[f32], kv: &KvView<'_, T>, sh: &AttnShape, out: &mut [f32]) {
    sh.check(q.len(), kv, out.len());
    if sh.n_new == 0 || sh.head_dim == 0 {
        return;
    }
    let level = isa::active();
    let simd = matches!(level, Isa::Avx2 | Isa::Avx512) && sh.head_dim.is_multiple_of(8);
    let avx512 = simd && level == Isa::Avx512;
    let tiling = Tiling::new(sh, pool.n_threads());
    let n_jobs = tiling.jobs();
    let d = sh.head_dim;
    let part_len = RMAX * (d + 2);
    PARTIALS.with(|parts| {
        let mut parts = parts.borrow_mut();
        if tiling.splits > 1 && parts.len() < n_jobs * part_len {
            parts.resize(n_jobs * part_len, 0.0);
        }
        let (out_ptr, part_ptr) = (SendPtr(out.as_mut_ptr()), SendPtr(parts.as_mut_ptr()));
        let next = AtomicUsize::new(0);
        pool.run(|_, _| {
            let (out_ptr, part_ptr) = (&out_ptr, &part_ptr);
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                sc.fit(d);
                loop {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    if j >= n_jobs {
                        break;
                    }
                    let job = tiling.job(j, sh);
                    run_tile(simd, avx512, q, kv, sh, &job, &mut sc);
                    if tiling.splits == 1 {
                        // SAFETY: tiles cover disjoint (token, head) rows of `out`.
                        unsafe { write_rows(sh, &job, &sc, out_ptr.0) };
                    } else {
                        // SAFETY: job `j` owns partial slot `j`, inside `parts`.
                        let slot = unsafe { std::slice::from_raw_parts_mut(part_ptr.0.add(j * part_len), part_len) };
                        save_partial(&job, &sc, d, slot);
                    }
                }
            })
        });
        if tiling.splits > 1 {
            merge(sh, &tiling, &parts, out);
        }
    });
}

/// Runs `job`'s rows over its keys, leaving `m`, `l` and unnormalized `o` in `sc`.
/// `simd`: AVX2 block steps; `avx512`: also the AVX-512 softmax exp.
fn run_tile<T: KvElem>(
    simd: bool,
    avx512: bool,
    q: &[f32],
    kv: &KvView<'_, T>,
    sh: &AttnShape,
    job: &Job,
    sc: &mut Scratch,
) {
    let (nh, d) = (sh.n_heads, sh.head_dim);
    let stride = sh.stride::<T>();
    let rows = job.toks * job.heads;
    // Rows per KV head: they come in `kvn` equal runs.
    let per = rows / job.kvn;
    let Scratch { q: qb, q8, k: kb, v: vb, s, m, l, o, lanes: lt } = sc;
    for r in 0..rows {
        let (t, h) = (job.t0 + r / job.heads, job.h0 + r % job.heads);
        for (dst, &x) in qb[r * d..(r + 1) * d].iter_mut().zip(&q[(t * nh + h) * d..][..d]) {
            *dst = x * sh.scale;
        }
    }
    // Per row, so a row's scores never depend on the other rows of its tile.
    if T::INT_SCORES {
        if q8.len() < job.kvn {
            q8.resize_with(job.kvn, QuantQuery::default);
        }
        for (i, qq) in q8[..job.kvn].iter_mut().enumerate() {
            qq.quantize(&qb[i * per * d..(i + 1) * per * d], per, d);
        }
    }
    let level = if avx512 {
        Isa::Avx512
    } else if simd {
        Isa::Avx2
    } else {
        Isa::Scalar
    };
    // Decode on AVX-512: scores and P·V read the cache rows in place (each
    // key chunk is widened once per three rows: for large groups, as MLA's,
    // widening the block once is cheaper).
    let direct = T::DIRECT && avx512 && sh.decode() && d.is_multiple_of(16) && per <= 8;
    let direct_pv = T::DIRECT_PV && avx512 && sh.decode() && d.is_multiple_of(16) && per <= 8;
    // Prefill on AVX-512 with float keys: the query rows in the SIMD lanes.
    let lanes = avx512 && !T::INT_SCORES && !sh.decode() && d.is_multiple_of(16) && job.kvn == 1;
    let rp = if lanes { rows.next_multiple_of(16) } else { rows };
    // Keys every row of the tile sees (blocks inside need no mask).
    let (mut seen_lo, mut seen_hi) = (0, usize::MAX);
    if lanes {
        for r in 0..rp {
            let keys = if r < rows { sh.keys(job.t0 + r / job.heads) } else { 0..0 };
            if r < rows {
                (seen_lo, seen_hi) = (seen_lo.max(keys.start), seen_hi.min(keys.end));
            }
            assert!(keys.end <= i32::MAX as usize, "attention: position past i32");
            (lt.ks[r], lt.ke[r]) = (keys.start as i32, keys.end as i32);
            for c in 0..d {
                lt.qt[c * rp + r] = if r < rows { qb[r * d + c] } else { 0.0 };
            }
        }
    }
    m[..rp].fill(f32::NEG_INFINITY);
    l[..rp].fill(0.0);
    o[..rows * d].fill(0.0);
    let mut b0 = job.keys.start;
    while b0 < job.keys.end {
        let (k, v, run) = kv.rows(b0, stride);
        let n = KB.min(job.keys.end - b0).min(run);
        // Keys padded for the score kernel's key step (AVX-512: 16, else 4).
        let n4 = if avx512 && d.is_multiple_of(16) { n.next_multiple_of(16) } else { n.next_multiple_of(4) };
        let next = (job.keys.end > b0 + n).then(|| {
            let (kn, vn, run_n) = kv.rows(b0 + n, stride);
            (kn, vn, (job.keys.end - b0 - n).min(KB).min(run_n))
        });
        for i in 0..job.kvn {
            let koff = (job.kvh + i) * d / T::VALUES;
            let (r0, r1) = (i * per, (i + 1) * per);
            if let Some((kn, vn, nn)) = next {
                T::prefetch(simd, &kn[koff..], stride, nn, d);
                T::prefetch(simd, &vn[koff..], stride, nn, d);
            }
            let (k, v, sr) = (&k[koff..], &v[koff..], &mut s[r0 * KB..]);
            if lanes {
                T::widen(simd, k, stride, n, n4, d, kb);
                T::widen(simd, v, stride, n, n, d, vb);
                let masked = b0 < seen_lo || b0 + n > seen_hi;
                lanes_block(lt, rp, rows, &kb[..n4 * d], &vb[..n * d], n, n4, d, (b0, masked), m, l, o);
                continue;
            }
            if direct {
                T::direct_scores(level, &qb[r0 * d..r1 * d], per, k, stride, n, d, sr, KB);
            } else if T::INT_SCORES {
                T::int_scores(level, &q8[i], k, stride, n, sr, KB);
            } else {
                T::widen(simd, k, stride, n, n4, d, kb);
                scores(simd, avx512, &qb[r0 * d..r1 * d], per, &kb[..n4 * d], n4, d, sr);
            }
            if !direct_pv {
                T::widen(simd, v, stride, n, n, d, vb);
            }
            for r in r0..r1 {
                let keys = sh.keys(job.t0 + r / job.heads);
                let (js, je) = (keys.start.clamp(b0, b0 + n) - b0, keys.end.clamp(b0, b0 + n) - b0);
                let p = &mut s[r * KB..r * KB + n];
                if js >= je {
                    p.fill(0.0);
                    continue;
                }
                let bmax = p[js..je].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let m_new = m[r].max(bmax);
                let sum = exp_sub_sum(simd, avx512, &mut p[js..je], m_new);
                p[..js].fill(0.0);
                p[je..].fill(0.0);
                if m[r] != m_new {
                    // First block: m = −∞ → corr = 0 on zeros.
                    let corr = (m[r] - m_new).exp();
                    l[r] *= corr;
                    scale(simd, &mut o[r * d..(r + 1) * d], corr);
                    m[r] = m_new;
                }
                l[r] += sum;
            }
            let (sr, or) = (&s[r0 * KB..], &mut o[r0 * d..r1 * d]);
            if direct_pv {
                T::direct_pv(level, sr, KB, per, v, stride, n, d, or);
            } else {
                pv(simd, avx512, sr, per, &vb[..n * d], n, d, or);
            }
        }
        b0 += n;
    }
}

/// Writes the normalized rows of a whole-tile job into `out`.
///
/// # Safety
/// `out` is the `n_new × n_heads × head_dim` output; no other thread writes these rows.
unsafe fn write_rows(sh: &AttnShape, job: &Job, sc: &Scratch, out: *mut f32) {
    let d = sh.head_dim;
    for r in 0..job.toks * job.heads {
        let (t, h) = (job.t0 + r / job.heads, job.h0 + r % job.heads);
        let dst = std::slice::from_raw_parts_mut(out.add((t * sh.n_heads + h) * d), d);
        let inv = finish(sh, h, sc.m[r], sc.l[r]);
        for (x, &y) in dst.iter_mut().zip(&sc.o[r * d..(r + 1) * d]) {
            *x = y * inv;
        }
    }
}

/// The factor that turns a row's unnormalized output `o` (running max `m`,
/// sum `l`) into the result: `1/l`, or with a sink `e^(m−M) / (l·e^(m−M) + e^(sink−M))`
/// where `M = max(m, sink)` (so neither exponent can overflow).
fn finish(sh: &AttnShape, head: usize, m: f32, l: f32) -> f32 {
    match sh.sinks {
        None => 1.0 / l,
        Some(s) => {
            let big = m.max(s[head]);
            let c = (m - big).exp();
            c / (l * c + (s[head] - big).exp())
        }
    }
}

/// Stores a split job's `(m, l, o)` rows in its partial slot.
fn save_partial(job: &Job, sc: &Scratch, d: usize, slot: &mut [f32]) {
    let rows = job.toks * job.heads;
    slot[..rows].copy_from_slice(&sc.m[..rows]);
    slot[RMAX..RMAX + rows].copy_from_slice(&sc.l[..rows]);
    slot[2 * RMAX..2 * RMAX + rows * d].copy_from_slice(&sc.o[..rows * d]);
}

/// Combines every tile's split pieces: `o = Σ e^(m_s − M) o_s / Σ e^(m_s − M) l_s`.
fn merge(sh: &AttnShape, tiling: &Tiling, parts: &[f32], out: &mut [f32]) {
    let d = sh.head_dim;
    let part_len = RMAX * (d + 2);
    for j0 in (0..tiling.jobs()).step_by(tiling.splits) {
        let job = tiling.job(j0, sh);
        debug_assert_eq!(job.tile * tiling.splits, j0);
        let slots = &parts[j0 * part_len..(j0 + tiling.splits) * part_len];
        for r in 0..job.toks * job.heads {
            let (t, h) = (job.t0 + r / job.heads, job.h0 + r % job.heads);
            let dst = &mut out[(t * sh.n_heads + h) * d..][..d];
            let sink = sh.sinks.map(|s| s[h]);
            let big = slots.chunks_exact(part_len).map(|p| p[r]).chain(sink).fold(f32::NEG_INFINITY, f32::max);
            dst.fill(0.0);
            // The sink's share of the denominator (no value).
            let mut l = sink.map_or(0.0, |s| (s - big).exp());
            for p in slots.chunks_exact(part_len) {
                if p[RMAX + r] == 0.0 {
                    continue; // a piece with no keys for this row (m = −∞)
                }
                let w = (p[r] - big).exp();
                l += w * p[RMAX + r];
                for (x, &y) in dst.iter_mut().zip(&p[2 * RMAX + r * d..][..d]) {
                    *x += w * y;
                }
            }
            let inv = 1.0 / l;
            dst.iter_mut().for_each(|x| *x *= inv);
        }
    }
}
