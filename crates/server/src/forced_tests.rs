//! Forced calls in every family: random logits through the guide's call
//! grammar always give markup that the family's parser reads back as one call
//! with schema-typed arguments.

use super::*;
use crate::guide::Vocab;
use crate::toolfmt::testing::collect;

fn tools() -> Vec<ToolDef> {
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"}},
        "required": ["city", "unit"]});
    let search = json!({"type": "object", "properties": {"q": {"type": "string", "minLength": 1, "maxLength": 8}},
        "required": ["q"]});
    vec![
        ToolDef { name: "get_weather".into(), description: None, parameters: weather },
        ToolDef { name: "search".into(), description: None, parameters: search },
    ]
}

/// Every byte as a token, plus some longer ones (markup pieces among them).
fn vocab() -> Arc<Vocab> {
    let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
    for t in ["<tool_call>", "</", "parameter", "\n", "{\"", "\": ", "Paris", "celsius", "true", "<|", "|>", "▁"] {
        bytes.push(t.as_bytes().to_vec());
    }
    let special = vec![false; bytes.len()];
    Arc::new(Vocab { bytes, special })
}

#[test]
fn forced_calls_parse_back_in_every_family() {
    let vocab = vocab();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for name in ToolFormat::NAMES.split('|') {
        let format = ToolFormat::from_name(name).expect("known");
        for n_tools in [1, 2] {
            let tools = &tools()[..n_tools];
            let grammar = forced_call_grammar(format, tools).expect("grammar");
            for budget in [120, 400] {
                let mut g = JsonGuide::new(Arc::new(grammar_clone(&grammar)), vocab.clone());
                let mut out = Vec::new();
                for step in 0..budget {
                    let mut logits: Vec<f32> = (0..vocab.bytes.len())
                        .map(|_| {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            (rng % 1000) as f32 / 100.0
                        })
                        .collect();
                    g.mask(&mut logits, budget - step);
                    let id = crate::guide::guide_tests_argmax(&logits);
                    out.extend_from_slice(&vocab.bytes[id as usize]);
                    if !g.accept(id) {
                        break;
                    }
                }
                assert!(
                    g.is_complete(),
                    "{name} ({n_tools} tools, budget {budget}): {:?}",
                    String::from_utf8_lossy(&out)
                );
                let text = String::from_utf8_lossy(&out).into_owned();
                let form = format.forced(&tools[0].name);
                let mut prime = form.prefix.to_string();
                if n_tools == 1 {
                    prime.push_str(&form.head);
                }
                let parse_tools = Tools::new(tools.iter().map(|t| (t.name.as_str(), &t.parameters)));
                let mut s = ToolSplitter::new(format, parse_tools, &prime);
                let mut pieces = Vec::new();
                s.push(&text, &mut pieces);
                s.finish(&mut pieces);
                let ctx = format!("{name} ({n_tools} tools, budget {budget}): {prime}{text}");
                let o = collect(pieces);
                assert_eq!(o.calls.len(), 1, "{ctx}");
                assert!(o.calls[0].2, "{ctx}");
                assert!(o.text.trim().is_empty(), "{ctx}: text {:?}", o.text);
                let args: Value = serde_json::from_str(&o.calls[0].1).expect("json");
                if o.calls[0].0 == "get_weather" {
                    assert!(args["city"].is_string(), "{ctx}");
                    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")), "{ctx}");
                    assert!(args.get("days").is_none_or(Value::is_i64), "{ctx}");
                    assert!(args.get("hourly").is_none_or(Value::is_boolean), "{ctx}");
                } else {
                    assert!(args["q"].as_str().is_some_and(|q| !q.is_empty()), "{ctx}");
                }
            }
        }
    }
}

fn grammar_clone(s: &Schema) -> Schema {
    Schema { nodes: s.nodes.clone(), root: s.root }
}
