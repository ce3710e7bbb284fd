//! HF chat templates rendered with minijinja, configured to behave like
//! transformers: trim_blocks + lstrip_blocks, loop controls, `raise_exception`,
//! `strftime_now`, a non-escaping `tojson`, python-style string/dict methods.

use crate::EngineError;
use serde_json::Value;

pub struct ChatTemplate {
    _private: (),
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are exposed to the template.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, EngineError> {
        let _ = (source, bos_token, eos_token);
        todo!("template helper")
    }

    /// Renders `messages` (OpenAI-style `[{"role", "content", ...}]`). `tools` is the
    /// OpenAI tools array if any; `extra` (an object) adds template variables such
    /// as `enable_thinking`.
    pub fn render(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
        extra: Option<&Value>,
    ) -> Result<String, EngineError> {
        let _ = (messages, tools, add_generation_prompt, extra);
        todo!("template helper")
    }
}
