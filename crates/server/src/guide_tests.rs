use super::*;
use serde_json::json;

fn guide(schema: serde_json::Value, tokens: &[&str]) -> JsonGuide {
    let schema = Arc::new(Schema::compile(&schema).unwrap());
    let mut bytes: Vec<Vec<u8>> = tokens.iter().map(|t| t.as_bytes().to_vec()).collect();
    let mut special = vec![false; bytes.len()];
    bytes.push(b"<eos>".to_vec());
    special.push(true);
    JsonGuide::new(schema, Arc::new(Vocab { bytes, special }))
}

fn accepts(schema: serde_json::Value, text: &str) -> bool {
    let g = guide(schema, &[]);
    let st = g.feed(&g.stacks, text.as_bytes());
    st.iter().any(|s| g.stack_complete(s))
}

#[test]
fn valid_documents_complete_and_invalid_ones_do_not() {
    let s = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "days"]});
    assert!(accepts(s.clone(), r#"{"city": "Paris", "days": 3}"#));
    assert!(accepts(s.clone(), r#"{"days":-12,"unit":"f","city":"a\"b\u00e9"}"#));
    assert!(!accepts(s.clone(), r#"{"city": "Paris"}"#), "missing required");
    assert!(!accepts(s.clone(), r#"{"city": "Paris", "days": 3.5}"#), "integer");
    assert!(!accepts(s.clone(), r#"{"city": "Paris", "days": -0}"#), "integer -0 (serde reads -0.0)");
    assert!(accepts(s.clone(), r#"{"city": "Paris", "days": 0}"#));
    assert!(!accepts(s.clone(), r#"{"city": "Paris", "days": 3, "x": 1}"#), "closed object");
    assert!(!accepts(s.clone(), r#"{"city": "Paris", "days": 3, "unit": "k"}"#), "enum");
    assert!(!accepts(s, r#"{"city": "Paris",, "days": 3}"#));
}

#[test]
fn any_of_lists_and_nested_values() {
    let s = json!({"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "n": {"type": ["number", "null"]},
        "meta": {}}});
    assert!(accepts(s.clone(), r#"{"tags": ["a", "b"], "n": null, "meta": {"x": [1, true, {"y": 2.5e3}]}}"#));
    assert!(accepts(s.clone(), r#"{"n": 0.25}"#));
    assert!(!accepts(s.clone(), r#"{"tags": []}"#), "minItems");
    assert!(accepts(
        json!({"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}}},
        "$ref": "#/$defs/t"}),
        r#"{"k": {"k": {}}}"#
    ));
}

/// Greedy decoding over a toy vocabulary whose preferred tokens are all invalid
/// still yields schema-valid JSON, closed within the token budget.
#[test]
fn masking_forces_valid_json_within_budget() {
    let tokens = [
        "hello", " world", "{", "}", "\"", ":", "city", "\":", " \"", "Par", "is", "\",", "days", "1", "2", ",", " ",
        "\n\n\n",
    ];
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"]});
    // The smallest valid document is 23 bytes; any budget from there works.
    for budget in [24, 26, 40] {
        let mut g = guide(schema.clone(), &tokens);
        let mut out = Vec::new();
        let n = g.vocab.bytes.len();
        for step in 0..budget {
            // Prefers "hello", then the string pieces, so strings would never end.
            let mut logits: Vec<f32> = (0..n)
                .map(|i| match tokens.get(i) {
                    Some(&"hello") => 10.0,
                    Some(&"Par") | Some(&"is") => 5.0,
                    Some(&"\n\n\n") => 4.0,
                    _ => (i % 5) as f32,
                })
                .collect();
            logits[n - 1] = 20.0; // EOS is never allowed mid-value
            g.mask(&mut logits, budget - step);
            let id = super::guide_tests_argmax(&logits);
            out.extend_from_slice(&g.vocab.bytes[id as usize]);
            if !g.accept(id) {
                break;
            }
        }
        let text = String::from_utf8(out).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("budget {budget}: {text:?}: {e}"));
        assert!(v["city"].is_string() && v["days"].is_i64(), "{text}");
    }
}

/// Random logits over JSON-ish tokens, many schemas and budgets: the output
/// always parses, and the guide stops it as soon as it is complete.
#[test]
fn random_logits_always_give_json() {
    let tokens = [
        "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "b", "key", "\"a\"", "\"k\": ", "1", "0", "-", ".", "e",
        "true", "false", "null", "\\", "u", "00", "\": \"", "\"}", "]}", "x\"", "{\"", "é", "k",
    ];
    let schemas = [
        json!({"type": "object"}),
        json!({}),
        json!({"type": "array", "items": {"type": "number"}, "minItems": 2}),
        json!({"type": "object", "properties": {"a": {"type": "string"}, "k": {"type": "boolean"}}, "required": ["k"]}),
        json!({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"b": {"type": "null"}}}]}),
    ];
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for schema in schemas {
        for budget in [3, 6, 10, 30, 80] {
            let mut g = guide(schema.clone(), &tokens);
            let n = g.vocab.bytes.len();
            let mut out = Vec::new();
            for step in 0..budget {
                let mut logits: Vec<f32> = (0..n)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng % 1000) as f32 / 100.0
                    })
                    .collect();
                g.mask(&mut logits, budget - step);
                let id = super::guide_tests_argmax(&logits);
                out.extend_from_slice(&g.vocab.bytes[id as usize]);
                if !g.accept(id) {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&out).into_owned();
            if budget >= 30 {
                assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{schema} budget {budget}: {text:?}");
                assert!(g.is_complete());
            }
        }
    }
}

/// `maxLength` holds whatever the tokens: escapes count and are refused at the
/// limit, and only well-formed UTF-8 is accepted, so a byte-fallback token that
/// is a lone continuation byte (which a client would decode as U+FFFD, one
/// more character) never gets in.
#[test]
fn max_length_counts_escapes_and_whole_utf8_characters() {
    let s = json!({"type": "string", "maxLength": 3});
    assert!(accepts(s.clone(), r#""abc""#));
    assert!(accepts(s.clone(), "\"é€😀\""), "three multibyte characters");
    assert!(!accepts(s.clone(), "\"é€😀a\""));
    assert!(!accepts(s.clone(), r#""ab\nc""#), "an escape is a character");
    assert!(!accepts(s.clone(), r#""abc\u00e9""#));
    for bad in
        [&[b'"', 0x80, b'"'][..], &[b'"', 0xC3, b'"'], &[b'"', 0xE0, 0x80, 0x80, b'"'], &[b'"', 0xC0, 0xAF, b'"']]
    {
        let g = guide(s.clone(), &[]);
        let st = g.feed(&g.stacks, bad);
        assert!(!st.iter().any(|s| g.stack_complete(s)), "{bad:?} must be refused");
    }
    // Sampling among byte tokens under a tight budget still closes valid UTF-8
    // within maxLength.
    let tokens = ["\"", "a", "\\", "n", "\u{e9}", "\u{20ac}"];
    let mut byte_tokens: Vec<Vec<u8>> = tokens.iter().map(|t| t.as_bytes().to_vec()).collect();
    byte_tokens.extend([vec![0xE2], vec![0x82], vec![0xAC], vec![0xC3], vec![0xA9], vec![0x80]]);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for budget in [12, 20, 40] {
        let schema = Arc::new(Schema::compile(&s).unwrap());
        let special = vec![false; byte_tokens.len()];
        let mut g = JsonGuide::new(schema, Arc::new(Vocab { bytes: byte_tokens.clone(), special }));
        let mut out = Vec::new();
        for step in 0..budget {
            let mut logits: Vec<f32> = (0..byte_tokens.len())
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % 1000) as f32
                })
                .collect();
            g.mask(&mut logits, budget - step);
            let id = super::guide_tests_argmax(&logits);
            out.extend_from_slice(&byte_tokens[id as usize]);
            if !g.accept(id) {
                break;
            }
        }
        let text = String::from_utf8(out.clone()).unwrap_or_else(|_| panic!("budget {budget}: not UTF-8: {out:?}"));
        let v: String = serde_json::from_str(&text).unwrap_or_else(|e| panic!("budget {budget}: {text:?}: {e}"));
        assert!(v.chars().count() <= 3, "budget {budget}: {v:?}");
    }
}

/// A schema whose shortest valid text no output could hold is refused when it
/// compiles (found by hand beside the json_schema fuzz target: building that
/// text for `minLength: 1e11` tried to allocate 100 GB). Every node counts,
/// an `anyOf` branch too; and the lengths agree with `min_text` below the bound.
#[test]
fn schemas_with_huge_minimal_texts_are_refused() {
    for s in [
        json!({"type": "string", "minLength": 100_000_000_000u64}),
        json!({"type": "array", "minItems": 4_000_000_000u64, "items": {"type": "string", "minLength": 30}}),
        json!({"type": "array", "minItems": 2000, "items": {"type": "array", "minItems": 2000, "items": {"type": "number"}}}),
        json!({"anyOf": [{"type": "number"}, {"type": "string", "minLength": 5_000_000}]}),
        json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 5_000_000}}}),
    ] {
        let e = Schema::compile(&s).unwrap_err().to_string();
        assert!(e.contains("shortest valid JSON"), "{s}: {e}");
    }
    let ok = json!({"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "array", "minItems": 3, "items": {"type": "string", "minLength": 4}},
        "b": {"anyOf": [{"type": "number"}, {"type": "string"}]}}});
    let s = Schema::compile(&ok).unwrap();
    let mut len = vec![4usize; s.nodes.len()];
    for _ in 0..13 {
        len = (0..s.nodes.len()).map(|n| s.min_len_over(n, &len)).collect();
    }
    for (n, &l) in len.iter().enumerate() {
        assert_eq!(l, s.min_text(n, 0).len(), "node {n}");
    }
}

#[test]
fn strings_never_hold_a_stop() {
    let schema = Schema::compile(&json!({"type": "object", "properties": {"s": {"type": "string"}}})).unwrap();
    let g = JsonGuide::new(
        Arc::new(schema.with_stops(&["<|call|>", "aab"])),
        Arc::new(Vocab { bytes: vec![], special: vec![] }),
    );
    let ok = |t: &str| g.feed(&g.stacks, t.as_bytes()).iter().any(|s| g.stack_complete(s));
    assert!(!ok(r#"{"s": "x<|call|>"}"#));
    assert!(!ok(r#"{"<|call|>": "x"}"#), "keys are strings too");
    // Overlapping starts: "aaab" ends with "aab" though "aaa" broke the first match.
    assert!(!ok(r#"{"s": "aaab"}"#));
    assert!(ok(r#"{"s": "aaa<|call|"}"#));
    assert!(ok(r#"{"s": "<|cal|>aba"}"#));
    // The marker can still be said, escaped.
    assert!(ok(r#"{"s": "\u003c|call|>"}"#));
    // Without stops the same texts are fine.
    assert!(accepts(json!({"type": "object"}), r#"{"s": "x<|call|>aab"}"#));
}
