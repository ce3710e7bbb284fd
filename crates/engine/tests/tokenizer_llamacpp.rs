//! Our GGUF tokenizers against llama.cpp's ids, recorded by
//! `scripts/make_tokenizer_refs.py` in `tests/data/tokenizer/smollm2_tokens.json`.
//! Needs the SmolLM2 GGUF in `$SHARDLM_CACHE` (default `~/.cache/shardlm`); without it
//! the tests skip, unless `CI=true`.

use formats::{GgufTokenizer, TokenizerSource};
use serde_json::Value;
use shardlm_engine::{StreamDecoder, Tokenizer};
use std::path::{Path, PathBuf};

const MODEL: &str = "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> Option<PathBuf> {
    let cache = match std::env::var_os("SHARDLM_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/shardlm"),
    };
    let path = cache.join(MODEL);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{} is missing (CI=true)", path.display());
    }
    eprintln!("skipping: {} not found (set SHARDLM_CACHE)", path.display());
    None
}

fn refs() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizer/smollm2_tokens.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn gguf_tokenizer(path: &Path) -> GgufTokenizer {
    match formats::open_model(path).expect("open GGUF").tokenizer {
        TokenizerSource::Gguf(g) => g,
        other => panic!("expected GGUF tokenizer metadata, got {other:?}"),
    }
}

fn build(g: GgufTokenizer) -> Tokenizer {
    Tokenizer::from_source(&TokenizerSource::Gguf(g)).expect("build tokenizer").expect("a tokenizer")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn texts(r: &Value) -> Vec<String> {
    r["cases"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect()
}

/// The fixed texts and then the seeded random ones, with llama.cpp's ids.
fn all_cases(r: &Value) -> (Vec<String>, Vec<Value>) {
    let fixed = r["cases"].as_array().unwrap().iter();
    let fuzz = r["fuzz"]["cases"].as_array().unwrap().iter();
    fixed.chain(fuzz).map(|c| (c["text"].as_str().unwrap().to_string(), c["ids"].clone())).unzip()
}

/// Encodes every text and lists the ones that differ from `want`.
fn mismatches(tok: &Tokenizer, texts: &[String], want: &[Value], add_special: bool) -> Vec<String> {
    let mut bad = Vec::new();
    for (text, want) in texts.iter().zip(want) {
        let got = tok.encode(text, add_special).unwrap();
        let want = ids(want);
        if got != want {
            bad.push(format!("{text:?}\n   ours:      {got:?}\n   llama.cpp: {want:?}"));
        }
    }
    bad
}

#[test]
fn smollm2_ids_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let r = refs();
    let g = gguf_tokenizer(&path);
    assert_eq!((g.model.as_str(), g.pre.as_deref()), ("gpt2", Some("smollm")));
    let tok = build(g);
    let texts = texts(&r);
    let cases = r["cases"].as_array().unwrap();
    assert!(texts.len() >= 30);
    let want: Vec<Value> = cases.iter().map(|c| c["ids"].clone()).collect();
    let bad = mismatches(&tok, &texts, &want, false);
    assert!(bad.is_empty(), "{} of {} texts differ:\n{}", bad.len(), texts.len(), bad.join("\n"));
    for (text, case) in texts.iter().zip(cases) {
        let ids = ids(&case["ids"]);
        assert_eq!(&tok.decode(&ids, false), text);
        assert_eq!(tok.decode(&ids, false), case["llama_cpp_detokenize"].as_str().unwrap());
        // Streaming gives the same text without the special tokens.
        let mut stream = StreamDecoder::new();
        let mut streamed: String = ids.iter().map(|&id| stream.push(&tok, id)).collect();
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, tok.decode(&ids, true), "{text:?}");
    }
    let (all, want) = all_cases(&r);
    let bad = mismatches(&tok, &all, &want, false);
    assert!(bad.is_empty(), "{} of {} texts (fuzz included) differ:\n{}", bad.len(), all.len(), bad.join("\n"));
    for (text, want) in all.iter().zip(&want) {
        assert_eq!(&tok.decode(&ids(want), false), text);
    }
    eprintln!("{} texts match llama.cpp", all.len());
}

#[test]
fn smollm2_special_tokens() {
    let Some(path) = model_path() else { return };
    let tok = build(gguf_tokenizer(&path));
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert!(tok.is_special(1) && tok.is_special(0) && !tok.is_special(19556));
    // add_bos_token is false in this GGUF.
    assert_eq!(tok.encode("Hello world", true).unwrap(), vec![19556, 905]);
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
    assert_eq!(tok.token_bytes(198), b"\n");
    assert_eq!(tok.decode(&[1, 4093, 198, 6004, 2], true), "user\nhi");
}

#[test]
fn pre_tokenizer_variants_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let r = refs();
    let g = gguf_tokenizer(&path);
    let (texts, base) = all_cases(&r);
    let mut failed = Vec::new();
    let variants = r["pre_variants"].as_object().unwrap();
    for (pre, diff) in variants {
        // Stored are only the texts whose ids differ from the "smollm" ones.
        let mut want = base.clone();
        for (i, ids) in diff.as_object().unwrap() {
            want[i.parse::<usize>().unwrap()] = ids.clone();
        }
        let tok = build(GgufTokenizer { pre: Some(pre.clone()), ..g.clone() });
        let bad = mismatches(&tok, &texts, &want, false);
        if !bad.is_empty() {
            failed.push(format!("pre {pre:?}: {} of {} differ:\n{}", bad.len(), texts.len(), bad.join("\n")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    eprintln!("{} pre-tokenizers x {} texts match llama.cpp", variants.len(), texts.len());
}

/// The SentencePiece vocabulary `make_tokenizer_refs.py` derives from SmolLM2's
/// (see `spm_vocab` there).
fn spm_from(g: &GgufTokenizer, r: &Value) -> GgufTokenizer {
    let spec = &r["spm_vocab"];
    let first_n = spec["first_n"].as_u64().unwrap() as usize;
    let mut vocab: Vec<(String, f32, i32)> =
        vec![("<unk>".into(), 0.0, 2), ("<s>".into(), 0.0, 3), ("</s>".into(), 0.0, 3)];
    vocab.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    for s in spec["specials"].as_array().unwrap() {
        vocab.push((s[0].as_str().unwrap().into(), 0.0, s[1].as_i64().unwrap() as i32));
    }
    let mut seen: std::collections::HashSet<String> = vocab.iter().map(|v| v.0.clone()).collect();
    // The byte-level vocabulary's bytes: decoding a normal token alone gives them.
    let bytelevel = build(g.clone());
    for i in 0..first_n.min(g.tokens.len()) {
        if g.token_types[i] != 1 {
            continue;
        }
        let Ok(text) = String::from_utf8(bytelevel.token_bytes(i as u32)) else { continue };
        let piece = text.replace(' ', "\u{2581}");
        if seen.insert(piece.clone()) {
            vocab.push((piece, -(i as f32), 1));
        }
    }
    assert_eq!(vocab.len() as u64, spec["size"].as_u64().unwrap(), "SPM vocabulary rule drifted");
    for s in spec["sample"].as_array().unwrap() {
        assert_eq!(vocab[s[0].as_u64().unwrap() as usize].0, s[1].as_str().unwrap());
    }
    GgufTokenizer {
        model: "llama".into(),
        pre: None,
        tokens: vocab.iter().map(|v| v.0.clone()).collect(),
        scores: vocab.iter().map(|v| v.1).collect(),
        token_types: vocab.iter().map(|v| v.2).collect(),
        merges: Vec::new(),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        pad_id: None,
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
    }
}

#[test]
fn sentencepiece_ids_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let r = refs();
    let tok = build(spm_from(&gguf_tokenizer(&path), &r));
    let texts = texts(&r);
    let spm = r["spm"].as_array().unwrap();
    let want: Vec<Value> = spm.iter().map(|c| c["ids"].clone()).collect();
    let bad = mismatches(&tok, &texts, &want, false);
    assert!(bad.is_empty(), "{} of {} texts differ:\n{}", bad.len(), texts.len(), bad.join("\n"));
    let want: Vec<Value> = spm.iter().map(|c| c["ids_add_bos"].clone()).collect();
    let bad = mismatches(&tok, &texts, &want, true);
    assert!(bad.is_empty(), "with BOS, {} of {} texts differ:\n{}", bad.len(), texts.len(), bad.join("\n"));
    for (text, case) in texts.iter().zip(spm) {
        // After a special token llama.cpp inserts a space, so only plain text round-trips.
        if !text.contains("<|im_") {
            assert_eq!(&tok.decode(&ids(&case["ids"]), false), text);
        }
    }
    eprintln!("{} texts match llama.cpp (SentencePiece)", texts.len());
}

/// SmolLM2's `tokenizer.json` recreated from the GGUF (BPE, individual digits, then
/// GPT-2 byte-level splitting) and loaded through the `tokenizer.json` path.
#[test]
fn tokenizer_json_path_matches_llama_cpp() {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::{AddedToken, PreTokenizerWrapper};

    let Some(path) = model_path() else { return };
    let r = refs();
    let g = gguf_tokenizer(&path);
    let vocab: Vocab = g.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = g.merges.iter().map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).unwrap());
    let bpe = BPE::builder().vocab_and_merges(vocab, merges.collect()).build().unwrap();
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ])));
    hf.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = (0..g.tokens.len())
        .filter(|&i| g.token_types[i] == 3)
        .map(|i| AddedToken::from(g.tokens[i].clone(), true))
        .collect();
    hf.add_special_tokens(&specials);

    let dir = std::env::temp_dir().join(format!("shardlm-smollm2-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("tokenizer.json");
    hf.save(&json, false).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}"#)
        .unwrap();
    let tok = Tokenizer::from_source(&TokenizerSource::HfJson(json)).unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    let texts = texts(&r);
    let cases = r["cases"].as_array().unwrap();
    let want: Vec<Value> = cases.iter().map(|c| c["ids"].clone()).collect();
    let bad = mismatches(&tok, &texts, &want, false);
    assert!(bad.is_empty(), "{} of {} texts differ:\n{}", bad.len(), texts.len(), bad.join("\n"));
    for (text, case) in texts.iter().zip(cases) {
        let ids = ids(&case["ids"]);
        assert_eq!(&tok.decode(&ids, false), text);
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
        assert_eq!(bytes, text.as_bytes());
    }
}
