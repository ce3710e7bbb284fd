//! Chat templates rendered by minijinja against Python jinja2 set up like
//! transformers (`tests/data/tokenizer/chat_template_refs.json`, written by
//! `scripts/make_tokenizer_refs.py --only templates`).

use serde_json::{json, Value};
use shardlm_engine::{ChatTemplate, EngineError};
use std::path::{Path, PathBuf};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tokenizer")
}

fn refs() -> Value {
    let path = data_dir().join("chat_template_refs.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn source(r: &Value, name: &str) -> String {
    if name == "smollm2" {
        return r["smollm2_template"].as_str().unwrap().to_string();
    }
    let path = data_dir().join("templates").join(format!("{name}.jinja"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn opt(v: &Value) -> Option<&Value> {
    if v.is_null() {
        None
    } else {
        Some(v)
    }
}

#[test]
fn templates_match_jinja2() {
    let r = refs();
    let (bos, eos) = (r["bos_token"].as_str(), r["eos_token"].as_str());
    let cases = r["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let label = format!("{name}/{} (gen prompt {})", case["conversation"], case["add_generation_prompt"]);
        let tmpl = ChatTemplate::new(&source(&r, name), bos, eos).unwrap_or_else(|e| panic!("{label}: {e}"));
        // Only typed_content.jinja reads list-form content itself.
        assert_eq!(tmpl.handles_content_parts(), name == "typed_content", "{label}");
        let got = tmpl.render(
            &case["messages"],
            opt(&case["tools"]),
            case["add_generation_prompt"].as_bool().unwrap(),
            opt(&case["extra"]),
        );
        match (got, case.get("expected"), case.get("error")) {
            (Ok(got), Some(want), _) => {
                // The reference ran at a fixed time; put today's date in its place.
                let mut want = want.as_str().unwrap().to_string();
                for call in case["strftime_calls"].as_array().unwrap() {
                    let now = chrono::Local::now().format(call[0].as_str().unwrap()).to_string();
                    want = want.replace(call[1].as_str().unwrap(), &now);
                }
                if got != want {
                    failures.push(format!("{label}:\n--- ours\n{got}\n--- jinja2\n{want}\n---"));
                }
            }
            (Err(EngineError::Template(msg)), None, Some(err)) => {
                let err = err.as_str().unwrap();
                if !msg.contains(err) {
                    failures.push(format!("{label}: error {msg:?} lacks {err:?}"));
                }
            }
            (got, want, err) => failures.push(format!("{label}: got {got:?}, want {want:?} / error {err:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    eprintln!("{} template cases match jinja2", cases.len());
}

#[test]
fn smollm2_template_is_the_one_in_the_gguf() {
    let cache = match std::env::var_os("SHARDLM_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/shardlm"),
    };
    let path = cache.join("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{} missing (CI=true)", path.display());
        eprintln!("skipping: {} not found", path.display());
        return;
    }
    let files = formats::open_model(&path).unwrap();
    assert_eq!(files.chat_template.as_deref(), refs()["smollm2_template"].as_str());
}

fn render(src: &str, messages: Value, extra: Option<Value>) -> Result<String, EngineError> {
    ChatTemplate::new(src, Some("<s>"), Some("</s>"))?.render(&messages, None, false, extra.as_ref())
}

#[test]
fn helpers_behave_like_transformers() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    // raise_exception surfaces its message.
    match render("{{ raise_exception('no ' + messages[0].role + ' allowed') }}", msgs.clone(), None) {
        Err(EngineError::Template(msg)) => assert!(msg.starts_with("no user allowed"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // strftime_now uses the local clock.
    let year = chrono::Local::now().format("%Y").to_string();
    assert_eq!(render("{{ strftime_now('%Y') }}", msgs.clone(), None).unwrap(), year);
    assert!(render("{{ strftime_now('%Q') }}", msgs.clone(), None).is_err());
    // tojson: no HTML escaping, Python separators, indent as int or string.
    let out = render(
        "{{ x | tojson }}|{{ x | tojson(indent='\t') }}",
        msgs.clone(),
        Some(json!({"x": {"a": "<&'>", "b": [1, 2.0]}})),
    );
    assert_eq!(
        out.unwrap(),
        "{\"a\": \"<&'>\", \"b\": [1, 2.0]}|{\n\t\"a\": \"<&'>\",\n\t\"b\": [\n\t\t1,\n\t\t2.0\n\t]\n}"
    );
    // Python string and dict methods, loop controls, slicing.
    let src = "{% for k, v in x.items() %}{% if k == 'c' %}{% break %}{% endif %}{{ k }}{{ v.strip() }},{% endfor %}{{ [1, 2, 3][::-1] }}";
    assert_eq!(
        render(src, msgs.clone(), Some(json!({"x": {"a": " 1 ", "b": "2\n", "c": "3"}}))).unwrap(),
        "a1,b2,[3, 2, 1]"
    );
    // Generation markers (transformers' AssistantTracker) are ignored.
    let src = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}";
    assert_eq!(render(src, msgs.clone(), None).unwrap(), "hi");
    // bos/eos and extra variables; `tools` only exists when given. Booleans print
    // the Python way.
    let src = "{{ bos_token }}{{ flag }}{{ tools is defined }}{{ eos_token }}";
    assert_eq!(render(src, msgs.clone(), Some(json!({"flag": 7}))).unwrap(), "<s>7False</s>");
    let tmpl = ChatTemplate::new(src, None, None).unwrap();
    assert_eq!(tmpl.render(&msgs, Some(&json!([])), true, None).unwrap(), "True");
    // Bad inputs are errors, not panics.
    assert!(render("{{ messages }}", json!({"role": "user"}), None).is_err());
    assert!(render("{{ messages }}", msgs.clone(), Some(json!([1]))).is_err());
    assert!(ChatTemplate::new("{% if %}", None, None).is_err());
}

#[test]
fn list_content_is_flattened_for_string_templates() {
    let smollm = refs()["smollm2_template"].as_str().unwrap().to_string();
    let tmpl = ChatTemplate::new(&smollm, None, None).unwrap();
    assert!(!tmpl.handles_content_parts());
    let msgs = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]}
    ]);
    let out = tmpl.render(&msgs, None, true, None).unwrap();
    assert_eq!(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
}
