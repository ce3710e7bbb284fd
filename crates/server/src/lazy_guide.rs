//! Guides the calls a model opens on its own (`tool_choice` auto), as
//! llama.cpp's lazy grammars do: generation is free until the output shows one
//! of the family's call markers ([`ToolFormat::lazy_triggers`]); from there the
//! JSON guide holds the call to the family's markup, a known tool and
//! schema-valid arguments, and lets go when the call has closed. So a call
//! that has started streaming can no longer turn invalid, and the arguments
//! can stream to the client as they are generated.
//!
//! The guide is fed the output from the marker on; when those bytes do not fit
//! the grammar (the model wrote the call in a shape the grammar does not know),
//! it does not attach, and the server holds that call back until it closes
//! (`chat::Generation`), so a bad call still comes back as text.

use crate::guide::{JsonGuide, Vocab};
use crate::guide_schema::Schema;
use std::sync::Arc;

/// What recording one token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lazy {
    /// Nothing changed.
    Free,
    /// The output just opened a call and the guide took hold of it.
    Attached,
    /// The guided call is complete; generation is free again.
    Released,
    /// A guided token (the call is under way).
    Guided,
}

pub struct LazyCalls {
    triggers: &'static [&'static str],
    grammar: Arc<Schema>,
    vocab: Arc<Vocab>,
    /// Output since the last guided call ended.
    out: Vec<u8>,
    /// `out[..searched]` holds no whole trigger that could still attach.
    searched: usize,
    active: Option<JsonGuide>,
}

impl LazyCalls {
    pub fn new(triggers: &'static [&'static str], grammar: Arc<Schema>, vocab: Arc<Vocab>) -> LazyCalls {
        LazyCalls { triggers, grammar, vocab, out: Vec::new(), searched: 0, active: None }
    }

    /// A call is being guided.
    pub fn active(&self) -> bool {
        self.active.is_some()
    }

    /// Masks `logits` while a call is guided (`remaining`: tokens left).
    pub fn mask(&self, logits: &mut [f32], remaining: usize) {
        if let Some(g) = &self.active {
            g.mask(logits, remaining);
        }
    }

    /// Records the sampled token `id`; `remaining`: tokens the request may
    /// still generate after it. A call that cannot close in those is not held
    /// (it would be cut either way; unheld, it comes back as text).
    pub fn accept(&mut self, id: u32, remaining: usize) -> Lazy {
        if let Some(g) = self.active.as_mut() {
            if g.accept(id) {
                return Lazy::Guided;
            }
            self.active = None;
            self.out.clear();
            self.searched = 0;
            return Lazy::Released;
        }
        let bytes = self.vocab.bytes.get(id as usize).map_or(&[][..], Vec::as_slice);
        self.out.extend_from_slice(bytes);
        let longest = self.triggers.iter().map(|t| t.len()).max().unwrap_or(0);
        let from = self.searched.min(self.out.len());
        let found = self.triggers.iter().filter_map(|t| find(&self.out[from..], t.as_bytes()).map(|p| from + p)).min();
        let Some(p) = found else {
            // A trigger may still end in the next token: keep its possible start.
            self.searched = self.out.len().saturating_sub(longest.saturating_sub(1));
            return Lazy::Free;
        };
        let mut g = JsonGuide::new(self.grammar.clone(), self.vocab.clone());
        if g.accept_bytes(&self.out[p..]) {
            if g.completion_tokens() < remaining {
                self.active = Some(g);
                return Lazy::Attached;
            }
            tracing::debug!("a call opened too close to max_tokens to close; not held");
            self.searched = p + 1;
            return Lazy::Free;
        }
        tracing::debug!(
            "a call opened in a shape the guide does not know: {:?}",
            String::from_utf8_lossy(&self.out[p..])
        );
        self.searched = p + 1;
        Lazy::Free
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}
