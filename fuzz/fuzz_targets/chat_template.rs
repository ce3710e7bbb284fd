//! Any text as a chat template, rendered over a conversation with a tool call:
//! the render succeeds or fails with a message, within minijinja's fuel.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(t) = engine::ChatTemplate::new(src, Some("<s>"), Some("</s>")) else { return };
    let messages = serde_json::json!([
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    ]);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let _ = t.render(&messages, Some(&tools), true, None);
});
