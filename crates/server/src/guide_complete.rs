//! How a guided value closes: the shortest text that completes it from the
//! guide's state, the tokens that text takes, and the longest token that
//! starts it (the guide forces these near the end of the token budget).

use super::{num_accepting, Arr, Frame, JsonGuide, Obj, Stack, FREE_KEY};
use crate::guide_schema::{Node, MAX_PROPS};

impl JsonGuide {
    /// The token whose bytes are the longest prefix of `text` (and valid).
    pub(super) fn longest_token_prefix(&self, text: &[u8]) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        for (i, b) in self.vocab.bytes.iter().enumerate() {
            if !b.is_empty() && !self.vocab.special[i] && text.starts_with(b) && best.is_none_or(|(l, _)| b.len() > l) {
                best = Some((b.len(), i as u32));
            }
        }
        best.map(|(_, id)| id)
    }

    /// About how many tokens the shortest completion takes: its text cut
    /// greedily into the longest tokens (an upper bound on what the forced
    /// close needs; one vocabulary scan per token).
    pub fn completion_tokens(&self) -> usize {
        let text = self.shortest_completion();
        let mut at = 0;
        let mut n = 0;
        while at < text.len() {
            let step = self
                .vocab
                .bytes
                .iter()
                .zip(&self.vocab.special)
                .filter(|(b, &sp)| !sp && !b.is_empty() && text[at..].starts_with(b))
                .map(|(b, _)| b.len())
                .max()
                .unwrap_or(1);
            at += step;
            n += 1;
        }
        n
    }

    /// The shortest text that completes the value from the current state.
    pub fn shortest_completion(&self) -> Vec<u8> {
        self.stacks.iter().map(|s| self.complete_stack(s)).min_by_key(|t| t.len()).unwrap_or_default()
    }

    pub(super) fn complete_stack(&self, s: &Stack) -> Vec<u8> {
        let mut out = Vec::new();
        let mut child_key = None;
        for frame in s.frames.iter().rev() {
            self.complete_frame(frame, child_key, &mut out);
            child_key = match frame {
                Frame::Lit { key, .. } => *key,
                _ => None,
            };
        }
        out
    }

    /// Appends the shortest text that closes `frame`; `child_key` is the property
    /// index of the key being matched just above it, if any.
    fn complete_frame(&self, frame: &Frame, child_key: Option<u16>, out: &mut Vec<u8>) {
        let sch = &self.schema;
        match frame {
            Frame::Value(node) => out.extend(sch.min_text(*node, 0)),
            Frame::Lit { text, pos, .. } => out.extend_from_slice(&text[*pos..]),
            Frame::Str { node, opened, chars, esc, cont, next, .. } => {
                if !opened {
                    out.extend(sch.min_text(*node, 0));
                    return;
                }
                // Finish a character under way: the lowest allowed byte, then 0x80s.
                if *cont > 0 {
                    out.push(next.0);
                    out.extend(std::iter::repeat_n(0x80, (*cont - 1) as usize));
                }
                match esc {
                    1 => out.push(b'n'),
                    2..=5 => out.extend(std::iter::repeat_n(b'0', (*esc - 1) as usize)),
                    _ => {}
                }
                let min = match sch.nodes.get(*node) {
                    Some(Node::String { min, .. }) => *min,
                    _ => 0,
                };
                out.extend(std::iter::repeat_n(b'a', min.saturating_sub(*chars)));
                out.push(b'"');
            }
            Frame::Num { state, .. } => {
                if !num_accepting(*state) {
                    out.push(b'0');
                }
            }
            Frame::Seq { node, next } => {
                if let Some(Node::Seq(items)) = sch.nodes.get(*node) {
                    out.extend(sch.seq_min_text(items, *next, 0));
                }
            }
            Frame::Raw { node, chars, matched } => {
                if let Some(Node::Raw { min, term, .. }) = sch.nodes.get(*node) {
                    if *chars < *min {
                        // `x` is in no terminator: it breaks a partial match.
                        out.extend(std::iter::repeat_n(b'x', min - chars));
                        out.extend_from_slice(term);
                    } else {
                        out.extend_from_slice(&term[*matched..]);
                    }
                }
            }
            Frame::Obj { node, state, seen, current } => {
                let Node::Object { props, required, additional } = &sch.nodes[*node] else { return };
                // The key being written (InKey) is not in `seen` yet, but its value is counted below.
                let writing = match (state, child_key) {
                    (Obj::InKey, Some(k)) if k != FREE_KEY && (k as usize) < MAX_PROPS => 1u64 << k,
                    _ => 0,
                };
                let missing = required & !seen & !writing;
                let value_of = |cur: u16| match props.get(cur as usize) {
                    Some((_, v)) if cur != FREE_KEY => sch.min_text(*v, 0),
                    _ => additional.map(|a| sch.min_text(a, 0)).unwrap_or_else(|| b"null".to_vec()),
                };
                let mut first = matches!(state, Obj::AfterOpen | Obj::AfterComma | Obj::Open);
                match state {
                    Obj::Open => {
                        out.extend(sch.min_text(*node, 0));
                        return;
                    }
                    Obj::InKey => {
                        out.extend_from_slice(b": ");
                        out.extend(value_of(child_key.unwrap_or(FREE_KEY)));
                    }
                    Obj::AfterKey => {
                        out.extend_from_slice(b": ");
                        out.extend(value_of(*current));
                    }
                    Obj::AfterComma if missing == 0 => {
                        // A comma needs one more member: the first unseen key, or a free one.
                        match (0..props.len()).find(|i| seen & (1 << i) == 0) {
                            Some(i) => {
                                out.extend_from_slice(&props[i].0);
                                out.extend_from_slice(b": ");
                                out.extend(sch.min_text(props[i].1, 0));
                            }
                            None => out.extend_from_slice(b"\"k\": null"),
                        }
                        first = false;
                    }
                    _ => {}
                }
                for (i, (key, value)) in props.iter().enumerate() {
                    if missing & (1 << i) != 0 {
                        if !first {
                            out.extend_from_slice(b", ");
                        }
                        first = false;
                        out.extend_from_slice(key);
                        out.extend_from_slice(b": ");
                        out.extend(sch.min_text(*value, 0));
                    }
                }
                out.push(b'}');
            }
            Frame::Arr { node, state, count } => {
                let Node::Array { items, min, .. } = &sch.nodes[*node] else { return };
                if *state == Arr::Open {
                    out.extend(sch.min_text(*node, 0));
                    return;
                }
                let item = sch.min_text(*items, 0);
                // Items present (the one being written counts) and whether the next needs a comma.
                let (mut have, mut comma) = match state {
                    Arr::AfterOpen | Arr::Open => (0, false),
                    Arr::InValue => (*count + 1, true),
                    Arr::AfterValue => (*count, true),
                    Arr::AfterComma => {
                        out.extend_from_slice(&item);
                        (*count + 1, true)
                    }
                };
                while have < *min {
                    if comma {
                        out.extend_from_slice(b", ");
                    }
                    out.extend_from_slice(&item);
                    have += 1;
                    comma = true;
                }
                out.push(b']');
            }
        }
    }
}
