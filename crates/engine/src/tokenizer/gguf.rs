//! Building a tokenizer from GGUF `tokenizer.ggml.*` metadata.

use super::bytelevel::{sentencepiece_to_bytes, token_to_bytes};
use super::partition::SpecialMatcher;
use super::spm::Spm;
use super::{pretok, Kind, Tokenizer};
use crate::EngineError;
use formats::GgufTokenizer;
use std::collections::HashMap;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// `tokenizer.ggml.token_type` values.
pub(crate) const TYPE_NORMAL: i32 = 1;
pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;
pub(crate) const TYPE_UNUSED: i32 = 5;
pub(crate) const TYPE_BYTE: i32 = 6;

fn err(what: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(format!("GGUF tokenizer: {what}"))
}

pub(crate) fn build(g: &GgufTokenizer) -> Result<Tokenizer, EngineError> {
    if g.tokens.is_empty() {
        return Err(err("tokenizer.ggml.tokens is empty"));
    }
    let n = g.tokens.len();
    let token_type = |id: usize| g.token_types.get(id).copied().unwrap_or(TYPE_NORMAL);
    // As in llama.cpp, a later duplicate of a token string wins the lookup.
    let ids: HashMap<String, u32> = g.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let check = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    // llama.cpp does not print control and unknown tokens unless asked to.
    let special: Vec<bool> = (0..n).map(|i| matches!(token_type(i), TYPE_CONTROL | TYPE_UNKNOWN)).collect();
    // The strings llama.cpp cuts out of the input before tokenizing.
    let matched: Vec<(String, u32)> = (0..n)
        .filter(|&i| matches!(token_type(i), TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN))
        .map(|i| (g.tokens[i].clone(), i as u32))
        .collect();

    match g.model.as_str() {
        "gpt2" => {
            let pre = pretok::lookup(g.pre.as_deref()).map_err(err)?;
            let hf = build_bpe(g, &ids, &pre, &matched)?;
            let pieces = (0..n)
                .map(|i| match token_type(i) {
                    TYPE_NORMAL | TYPE_BYTE => token_to_bytes(&g.tokens[i]),
                    TYPE_UNUSED => Vec::new(),
                    _ => g.tokens[i].clone().into_bytes(),
                })
                .collect();
            Ok(Tokenizer {
                kind: Kind::GgufBpe(Box::new(hf)),
                pieces,
                special,
                ids,
                bos: check(g.bos_id),
                eos: check(g.eos_id),
                add_bos: g.add_bos.unwrap_or(pre.add_bos),
                add_eos: g.add_eos.unwrap_or(false),
                add_space_prefix: false,
            })
        }
        "llama" => {
            let spm = Spm::new(&g.tokens, &g.scores, &ids, check(g.unk_id));
            let pieces = (0..n)
                .map(|i| match token_type(i) {
                    TYPE_NORMAL | TYPE_BYTE => sentencepiece_to_bytes(&g.tokens[i]),
                    TYPE_UNUSED => Vec::new(),
                    _ => g.tokens[i].clone().into_bytes(),
                })
                .collect();
            Ok(Tokenizer {
                kind: Kind::Spm { spm, specials: SpecialMatcher::new(matched) },
                pieces,
                special,
                ids,
                bos: check(g.bos_id),
                eos: check(g.eos_id),
                add_bos: g.add_bos.unwrap_or(true),
                add_eos: g.add_eos.unwrap_or(false),
                add_space_prefix: g.add_space_prefix.unwrap_or(true),
            })
        }
        other => Err(err(format!("unsupported tokenizer.ggml.model {other:?} (supported: gpt2, llama)"))),
    }
}

/// Byte-level BPE through the `tokenizers` crate: llama.cpp's regex splits, then the
/// byte-to-character mapping, then rank-ordered merges.
fn build_bpe(
    g: &GgufTokenizer,
    ids: &HashMap<String, u32>,
    pre: &pretok::PreTokenizer,
    matched: &[(String, u32)],
) -> Result<tokenizers::Tokenizer, EngineError> {
    let vocab: Vocab = ids.iter().map(|(t, &i)| (t.clone(), i)).collect();
    let mut merges = Vec::with_capacity(g.merges.len());
    for m in &g.merges {
        // llama.cpp looks for the separator from the second byte on.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            return Err(err(format!("bad merge {m:?}")));
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        // A merge that cannot produce a token never changes llama.cpp's output
        // except through byte fallback; `tokenizers` rejects such merges.
        if ids.contains_key(a) && ids.contains_key(b) && ids.contains_key(&format!("{a}{b}")) {
            merges.push((a.to_string(), b.to_string()));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| err(format!("BPE: {e}")))?;
    let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| err(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    tk.with_decoder(Some(ByteLevel::new(false, false, false)));
    let types = &g.token_types;
    let added: Vec<AddedToken> = matched
        .iter()
        .map(|(text, id)| {
            let control = types.get(*id as usize).copied() != Some(TYPE_USER_DEFINED);
            AddedToken::from(text.clone(), control).normalized(false)
        })
        .collect();
    tk.add_special_tokens(&added.iter().filter(|t| t.special).cloned().collect::<Vec<_>>());
    tk.add_tokens(&added.iter().filter(|t| !t.special).cloned().collect::<Vec<_>>());
    Ok(tk)
}
