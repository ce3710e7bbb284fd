//! The KV block manager: which pool blocks each sequence holds, and the prefix
//! cache over them.
//!
//! # Prefix cache
//! A *full* block (all `block` positions computed) is named by a chained hash:
//! `h_i = H(h_{i−1}, tokens of block i)`, so equal hashes mean equal tokens *and*
//! equal everything before them — the KV of a position depends on the whole
//! prefix. A new sequence walks its prompt's full blocks and takes every block
//! whose hash is cached, stopping at the first miss (vLLM's scheme; a radix tree
//! as in SGLang would also share partial blocks, which an agent loop gains
//! little from: a conversation grows by whole turns).
//!
//! # Lifetimes
//! Every block is in exactly one state:
//! - **used**: referenced by one or more running sequences (`refs > 0`);
//! - **cached**: unreferenced but hashed, kept for reuse and evicted least
//!   recently used first when a free block is needed;
//! - **free**: unreferenced and unhashed.
//!
//! Only full blocks are shared, and a full block is never written again, so
//! sharing needs no copy-on-write.

use std::collections::{BTreeSet, HashMap};

/// A full block's name: 128 bits of a BLAKE3 chain over every token before
/// and in it. 128 bits because the disk tier keeps blocks across restarts and
/// users, where a collision would silently serve another conversation's KV;
/// at 2⁻⁶⁴ birthday odds per 2³² blocks that is out of reach. BLAKE3 rather
/// than xxh3-128: it is collision-resistant by design, not only well mixed,
/// and one block's 64–512 bytes hash in well under a microsecond.
pub type BlockHash = u128;

/// Chains a block's tokens onto the hash of everything before it.
pub fn chain_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(&parent.to_le_bytes());
    h.update(bytemuck::cast_slice(tokens));
    let out = h.finalize();
    u128::from_le_bytes(out.as_bytes()[..16].try_into().expect("32-byte digest"))
}

/// The hashes of the full blocks of `tokens`, in order.
pub fn block_hashes(tokens: &[u32], block: usize) -> Vec<BlockHash> {
    let mut parent = 0;
    tokens
        .chunks_exact(block)
        .map(|c| {
            parent = chain_hash(parent, c);
            parent
        })
        .collect()
}

#[derive(Debug, Clone, Default)]
struct BlockInfo {
    refs: u32,
    hash: Option<BlockHash>,
    /// Tick of the last release (LRU order of cached blocks).
    last_used: u64,
}

/// Counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockStats {
    pub total: usize,
    pub used: usize,
    pub cached: usize,
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockManager {
    /// Positions per block.
    pub block: usize,
    info: Vec<BlockInfo>,
    free: Vec<u32>,
    /// Cached blocks by (last release tick, id): the first is the LRU victim.
    cached: BTreeSet<(u64, u32)>,
    by_hash: HashMap<BlockHash, u32>,
    tick: u64,
    /// Whether full blocks are registered and looked up at all.
    pub prefix_cache: bool,
    /// When set, every block that becomes cached is also recorded here (the
    /// disk tier writes it through, [`super::disk_tier`]).
    pub just_cached: Option<Vec<(u32, BlockHash)>>,
}

impl BlockManager {
    pub fn new(n_blocks: usize, block: usize, prefix_cache: bool) -> BlockManager {
        BlockManager {
            block,
            info: vec![BlockInfo::default(); n_blocks],
            // Popped from the end: hand out low ids first.
            free: (0..n_blocks as u32).rev().collect(),
            cached: BTreeSet::new(),
            by_hash: HashMap::new(),
            tick: 0,
            prefix_cache,
            just_cached: None,
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.info.len()
    }

    /// Blocks that can be handed out now (free plus evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.cached.len()
    }

    pub fn stats(&self) -> BlockStats {
        let (free, cached) = (self.free.len(), self.cached.len());
        BlockStats { total: self.info.len(), used: self.info.len() - free - cached, cached, free }
    }

    /// The longest run of cached blocks that starts `hashes` (the full blocks of
    /// a prompt), referenced for the caller. At most `max_blocks` are taken.
    pub fn acquire_prefix(&mut self, hashes: &[BlockHash], max_blocks: usize) -> Vec<u32> {
        if !self.prefix_cache {
            return Vec::new();
        }
        let mut got = Vec::new();
        for h in hashes.iter().take(max_blocks) {
            let Some(&b) = self.by_hash.get(h) else { break };
            self.reference(b);
            got.push(b);
        }
        got
    }

    /// Whether every block named in `hashes` is cached or in use.
    pub fn has_all(&self, hashes: &[BlockHash]) -> bool {
        self.prefix_cache && hashes.iter().all(|h| self.by_hash.contains_key(h))
    }

    /// The blocks named by `hashes`, referenced for the caller, or `None`
    /// (nothing referenced) unless every one is there.
    pub fn acquire_exact(&mut self, hashes: &[BlockHash]) -> Option<Vec<u32>> {
        if !self.has_all(hashes) {
            return None;
        }
        let got: Vec<u32> = hashes.iter().map(|h| self.by_hash[h]).collect();
        got.iter().for_each(|&b| self.reference(b));
        Some(got)
    }

    fn reference(&mut self, b: u32) {
        let info = &mut self.info[b as usize];
        if info.refs == 0 {
            self.cached.remove(&(info.last_used, b));
        }
        info.refs += 1;
    }

    /// One block for the caller's exclusive use: a free one, else the least
    /// recently used cached one (forgetting its hash). `None` when every block
    /// is referenced.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.cached.pop_first()?;
                if let Some(h) = self.info[b as usize].hash.take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.info[b as usize].refs = 1;
        Some(b)
    }

    /// Names a block the caller has just filled, so later prompts can reuse it.
    /// A block already cached under the same hash (another sequence computed the
    /// same prefix concurrently) is left as is; this one stays private.
    pub fn register(&mut self, b: u32, hash: BlockHash) {
        if !self.prefix_cache || self.info[b as usize].hash.is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.by_hash.entry(hash) {
            e.insert(b);
            self.info[b as usize].hash = Some(hash);
        }
    }

    /// Drops the caller's references; blocks nobody references become cached
    /// (hashed) or free.
    pub fn release(&mut self, blocks: &[u32]) {
        self.tick += 1;
        // Release the tail first so that, at equal ticks, a prefix's later
        // blocks are evicted before its earlier ones (the earlier ones are
        // shared by more continuations).
        for &b in blocks.iter().rev() {
            let info = &mut self.info[b as usize];
            debug_assert!(info.refs > 0, "release of an unreferenced block {b}");
            info.refs = info.refs.saturating_sub(1);
            if info.refs == 0 {
                if let Some(h) = info.hash {
                    if let Some(j) = self.just_cached.as_mut() {
                        j.push((b, h));
                    }
                    info.last_used = self.tick;
                    self.cached.insert((self.tick, b));
                    self.tick += 1;
                } else {
                    self.free.push(b);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_reuse_stops_at_the_first_difference_and_counts_stay_consistent() {
        let mut m = BlockManager::new(8, 4, true);
        let a: Vec<u32> = (0..12).collect();
        let ha = block_hashes(&a, 4);
        assert!(m.acquire_prefix(&ha, 3).is_empty());
        let blocks: Vec<u32> = (0..3).map(|_| m.allocate().unwrap()).collect();
        for (b, h) in blocks.iter().zip(&ha) {
            m.register(*b, *h);
        }
        m.release(&blocks);
        assert_eq!(m.stats(), BlockStats { total: 8, used: 0, cached: 3, free: 5 });
        // Same first 8 tokens, different third block.
        let mut b2 = a.clone();
        b2[9] = 99;
        let got = m.acquire_prefix(&block_hashes(&b2, 4), 3);
        assert_eq!(got, blocks[..2]);
        assert_eq!(m.stats().used, 2);
        // A change in the first block shares nothing, even with equal later blocks.
        let mut c = a.clone();
        c[0] = 7;
        assert!(m.acquire_prefix(&block_hashes(&c, 4), 3).is_empty());
        m.release(&got);
        assert_eq!(m.stats().used, 0);
    }

    #[test]
    fn eviction_takes_the_least_recently_released_block() {
        let mut m = BlockManager::new(2, 2, true);
        let (x, y) = (m.allocate().unwrap(), m.allocate().unwrap());
        assert_eq!(m.allocate(), None);
        m.register(x, 1);
        m.register(y, 2);
        m.release(&[x]);
        m.release(&[y]);
        let z = m.allocate().unwrap();
        assert_eq!(z, x, "x was released first");
        assert!(m.acquire_prefix(&[1], 1).is_empty(), "x's hash is forgotten");
        assert_eq!(m.acquire_prefix(&[2], 1), vec![y]);
    }
}
