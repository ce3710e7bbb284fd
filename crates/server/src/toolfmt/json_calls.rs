//! Llama 3 and Mistral: calls written as JSON objects, arguments streamed.
//!
//! - Llama 3.1–3.3: the whole output is one call, or several joined by `;`,
//!   `{"name": "NAME", "parameters": {…}}`, optionally after `<|python_tag|>`.
//!   Output that does not open with either is plain text.
//! - Mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects
//!   (tokenizers up to v3), or `NAME[ARGS]{…}` with one `[TOOL_CALLS]` per call
//!   (v11 on; some write `[CALL_ID]ID` before `[ARGS]`). Text may come first.
//!
//! Arguments stream as soon as `{"name": "NAME", "arguments": ` has been read;
//! [`ValueEnd`] finds where the arguments object closes without parsing it. A
//! call whose keys come in another order is parsed whole at the end.

use super::hermes::{emit_whole, parse_json_calls, read_head, Head, ParsedCall};
use super::{held_back, is_json_object, push_args, push_text, CallParser, Piece, Tools};

const PYTHON_TAG: &str = "<|python_tag|>";
const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// Where a JSON object or list, fed in pieces from its opening bracket, closes:
/// bracket depth outside strings (escapes honoured). It does not validate; the
/// arguments are checked as a whole when the call ends.
#[derive(Debug, Default, Clone)]
pub struct ValueEnd {
    depth: u32,
    in_str: bool,
    esc: bool,
}

impl ValueEnd {
    /// Feeds the next bytes; `Some(n)`: the value closes after the first `n`.
    pub fn feed(&mut self, s: &str) -> Option<usize> {
        for (i, b) in s.bytes().enumerate() {
            if self.in_str {
                match (self.esc, b) {
                    (true, _) => self.esc = false,
                    (false, b'\\') => self.esc = true,
                    (false, b'"') => self.in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_str = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

#[derive(Debug)]
enum St {
    /// Llama 3, nothing decided: leading space, maybe `<|python_tag|>`.
    Start,
    Text,
    /// Mistral, after `[TOOL_CALLS]`: a list or a v11 name.
    AfterMarker,
    /// Mistral v11: the name up to `[ARGS]`.
    Name,
    /// `{"name": …, "arguments"|"parameters": `.
    Head,
    Args(ValueEnd),
    /// After the arguments: the call object's own `}` (not in v11).
    CallClose,
    /// Between calls: `;` (Llama 3), `,` or `]` (a Mistral list).
    Between,
    /// Keys in another order: everything to the end, parsed whole.
    Whole,
}

pub struct JsonCalls {
    mistral: bool,
    tools: Tools,
    st: St,
    buf: String,
    /// The markup of the open call (or of the calls so far, for `Whole`).
    raw: String,
    args: String,
    /// A call has started and not ended.
    open: bool,
    /// Mistral: inside a `[…]` list of call objects.
    list: bool,
}

impl JsonCalls {
    pub fn llama3(tools: Tools) -> JsonCalls {
        JsonCalls::new(false, tools)
    }

    pub fn mistral(tools: Tools) -> JsonCalls {
        JsonCalls::new(true, tools)
    }

    fn new(mistral: bool, tools: Tools) -> JsonCalls {
        let st = if mistral { St::Text } else { St::Start };
        JsonCalls {
            mistral,
            tools,
            st,
            buf: String::new(),
            raw: String::new(),
            args: String::new(),
            open: false,
            list: false,
        }
    }

    fn consume(&mut self, n: usize) -> String {
        let s: String = self.buf.drain(..n).collect();
        self.raw.push_str(&s);
        s
    }

    fn skip_ws(&mut self) {
        let ws = self.buf.len() - self.buf.trim_start().len();
        self.consume(ws);
    }

    fn start_call(&mut self, name: &str, out: &mut Vec<Piece>) -> bool {
        let name = name.trim();
        if !self.tools.knows(name) {
            self.fail(&format!("unknown function '{name}'"), out);
            return false;
        }
        self.args.clear();
        self.open = true;
        out.push(Piece::CallStart { name: name.to_string() });
        true
    }

    fn emit_args(&mut self, s: &str, out: &mut Vec<Piece>) {
        self.args.push_str(s);
        push_args(out, s);
    }

    fn end_call(&mut self, out: &mut Vec<Piece>) {
        let valid = is_json_object(&self.args);
        if !valid {
            tracing::warn!("tool call arguments are not a JSON object: {:?}", self.raw);
        }
        out.push(Piece::CallEnd { valid, raw: std::mem::take(&mut self.raw) });
        self.args.clear();
        self.open = false;
    }

    /// Malformed markup: an open call ends invalid (its markup goes back as
    /// text in non-streamed answers); otherwise the markup is text.
    fn fail(&mut self, why: &str, out: &mut Vec<Piece>) {
        tracing::warn!("tool call markup not understood ({why}); returned as text: {:?}", self.raw);
        let raw = std::mem::take(&mut self.raw);
        if self.open {
            out.push(Piece::CallEnd { valid: false, raw });
        } else {
            push_text(out, &raw);
        }
        self.args.clear();
        self.open = false;
        self.list = false;
        self.st = St::Text;
    }

    /// One step; false when more text is needed.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match std::mem::replace(&mut self.st, St::Text) {
            St::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                    self.st = St::Start;
                    return false;
                }
                self.raw.clear();
                if t.starts_with(PYTHON_TAG) {
                    self.skip_ws();
                    self.consume(PYTHON_TAG.len());
                    self.st = St::Head;
                } else if t.starts_with('{') {
                    self.st = St::Head;
                }
                true
            }
            St::Text => {
                if !self.mistral {
                    let t = std::mem::take(&mut self.buf);
                    push_text(out, &t);
                    return false;
                }
                if let Some(p) = self.buf.find(TOOL_CALLS) {
                    let before: String = self.buf.drain(..p).collect();
                    push_text(out, &before);
                    self.raw.clear();
                    self.consume(TOOL_CALLS.len());
                    self.st = St::AfterMarker;
                    return true;
                }
                let keep = held_back(&self.buf, &[TOOL_CALLS]);
                let t: String = self.buf.drain(..self.buf.len() - keep).collect();
                push_text(out, &t);
                false
            }
            St::AfterMarker => {
                self.skip_ws();
                if self.buf.is_empty() {
                    self.st = St::AfterMarker;
                    return false;
                }
                if self.buf.starts_with('[') {
                    self.consume(1);
                    self.list = true;
                    self.st = St::Head;
                } else {
                    self.st = St::Name;
                }
                true
            }
            St::Name => {
                let Some(p) = self.buf.find(ARGS) else {
                    self.st = St::Name;
                    if self.buf.len() > 512 {
                        self.fail("no [ARGS] after the function name", out);
                        return true;
                    }
                    return false;
                };
                let head = self.consume(p);
                self.consume(ARGS.len());
                let name = head.split(CALL_ID).next().unwrap_or_default().to_string();
                if self.start_call(&name, out) {
                    self.skip_ws();
                    self.st = St::Args(ValueEnd::default());
                }
                true
            }
            St::Head => match read_head(&self.buf) {
                Head::Need => {
                    self.st = St::Head;
                    false
                }
                Head::No => {
                    self.st = St::Whole;
                    true
                }
                Head::Yes { name, len } => {
                    if !self.tools.knows(&name) {
                        // Parsed whole at the end, and then given back as text.
                        self.st = St::Whole;
                        return true;
                    }
                    self.consume(len);
                    if self.start_call(&name, out) {
                        self.st = St::Args(ValueEnd::default());
                    }
                    true
                }
            },
            St::Args(mut scan) => {
                if self.buf.is_empty() {
                    self.st = St::Args(scan);
                    return false;
                }
                if !self.args.is_empty() || self.buf.starts_with('{') {
                    if let Some(n) = scan.feed(&self.buf) {
                        let s = self.consume(n);
                        self.emit_args(&s, out);
                        if self.list || !self.mistral {
                            self.st = St::CallClose;
                        } else {
                            self.end_call(out);
                            self.st = St::Text;
                        }
                        return true;
                    }
                    let s = self.consume(self.buf.len());
                    self.emit_args(&s, out);
                    self.st = St::Args(scan);
                    return false;
                }
                self.fail("the arguments are not a JSON object", out);
                true
            }
            St::CallClose => {
                self.skip_ws();
                if self.buf.is_empty() {
                    self.st = St::CallClose;
                    return false;
                }
                if self.buf.starts_with('}') {
                    self.consume(1);
                    self.end_call(out);
                    self.st = St::Between;
                    return true;
                }
                self.fail("text after the arguments", out);
                true
            }
            St::Between => {
                let sep = |c: char| c.is_whitespace() || (!self.mistral && c == ';') || (self.list && c == ',');
                let n = self.buf.len() - self.buf.trim_start_matches(sep).len();
                self.consume(n);
                if self.buf.is_empty() {
                    self.st = St::Between;
                    return false;
                }
                if self.buf.starts_with('{') {
                    self.st = St::Head;
                } else if !self.mistral && self.buf.starts_with(PYTHON_TAG) {
                    self.consume(PYTHON_TAG.len());
                    self.st = St::Head;
                } else if !self.mistral && PYTHON_TAG.starts_with(self.buf.as_str()) {
                    self.st = St::Between;
                    return false;
                } else if self.list && self.buf.starts_with(']') {
                    self.consume(1);
                    self.list = false;
                    self.raw.clear();
                    self.st = St::Text;
                } else {
                    // Text after the calls.
                    self.raw.clear();
                    self.list = false;
                    self.st = St::Text;
                }
                true
            }
            St::Whole => {
                self.st = St::Whole;
                false
            }
        }
    }

    /// The calls of a `Whole` body, or the body as text.
    fn finish_whole(&mut self, out: &mut Vec<Piece>) {
        let rest = std::mem::take(&mut self.buf);
        self.raw.push_str(&rest);
        let body = self.raw.trim_start();
        let body = body.strip_prefix(PYTHON_TAG).or_else(|| body.strip_prefix(TOOL_CALLS)).unwrap_or(body);
        // The rest of a list whose first calls streamed: `{…}, {…}]`.
        let body = match body.trim_end().strip_suffix(']') {
            Some(b) if self.list && !body.starts_with('[') => b,
            _ => body,
        };
        let calls: Option<Vec<ParsedCall>> =
            parse_json_calls(body, self.mistral).filter(|c| c.iter().all(|c| self.tools.knows(&c.name)));
        match calls {
            Some(calls) => emit_whole(calls, &std::mem::take(&mut self.raw), out),
            None => self.fail("not a call", out),
        }
    }
}

impl CallParser for JsonCalls {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        while self.step(out) {}
        match std::mem::replace(&mut self.st, St::Text) {
            St::Start | St::Text | St::Between => {
                let rest = std::mem::take(&mut self.buf);
                push_text(out, &rest);
            }
            // A list or a v11 call cut before its arguments.
            St::AfterMarker | St::Name => {
                let rest = std::mem::take(&mut self.buf);
                self.raw.push_str(&rest);
                self.fail("unclosed markup at the end of the output", out);
            }
            St::Head | St::Whole => self.finish_whole(out),
            // The arguments closed but the call object did not: the call stands.
            St::CallClose => self.end_call(out),
            St::Args(_) => {
                let rest = std::mem::take(&mut self.buf);
                self.raw.push_str(&rest);
                self.emit_args(&rest, out);
                self.end_call(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{every_split, run, weather_tools};
    use super::*;

    fn llama3() -> Box<dyn CallParser> {
        Box::new(JsonCalls::llama3(weather_tools()))
    }

    fn mistral() -> Box<dyn CallParser> {
        Box::new(JsonCalls::mistral(weather_tools()))
    }

    #[test]
    fn value_end_ignores_brackets_in_strings() {
        let mut v = ValueEnd::default();
        assert_eq!(v.feed(r#"{"a": "}\"{", "b": [1, {"c": 2}]"#), None);
        assert_eq!(v.feed("} tail"), Some(1));
    }

    #[test]
    fn llama3_calls_stream_and_split_everywhere() {
        let out = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}; {\"name\": \"search\", \"parameters\": {\"q\": \"a;b}\"}}";
        let o = every_split(&llama3, out, &["\"name\"", "parameters"]);
        assert_eq!(o.text, "");
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0], ("get_weather".into(), r#"{"city": "Paris", "days": 2}"#.into(), true));
        assert_eq!(o.calls[1], ("search".into(), r#"{"q": "a;b}"}"#.into(), true));
        let tagged = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}\n\n<|python_tag|>{\"name\": \"search\", \"parameters\": {}}";
        let o = every_split(&llama3, tagged, &["<|python", "\"name\""]);
        assert_eq!((o.text.as_str(), o.calls.len()), ("", 2));
    }

    #[test]
    fn llama3_text_and_other_orders() {
        let o = every_split(&llama3, "Hello {not json", &[]);
        assert_eq!((o.text.as_str(), o.calls.len()), ("Hello {not json", 0));
        let o = every_split(&llama3, "{not json", &[]);
        assert_eq!((o.text.as_str(), o.calls.len()), ("{not json", 0));
        let o = run(&llama3, &["{\"parameters\": {\"q\": 1}, ", "\"name\": \"search\"}"]);
        assert_eq!(o.calls, vec![("search".into(), r#"{"q":1}"#.into(), true)]);
        let o = every_split(&llama3, "{\"name\": \"nope\", \"parameters\": {}}", &[]);
        assert_eq!((o.text.as_str(), o.calls.len()), ("{\"name\": \"nope\", \"parameters\": {}}", 0));
    }

    #[test]
    fn llama3_cut_call_is_invalid() {
        let o = every_split(&llama3, "{\"name\": \"search\", \"parameters\": {\"q\": \"x", &[]);
        assert_eq!(o.calls.len(), 1);
        assert!(!o.calls[0].2);
    }

    #[test]
    fn mistral_list_streams() {
        let out = "Let me look.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"search\", \"arguments\": {\"q\": \"]\"}}]";
        let o = every_split(&mistral, out, &["[TOOL_CALLS]", "\"name\""]);
        assert_eq!(o.text, "Let me look.");
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0], ("get_weather".into(), r#"{"city": "Oslo"}"#.into(), true));
        assert_eq!(o.calls[1], ("search".into(), r#"{"q": "]"}"#.into(), true));
    }

    #[test]
    fn mistral_v11_streams() {
        let out = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\", \"days\": 3}[TOOL_CALLS]search[CALL_ID]abc123456[ARGS]{\"q\": \"y\"}";
        let o = every_split(&mistral, out, &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]);
        assert_eq!(o.text, "");
        assert_eq!(o.calls[0], ("get_weather".into(), r#"{"city": "Rome", "days": 3}"#.into(), true));
        assert_eq!(o.calls[1], ("search".into(), r#"{"q": "y"}"#.into(), true));
    }

    #[test]
    fn mistral_malformed_is_text_or_invalid() {
        let o = every_split(&mistral, "[TOOL_CALLS]nope[ARGS]{}", &[]);
        assert_eq!((o.text.as_str(), o.calls.len()), ("[TOOL_CALLS]nope[ARGS]{}", 0));
        let o = every_split(&mistral, "[TOOL_CALLS]search[ARGS]{\"q\": ", &[]);
        assert!(!o.calls[0].2);
        // Another key order: parsed whole when the output ends.
        let o = run(&mistral, &["[TOOL_CALLS][{\"arguments\": {\"q\": \"z\"}, ", "\"name\": \"search\"}]"]);
        assert_eq!(o.calls, vec![("search".into(), r#"{"q":"z"}"#.into(), true)]);
    }
}
