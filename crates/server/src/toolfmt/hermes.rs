//! The JSON families. Hermes/Qwen2.5/Qwen3 (and the injected tool prompt):
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, repeatable; the
//! arguments stream once `{"name": "…", "arguments": ` has been read (other key
//! orders are parsed when the call closes). Llama 3 and Mistral, which write
//! calls as JSON objects too, are in `json_calls`.

use super::{held_back, is_json_object, push_args, push_text, CallParser, Piece, Tools};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

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

/// The calls in a JSON body (a call object, a list of them, or several).
pub fn parse_json_calls(body: &str, mistral: bool) -> Option<Vec<ParsedCall>> {
    let body = body.trim();
    if mistral && !body.starts_with('[') && !body.starts_with('{') {
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

pub(super) fn emit_whole(calls: Vec<ParsedCall>, raw: &str, out: &mut Vec<Piece>) {
    for c in calls {
        out.push(Piece::CallStart { name: c.name });
        out.push(Piece::CallArgs(c.arguments));
        out.push(Piece::CallEnd { valid: true, raw: raw.to_string() });
    }
}

/// Reads `{"name": "NAME", "arguments": ` at the start of `s`.
pub(super) enum Head {
    Need,
    No,
    Yes { name: String, len: usize },
}

pub(super) fn read_head(s: &str) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let lit = |i: &mut usize, t: &str| -> Option<bool> {
        let t = t.as_bytes();
        let n = t.len().min(b.len() - *i);
        if b[*i..*i + n] != t[..n] {
            return Some(false);
        }
        if n < t.len() {
            return None;
        }
        *i += t.len();
        Some(true)
    };
    macro_rules! need {
        ($e:expr) => {
            match $e {
                None => return Head::Need,
                Some(false) => return Head::No,
                Some(true) => {}
            }
        };
    }
    ws(&mut i);
    need!(lit(&mut i, "{"));
    ws(&mut i);
    need!(lit(&mut i, "\"name\""));
    ws(&mut i);
    need!(lit(&mut i, ":"));
    ws(&mut i);
    need!(lit(&mut i, "\""));
    let start = i - 1;
    let mut esc = false;
    loop {
        if i >= b.len() {
            return Head::Need;
        }
        match b[i] {
            b'\\' if !esc => esc = true,
            b'"' if !esc => break,
            _ => esc = false,
        }
        i += 1;
    }
    i += 1;
    let Ok(name) = serde_json::from_str::<String>(&s[start..i]) else { return Head::No };
    ws(&mut i);
    need!(lit(&mut i, ","));
    ws(&mut i);
    if i < b.len() && b[i..].starts_with(b"\"p") {
        need!(lit(&mut i, "\"parameters\""));
    } else {
        need!(lit(&mut i, "\"arguments\""));
    }
    ws(&mut i);
    need!(lit(&mut i, ":"));
    ws(&mut i);
    if i >= b.len() {
        return Head::Need;
    }
    if b[i] != b'{' {
        return Head::No;
    }
    Head::Yes { name, len: i }
}

#[derive(Debug, PartialEq)]
enum St {
    Text,
    Head,
    Args,
    /// Not in the streamable key order: parsed when it closes.
    Whole,
}

pub struct Hermes {
    tools: Tools,
    st: St,
    buf: String,
    raw: String,
    args: String,
}

impl Hermes {
    pub fn new(tools: Tools) -> Hermes {
        Hermes { tools, st: St::Text, buf: String::new(), raw: String::new(), args: String::new() }
    }

    fn fail(&mut self, out: &mut Vec<Piece>) {
        tracing::warn!("tool call not understood; returned as text: {:?}", self.raw);
        let raw = std::mem::take(&mut self.raw);
        push_text(out, &raw);
        self.st = St::Text;
    }

    /// The streamed arguments: all but a trailing `}` (the call object's own) and space.
    fn args_part(s: &str) -> &str {
        let t = s.trim_end();
        let t = t.strip_suffix('}').unwrap_or(t);
        t.trim_end()
    }

    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.st {
            St::Text => {
                if let Some(p) = self.buf.find(OPEN) {
                    let before: String = self.buf.drain(..p).collect();
                    push_text(out, &before);
                    self.raw = self.buf.drain(..OPEN.len()).collect();
                    self.st = St::Head;
                    return true;
                }
                let keep = held_back(&self.buf, &[OPEN]);
                let t: String = self.buf.drain(..self.buf.len() - keep).collect();
                push_text(out, &t);
                false
            }
            St::Head => match read_head(&self.buf) {
                Head::Need if !self.buf.contains(CLOSE) => false,
                Head::Yes { name, len } if self.tools.knows(&name) => {
                    let h: String = self.buf.drain(..len).collect();
                    self.raw.push_str(&h);
                    self.args.clear();
                    out.push(Piece::CallStart { name });
                    self.st = St::Args;
                    true
                }
                _ => {
                    self.st = St::Whole;
                    true
                }
            },
            St::Whole => {
                let Some(p) = self.buf.find(CLOSE) else { return false };
                let body: String = self.buf.drain(..p + CLOSE.len()).collect();
                self.raw.push_str(&body);
                match parse_json_calls(&body[..p], false).filter(|c| c.iter().all(|c| self.tools.knows(&c.name))) {
                    Some(calls) => {
                        emit_whole(calls, &self.raw, out);
                        self.raw.clear();
                        self.st = St::Text;
                    }
                    None => self.fail(out),
                }
                true
            }
            St::Args => {
                if let Some(p) = self.buf.find(CLOSE) {
                    let body: String = self.buf.drain(..p + CLOSE.len()).collect();
                    self.raw.push_str(&body);
                    self.close_args(&body[..p], out);
                    return true;
                }
                let keep = held_back(&self.buf, &[CLOSE]);
                let avail = &self.buf[..self.buf.len() - keep];
                let part = Hermes::args_part(avail).len();
                let s: String = self.buf.drain(..part).collect();
                self.raw.push_str(&s);
                self.args.push_str(&s);
                push_args(out, &s);
                false
            }
        }
    }

    /// The call's remaining text up to `</tool_call>` (or the end): the
    /// arguments' end and the call object's `}`.
    fn close_args(&mut self, rest: &str, out: &mut Vec<Piece>) {
        let t = rest.trim_end();
        let closed = t.ends_with('}');
        let part = Hermes::args_part(rest);
        self.args.push_str(part);
        push_args(out, part);
        let valid = closed && is_json_object(&self.args);
        if !valid {
            tracing::warn!("tool call arguments are not a JSON object: {:?}", self.raw);
        }
        out.push(Piece::CallEnd { valid, raw: std::mem::take(&mut self.raw) });
        self.args.clear();
        self.st = St::Text;
    }
}

impl CallParser for Hermes {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.st {
            St::Text => push_text(out, &rest),
            St::Args => {
                self.raw.push_str(&rest);
                self.close_args(&rest, out);
            }
            St::Head | St::Whole => {
                self.raw.push_str(&rest);
                let body = self.raw[OPEN.len().min(self.raw.len())..].to_string();
                match parse_json_calls(&body, false).filter(|c| c.iter().all(|c| self.tools.knows(&c.name))) {
                    Some(calls) => {
                        emit_whole(calls, &self.raw, out);
                        self.raw.clear();
                    }
                    None => self.fail(out),
                }
            }
        }
        self.st = St::Text;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{every_split, weather_tools};
    use super::*;

    fn hermes() -> Box<dyn CallParser> {
        Box::new(Hermes::new(weather_tools()))
    }

    #[test]
    fn hermes_calls_stream_and_split_everywhere() {
        let out = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"arguments\": {\"q\": \"x\"}, \"name\": \"search\"}</tool_call>";
        let o = every_split(&hermes, out, &["<tool_call>", "</tool", "\"name\""]);
        assert_eq!(o.text, "Sure.\n\n");
        assert_eq!(o.calls[0], ("get_weather".into(), r#"{"city": "Paris"}"#.into(), true));
        assert_eq!(o.calls[1], ("search".into(), r#"{"q":"x"}"#.into(), true));
    }

    #[test]
    fn malformed_or_unknown_is_text() {
        let o = every_split(&hermes, "<tool_call>{\"name\": oops}</tool_call> done", &[]);
        assert!(o.calls.is_empty());
        assert_eq!(o.text, "<tool_call>{\"name\": oops}</tool_call> done");
        let o = every_split(&hermes, "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", &[]);
        assert!(o.calls.is_empty());
        let o = every_split(&hermes, "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": 1</tool_call>", &[]);
        assert!(!o.calls[0].2);
    }
}
