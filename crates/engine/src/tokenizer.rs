//! Tokenizers: built from GGUF `tokenizer.ggml.*` metadata (gpt2 byte-level BPE with
//! its named pre-tokenizer, or llama SentencePiece) or loaded from `tokenizer.json`,
//! both through the `tokenizers` crate so the algorithms are the reference ones.

use crate::EngineError;
use formats::TokenizerSource;

pub struct Tokenizer {
    _private: (),
}

impl Tokenizer {
    /// `Ok(None)` for `TokenizerSource::None`.
    pub fn from_source(src: &TokenizerSource) -> Result<Option<Tokenizer>, EngineError> {
        let _ = src;
        todo!("tokenizer helper")
    }

    /// Encodes `text`. With `add_special`, adds BOS/EOS as the model's metadata asks
    /// (same as llama.cpp's `add_special`). Special-token strings in `text` (e.g.
    /// `<|im_start|>`) are always recognized as their single ids, as llama.cpp does
    /// with `parse_special = true`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, EngineError> {
        let _ = (text, add_special);
        todo!("tokenizer helper")
    }

    /// Decodes ids to text. With `skip_special`, control tokens are dropped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let _ = (ids, skip_special);
        todo!("tokenizer helper")
    }

    /// The raw bytes a token stands for (byte-level BPE bytes, SentencePiece pieces
    /// with ▁ as space and <0xNN> byte tokens). Control tokens give their text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let _ = id;
        todo!("tokenizer helper")
    }

    pub fn vocab_size(&self) -> usize {
        todo!("tokenizer helper")
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        let _ = token;
        todo!("tokenizer helper")
    }

    /// Whether `id` is a control/special token (not printed in streamed text).
    pub fn is_special(&self, id: u32) -> bool {
        let _ = id;
        todo!("tokenizer helper")
    }

    pub fn bos_id(&self) -> Option<u32> {
        todo!("tokenizer helper")
    }

    pub fn eos_id(&self) -> Option<u32> {
        todo!("tokenizer helper")
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes until they
/// form complete UTF-8 characters (a multi-byte character may span tokens).
pub struct StreamDecoder {
    _private: (),
}

impl StreamDecoder {
    pub fn new() -> Self {
        todo!("tokenizer helper")
    }

    /// Feeds one token; returns the text that became complete (possibly empty).
    /// Special tokens produce no text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let _ = (tok, id);
        todo!("tokenizer helper")
    }

    /// Whatever is still pending at the end (invalid bytes become U+FFFD).
    pub fn finish(&mut self) -> String {
        todo!("tokenizer helper")
    }
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}
