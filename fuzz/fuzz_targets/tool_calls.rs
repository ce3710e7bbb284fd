//! Any model output through every family's streaming tool-call parser, cut
//! into chunks at the first byte's choice of positions: pieces or text, never
//! a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use server::toolfmt::Tools;
use server::tools::{ToolFormat, ToolSplitter};

const FORMATS: [&str; 9] = ["hermes", "llama3", "mistral", "harmony", "qwen3_coder", "glm", "minimax", "deepseek", "kimi"];

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let params = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}});
    for name in FORMATS {
        let Some(format) = ToolFormat::from_name(name) else { continue };
        let tools = Tools::new([("get_weather", &params)]);
        let mut split = ToolSplitter::new(format, tools, "");
        let mut out = Vec::new();
        let step = usize::from(cut % 7) + 1;
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            split.push(&chunk.iter().collect::<String>(), &mut out);
        }
        split.finish(&mut out);
    }
});
