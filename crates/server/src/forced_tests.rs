//! Forced calls in every family: random logits through the guide's call
//! grammar always give markup that the family's parser reads back as one call
//! with schema-typed arguments.

use super::*;
use crate::guide::Vocab;
use crate::lazy_guide::{Lazy, LazyCalls};
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
                    let mut logits = random_logits(&mut rng, vocab.bytes.len());
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

/// A model that keeps offering its family's end markers inside an argument
/// (a small model at temperature 1 copies the markup around it): the guide
/// keeps them out of every string, so the call still parses back whole.
#[test]
fn end_markers_never_cut_a_forced_call() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for name in ToolFormat::NAMES.split('|') {
        let format = ToolFormat::from_name(name).expect("known");
        let base = vocab();
        let mut bytes = base.bytes.clone();
        let markers = bytes.len();
        bytes.extend(format.string_stops().iter().map(|s| s.as_bytes().to_vec()));
        let vocab = Arc::new(Vocab { special: vec![false; bytes.len()], bytes });
        let tools = &tools()[..1];
        let mut g = JsonGuide::new(Arc::new(forced_call_grammar(format, tools).expect("grammar")), vocab.clone());
        let mut out = Vec::new();
        for step in 0..200 {
            let mut logits = random_logits(&mut rng, vocab.bytes.len());
            for l in &mut logits[markers..] {
                *l += 50.0;
            }
            g.mask(&mut logits, 200 - step);
            let id = crate::guide::guide_tests_argmax(&logits);
            out.extend_from_slice(&vocab.bytes[id as usize]);
            if !g.accept(id) {
                break;
            }
        }
        let text = String::from_utf8_lossy(&out).into_owned();
        let form = format.forced(&tools[0].name);
        let prime = format!("{}{}", form.prefix, form.head);
        let mut s =
            ToolSplitter::new(format, Tools::new(tools.iter().map(|t| (t.name.as_str(), &t.parameters))), &prime);
        let mut pieces = Vec::new();
        s.push(&text, &mut pieces);
        s.finish(&mut pieces);
        let o = collect(pieces);
        assert!(o.calls.len() == 1 && o.calls[0].2, "{name}: {prime}{text}");
    }
}

/// Calls the model opens on its own: once the output shows a trigger, the lazy
/// guide holds random logits to a call that the family's parser reads back as
/// one valid call, then lets go.
#[test]
fn lazy_guide_holds_unforced_calls_in_every_family() {
    let vocab = vocab();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for name in ToolFormat::NAMES.split('|') {
        let format = ToolFormat::from_name(name).expect("known");
        for n_tools in [1, 2] {
            let tools = &tools()[..n_tools];
            let grammar = Arc::new(lazy_call_grammar(format, tools).expect("grammar"));
            for trigger in format.lazy_triggers() {
                let mut lazy = LazyCalls::new(format.lazy_triggers(), grammar.clone(), vocab.clone());
                let mut out: Vec<u8> = Vec::new();
                // The trigger, a byte at a time: it attaches on its last byte.
                for (i, b) in trigger.bytes().enumerate() {
                    let got = lazy.accept(b as u32, 1000);
                    out.push(b);
                    let want = if i + 1 == trigger.len() { Lazy::Attached } else { Lazy::Free };
                    assert_eq!(got, want, "{name}: byte {i} of {trigger:?}");
                }
                let budget = 300;
                let mut released = false;
                for step in 0..budget {
                    assert!(lazy.active(), "{name}");
                    let mut logits = random_logits(&mut rng, vocab.bytes.len());
                    lazy.mask(&mut logits, budget - step);
                    let id = crate::guide::guide_tests_argmax(&logits);
                    out.extend_from_slice(&vocab.bytes[id as usize]);
                    if lazy.accept(id, budget - step - 1) == Lazy::Released {
                        released = true;
                        break;
                    }
                }
                let text = String::from_utf8_lossy(&out).into_owned();
                let ctx = format!("{name} ({n_tools} tools, trigger {trigger:?}): {text}");
                assert!(released && !lazy.active(), "{ctx}");
                let parse_tools = Tools::new(tools.iter().map(|t| (t.name.as_str(), &t.parameters)));
                let mut s = ToolSplitter::new(format, parse_tools, "");
                let mut pieces = Vec::new();
                s.push(&text, &mut pieces);
                s.finish(&mut pieces);
                let o = collect(pieces);
                assert_eq!(o.calls.len(), 1, "{ctx}");
                assert!(o.calls[0].2, "{ctx}");
                assert!(o.text.trim().is_empty(), "{ctx}: text {:?}", o.text);
                let args: Value = serde_json::from_str(&o.calls[0].1).expect("json");
                assert!(args.is_object(), "{ctx}");
                // Free again: text after the call is not constrained.
                assert_eq!(lazy.accept(b'x' as u32, 1000), Lazy::Free, "{ctx}");
            }
        }
    }
    // A marker followed, in the same token, by what no call shape allows: no hold.
    let format = ToolFormat::Hermes;
    let grammar = Arc::new(lazy_call_grammar(format, &tools()).expect("grammar"));
    let mut bytes = vocab.bytes.clone();
    bytes.push(b"<tool_call>oops".to_vec());
    let odd = Arc::new(Vocab { special: vec![false; bytes.len()], bytes });
    let mut lazy = LazyCalls::new(format.lazy_triggers(), grammar, odd.clone());
    assert_eq!(lazy.accept(odd.bytes.len() as u32 - 1, 1000), Lazy::Free);
    assert!(!lazy.active());
    // A call opened with too few tokens left to close it is not held.
    let mut lazy = LazyCalls::new(
        format.lazy_triggers(),
        Arc::new(lazy_call_grammar(format, &tools()).expect("grammar")),
        vocab.clone(),
    );
    let last = b'>' as u32;
    for b in "<tool_call".bytes() {
        assert_eq!(lazy.accept(b as u32, 5), Lazy::Free);
    }
    assert_eq!(lazy.accept(last, 5), Lazy::Free);
    assert!(!lazy.active());
}

/// `n` logits in `0..10` from a xorshift generator.
fn random_logits(rng: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % 1000) as f32 / 100.0
        })
        .collect()
}

fn grammar_clone(s: &Schema) -> Schema {
    Schema { nodes: s.nodes.clone(), root: s.root, stops: s.stops.clone() }
}

/// The test templates (tests/fixtures/templates): each is detected as its
/// family, and an earlier call and its result re-render in the family's own
/// markup, with earlier reasoning kept or dropped as the family expects.
#[test]
fn history_renders_in_each_familys_format() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/templates");
    // (file, format, call markup the history must hold, whether the reasoning is kept)
    let cases: [(&str, ToolFormat, &str, bool); 10] = [
        ("llama3", ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}<|eot_id|>", false),
        ("mistral", ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]</s>", false),
        ("hermes", ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>", false),
        ("qwen3_coder", ToolFormat::Qwen3Coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", true),
        ("glm", ToolFormat::Glm, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", true),
        ("minimax", ToolFormat::MiniMax, "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n</minimax:tool_call>", true),
        ("deepseek", ToolFormat::DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", false),
        ("deepseek_v3", ToolFormat::DeepSeekV3, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>", false),
        ("kimi", ToolFormat::Kimi, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 2}<|tool_call_end|><|tool_calls_section_end|>", false),
        ("harmony", ToolFormat::Harmony, "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>", true),
    ];
    for (file, format, markup, keeps_reasoning) in cases {
        let src = std::fs::read_to_string(format!("{dir}/{file}.jinja")).expect("template");
        assert_eq!(ToolFormat::detect(Some(&src)), format, "{file}");
        let tpl = engine::ChatTemplate::new(&src, Some("<s>"), Some("</s>")).expect("compiles");
        let req = ChatRequest {
            messages: vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather in Paris?"}),
                json!({"role": "assistant", "content": "", "reasoning_content": "THOUGHT-1",
                       "tool_calls": [{"id": "call_1", "type": "function",
                                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "RESULT-21C"}),
            ],
            tools: tools(),
            tool_choice: ToolChoice::Auto,
            response_format: ResponseFormat::Text,
            max_tokens: None,
            sampling: Default::default(),
            stop: Vec::new(),
            max_tokens_field: "max_tokens",
            thinking: None,
            ignore_eos: false,
            draft: Default::default(),
        };
        let messages = template_messages(&req, format, "");
        let text = tpl
            .render(&Value::Array(messages), Some(&tools_json(&req.tools)), true, None)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(markup), "{file}: no {markup:?} in\n{text}");
        assert!(text.contains("RESULT-21C") && text.contains("get_weather"), "{file}");
        assert_eq!(text.contains("THOUGHT-1"), keeps_reasoning, "{file}: reasoning\n{text}");
    }
}
