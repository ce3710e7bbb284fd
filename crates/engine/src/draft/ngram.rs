//! N-gram drafting (prompt lookup): the last few tokens of a sequence are
//! looked up earlier in its own history (prompt and output), and what
//! followed there is proposed. When a model edits or quotes its prompt, long
//! runs of the output repeat it, and every accepted draft token is a decode
//! step saved.
//!
//! Beside it, a pool shared by every request ([`NgramPool`], as llama.cpp's
//! `ngram-mod`): a fixed-size table from the hash of `POOL_N` tokens to the
//! token that followed them last, fed with finished sequences, so that a
//! conversation's next turn (or another request over the same file) finds
//! continuations its own prompt lacks.

/// Longest and shortest suffix matched by [`lookup`]. Code repeats short
/// runs everywhere (`self.`, `}\n    `): the longest match picks the right
/// place among them.
pub const N_MAX: usize = 8;
pub const N_MIN: usize = 1;
/// Tokens hashed per pool entry.
pub const POOL_N: usize = 4;
/// Pool entries (a power of two; 4 bytes each).
const POOL_SIZE: usize = 1 << 20;
const EMPTY: u32 = u32::MAX;

/// Up to `k` tokens following the most recent earlier occurrence of the
/// longest suffix of `history` (`N_MAX` tokens down to `N_MIN`) that occurs
/// before; empty when none does. The proposal may run into the suffix itself
/// (a repeating pattern continues).
pub fn lookup(history: &[u32], k: usize) -> Vec<u32> {
    lookup_matched(history, k).0
}

/// [`lookup`], with the length of the suffix that matched (0 when none
/// did): a longer match predicts better, which the scheduler learns per
/// length.
pub fn lookup_matched(history: &[u32], k: usize) -> (Vec<u32>, usize) {
    let len = history.len();
    for n in (N_MIN..=N_MAX.min(len.saturating_sub(1))).rev() {
        let key = &history[len - n..];
        // Occurrences ending before the suffix's own, latest first.
        let found = (0..len - n).rev().find(|&s| &history[s..s + n] == key);
        if let Some(s) = found {
            let from = s + n;
            return (history[from..(from + k).min(len)].to_vec(), n);
        }
    }
    (Vec::new(), 0)
}

/// The shared n-gram pool: `hash(POOL_N tokens) → next token`.
pub struct NgramPool {
    table: Vec<u32>,
}

impl Default for NgramPool {
    fn default() -> Self {
        NgramPool::new()
    }
}

/// FNV-1a over the tokens' bytes, folded to the table size.
fn hash(tokens: &[u32]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    (h as usize) & (POOL_SIZE - 1)
}

impl NgramPool {
    pub fn new() -> NgramPool {
        NgramPool { table: vec![EMPTY; POOL_SIZE] }
    }

    /// Records every `POOL_N`-gram of `tokens` with the token after it.
    pub fn feed(&mut self, tokens: &[u32]) {
        for w in tokens.windows(POOL_N + 1) {
            self.table[hash(&w[..POOL_N])] = w[POOL_N];
        }
    }

    /// Up to `k` tokens chained from the pool after `history`'s last
    /// `POOL_N` tokens (each proposal extends the key of the next).
    pub fn lookup(&self, history: &[u32], k: usize) -> Vec<u32> {
        if history.len() < POOL_N {
            return Vec::new();
        }
        let mut key: Vec<u32> = history[history.len() - POOL_N..].to_vec();
        let mut out = Vec::new();
        while out.len() < k {
            let next = self.table[hash(&key)];
            if next == EMPTY {
                break;
            }
            out.push(next);
            key.remove(0);
            key.push(next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_suffix() {
        // "1 2 3 4 5 … 1 2 3" → "4 5".
        let h = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 2), vec![4, 5]);
        assert_eq!(lookup(&h, 10), vec![4, 5, 9, 1, 2, 3]);
        // The longer suffix wins over a later one-token match.
        let h = [1, 2, 7, 5, 2, 8, 1, 2];
        assert_eq!(lookup(&h, 1), vec![7]);
        assert_eq!(lookup_matched(&h, 1), (vec![7], 2));
        assert!(lookup(&[1, 2, 3], 4).is_empty());
        assert!(lookup(&[], 4).is_empty());
    }

    #[test]
    fn the_pool_chains_across_sequences() {
        let mut p = NgramPool::new();
        p.feed(&[10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(p.lookup(&[0, 10, 11, 12, 13], 3), vec![14, 15, 16]);
        assert!(p.lookup(&[1, 2, 3, 4], 3).is_empty());
    }
}
