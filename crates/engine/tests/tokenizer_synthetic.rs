//! Tokenizers built from small hand-made vocabularies: GGUF byte-level BPE, GGUF
//! SentencePiece, `tokenizer.json`, and the streaming decoder. No model files needed.

use formats::{GgufTokenizer, TokenizerSource};
use shardlm_engine::{StreamDecoder, Tokenizer};

/// GPT-2's byte-to-character table.
fn byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 256;
    for x in 0..256u32 {
        if printable(x) {
            if x == b as u32 {
                return char::from_u32(x).unwrap();
            }
        } else {
            if x == b as u32 {
                return char::from_u32(next).unwrap();
            }
            next += 1;
        }
    }
    unreachable!()
}

const IM_START: u32 = 258;
const TOOL: u32 = 259;
const UNUSED: u32 = 260;

/// Ids 0..256 are the bytes, then "Ġh" (256), "Ġhi" (257), a control token, a
/// user-defined token and an unused one.
fn bpe_vocab(pre: &str) -> GgufTokenizer {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    tokens.extend(["Ġh", "Ġhi", "<|im_start|>", "<tool>", "<unused0>"].map(String::from));
    let mut token_types = vec![1; 258];
    token_types.extend([3, 4, 5]);
    GgufTokenizer {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types,
        merges: vec!["Ġ h".into(), "Ġh i".into()],
        bos_id: Some(IM_START),
        eos_id: Some(IM_START),
        ..Default::default()
    }
}

fn build(g: GgufTokenizer) -> Tokenizer {
    Tokenizer::from_source(&TokenizerSource::Gguf(g)).unwrap().unwrap()
}

#[test]
fn byte_level_bpe() {
    let tok = build(bpe_vocab("smollm"));
    assert_eq!(tok.vocab_size(), 261);
    assert_eq!(tok.encode(" hi", false).unwrap(), vec![257]);
    assert_eq!(tok.encode(" hi", true).unwrap(), vec![257], "gpt2 vocabularies add no BOS by default");
    assert!(!tok.adds_bos());
    assert_eq!(tok.encode("<|im_start|> hi<tool>!", false).unwrap(), vec![IM_START, 257, TOOL, b'!' as u32]);
    // "smollm" splits digits one by one; bytes stand for themselves.
    assert_eq!(tok.encode("12", false).unwrap(), vec![b'1' as u32, b'2' as u32]);
    assert_eq!(tok.encode("é", false).unwrap(), vec![0xC3, 0xA9]);
    assert_eq!(tok.encode("", true).unwrap(), Vec::<u32>::new());
    let ids = [IM_START, 257, TOOL, UNUSED, 0xC3, 0xA9];
    assert_eq!(tok.decode(&ids, false), "<|im_start|> hi<tool>é");
    assert_eq!(tok.decode(&ids, true), " hi<tool>é", "control tokens go, user-defined ones stay");
    assert_eq!(tok.decode(&[0xC3], false), "\u{FFFD}");
    assert!(tok.is_special(IM_START) && !tok.is_special(TOOL) && !tok.is_special(257) && !tok.is_special(9999));
    assert_eq!(tok.token_bytes(257), b" hi");
    assert_eq!(tok.token_bytes(0xC3), vec![0xC3]);
    assert_eq!(tok.token_bytes(9999), Vec::<u8>::new());
    assert_eq!((tok.token_to_id("Ġhi"), tok.token_to_id("nope")), (Some(257), None));
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(IM_START), Some(IM_START)));

    // The GGUF flag wins over the pre-tokenizer's default.
    let tok = build(GgufTokenizer { add_bos: Some(true), add_eos: Some(true), ..bpe_vocab("gpt-2") });
    assert_eq!(tok.encode(" hi", true).unwrap(), vec![IM_START, 257, IM_START]);
    assert_eq!(tok.encode(" hi", false).unwrap(), vec![257]);
    // llama-bpe turns BOS on by itself.
    assert_eq!(build(bpe_vocab("llama-bpe")).encode(" hi", true).unwrap(), vec![IM_START, 257]);
}

#[test]
fn unsupported_metadata_is_an_error() {
    for g in [
        bpe_vocab("no-such-pre"),
        GgufTokenizer { model: "bert".into(), ..bpe_vocab("gpt-2") },
        GgufTokenizer { tokens: vec![], ..bpe_vocab("gpt-2") },
        GgufTokenizer { merges: vec!["nospace".into()], ..bpe_vocab("gpt-2") },
    ] {
        assert!(Tokenizer::from_source(&TokenizerSource::Gguf(g)).is_err());
    }
    assert!(Tokenizer::from_source(&TokenizerSource::None).unwrap().is_none());
    let missing = TokenizerSource::HfJson("/nonexistent/tokenizer.json".into());
    assert!(Tokenizer::from_source(&missing).is_err());
}

/// `<unk> <s> </s> <0x00>..<0xFF>` (ids 3..259), then scored pieces.
fn spm_vocab() -> GgufTokenizer {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let pieces = [("▁", -1.0), ("h", -2.0), ("i", -2.0), ("e", -2.0), ("▁h", -3.0), ("▁hi", -4.0), ("hi", -9.0)];
    let mut scores = vec![0.0; tokens.len()];
    let mut token_types = vec![2, 3, 3];
    token_types.extend([6; 256]);
    for (p, s) in pieces {
        tokens.push(p.into());
        scores.push(s);
        token_types.push(1);
    }
    GgufTokenizer {
        model: "llama".into(),
        tokens,
        token_types,
        scores,
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    }
}

#[test]
fn sentencepiece() {
    let (sp, h, i, sp_h, sp_hi, hi) = (259, 260, 261, 263, 264, 265);
    let tok = build(spm_vocab());
    // A space goes in front; "▁h" (-3) beats "hi" (-9), then "▁hi" forms.
    assert_eq!(tok.encode("hi", false).unwrap(), vec![sp_hi]);
    assert_eq!(tok.encode("hi", true).unwrap(), vec![1, sp_hi], "llama vocabularies add BOS by default");
    assert!(tok.adds_bos());
    assert_eq!(tok.encode("", true).unwrap(), vec![1]);
    // Unknown characters become byte tokens: é = C3 A9.
    assert_eq!(tok.encode("hé", false).unwrap(), vec![sp_h, 3 + 0xC3, 3 + 0xA9]);
    // After a special token the space prefix comes again.
    assert_eq!(tok.encode("hi</s>hi", false).unwrap(), vec![sp_hi, 2, sp_hi]);
    assert_eq!(tok.encode(" hi", false).unwrap(), vec![sp, sp_hi]);
    assert_eq!(tok.decode(&[1, sp_hi], true), "hi", "the added space is dropped");
    assert_eq!(tok.decode(&[sp, sp_hi, 3 + 0xC3, 3 + 0xA9], false), " hié");
    assert_eq!(tok.decode(&[1, sp_hi], false), "<s> hi");
    assert_eq!(tok.token_bytes(sp_hi), b" hi");
    assert_eq!(tok.token_bytes(3 + 0x0A), b"\n");
    assert!(tok.is_special(0) && tok.is_special(1) && !tok.is_special(sp_hi));

    let tok = build(GgufTokenizer { add_space_prefix: Some(false), add_bos: Some(false), ..spm_vocab() });
    assert_eq!(tok.encode("hi", true).unwrap(), vec![hi]);
    assert_eq!(tok.encode("ih", true).unwrap(), vec![i, h]);
    assert_eq!(tok.decode(&[h, i], false), "hi");
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let mut s = StreamDecoder::new();
    assert_eq!(s.push_bytes(b"a\xC3"), "a");
    assert_eq!(s.push_bytes(b"\xA9b"), "\u{e9}b");
    let frog = "🐸".as_bytes();
    assert_eq!(s.push_bytes(&frog[..1]), "");
    assert_eq!(s.push_bytes(&frog[1..3]), "");
    assert_eq!(s.push_bytes(&frog[3..]), "🐸");
    // Bytes that can never become a character are replaced at once.
    assert_eq!(s.push_bytes(b"\xFFx\xC3("), "\u{FFFD}x\u{FFFD}(");
    assert_eq!(s.push_bytes(b"\xE2\x82"), "");
    assert_eq!(s.finish(), "\u{FFFD}");
    assert_eq!(s.finish(), "");

    // Through a tokenizer: byte tokens of "é😀" one at a time; control tokens print nothing.
    let tok = build(bpe_vocab("gpt-2"));
    let mut ids = vec![IM_START];
    ids.extend(tok.encode("é😀", false).unwrap());
    assert_eq!(ids.len(), 7);
    let mut s = StreamDecoder::default();
    let pieces: Vec<String> = ids.iter().map(|&id| s.push(&tok, id)).collect();
    assert_eq!(pieces, ["", "", "é", "", "", "", "😀"]);
    assert_eq!(s.finish(), "");
}

#[test]
fn tokenizer_json() {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::AddedToken;

    let g = bpe_vocab("gpt-2");
    let vocab: Vocab = g.tokens.iter().take(258).enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = vec![("Ġ".to_string(), "h".to_string()), ("Ġh".to_string(), "i".to_string())];
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().unwrap();
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    hf.with_decoder(Some(ByteLevel::default()));
    hf.add_special_tokens(&[AddedToken::from("<|im_start|>", true), AddedToken::from("<|im_end|>", true)]);
    hf.add_tokens(&[AddedToken::from("<tool>", false)]);

    let dir = std::env::temp_dir().join(format!("shardlm-tokenizer-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    hf.save(&path, false).unwrap();
    let config = r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": true}}"#;
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let tok = Tokenizer::from_source(&TokenizerSource::HfJson(path)).unwrap().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let (start, end, tool) = (258, 259, 260);
    assert_eq!(tok.vocab_size(), 261);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(start), Some(end)));
    let ids = tok.encode("<|im_start|> hi<tool>é<|im_end|>", false).unwrap();
    assert_eq!(ids, vec![start, 257, tool, 0xC3, 0xA9, end]);
    assert_eq!(tok.decode(&ids, false), "<|im_start|> hi<tool>é<|im_end|>");
    assert_eq!(tok.decode(&ids, true), " hi<tool>é");
    assert!(tok.is_special(start) && !tok.is_special(tool) && !tok.is_special(257));
    assert_eq!(tok.token_bytes(257), b" hi");
    assert_eq!(tok.token_bytes(0xA9), vec![0xA9]);
    assert_eq!(tok.token_bytes(tool), b"<tool>");
    assert_eq!(tok.token_to_id("<tool>"), Some(tool));
    assert!(!tok.adds_bos(), "no post-processor, so no BOS");
}

#[test]
fn tokenizers_and_templates_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<shardlm_engine::ChatTemplate>();
}
