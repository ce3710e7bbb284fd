//! Constrained decoding: the output is guaranteed to be JSON valid against a
//! schema (forced tool calls, `response_format: json_schema`/`json_object`).
//!
//! Why not `llguidance`: it is the general tool (Lark grammars, a token trie,
//! its own JSON-schema compiler), but it adds a grammar compiler and regex-derivative
//! engine to a build that runs on two shared cores, and the server only needs
//! JSON Schema. This guide is a byte-level pushdown automaton over the compiled
//! schema (`guide_schema`), run nondeterministically (a set of stacks) so that
//! `anyOf`, type lists and enum prefixes need no backtracking. Each step:
//! - the highest-logit candidates are fed to a copy of the state; the ones that
//!   keep it alive stay, every other logit becomes -inf (the sampler then draws
//!   among valid tokens with the request's temperature/top-p);
//! - when the token budget gets down to the length of the shortest completion
//!   of the current state, the guide forces that completion token by token, so
//!   the JSON closes before `max_tokens` cuts it;
//! - once the value is complete, `accept` returns false and generation stops.
//!
//! It assumes every byte is some token (true of byte-level BPE and of
//! SentencePiece with byte fallback), so a valid continuation always exists.

use crate::guide_schema::{Node, NodeId, Schema, MAX_PROPS};
use std::sync::Arc;

/// Longest run of whitespace allowed between JSON tokens (stops newline loops).
const WS_CAP: u8 = 4;
/// Candidates checked per step before scanning the whole vocabulary.
const TOP_CANDIDATES: usize = 64;
/// Alternative parses kept at once.
const MAX_STACKS: usize = 64;
/// Tokens before the forced close from which candidates are checked to fit the budget.
const LOOKAHEAD: usize = 48;
/// Longest number literal (digits loops).
const MAX_NUMBER: u8 = 24;
/// Longest integer literal: it must fit an i64 (clients and serde read it as one).
const MAX_INTEGER: u8 = 18;

/// The bytes of each token id, and which ids are control tokens.
pub struct Vocab {
    pub bytes: Vec<Vec<u8>>,
    pub special: Vec<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Obj {
    Open,
    AfterOpen,
    InKey,
    AfterKey,
    InValue,
    AfterValue,
    AfterComma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arr {
    Open,
    AfterOpen,
    InValue,
    AfterValue,
    AfterComma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
    /// Two exponent digits: the most (larger exponents overflow f64 parsers).
    ExpDigits2,
}

#[derive(Debug, Clone)]
enum Frame {
    /// A value of `node` comes next (whitespace first is fine).
    Value(NodeId),
    /// Matching an exact text; `key` is the property index when it is an object key.
    Lit {
        text: Arc<[u8]>,
        pos: usize,
        key: Option<u16>,
    },
    /// `esc`: 0 none, 1 after `\`, 2..=5 hex digits of `\u` still to come.
    /// `cont`: UTF-8 continuation bytes still due for the current character,
    /// the next of which must lie in `next` (`lo..=hi`): only well-formed UTF-8
    /// is accepted, so every character counted against `maxLength` is one the
    /// client will decode as one (a stray continuation byte would decode as
    /// U+FFFD and add a character nobody counted).
    Str {
        node: NodeId,
        opened: bool,
        chars: usize,
        esc: u8,
        cont: u8,
        next: (u8, u8),
        /// `(k, len)`: the string ends with the first `len` bytes of the
        /// schema's stop `k` (the longest such match; `len` 0: none).
        stop: (u8, u8),
    },
    Num {
        integer: bool,
        state: Num,
        len: u8,
    },
    Obj {
        node: NodeId,
        state: Obj,
        seen: u64,
        current: u16,
    },
    Arr {
        node: NodeId,
        state: Arr,
        count: usize,
    },
    /// A `Node::Seq` whose items before `next` are written.
    Seq {
        node: NodeId,
        next: usize,
    },
    /// A `Node::Raw` value: `chars` written, `matched` bytes of its terminator seen.
    Raw {
        node: NodeId,
        chars: usize,
        matched: usize,
    },
}

impl Frame {
    /// A string of `node` (`usize::MAX`: a free key), at its opening quote or past it.
    fn string(node: NodeId, opened: bool) -> Frame {
        Frame::Str { node, opened, chars: 0, esc: 0, cont: 0, next: (0x80, 0xBF), stop: (0, 0) }
    }
}

#[derive(Debug, Clone)]
struct Stack {
    frames: Vec<Frame>,
    ws: u8,
}

/// Free key of an open object (no listed property).
const FREE_KEY: u16 = u16::MAX;

pub struct JsonGuide {
    schema: Arc<Schema>,
    vocab: Arc<Vocab>,
    stacks: Vec<Stack>,
}

/// The stop match of a string after byte `b` (see `Frame::Str::stop`), or
/// `None` when the string would then end with a whole stop.
fn advance_stop(stops: &[Vec<u8>], (k, len): (u8, u8), b: u8) -> Option<(u8, u8)> {
    let Some(prev) = stops.get(k as usize).map(|s| &s[..len as usize]) else { return Some((0, 0)) };
    // Whether `prev` followed by `b` ends with `p`.
    let ends_with = |p: &[u8]| p.split_last().is_some_and(|(&last, head)| last == b && prev.ends_with(head));
    let mut best = (0u8, 0u8);
    for (i, s) in stops.iter().enumerate() {
        let longest = s.len().min(len as usize + 1);
        if let Some(l) = (best.1 as usize + 1..=longest).rev().find(|&l| ends_with(&s[..l])) {
            if l == s.len() {
                return None;
            }
            best = (i as u8, l as u8);
        }
    }
    Some(best)
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonGuide {
    pub fn new(schema: Arc<Schema>, vocab: Arc<Vocab>) -> JsonGuide {
        let root = schema.root;
        JsonGuide { schema, vocab, stacks: vec![Stack { frames: vec![Frame::Value(root)], ws: 0 }] }
    }

    /// A complete JSON value has been produced.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(|s| self.stack_complete(s))
    }

    fn stack_complete(&self, s: &Stack) -> bool {
        match s.frames.as_slice() {
            [] => true,
            [Frame::Num { state, .. }] => num_accepting(*state),
            _ => false,
        }
    }

    /// Feeds bytes to every stack; the result is empty when they cannot continue.
    fn feed(&self, stacks: &[Stack], bytes: &[u8]) -> Vec<Stack> {
        let mut cur = stacks.to_vec();
        for &b in bytes {
            let mut next = Vec::new();
            for s in cur {
                self.step(s, b, &mut next);
                if next.len() > MAX_STACKS {
                    next.truncate(MAX_STACKS);
                }
            }
            if next.is_empty() {
                return next;
            }
            cur = next;
        }
        cur
    }

    /// Whether `text` could continue the output so far.
    pub fn allows(&self, text: &[u8]) -> bool {
        !text.is_empty() && !self.feed(&self.stacks, text).is_empty()
    }

    /// Records the chosen token; false once the JSON value is complete.
    pub fn accept(&mut self, id: u32) -> bool {
        let bytes = self.vocab.bytes.get(id as usize).cloned().unwrap_or_default();
        let next = self.feed(&self.stacks, &bytes);
        if !next.is_empty() {
            self.stacks = next;
        }
        !self.is_complete()
    }

    /// Feeds output that did not come through [`JsonGuide::accept`] (a lazy
    /// guide's trigger and what followed it); false, and no change, when the
    /// bytes cannot continue the value.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> bool {
        let next = self.feed(&self.stacks, bytes);
        if next.is_empty() {
            return false;
        }
        self.stacks = next;
        true
    }

    /// Leaves only valid tokens in `logits` (see the module doc).
    pub fn mask(&self, logits: &mut [f32], remaining: usize) {
        let closing = self.shortest_completion();
        if closing.len() + 1 >= remaining {
            if let Some(id) = self.longest_token_prefix(&closing).filter(|&id| self.token_ok(id)) {
                keep_only(logits, &[id]);
                return;
            }
        }
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let k = TOP_CANDIDATES.min(order.len());
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        order.select_nth_unstable_by(k.saturating_sub(1), by_logit);
        let mut valid: Vec<u32> = order[..k].iter().copied().filter(|&id| self.token_ok(id)).collect();
        if valid.is_empty() {
            order.sort_unstable_by(by_logit);
            valid = order.iter().copied().filter(|&id| self.token_ok(id)).take(16).collect();
        }
        // Near the end of the budget, no token may open more than the rest can close
        // (each byte is some token, so a completion of n bytes fits in n tokens).
        if remaining <= closing.len() + LOOKAHEAD {
            let fitting: Vec<u32> = valid.iter().copied().filter(|&id| self.fits(id, remaining)).collect();
            let closer = || self.longest_token_prefix(&closing).filter(|&id| self.token_ok(id));
            match (fitting.is_empty(), closer()) {
                (false, _) => valid = fitting,
                (true, Some(id)) => valid = vec![id],
                (true, None) => {}
            }
        }
        if valid.is_empty() {
            if let Some(id) = self.longest_token_prefix(&closing).filter(|&id| self.token_ok(id)) {
                valid.push(id);
            }
        }
        if !valid.is_empty() {
            keep_only(logits, &valid);
        }
    }

    /// Whether after token `id` the value can still close in `remaining - 1` tokens.
    fn fits(&self, id: u32, remaining: usize) -> bool {
        let Some(bytes) = self.vocab.bytes.get(id as usize) else { return false };
        let next = self.feed(&self.stacks, bytes);
        next.iter().any(|s| self.stack_complete(s) || self.complete_stack(s).len() < remaining)
    }

    fn token_ok(&self, id: u32) -> bool {
        let i = id as usize;
        match (self.vocab.bytes.get(i), self.vocab.special.get(i)) {
            (Some(b), Some(false)) => self.allows(b),
            _ => false,
        }
    }

    /// Advances one stack by byte `b`, pushing every way it can continue.
    fn step(&self, mut st: Stack, b: u8, out: &mut Vec<Stack>) {
        let sch = &self.schema;
        let ws_ok = |st: &mut Stack| {
            if st.ws < WS_CAP {
                st.ws += 1;
                true
            } else {
                false
            }
        };
        let Some(top) = st.frames.last_mut() else {
            if is_ws(b) && ws_ok(&mut st) {
                out.push(st);
            }
            return;
        };
        if !is_ws(b) || matches!(top, Frame::Lit { .. } | Frame::Str { opened: true, .. } | Frame::Raw { .. }) {
            st.ws = 0;
        }
        match top {
            Frame::Value(node) => {
                if is_ws(b) && sch.skips_ws(*node, 0) {
                    if ws_ok(&mut st) {
                        out.push(st);
                    }
                    return;
                }
                let node = *node;
                st.frames.pop();
                for f in self.expand(node) {
                    let mut s = st.clone();
                    s.frames.push(f);
                    self.step(s, b, out);
                }
            }
            Frame::Seq { node, next } => {
                let Some(Node::Seq(items)) = sch.nodes.get(*node) else { return };
                if *next >= items.len() {
                    st.frames.pop();
                    self.child_done(&mut st, None);
                    self.step(st, b, out);
                    return;
                }
                let (item, optional) = items[*next];
                *next += 1;
                if optional {
                    self.step(st.clone(), b, out);
                }
                st.frames.push(Frame::Value(item));
                self.step(st, b, out);
            }
            Frame::Raw { node, chars, matched } => {
                let Some(Node::Raw { min, max, term }) = sch.nodes.get(*node) else { return };
                if b == term[*matched] {
                    *matched += 1;
                    if *matched == term.len() {
                        if *chars < *min {
                            return;
                        }
                        st.frames.pop();
                        self.child_done(&mut st, None);
                    }
                    out.push(st);
                    return;
                }
                if b < 0x20 && b != b'\n' && b != b'\t' {
                    return;
                }
                // The bytes that looked like the terminator were text after all
                // (terminators repeat no byte of their start, so no other match is lost).
                let mut add = *matched;
                *matched = usize::from(b == term[0]);
                if *matched == 0 && b & 0xC0 != 0x80 {
                    add += 1;
                }
                *chars += add;
                if max.is_some_and(|m| *chars > m) {
                    return;
                }
                out.push(st);
            }
            Frame::Lit { text, pos, key } => {
                if text.get(*pos) != Some(&b) {
                    return;
                }
                *pos += 1;
                if *pos == text.len() {
                    let key = *key;
                    st.frames.pop();
                    self.child_done(&mut st, key);
                }
                out.push(st);
            }
            Frame::Str { node, opened, chars, esc, cont, next, stop } => {
                let (min, max) = match sch.nodes.get(*node) {
                    Some(Node::String { min, max }) => (*min, *max),
                    _ => (0, None),
                };
                if !*opened {
                    if b == b'"' {
                        *opened = true;
                        out.push(st);
                    }
                    return;
                }
                if *esc != 0 || *cont != 0 || b != b'"' {
                    match advance_stop(&sch.stops, *stop, b) {
                        Some(s) => *stop = s,
                        None => return,
                    }
                }
                match *esc {
                    1 => {
                        if b == b'u' {
                            *esc = 5;
                        } else if b"\"\\/bfnrt".contains(&b) {
                            *esc = 0;
                            *chars += 1;
                        } else {
                            return;
                        }
                    }
                    2..=5 => {
                        if !b.is_ascii_hexdigit() {
                            return;
                        }
                        *esc -= 1;
                        if *esc == 1 {
                            *esc = 0;
                            *chars += 1;
                        }
                    }
                    _ if *cont > 0 => {
                        if !(next.0..=next.1).contains(&b) {
                            return;
                        }
                        *cont -= 1;
                        *next = (0x80, 0xBF);
                    }
                    _ if b == b'"' => {
                        if *chars < min {
                            return;
                        }
                        st.frames.pop();
                        self.child_done(&mut st, Some(FREE_KEY));
                    }
                    _ if b == b'\\' => {
                        // An escape is one more character: room for it first.
                        if max.is_some_and(|m| *chars >= m) {
                            return;
                        }
                        *esc = 1;
                    }
                    _ if b < 0x20 => return,
                    _ => {
                        // A lead byte: how many continuation bytes follow, and the
                        // range of the first (no overlongs, surrogates or > U+10FFFF).
                        let (n, first) = match b {
                            0x00..=0x7F => (0, (0x80, 0xBF)),
                            0xC2..=0xDF => (1, (0x80, 0xBF)),
                            0xE0 => (2, (0xA0, 0xBF)),
                            0xED => (2, (0x80, 0x9F)),
                            0xE1..=0xEF => (2, (0x80, 0xBF)),
                            0xF0 => (3, (0x90, 0xBF)),
                            0xF1..=0xF3 => (3, (0x80, 0xBF)),
                            0xF4 => (3, (0x80, 0x8F)),
                            _ => return, // continuation without a lead, C0/C1, F5..
                        };
                        if max.is_some_and(|m| *chars >= m) {
                            return;
                        }
                        *chars += 1;
                        *cont = n;
                        *next = first;
                    }
                }
                out.push(st);
            }
            Frame::Num { integer, state, len } => {
                let next = num_next(*state, b, *integer);
                match next {
                    Some(n) if *len < if *integer { MAX_INTEGER } else { MAX_NUMBER } => {
                        *state = n;
                        *len += 1;
                        out.push(st);
                    }
                    Some(_) => {}
                    None if num_accepting(*state) => {
                        st.frames.pop();
                        self.child_done(&mut st, None);
                        self.step(st, b, out);
                    }
                    None => {}
                }
            }
            Frame::Obj { node, state, seen, current } => {
                let Node::Object { props, required, additional } = &sch.nodes[*node] else { return };
                let all_required = required & !*seen == 0;
                let key_left = additional.is_some() || (0..props.len()).any(|i| *seen & (1 << i) == 0);
                match (*state, b) {
                    (Obj::Open, b'{') => *state = Obj::AfterOpen,
                    (Obj::Open, _) => return,
                    (Obj::AfterOpen | Obj::AfterComma | Obj::AfterKey | Obj::AfterValue, w) if is_ws(w) => {
                        if !ws_ok(&mut st) {
                            return;
                        }
                    }
                    (Obj::AfterOpen | Obj::AfterValue, b'}') if all_required => {
                        st.frames.pop();
                        self.child_done(&mut st, None);
                    }
                    (Obj::AfterOpen | Obj::AfterComma, b'"') => {
                        *state = Obj::InKey;
                        let seen = *seen;
                        let additional = *additional;
                        for (i, (key, _)) in props.iter().enumerate() {
                            if seen & (1 << i) == 0 {
                                let mut s = st.clone();
                                s.frames.push(Frame::Lit { text: key.clone(), pos: 1, key: Some(i as u16) });
                                out.push(s);
                            }
                        }
                        if additional.is_some() {
                            st.frames.push(Frame::string(usize::MAX, true));
                            out.push(st);
                        }
                        return;
                    }
                    (Obj::AfterKey, b':') => {
                        let value = if *current == FREE_KEY {
                            additional.expect("free keys only in open objects")
                        } else {
                            props[*current as usize].1
                        };
                        *state = Obj::InValue;
                        st.frames.push(Frame::Value(value));
                    }
                    (Obj::AfterValue, b',') if key_left => *state = Obj::AfterComma,
                    _ => return,
                }
                out.push(st);
            }
            Frame::Arr { node, state, count } => {
                let Node::Array { items, min, max } = &sch.nodes[*node] else { return };
                let (items, min, max) = (*items, *min, *max);
                match (*state, b) {
                    (Arr::Open, b'[') => *state = Arr::AfterOpen,
                    (Arr::Open, _) => return,
                    (Arr::AfterOpen | Arr::AfterValue | Arr::AfterComma, w) if is_ws(w) => {
                        if !ws_ok(&mut st) {
                            return;
                        }
                    }
                    (Arr::AfterOpen | Arr::AfterValue, b']') if *count >= min => {
                        st.frames.pop();
                        self.child_done(&mut st, None);
                    }
                    (Arr::AfterValue, b',') if max.is_none_or(|m| *count < m) => *state = Arr::AfterComma,
                    (Arr::AfterOpen | Arr::AfterComma, _) if max.is_none_or(|m| *count < m) => {
                        *state = Arr::InValue;
                        st.frames.push(Frame::Value(items));
                        self.step(st, b, out);
                        return;
                    }
                    _ => return,
                }
                out.push(st);
            }
        }
    }

    /// The frames a value of `node` can start as.
    fn expand(&self, node: NodeId) -> Vec<Frame> {
        let mut out = Vec::new();
        self.expand_into(node, &mut out, 0);
        out
    }

    fn expand_into(&self, node: NodeId, out: &mut Vec<Frame>, depth: usize) {
        if depth > 16 {
            return;
        }
        match &self.schema.nodes[node] {
            Node::Object { .. } => out.push(Frame::Obj { node, state: Obj::Open, seen: 0, current: 0 }),
            Node::Array { .. } => out.push(Frame::Arr { node, state: Arr::Open, count: 0 }),
            Node::String { .. } => out.push(Frame::string(node, false)),
            Node::Number { integer } => out.push(Frame::Num { integer: *integer, state: Num::Start, len: 0 }),
            Node::Literals(alts) => {
                out.extend(alts.iter().map(|t| Frame::Lit { text: t.clone(), pos: 0, key: None }));
            }
            Node::AnyOf(alts) => {
                for &a in alts {
                    self.expand_into(a, out, depth + 1);
                }
            }
            Node::Markup(alts) => out.extend(alts.iter().map(|t| Frame::Lit { text: t.clone(), pos: 0, key: None })),
            Node::Seq(_) => out.push(Frame::Seq { node, next: 0 }),
            Node::Raw { .. } => out.push(Frame::Raw { node, chars: 0, matched: 0 }),
        }
    }

    /// Tells the frame now on top that its child finished (`key`: which key).
    fn child_done(&self, st: &mut Stack, key: Option<u16>) {
        match st.frames.last_mut() {
            Some(Frame::Obj { state, seen, current, .. }) => match *state {
                Obj::InKey => {
                    let k = key.unwrap_or(FREE_KEY);
                    if k != FREE_KEY && (k as usize) < MAX_PROPS {
                        *seen |= 1 << k;
                    }
                    *current = k;
                    *state = Obj::AfterKey;
                }
                Obj::InValue => *state = Obj::AfterValue,
                _ => {}
            },
            Some(Frame::Arr { state, count, .. }) if *state == Arr::InValue => {
                *state = Arr::AfterValue;
                *count += 1;
            }
            // A sequence whose last item is written is done too.
            Some(Frame::Seq { node, next }) => {
                if matches!(self.schema.nodes.get(*node), Some(Node::Seq(items)) if *next >= items.len()) {
                    st.frames.pop();
                    self.child_done(st, None);
                }
            }
            _ => {}
        }
    }
}

fn keep_only(logits: &mut [f32], ids: &[u32]) {
    let kept: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
    logits.fill(f32::NEG_INFINITY);
    for (&i, &v) in ids.iter().zip(&kept) {
        // A kept token must stay drawable even if its own logit was -inf.
        logits[i as usize] = if v.is_finite() { v } else { 0.0 };
    }
}

fn num_accepting(s: Num) -> bool {
    matches!(s, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits | Num::ExpDigits2)
}

/// JSON number grammar, one byte at a time; `None` ends (or breaks) the number.
fn num_next(s: Num, b: u8, integer: bool) -> Option<Num> {
    let digit = b.is_ascii_digit();
    match (s, b) {
        (Num::Start, b'-') => Some(Num::Minus),
        // No "-0" integer: serde_json (and so the Anthropic `input` object)
        // reads it as the float -0.0, which a client's integer check refuses.
        (Num::Minus, b'0') if integer => None,
        (Num::Start | Num::Minus, b'0') => Some(Num::Zero),
        (Num::Start | Num::Minus, _) if digit => Some(Num::Int),
        (Num::Int, _) if digit => Some(Num::Int),
        (Num::Zero | Num::Int, b'.') if !integer => Some(Num::Dot),
        (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') if !integer => Some(Num::Exp),
        (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
        (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
        (Num::Exp | Num::ExpSign, _) if digit => Some(Num::ExpDigits),
        (Num::ExpDigits, _) if digit => Some(Num::ExpDigits2),
        _ => None,
    }
}

#[path = "guide_complete.rs"]
mod complete;

#[cfg(test)]
#[path = "guide_tests.rs"]
mod tests;

#[cfg(test)]
pub(crate) fn guide_tests_argmax(x: &[f32]) -> u32 {
    engine::sampler::argmax(x)
}
