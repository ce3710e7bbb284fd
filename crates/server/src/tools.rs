//! Tool-call formats: which family a chat template speaks (or `--tool-format`
//! names), its streaming parser (`toolfmt`), and how a forced call is written
//! (the prompt suffix and the markup the guide emits around the arguments).
//!
//! A call that does not parse is given back as plain text, never an error.

use crate::toolfmt::{self, CallParser, Piece, Tools};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes/Qwen2.5/Qwen3: `<tool_call>{"name", "arguments"}</tool_call>`.
    Hermes,
    Llama3,
    Mistral,
    /// gpt-oss: channels, `to=functions.NAME`.
    Harmony,
    /// Qwen3-Coder, Qwen3.5/3.6: `<function=NAME><parameter=K>…`.
    Qwen3Coder,
    /// GLM-4.5/4.6/4.7: `<tool_call>NAME<arg_key>…`.
    Glm,
    MiniMax,
    /// DeepSeek V3.1+ (`NAME<｜tool▁sep｜>{json}`); V3/R1 below.
    DeepSeek,
    /// DeepSeek V3/R1: `function<｜tool▁sep｜>NAME` and a fenced json block.
    DeepSeekV3,
    Kimi,
    /// The template ignores `tools`: they are described in the system prompt and
    /// the model answers in the Hermes format.
    Injected,
}

/// How one forced call is written: `prefix` ends the prompt, then for the
/// chosen tool `head`, the arguments, `tail`.
pub struct ForcedForm {
    pub prefix: &'static str,
    pub head: String,
    pub args: ForcedArgs,
    pub tail: &'static str,
}

pub enum ForcedArgs {
    Json,
    /// One element per parameter: `open(key)`, the value (raw text for strings,
    /// JSON otherwise), `close`, then `after`.
    Xml {
        open: fn(&str) -> String,
        close: &'static str,
        after: &'static str,
    },
}

impl ToolFormat {
    /// Picks the format from the chat template's source.
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(src) = template else { return ToolFormat::Injected };
        if src.contains("<|channel|>") {
            ToolFormat::Harmony
        } else if src.contains("<minimax:tool_call>") {
            ToolFormat::MiniMax
        } else if src.contains("tool▁calls▁begin") || src.contains("tool▁call▁begin") {
            if src.contains("```json") {
                ToolFormat::DeepSeekV3
            } else {
                ToolFormat::DeepSeek
            }
        } else if src.contains("<|tool_calls_section_begin|>") || src.contains("<|tool_call_begin|>") {
            ToolFormat::Kimi
        } else if src.contains("<arg_key>") {
            ToolFormat::Glm
        } else if src.contains("<function=") || src.contains("<parameter=") {
            ToolFormat::Qwen3Coder
        } else if src.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if src.contains("<|python_tag|>") || src.contains("ipython") {
            ToolFormat::Llama3
        } else if src.contains("tools") {
            // A template that renders tools without a known call syntax: Hermes is
            // the most common answer format.
            ToolFormat::Hermes
        } else {
            ToolFormat::Injected
        }
    }

    /// `--tool-format` names.
    pub fn from_name(name: &str) -> Option<ToolFormat> {
        Some(match name {
            "hermes" => ToolFormat::Hermes,
            "llama3" => ToolFormat::Llama3,
            "mistral" => ToolFormat::Mistral,
            "harmony" => ToolFormat::Harmony,
            "qwen3_coder" => ToolFormat::Qwen3Coder,
            "glm" => ToolFormat::Glm,
            "minimax" => ToolFormat::MiniMax,
            "deepseek" => ToolFormat::DeepSeek,
            "deepseek_v3" => ToolFormat::DeepSeekV3,
            "kimi" => ToolFormat::Kimi,
            _ => return None,
        })
    }

    pub const NAMES: &'static str = "hermes|llama3|mistral|harmony|qwen3_coder|glm|minimax|deepseek|deepseek_v3|kimi";

    pub fn native(self) -> bool {
        self != ToolFormat::Injected
    }

    /// Whether the output needs the parser even without tools (Harmony's channels).
    pub fn structured_output(self) -> bool {
        self == ToolFormat::Harmony
    }

    /// Texts the family's parser reads as the end of a call (or of a Harmony
    /// message), so that a JSON string the guide writes must not contain them:
    /// a sampled argument holding `<|call|>` would otherwise cut the call short
    /// and turn it into text. Llama 3 and Mistral calls end by their braces.
    pub fn string_stops(self) -> &'static [&'static str] {
        use toolfmt::deepseek::{CALLS_END, CALL_END};
        match self {
            ToolFormat::Hermes | ToolFormat::Injected => &["</tool_call>"],
            ToolFormat::Llama3 | ToolFormat::Mistral => &[],
            ToolFormat::Harmony => &["<|end|>", "<|call|>", "<|return|>", "<|start|>"],
            ToolFormat::Kimi => &["<|tool_call_end|>", "<|tool_calls_section_end|>"],
            ToolFormat::DeepSeek => &[CALL_END, CALLS_END],
            ToolFormat::DeepSeekV3 => &[CALL_END, CALLS_END, "```"],
            ToolFormat::Qwen3Coder => &["</parameter>", "</function>", "</tool_call>"],
            ToolFormat::Glm => &["</arg_value>", "</tool_call>"],
            ToolFormat::MiniMax => &["</parameter>", "</invoke>"],
        }
    }

    /// Markup that may be control tokens in the family's vocabulary, and must
    /// reach the parser as text (end-of-turn tokens that stop generation excluded).
    pub fn printed_markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Harmony => &["<|channel|>", "<|message|>", "<|constrain|>", "<|start|>", "<|end|>"],
            ToolFormat::Kimi => &[
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
            ],
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => &[
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁call▁end｜>",
                "<｜tool▁sep｜>",
            ],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            _ => &["<tool_call>", "</tool_call>", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"],
        }
    }

    /// A fresh streaming parser for one response.
    pub fn parser(self, tools: Tools) -> Box<dyn CallParser> {
        match self {
            ToolFormat::Hermes | ToolFormat::Injected => Box::new(toolfmt::hermes::Hermes::new(tools)),
            ToolFormat::Llama3 => Box::new(toolfmt::json_calls::JsonCalls::llama3(tools)),
            ToolFormat::Mistral => Box::new(toolfmt::json_calls::JsonCalls::mistral(tools)),
            ToolFormat::Harmony => Box::new(toolfmt::harmony::Harmony::new(tools)),
            ToolFormat::Qwen3Coder => Box::new(toolfmt::qwen3_coder::parser(tools)),
            ToolFormat::Glm => Box::new(toolfmt::glm::parser(tools)),
            ToolFormat::MiniMax => Box::new(toolfmt::minimax::parser(tools)),
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => Box::new(toolfmt::deepseek::parser(tools)),
            ToolFormat::Kimi => Box::new(toolfmt::kimi::parser(tools)),
        }
    }

    /// The markers that open a call the model writes on its own: from the
    /// first of them in the output, the lazy guide (`lazy_guide`) holds the
    /// call to [`ToolFormat::lazy_forms`]. Each is a prefix of those forms.
    pub fn lazy_triggers(self) -> &'static [&'static str] {
        use toolfmt::deepseek::CALLS_BEGIN;
        match self {
            ToolFormat::Hermes | ToolFormat::Injected | ToolFormat::Qwen3Coder | ToolFormat::Glm => &["<tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>", "{\"name\""],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::Harmony => &["<|channel|>commentary to=functions."],
            ToolFormat::MiniMax => &["<minimax:tool_call>"],
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => &[CALLS_BEGIN],
            ToolFormat::Kimi => &["<|tool_calls_section_begin|>"],
        }
    }

    /// The shapes an unforced call of `name` may take, whole (prefix and head
    /// included): the forced form, and the family's other spellings (Llama 3
    /// after `<|python_tag|>`, Mistral v11's `NAME[ARGS]{…}`).
    pub fn lazy_forms(self, name: &str) -> Vec<ForcedForm> {
        let forced = self.forced(name);
        let whole = |prefix: &str, f: &ForcedForm, tail: &'static str| ForcedForm {
            prefix: "",
            head: format!("{prefix}{}{}", f.prefix, f.head),
            args: match f.args {
                ForcedArgs::Json => ForcedArgs::Json,
                ForcedArgs::Xml { open, close, after } => ForcedArgs::Xml { open, close, after },
            },
            tail,
        };
        let mut forms = vec![whole("", &forced, forced.tail)];
        match self {
            ToolFormat::Llama3 => forms.push(whole("<|python_tag|>", &forced, forced.tail)),
            ToolFormat::Mistral => forms.push(ForcedForm {
                prefix: "",
                head: format!("[TOOL_CALLS]{name}[ARGS]"),
                args: ForcedArgs::Json,
                tail: "",
            }),
            _ => {}
        }
        forms
    }

    /// How a forced call of `name` is written.
    pub fn forced(self, name: &str) -> ForcedForm {
        use toolfmt::deepseek::SEP;
        let q = Value::String(name.to_string()).to_string();
        let json = |prefix, head: String, tail| ForcedForm { prefix, head, args: ForcedArgs::Json, tail };
        match self {
            ToolFormat::Hermes | ToolFormat::Injected => {
                json("<tool_call>\n", format!("{{\"name\": {q}, \"arguments\": "), "}\n</tool_call>")
            }
            ToolFormat::Llama3 => json("", format!("{{\"name\": {q}, \"parameters\": "), "}"),
            ToolFormat::Mistral => json("[TOOL_CALLS]", format!("[{{\"name\": {q}, \"arguments\": "), "}]"),
            ToolFormat::Harmony => {
                json("<|channel|>commentary to=functions.", format!("{name} <|constrain|>json<|message|>"), "")
            }
            ToolFormat::DeepSeek => json(DS_PREFIX, format!("{name}{SEP}"), DS_TAIL),
            ToolFormat::DeepSeekV3 => json(
                DS_PREFIX,
                format!("function{SEP}{name}\n```json\n"),
                "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ),
            ToolFormat::Kimi => json(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.",
                format!("{name}:0<|tool_call_argument_begin|>"),
                "<|tool_call_end|><|tool_calls_section_end|>",
            ),
            ToolFormat::Qwen3Coder => ForcedForm {
                prefix: "<tool_call>\n<function=",
                head: format!("{name}>\n"),
                args: ForcedArgs::Xml { open: |k| format!("<parameter={k}>\n"), close: "</parameter>", after: "\n" },
                tail: "</function>\n</tool_call>",
            },
            ToolFormat::Glm => ForcedForm {
                prefix: "<tool_call>",
                head: format!("{name}\n"),
                args: ForcedArgs::Xml {
                    open: |k| format!("<arg_key>{k}</arg_key>\n<arg_value>"),
                    close: "</arg_value>",
                    after: "\n",
                },
                tail: "</tool_call>",
            },
            ToolFormat::MiniMax => ForcedForm {
                prefix: "<minimax:tool_call>\n<invoke name=\"",
                head: format!("{name}\">\n"),
                args: ForcedArgs::Xml {
                    open: |k| format!("<parameter name=\"{k}\">"),
                    close: "</parameter>",
                    after: "\n",
                },
                tail: "</invoke>\n</minimax:tool_call>",
            },
        }
    }
}

const DS_PREFIX: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
const DS_TAIL: &str = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

/// Splits streamed output into text, reasoning and calls.
pub struct ToolSplitter {
    parser: Option<Box<dyn CallParser>>,
    /// What reading the prompt's forced prefix gave (a call's start), handed out first.
    primed: Vec<Piece>,
}

impl ToolSplitter {
    /// `prime`: markup that ends the prompt (a forced call's prefix), read by the
    /// parser as if the model had written it.
    pub fn new(format: ToolFormat, tools: Tools, prime: &str) -> ToolSplitter {
        let mut parser = format.parser(tools);
        let mut primed = Vec::new();
        parser.push(prime, &mut primed);
        primed.retain(|p| !matches!(p, Piece::Text(_)));
        ToolSplitter { parser: Some(parser), primed }
    }

    /// Passes all text through (requests without tools).
    pub fn new_plain() -> ToolSplitter {
        ToolSplitter { parser: None, primed: Vec::new() }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        out.append(&mut self.primed);
        match self.parser.as_mut() {
            Some(p) => p.push(text, out),
            None => toolfmt::push_text(out, text),
        }
    }

    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        out.append(&mut self.primed);
        if let Some(p) = self.parser.as_mut() {
            p.finish(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toolfmt::testing::{collect, weather_tools};

    #[test]
    fn format_follows_the_template() {
        let cases = [
            ("{{ '<tool_call>' }}", ToolFormat::Hermes),
            ("<tool_call>\n<function={{ name }}>", ToolFormat::Qwen3Coder),
            ("<tool_call>{{ name }}<arg_key>", ToolFormat::Glm),
            ("<minimax:tool_call>", ToolFormat::MiniMax),
            ("<|start|>assistant<|channel|>final", ToolFormat::Harmony),
            ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ n }}<｜tool▁sep｜>", ToolFormat::DeepSeek),
            ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ n }}\n```json\n", ToolFormat::DeepSeekV3),
            ("<|tool_calls_section_begin|>", ToolFormat::Kimi),
            ("[TOOL_CALLS]", ToolFormat::Mistral),
            ("<|python_tag|>", ToolFormat::Llama3),
            ("<|im_start|>{{ m.content }}", ToolFormat::Injected),
        ];
        for (src, want) in cases {
            assert_eq!(ToolFormat::detect(Some(src)), want, "{src}");
        }
        assert_eq!(ToolFormat::detect(None), ToolFormat::Injected);
        for name in ToolFormat::NAMES.split('|') {
            assert!(ToolFormat::from_name(name).is_some(), "{name}");
        }
    }

    /// A forced call written the way the guide writes it parses back, in every family.
    #[test]
    fn forced_forms_parse_back() {
        let all = ToolFormat::NAMES.split('|').filter_map(ToolFormat::from_name);
        for f in all {
            let form = f.forced("get_weather");
            let args = match form.args {
                ForcedArgs::Json => r#"{"city": "Paris", "days": 2}"#.to_string(),
                ForcedArgs::Xml { open, close, after } => {
                    format!("{}Paris{close}{after}{}2{close}{after}", open("city"), open("days"))
                }
            };
            // The head is in the prompt (one tool) or written by the model (several).
            for head_in_prompt in [false, true] {
                let (prime, body) = if head_in_prompt {
                    (format!("{}{}", form.prefix, form.head), format!("{args}{}", form.tail))
                } else {
                    (form.prefix.to_string(), format!("{}{args}{}", form.head, form.tail))
                };
                let mut s = ToolSplitter::new(f, weather_tools(), &prime);
                let mut out = Vec::new();
                s.push(&body, &mut out);
                s.finish(&mut out);
                let o = collect(out);
                assert_eq!(o.text, "", "{f:?}");
                assert_eq!(o.calls.len(), 1, "{f:?}: {body}");
                let v: Value = serde_json::from_str(&o.calls[0].1).expect("json");
                assert_eq!(v, serde_json::json!({"city": "Paris", "days": 2}), "{f:?}");
            }
        }
        use toolfmt::deepseek::{CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END};
        assert_eq!(DS_PREFIX, format!("{CALLS_BEGIN}{CALL_BEGIN}"));
        assert_eq!(DS_TAIL, format!("{CALL_END}{CALLS_END}"));
    }
}
