//! The sliding-window block group of the paged pool (docs/ARCHITECTURE.md,
//! "Sliding-window layers in the paged pool").
//!
//! A sliding-window layer's query at position `p` reads keys `p + 1 − w ..= p`
//! only, so a sequence needs that layer's blocks for the last `w − 1`
//! positions and the ones it writes in this step, however long it grows. The
//! windowed layers therefore keep blocks of their own (the pool's window
//! group, [`model::KvPool::set_window_layers`]), handed out by a second
//! [`BlockManager`] with the same block size: each sequence holds the window
//! blocks of logical blocks `first .. first + len` (position `p` in logical
//! block `p / block`, as in the full table), and gives back every block that
//! fell out of the window after each step (`trim`).
//!
//! # Bound and reservation
//! After a trim a sequence at `kv_len` holds blocks from `(kv_len + 1 − w) /
//! block` on; a step of `n ≤ step_tokens` tokens then needs positions
//! `kv_len + 1 − w .. kv_len + n`: `w − 1 + n` positions, at most
//! [`model::window_blocks_per_seq`] blocks, and never more than the blocks of
//! its whole length. Admission reserves that many for the sequence
//! ([`WindowGroup::reserve`]) and waits while the group's unreserved blocks
//! fall short, so the group never runs dry (shared cached blocks only lower
//! the count; cached, unreferenced blocks are evicted for new ones) and never
//! preempts. A group of `max_batch` rows' worth never makes anyone wait.
//!
//! # Prefix cache
//! A full window block is registered under the same chained hash as the full
//! group's block of the same positions, and released blocks stay cached (LRU)
//! as in the full group. Resuming a prompt at `j` cached full blocks also
//! needs the window blocks of the `w − 1` positions before `j · block`
//! ([`WindowGroup::resume_range`]); the scheduler resumes at the deepest `j`
//! where both groups (and a hybrid model's state snapshot) have it. A resume
//! reads the very KV the run that cached it wrote, so it computes, bit for
//! bit, what the same resume computes over a pool of every position.

use super::blocks::{BlockHash, BlockManager, BlockStats};
use std::ops::Range;

#[derive(Debug)]
pub struct WindowGroup {
    /// The widest sliding window of the model, in positions.
    pub window: usize,
    /// Most blocks one sequence holds ([`model::window_blocks_per_seq`]).
    pub per_seq: usize,
    blocks: BlockManager,
    /// Blocks reserved by running sequences (at most `n_blocks`).
    reserved: usize,
}

/// One sequence's window blocks: `blocks[i]` holds logical block `first + i`;
/// `reserved`: the most it may hold ([`WindowGroup::reserve`]).
#[derive(Debug, Clone, Default)]
pub struct SeqWindow {
    pub first: usize,
    pub blocks: Vec<u32>,
    pub reserved: usize,
}

impl SeqWindow {
    pub fn view(&self) -> model::WindowBlocks<'_> {
        model::WindowBlocks { first: self.first, blocks: &self.blocks }
    }

    /// Positions `..n` the held blocks (of `block` positions) reach.
    pub fn covered(&self, block: usize) -> usize {
        (self.first + self.blocks.len()) * block
    }

    /// The block holding logical block `k`, if held.
    fn get(&self, k: usize) -> Option<u32> {
        k.checked_sub(self.first).and_then(|i| self.blocks.get(i).copied())
    }
}

/// Window blocks for `max_batch` long sequences at a time in steps of
/// `step_tokens` (plus, with the prefix cache, one resumable window per batch
/// row, as the hybrid state snapshots): with that many no request waits for
/// window blocks. 0 when the model has no windowed layers or a sequence's
/// window blocks would not be fewer than a whole context's (`context`
/// positions), where a window group saves nothing.
pub fn window_blocks_for(
    window: Option<usize>,
    context: usize,
    block: usize,
    max_batch: usize,
    step_tokens: usize,
    prefix_cache: bool,
) -> usize {
    let Some(w) = window else { return 0 };
    let per_seq = model::window_blocks_per_seq(w, block, step_tokens);
    if per_seq * block >= context {
        return 0;
    }
    let resume = if prefix_cache { resume_blocks(w, block) } else { 0 };
    max_batch * (per_seq + resume)
}

/// Most blocks a resume needs: those of the `w − 1` positions before it.
fn resume_blocks(w: usize, block: usize) -> usize {
    (w.max(1) - 1).div_ceil(block.max(1)) + 1
}

impl WindowGroup {
    pub fn new(window: usize, block: usize, n_blocks: usize, step_tokens: usize, prefix_cache: bool) -> WindowGroup {
        WindowGroup {
            window: window.max(1),
            per_seq: model::window_blocks_per_seq(window, block, step_tokens),
            blocks: BlockManager::new(n_blocks, block, prefix_cache),
            reserved: 0,
        }
    }

    /// Reserves for `w` the blocks a sequence of up to `len` positions can
    /// hold at once; false (nothing reserved) when the group lacks them.
    pub fn reserve(&mut self, w: &mut SeqWindow, len: usize) -> bool {
        let want = self.per_seq.min(len.div_ceil(self.blocks.block)).max(1);
        if w.reserved >= want {
            return true;
        }
        if self.reserved - w.reserved + want > self.blocks.n_blocks() {
            return false;
        }
        self.reserved = self.reserved - w.reserved + want;
        w.reserved = want;
        true
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.n_blocks()
    }

    pub fn stats(&self) -> BlockStats {
        self.blocks.stats()
    }

    /// The first logical block a query at position `pos` reads.
    pub fn first_needed(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window) / self.blocks.block
    }

    /// The logical blocks a resume after `j` full blocks needs.
    pub fn resume_range(&self, j: usize) -> Range<usize> {
        if j == 0 {
            return 0..0;
        }
        self.first_needed(j * self.blocks.block)..j
    }

    /// Whether the window blocks for a resume after `j` blocks (named by the
    /// prompt's chained `hashes`) are all cached or held.
    pub fn can_resume(&self, hashes: &[BlockHash], j: usize) -> bool {
        hashes.get(self.resume_range(j)).is_some_and(|h| self.blocks.has_all(h))
    }

    /// Gives `w` the window blocks of a resume after `j` blocks, referenced
    /// (checked with [`WindowGroup::can_resume`]).
    pub fn acquire(&mut self, w: &mut SeqWindow, hashes: &[BlockHash], j: usize) {
        let r = self.resume_range(j);
        w.blocks = self.blocks.acquire_exact(&hashes[r.clone()]).unwrap_or_default();
        w.first = r.start;
    }

    /// Gives back the blocks no query from position `kv_len` on reads.
    pub fn trim(&mut self, w: &mut SeqWindow, kv_len: usize) {
        let lo = self.first_needed(kv_len);
        let dead = lo.saturating_sub(w.first).min(w.blocks.len());
        self.blocks.release(&w.blocks[..dead]);
        w.blocks.drain(..dead);
        w.first = if w.blocks.is_empty() { lo } else { w.first + dead };
    }

    /// Allocates blocks until `w` covers positions `..positions`; false when
    /// the group ran dry (some blocks may have been added).
    pub fn grow(&mut self, w: &mut SeqWindow, positions: usize) -> bool {
        while (w.first + w.blocks.len()) * self.blocks.block < positions {
            match self.blocks.allocate() {
                Some(b) => w.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Names the window block of logical block `k` (now full) `hash`.
    pub fn register(&mut self, w: &SeqWindow, k: usize, hash: BlockHash) {
        if let Some(b) = w.get(k) {
            self.blocks.register(b, hash);
        }
    }

    /// Gives back `w`'s blocks and its reservation.
    pub fn release(&mut self, w: &mut SeqWindow) {
        self.blocks.release(&w.blocks);
        self.reserved -= w.reserved.min(self.reserved);
        *w = SeqWindow::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::blocks::block_hashes;

    #[test]
    fn a_sequence_holds_its_window_only_and_resumes_need_the_window_cached() {
        // Window 8, blocks of 4, steps of up to 4 tokens: at most
        // ceil((7 + 4) / 4) + 1 = 4 blocks per sequence.
        let mut g = WindowGroup::new(8, 4, 8, 4, true);
        assert_eq!(g.per_seq, 4);
        let toks: Vec<u32> = (0..40).collect();
        let hashes = block_hashes(&toks, 4);
        let mut w = SeqWindow::default();
        let mut kv_len = 0;
        while kv_len < 40 {
            assert!(g.grow(&mut w, kv_len + 4));
            assert!(w.blocks.len() <= g.per_seq, "{} blocks at {kv_len}", w.blocks.len());
            kv_len += 4;
            g.register(&w, kv_len / 4 - 1, hashes[kv_len / 4 - 1]);
            g.trim(&mut w, kv_len);
            // The next query at kv_len reads from kv_len − 7 on.
            assert_eq!(w.first, (kv_len + 1).saturating_sub(8) / 4);
        }
        g.release(&mut w);
        assert_eq!(g.stats().used, 0);
        // A resume at 40 needs logical blocks 8 and 9 (positions 33..40): cached.
        assert_eq!(g.resume_range(10), 8..10);
        assert!(g.can_resume(&hashes, 10));
        // 10 blocks were registered in a group of 8: the two released first
        // (logical 0 and 1) were evicted, 2..10 are cached. A resume at 20
        // needs blocks 3 and 4.
        assert!(g.can_resume(&hashes, 5));
        assert!(!g.can_resume(&hashes, 1), "block 0 was evicted");
        let mut got = SeqWindow::default();
        g.acquire(&mut got, &hashes, 10);
        assert_eq!((got.first, got.blocks.len()), (8, 2));
        // Fill the group with new blocks: the cached ones are evicted, oldest first.
        let mut other = SeqWindow::default();
        assert!(g.grow(&mut other, 6 * 4));
        assert!(!g.grow(&mut other, 7 * 4), "two blocks are referenced by the resume");
        assert!(!g.can_resume(&hashes, 5));
    }

    #[test]
    fn sizes() {
        // Gemma 3 270M: window 512, blocks of 32, steps of 512.
        assert_eq!(model::window_blocks_per_seq(512, 32, 512), 33);
        assert_eq!(window_blocks_for(Some(512), 32768, 32, 2, 512, false), 66);
        assert_eq!(window_blocks_for(Some(512), 32768, 32, 2, 512, true), 2 * (33 + 17));
        assert_eq!(window_blocks_for(None, 32768, 32, 2, 512, true), 0);
        assert_eq!(window_blocks_for(Some(512), 1024, 32, 2, 512, true), 0, "no saving at 1K context");
    }
}
