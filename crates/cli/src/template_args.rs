//! `--chat-template FILE` and `--tool-format NAME`, shared by `run` and `serve`:
//! they fix a model whose shipped template is wrong or lacks tools.

use anyhow::{Context, Result};
use clap::Args;
use server::tools::ToolFormat;
use std::path::PathBuf;

#[derive(Args, Debug, Clone, Default)]
pub struct TemplateArgs {
    /// Jinja chat template to use instead of the model's (rendered with the same
    /// transformers semantics).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Tool-call format of the model's output (default: detected from the chat
    /// template): hermes|llama3|mistral|harmony|qwen3_coder|glm|minimax|deepseek|deepseek_v3|kimi.
    #[arg(long, value_parser = parse_tool_format)]
    pub tool_format: Option<ToolFormat>,
}

fn parse_tool_format(s: &str) -> Result<ToolFormat, String> {
    ToolFormat::from_name(s).ok_or_else(|| format!("unknown tool format '{s}' (use {})", ToolFormat::NAMES))
}

impl TemplateArgs {
    /// Reads and compiles `--chat-template` (before the model loads, so a bad
    /// file fails fast); `None` without the flag.
    pub fn read(&self) -> Result<Option<String>> {
        let Some(path) = &self.chat_template else { return Ok(None) };
        let src =
            std::fs::read_to_string(path).with_context(|| format!("cannot read --chat-template {}", path.display()))?;
        engine::ChatTemplate::new(&src, None, None)
            .with_context(|| format!("--chat-template {} does not compile", path.display()))?;
        Ok(Some(src))
    }
}
