//! Tokenizers: built from GGUF `tokenizer.ggml.*` metadata (gpt2 byte-level BPE with
//! its named pre-tokenizer, or llama SentencePiece) or loaded from `tokenizer.json`.
//! Byte-level BPE goes through the `tokenizers` crate with llama.cpp's pre-tokenizer
//! regexes; SentencePiece follows llama.cpp's score-ordered merges (`spm.rs`), which
//! the crate's rank-ordered BPE cannot express exactly.

mod bytelevel;
mod gguf;
mod hfjson;
mod partition;
mod pretok;
mod spm;

use crate::EngineError;
use formats::TokenizerSource;
use partition::{Fragment, SpecialMatcher};
use std::collections::HashMap;

pub struct Tokenizer {
    kind: Kind,
    /// The bytes each id stands for (`token_bytes`).
    pieces: Vec<Vec<u8>>,
    /// Control tokens: not printed when streaming, dropped by `skip_special`.
    special: Vec<bool>,
    ids: HashMap<String, u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece: a space goes before text at the start and after special tokens.
    add_space_prefix: bool,
}

enum Kind {
    /// `tokenizer.json`: the `tokenizers` pipeline, post-processor included, does it all.
    HfJson(Box<tokenizers::Tokenizer>),
    /// GGUF byte-level BPE through `tokenizers`; BOS/EOS are added here.
    GgufBpe(Box<tokenizers::Tokenizer>),
    /// GGUF SentencePiece, tokenized as llama.cpp does.
    Spm { spm: spm::Spm, specials: SpecialMatcher },
}

impl Tokenizer {
    /// `Ok(None)` for `TokenizerSource::None`.
    pub fn from_source(src: &TokenizerSource) -> Result<Option<Tokenizer>, EngineError> {
        match src {
            TokenizerSource::None => Ok(None),
            TokenizerSource::HfJson(path) => hfjson::load(path).map(Some),
            TokenizerSource::Gguf(g) => gguf::build(g).map(Some),
        }
    }

    /// Encodes `text`. With `add_special`, adds BOS/EOS as the model's metadata asks
    /// (same as llama.cpp's `add_special`). Special-token strings in `text` (e.g.
    /// `<|im_start|>`) are always recognized as their single ids, as llama.cpp does
    /// with `parse_special = true`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, EngineError> {
        let hf_err = |e: tokenizers::Error| EngineError::Tokenizer(e.to_string());
        let mut out = Vec::new();
        let bos = self.bos.filter(|_| add_special && self.add_bos);
        let eos = self.eos.filter(|_| add_special && self.add_eos);
        match &self.kind {
            Kind::HfJson(hf) => return Ok(hf.encode(text, add_special).map_err(hf_err)?.get_ids().to_vec()),
            Kind::GgufBpe(hf) => {
                out.extend(bos);
                out.extend_from_slice(hf.encode(text, false).map_err(hf_err)?.get_ids());
            }
            Kind::Spm { spm, specials } => {
                out.extend(bos);
                let mut after_special = true;
                for frag in specials.split(text) {
                    match frag {
                        Fragment::Text(t) => {
                            let prefix = if self.add_space_prefix && after_special { " " } else { "" };
                            let escaped = format!("{prefix}{t}").replace(' ', "\u{2581}");
                            spm.tokenize(&escaped, &self.ids, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        out.extend(eos);
        Ok(out)
    }

    /// Decodes ids to text. With `skip_special`, control tokens are dropped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        if let Kind::HfJson(hf) = &self.kind {
            if let Ok(text) = hf.decode(ids, skip_special) {
                return text;
            }
        }
        let mut bytes = Vec::new();
        let mut first = true;
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            let Some(piece) = self.pieces.get(id as usize) else { continue };
            if piece.is_empty() {
                continue;
            }
            // SentencePiece's added space before the text is not part of it.
            let strip = first && self.add_space_prefix && !self.is_special(id) && piece[0] == b' ';
            bytes.extend_from_slice(&piece[strip as usize..]);
            first = false;
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes a token stands for (byte-level BPE bytes, SentencePiece pieces
    /// with ▁ as space and <0xNN> byte tokens). Control tokens give their text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.pieces.get(id as usize).cloned().unwrap_or_default()
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.kind {
            Kind::HfJson(hf) => hf.token_to_id(token),
            _ => self.ids.get(token).copied(),
        }
    }

    /// Whether `id` is a control/special token (not printed in streamed text).
    /// Makes the control token spelled `text` print like text (tool-call
    /// markup the server parses, e.g. Harmony's `<|channel|>`); false if there is none.
    pub fn print_special(&mut self, text: &str) -> bool {
        match self.token_to_id(text) {
            Some(id) if self.is_special(id) && self.pieces.get(id as usize).is_some_and(|p| p == text.as_bytes()) => {
                self.special[id as usize] = false;
                true
            }
            _ => false,
        }
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether `encode(.., add_special = true)` puts BOS first (GGUF tokenizers;
    /// for `tokenizer.json` the post-processor decides and this reads the config).
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes until they
/// form complete UTF-8 characters (a multi-byte character may span tokens).
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder { pending: Vec::new() }
    }

    /// Feeds one token; returns the text that became complete (possibly empty).
    /// Special tokens produce no text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if tok.is_special(id) {
            return String::new();
        }
        match tok.pieces.get(id as usize) {
            Some(piece) => self.push_bytes(piece),
            None => String::new(),
        }
    }

    /// Feeds raw bytes; returns the complete characters, keeping an unfinished
    /// sequence at the end for later. Bytes that can never start or continue a
    /// character become U+FFFD at once.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).expect("valid prefix"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start = valid + bad;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Whatever is still pending at the end (invalid bytes become U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}
