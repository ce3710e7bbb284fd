//! llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm_session`): start from
//! UTF-8 characters, repeatedly merge the adjacent pair whose concatenation is the
//! vocabulary entry with the highest score (leftmost on ties), and write pieces that
//! are not in the vocabulary as `<0xNN>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The vocabulary side of the SentencePiece model.
#[derive(Debug, Clone)]
pub(crate) struct Spm {
    scores: Vec<f32>,
    /// Id of the `<0xNN>` token (or of the one-byte piece) for each byte.
    byte_ids: Vec<Option<u32>>,
    unk: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    // The heap's top is the highest score, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm {
    pub(crate) fn new(tokens: &[String], scores: &[f32], ids: &HashMap<String, u32>, unk: Option<u32>) -> Self {
        let mut scores = scores.to_vec();
        scores.resize(tokens.len(), 0.0);
        let byte_ids = (0..=255u8)
            .map(|b| {
                ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                    let single = [b];
                    std::str::from_utf8(&single).ok().and_then(|s| ids.get(s).copied())
                })
            })
            .collect();
        Spm { scores, byte_ids, unk }
    }

    /// Tokenizes one fragment whose spaces are already written as `▁`.
    pub(crate) fn tokenize(&self, text: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let len = c.len_utf8();
            let next = if start + len == text.len() { None } else { Some(i + 1) };
            symbols.push(Symbol { start, len, prev: i.checked_sub(1), next });
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
                let (Some(left), Some(right)) = (left, right) else { return };
                let (l, r) = (symbols[left], symbols[right]);
                let piece = &text[l.start..r.start + r.len];
                if let Some(&id) = ids.get(piece) {
                    if let Some(&score) = self.scores.get(id as usize) {
                        queue.push(Bigram { left, right, score, size: piece.len() });
                    }
                }
            };
        for i in 1..symbols.len() {
            try_add(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // Skip pairs that an earlier merge changed.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bigram.left);
            }
            try_add(&symbols, &mut queue, symbols[bigram.left].prev, Some(bigram.left));
            try_add(&symbols, &mut queue, Some(bigram.left), symbols[bigram.left].next);
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            let sym = symbols[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            cur = sym.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32)]) -> (Vec<String>, Vec<f32>, HashMap<String, u32>) {
        let tokens: Vec<String> = entries.iter().map(|e| e.0.to_string()).collect();
        let scores = entries.iter().map(|e| e.1).collect();
        let ids = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        (tokens, scores, ids)
    }

    #[test]
    fn merges_by_score_then_position() {
        let (t, s, ids) = vocab(&[
            ("<unk>", 0.0),
            ("<0x41>", 0.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
            ("abc", -3.0),
            ("▁", -1.0),
        ]);
        let spm = Spm::new(&t, &s, &ids, Some(0));
        let mut out = vec![];
        // "bc" (-2) beats "ab" (-5), then "a" + "bc" makes "abc".
        spm.tokenize("abc", &ids, &mut out);
        assert_eq!(out, vec![7]);
        out.clear();
        spm.tokenize("cab", &ids, &mut out);
        assert_eq!(out, vec![4, 5]);
        out.clear();
        // Equal scores: the leftmost pair merges first.
        spm.tokenize("abab", &ids, &mut out);
        assert_eq!(out, vec![5, 5]);
        out.clear();
        // Unknown characters fall back to bytes, then to <unk>.
        spm.tokenize("▁A☃", &ids, &mut out);
        assert_eq!(out, vec![8, 1, 0, 0, 0]);
    }
}
