//! Tool calls in model output: the families' formats, chosen from the chat
//! template, parsed from complete text; `ToolSplitter` does the same on a stream,
//! holding back anything that may be call markup so that clients never see it.
//!
//! - Hermes/Qwen (and the injected prompt for templates without tools):
//!   `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, repeatable.
//! - Llama 3: optional `<|python_tag|>`, then `{"name": …, "parameters": {…}}`,
//!   several separated by `;`, as the whole output.
//! - Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or the v11
//!   form `[TOOL_CALLS]name[ARGS]{…}`.
//!
//! A call that does not parse is given back as plain text, never an error.

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    /// The template ignores `tools`: they are described in the system prompt and
    /// the model answers in the Hermes format.
    Injected,
}

impl ToolFormat {
    /// Picks the format from the chat template's source.
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(src) = template else { return ToolFormat::Injected };
        if src.contains("<tool_call>") {
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

    /// Text that opens a call (the first is what forced calls start with).
    fn starts(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes | ToolFormat::Injected => &["<tool_call>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
        }
    }

    /// Appended after the generation prompt when a call is forced.
    pub fn forced_prefix(self) -> &'static str {
        match self {
            ToolFormat::Hermes | ToolFormat::Injected => "<tool_call>\n",
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "",
        }
    }

    pub fn native(self) -> bool {
        self != ToolFormat::Injected
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments as a JSON object text.
    pub arguments: String,
}

/// `{"name": …, "arguments"|"parameters": {…}}` → a call.
pub fn call_from_json(v: &Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(Value::Object(Default::default()));
    let args = match args {
        // Some models write the arguments as a JSON string.
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
        v @ Value::Object(_) => v,
        _ => return None,
    };
    Some(ParsedCall { name, arguments: args.to_string() })
}

/// Every JSON value in `text`, separated by whitespace, `;` or `,`.
fn json_values(text: &str) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = it.next()?.ok()?;
        out.push(v);
        rest = rest[it.byte_offset()..].trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
    }
    Some(out)
}

/// The calls in a call body (the text after the start marker, end marker removed).
pub fn parse_body(format: ToolFormat, body: &str) -> Option<Vec<ParsedCall>> {
    let body = body.trim();
    if format == ToolFormat::Mistral && !body.starts_with('[') && !body.starts_with('{') {
        // v11: name[ARGS]{json}, possibly with [CALL_ID]id before [ARGS].
        let (name, args) = body.split_once("[ARGS]")?;
        let name = name.split("[CALL_ID]").next()?.trim();
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        return call_from_json(&serde_json::json!({"name": name, "arguments": args})).map(|c| vec![c]);
    }
    let mut calls = Vec::new();
    for v in json_values(body)? {
        match v {
            Value::Array(items) => {
                for item in items {
                    calls.push(call_from_json(&item)?);
                }
            }
            v => calls.push(call_from_json(&v)?),
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// Splits streamed output into text and calls.
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

pub struct ToolSplitter {
    format: ToolFormat,
    /// Text not yet given out (may hold the start of a marker).
    pending: String,
    /// Inside a call since this marker; `pending` holds its body.
    in_call: Option<&'static str>,
    /// Nothing but whitespace has been output (Llama 3 calls are the whole output).
    at_start: bool,
    /// The whole output is one guided call object (forced tool choice).
    forced: bool,
    /// No tools in the request: everything is text.
    plain: bool,
}

impl ToolSplitter {
    pub fn new(format: ToolFormat, forced: bool) -> ToolSplitter {
        ToolSplitter { format, pending: String::new(), in_call: None, at_start: true, forced, plain: false }
    }

    /// Passes all text through (requests without tools).
    pub fn new_plain() -> ToolSplitter {
        ToolSplitter { plain: true, ..ToolSplitter::new(ToolFormat::Hermes, false) }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        if self.plain {
            if !text.is_empty() {
                out.push(Piece::Text(text.to_string()));
            }
            return;
        }
        self.pending.push_str(text);
        if self.forced {
            return;
        }
        loop {
            if let Some(marker) = self.in_call {
                // Only Hermes calls close; the others run to the end of the output.
                let end = "</tool_call>";
                if !matches!(self.format, ToolFormat::Hermes | ToolFormat::Injected) {
                    return;
                }
                let Some(pos) = self.pending.find(end) else { return };
                let body: String = self.pending.drain(..pos + end.len()).collect();
                let inner = &body[..pos];
                match parse_body(self.format, inner) {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                    None => out.push(Piece::Text(format!("{marker}{body}"))),
                }
                self.in_call = None;
                continue;
            }
            if self.at_start && self.format == ToolFormat::Llama3 {
                let trimmed = self.pending.trim_start();
                if trimmed.is_empty() {
                    return;
                }
                if trimmed.starts_with('{') {
                    self.pending = trimmed.to_string();
                    self.in_call = Some("");
                    self.at_start = false;
                    return;
                }
            }
            let found = self.format.starts().iter().filter_map(|m| self.pending.find(m).map(|p| (p, *m))).min();
            if let Some((pos, marker)) = found {
                let before: String = self.pending.drain(..pos + marker.len()).take(pos).collect();
                self.emit_text(before, out);
                self.in_call = Some(marker);
                continue;
            }
            // Hold back a suffix that may be the start of a marker.
            let keep = self
                .format
                .starts()
                .iter()
                .flat_map(|m| (1..m.len()).filter(|&k| self.pending.ends_with(&m[..k])))
                .max()
                .unwrap_or(0);
            let cut = self.pending.len() - keep;
            let text: String = self.pending.drain(..cut).collect();
            self.emit_text(text, out);
            return;
        }
    }

    fn emit_text(&mut self, text: String, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        out.push(Piece::Text(text));
    }

    /// Flushes at the end of generation: an unclosed call is parsed if it can
    /// be, else given back as text.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let rest = std::mem::take(&mut self.pending);
        if self.forced {
            match parse_body(self.format, &rest) {
                Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                None => self.emit_text(rest, out),
            }
            return;
        }
        match self.in_call.take() {
            Some(marker) => match parse_body(self.format, &rest) {
                Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                None => self.emit_text(format!("{marker}{rest}"), out),
            },
            None => self.emit_text(rest, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(format: ToolFormat, chunks: &[&str]) -> (String, Vec<ParsedCall>) {
        let mut s = ToolSplitter::new(format, false);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        let mut text = String::new();
        let mut calls = Vec::new();
        for p in out {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (text, calls)
    }

    #[test]
    fn hermes_calls_split_across_chunks_never_leak_markup() {
        let (text, calls) = split(
            ToolFormat::Hermes,
            &[
                "Sure.\n<tool",
                "_call>\n{\"name\": \"get_weather\", \"argu",
                "ments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ],
        );
        assert_eq!(text, "Sure.\n");
        assert_eq!(calls, vec![ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
    }

    #[test]
    fn malformed_call_is_plain_text() {
        let (text, calls) = split(ToolFormat::Injected, &["<tool_call>{\"name\": oops}</tool_call> done"]);
        assert!(calls.is_empty());
        assert_eq!(text, "<tool_call>{\"name\": oops}</tool_call> done");
    }

    #[test]
    fn llama3_and_mistral_forms() {
        let (text, calls) = split(
            ToolFormat::Llama3,
            &["  {\"name\": \"a\", \"parameters\": {\"x\": 1}}; ", "{\"name\": \"b\", \"parameters\": {}}"],
        );
        assert_eq!(text, "");
        assert_eq!(calls.len(), 2);
        let (_, calls) =
            split(ToolFormat::Mistral, &["[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": \"y\"}}]"]);
        assert_eq!(calls[0].arguments, r#"{"x":"y"}"#);
        let (_, calls) = split(ToolFormat::Mistral, &["[TOOL_CALLS]get[ARGS]{\"q\": 2}"]);
        assert_eq!(calls[0].name, "get");
        let (text, calls) = split(ToolFormat::Llama3, &["Hello {not json"]);
        assert!(calls.is_empty());
        assert_eq!(text, "Hello {not json");
    }

    #[test]
    fn format_follows_the_template() {
        assert_eq!(ToolFormat::detect(Some("{{ '<tool_call>' }}")), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect(Some("<|im_start|>{{ m.content }}")), ToolFormat::Injected);
        assert_eq!(ToolFormat::detect(None), ToolFormat::Injected);
    }
}
