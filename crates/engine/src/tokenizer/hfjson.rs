//! Loading an HF `tokenizer.json` (plus `tokenizer_config.json` beside it for the
//! BOS/EOS strings).

use super::bytelevel::{sentencepiece_to_bytes, token_to_bytes};
use super::{Kind, Tokenizer};
use crate::EngineError;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

pub(crate) fn load(path: &Path) -> Result<Tokenizer, EngineError> {
    let build_err = |what: String| EngineError::TokenizerBuild { path: path.to_path_buf(), what };
    let hf = tokenizers::Tokenizer::from_file(path).map_err(|e| build_err(e.to_string()))?;
    let n = hf.get_vocab_size(true);
    let added = hf.get_added_tokens_decoder();
    let byte_level =
        hf.get_decoder().and_then(|d| serde_json::to_string(d).ok()).is_some_and(|json| json.contains("\"ByteLevel\""));
    let mut pieces = Vec::with_capacity(n);
    let mut special = Vec::with_capacity(n);
    for id in 0..n as u32 {
        if let Some(tok) = added.get(&id) {
            pieces.push(tok.content.clone().into_bytes());
            special.push(tok.special);
            continue;
        }
        special.push(false);
        pieces.push(match hf.id_to_token(id) {
            Some(t) if byte_level => token_to_bytes(&t),
            Some(t) => sentencepiece_to_bytes(&t),
            None => Vec::new(),
        });
    }
    let ids: HashMap<String, u32> = hf.get_vocab(true).into_iter().collect();
    let config = path.parent().map(|dir| dir.join("tokenizer_config.json"));
    let config: Option<Value> =
        config.and_then(|p| std::fs::read(p).ok()).and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let special_id = |key: &str| -> Option<u32> {
        let v = config.as_ref()?.get(key)?;
        let text = v.as_str().or_else(|| v.get("content").and_then(Value::as_str))?;
        ids.get(text).copied()
    };
    let (bos, eos) = (special_id("bos_token"), special_id("eos_token"));
    // What the post-processor adds (it, not the config flags, decides in `encode`).
    let framing = hf.encode("", true).map(|e| e.get_ids().to_vec()).unwrap_or_default();
    let add_bos = bos.is_some() && framing.first().copied() == bos;
    let add_eos = eos.is_some() && framing.last().copied() == eos;
    Ok(Tokenizer {
        bos,
        eos,
        add_bos,
        add_eos,
        kind: Kind::HfJson(Box::new(hf)),
        pieces,
        special,
        ids,
        add_space_prefix: false,
    })
}
