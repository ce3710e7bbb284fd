//! Streaming tool-call parsers, one per model family. Each turns the model's
//! text, pushed in arbitrary fragments, into `Piece`s: plain text, reasoning,
//! and calls whose arguments stream as JSON fragments. Markup is held back until
//! it is known not to be a marker, so it never reaches a text delta even when a
//! marker is split across tokens.
//!
//! The section families (Qwen3-Coder, GLM, MiniMax, DeepSeek, Kimi) share one
//! state machine, `Sectioned`, driven by the family's `Syntax` (its markers);
//! Harmony (gpt-oss) and the JSON families (Hermes; Llama 3 and Mistral in
//! `json_calls`) have their own.
//! XML parameter values are raw text, typed by the tool's JSON schema: strings
//! stream as JSON strings, other types are parsed as JSON when they close.

pub mod deepseek;
pub mod glm;
pub mod harmony;
pub mod hermes;
pub mod json_calls;
pub mod kimi;
pub mod minimax;
pub mod qwen3_coder;

use serde_json::Value;
use std::collections::HashMap;

/// What a parser gives out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    /// A call begins: its arguments follow as `CallArgs` fragments (JSON text).
    CallStart {
        name: String,
    },
    CallArgs(String),
    /// The call ended. `valid: false` = its arguments did not parse; `raw` is the
    /// markup as the model wrote it (non-streamed answers give it back as text).
    CallEnd {
        valid: bool,
        raw: String,
    },
}

/// A streaming parser of one family's output.
pub trait CallParser: Send {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>);
    /// End of output: flushes what is held, closing or failing an open call.
    fn finish(&mut self, out: &mut Vec<Piece>);
}

/// The request's tools: which names exist and their parameter schemas.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    params: HashMap<String, Value>,
    /// Any name is a tool (`shardlm run --tool-format`, which has no tool list).
    any: bool,
}

impl Tools {
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Tools {
        Tools { params: tools.into_iter().map(|(n, p)| (n.to_string(), p.clone())).collect(), any: false }
    }

    /// Every name counts as a tool; XML values stay strings.
    pub fn any() -> Tools {
        Tools { params: HashMap::new(), any: true }
    }

    pub fn knows(&self, name: &str) -> bool {
        self.any || self.params.contains_key(name)
    }

    /// Whether parameter `key` of `tool` is a plain string (its raw XML text is the value).
    pub fn is_string(&self, tool: &str, key: &str) -> bool {
        let Some(p) = self.params.get(tool).and_then(|s| s.get("properties")).and_then(|p| p.get(key)) else {
            // Unknown parameters stay text, as the families' reference parsers do.
            return true;
        };
        match p.get("type") {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(ts)) => ts.iter().all(|t| t == "string" || t == "null"),
            None => p.get("enum").and_then(Value::as_array).is_some_and(|e| e.iter().all(Value::is_string)),
            _ => false,
        }
    }
}

/// Pushes text, merged with a text piece just before it.
pub fn push_text(out: &mut Vec<Piece>, s: &str) {
    if s.is_empty() {
        return;
    }
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push_str(s);
    } else {
        out.push(Piece::Text(s.to_string()));
    }
}

pub fn push_reasoning(out: &mut Vec<Piece>, s: &str) {
    if s.is_empty() {
        return;
    }
    if let Some(Piece::Reasoning(t)) = out.last_mut() {
        t.push_str(s);
    } else {
        out.push(Piece::Reasoning(s.to_string()));
    }
}

pub fn push_args(out: &mut Vec<Piece>, s: &str) {
    if !s.is_empty() {
        out.push(Piece::CallArgs(s.to_string()));
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of one of `markers`
/// (text that may still become a marker), on a char boundary.
pub fn held_back(s: &str, markers: &[&str]) -> usize {
    let mut keep = 0;
    for m in markers {
        for k in (1..m.len().min(s.len() + 1)).rev() {
            if k > keep && s.is_char_boundary(s.len() - k) && m.is_char_boundary(k) && s.ends_with(&m[..k]) {
                keep = k;
                break;
            }
        }
    }
    keep
}

/// The earliest of `markers` in `s`: (position, marker).
pub fn find_first<'m>(s: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter(|m| !m.is_empty())
        .filter_map(|m| s.find(m).map(|p| (p, *m)))
        .min_by_key(|(p, m)| (*p, usize::MAX - m.len()))
}

/// Whether `s` could still grow into `marker` (or already starts with it).
pub fn could_be(s: &str, marker: &str) -> bool {
    !marker.is_empty() && (marker.starts_with(s) || s.starts_with(marker))
}

/// JSON-escaped text without the quotes.
pub fn json_escape(s: &str) -> String {
    let q = Value::String(s.to_string()).to_string();
    q[1..q.len() - 1].to_string()
}

/// Whether `s` is a JSON object.
pub fn is_json_object(s: &str) -> bool {
    serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object())
}

/// How a section family writes arguments.
#[derive(Debug, Clone, Copy)]
pub enum ArgSyntax {
    /// A JSON object, up to `end` ("" = up to the call's close).
    Json { end: &'static str },
    /// `open KEY name_end [value_open] VALUE close`, repeated.
    Xml { open: &'static str, name_end: &'static str, value_open: &'static str, close: &'static str },
}

/// The markers of a section family.
#[derive(Debug, Clone, Copy)]
pub struct Syntax {
    /// Opens a group of calls (or one call, when `call_open` is empty).
    pub open: &'static str,
    pub close: &'static str,
    /// Opens each call inside the group; "" = the call starts right after `open`.
    pub call_open: &'static str,
    /// End of the call's name: (marker, consumed). An unconsumed marker stays for the arguments.
    pub name_end: &'static [(&'static str, bool)],
    /// Closes a call; "" = the group's `close` does.
    pub call_close: &'static str,
    pub args: ArgSyntax,
    /// Stripped from the name (Kimi's `functions.`).
    pub name_prefix: &'static str,
    /// The name ends at this character (Kimi's `:IDX`).
    pub name_cut: Option<char>,
    /// DeepSeek V3: a header equal to `.0` means the name follows up to `.1`,
    /// then the JSON up to `.2` (a fenced block).
    pub typed_header: Option<(&'static str, &'static str, &'static str)>,
}

#[derive(Debug)]
enum St {
    Text,
    /// Inside a group, between calls.
    Group,
    /// Reading the call's name (`second`: after DeepSeek V3's `function` header).
    Name {
        second: bool,
    },
    Json {
        end: &'static str,
        started: bool,
    },
    /// JSON ended at its own marker; the call's close is next.
    AfterJson,
    XmlBetween,
    XmlKey,
    XmlValueOpen {
        key: String,
    },
    XmlValue {
        key: String,
        string: bool,
        started: bool,
    },
}

/// The shared state machine of the section families.
pub struct Sectioned {
    syn: Syntax,
    tools: Tools,
    st: St,
    buf: String,
    /// Markup of the open group/call as written (given back as text on failure).
    raw: String,
    /// The open call: name and its arguments so far (JSON).
    name: String,
    args: String,
    /// Parameters written so far (XML families).
    params: usize,
}

impl Sectioned {
    pub fn new(syn: Syntax, tools: Tools) -> Sectioned {
        Sectioned {
            syn,
            tools,
            st: St::Text,
            buf: String::new(),
            raw: String::new(),
            name: String::new(),
            args: String::new(),
            params: 0,
        }
    }

    fn consume(&mut self, n: usize) -> String {
        let s: String = self.buf.drain(..n).collect();
        self.raw.push_str(&s);
        s
    }

    fn emit_args(&mut self, s: &str, out: &mut Vec<Piece>) {
        self.args.push_str(s);
        push_args(out, s);
    }

    /// A malformed call or group: its markup goes back out as text.
    fn fail(&mut self, why: &str, out: &mut Vec<Piece>) {
        tracing::warn!("tool call markup not understood ({why}); returned as text: {:?}", self.raw);
        let raw = std::mem::take(&mut self.raw);
        if self.in_call() {
            out.push(Piece::CallEnd { valid: false, raw });
        } else {
            push_text(out, &raw);
        }
        self.args.clear();
        self.st = St::Text;
    }

    fn in_call(&self) -> bool {
        !matches!(self.st, St::Text | St::Group | St::Name { .. })
    }

    fn end_call(&mut self, out: &mut Vec<Piece>) {
        let valid = is_json_object(&self.args);
        if !valid {
            tracing::warn!("tool call '{}' has arguments that are not a JSON object: {:?}", self.name, self.args);
        }
        out.push(Piece::CallEnd { valid, raw: std::mem::take(&mut self.raw) });
        self.args.clear();
        self.st = if self.syn.call_close.is_empty() { St::Text } else { St::Group };
    }

    fn start_call(&mut self, name: &str, out: &mut Vec<Piece>) -> bool {
        let mut name = name.trim();
        name = name.strip_prefix(self.syn.name_prefix).unwrap_or(name);
        if let Some(c) = self.syn.name_cut {
            name = name.split(c).next().unwrap_or(name);
        }
        if !self.tools.knows(name) {
            let why = format!("unknown function '{name}'");
            self.fail(&why, out);
            return false;
        }
        self.name = name.to_string();
        self.args.clear();
        self.params = 0;
        out.push(Piece::CallStart { name: name.to_string() });
        true
    }

    /// One step; false when more text is needed.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        let syn = self.syn;
        match std::mem::replace(&mut self.st, St::Text) {
            St::Text => {
                if let Some(p) = self.buf.find(syn.open) {
                    let before: String = self.buf.drain(..p).collect();
                    push_text(out, &before);
                    self.raw.clear();
                    self.consume(syn.open.len());
                    self.st = if syn.call_open.is_empty() { St::Name { second: false } } else { St::Group };
                    return true;
                }
                let keep = held_back(&self.buf, &[syn.open]);
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                push_text(out, &text);
                false
            }
            St::Group => {
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.consume(ws);
                self.st = St::Group;
                if self.buf.starts_with(syn.call_open) && !syn.call_open.is_empty() {
                    self.consume(syn.call_open.len());
                    self.st = St::Name { second: false };
                    return true;
                }
                if self.buf.starts_with(syn.close) {
                    self.consume(syn.close.len());
                    self.raw.clear();
                    self.st = St::Text;
                    return true;
                }
                if self.buf.is_empty() || could_be(&self.buf, syn.call_open) || could_be(&self.buf, syn.close) {
                    return false;
                }
                self.fail("text between calls", out);
                true
            }
            St::Name { second } => {
                let ends: Vec<&str> = if second {
                    vec![syn.typed_header.map_or("", |t| t.1)]
                } else {
                    syn.name_end.iter().map(|e| e.0).collect()
                };
                let Some((p, m)) = find_first(&self.buf, &ends) else {
                    self.st = St::Name { second };
                    if self.buf.len() > 256 {
                        self.fail("no end to the function name", out);
                        return true;
                    }
                    return false;
                };
                let consumed = second || syn.name_end.iter().any(|e| e.0 == m && e.1);
                let name = self.consume(p);
                if consumed {
                    self.consume(m.len());
                }
                if let Some((word, _, json_end)) = syn.typed_header {
                    if !second && name.trim() == word {
                        self.st = St::Name { second: true };
                        return true;
                    }
                    if second {
                        if self.start_call(&name, out) {
                            self.st = St::Json { end: json_end, started: false };
                        }
                        return true;
                    }
                }
                if self.start_call(&name, out) {
                    self.st = match syn.args {
                        ArgSyntax::Json { end } => St::Json { end, started: false },
                        ArgSyntax::Xml { .. } => St::XmlBetween,
                    };
                }
                true
            }
            St::Json { end, started } => {
                let end_marker = if end.is_empty() { syn.call_close } else { end };
                let mut started = started;
                if !started {
                    let ws = self.buf.len() - self.buf.trim_start().len();
                    self.consume(ws);
                    started = !self.buf.is_empty();
                }
                let found = if end_marker.is_empty() { None } else { self.buf.find(end_marker) };
                let found = found.map(|p| (p, end_marker));
                match found {
                    Some((p, m)) => {
                        let body = self.consume(p);
                        let body = body.trim_end();
                        self.emit_args(body, out);
                        self.consume(m.len());
                        if end.is_empty() {
                            self.end_call(out);
                        } else {
                            self.st = St::AfterJson;
                        }
                        true
                    }
                    None => {
                        // Stream all but a possible marker start and trailing space.
                        let keep = held_back(&self.buf, &[end_marker]);
                        let cut = self.buf.len() - keep;
                        let cut = self.buf[..cut].trim_end().len();
                        let s = self.consume(cut);
                        self.emit_args(&s, out);
                        self.st = St::Json { end, started };
                        false
                    }
                }
            }
            St::AfterJson => {
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.consume(ws);
                if self.buf.starts_with(syn.call_close) {
                    self.consume(syn.call_close.len());
                    self.end_call(out);
                    return true;
                }
                self.st = St::AfterJson;
                if self.buf.is_empty() || could_be(&self.buf, syn.call_close) {
                    return false;
                }
                self.fail("text after the arguments", out);
                true
            }
            St::XmlBetween => {
                let ArgSyntax::Xml { open, .. } = syn.args else { unreachable!("xml state of a json family") };
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.consume(ws);
                self.st = St::XmlBetween;
                let close = if syn.call_close.is_empty() { syn.close } else { syn.call_close };
                if self.buf.starts_with(open) {
                    self.consume(open.len());
                    self.st = St::XmlKey;
                    return true;
                }
                if self.buf.starts_with(close) {
                    self.consume(close.len());
                    let tail = if self.params == 0 { "{}" } else { "}" };
                    self.emit_args(tail, out);
                    self.end_call(out);
                    return true;
                }
                if self.buf.is_empty() || could_be(&self.buf, open) || could_be(&self.buf, close) {
                    return false;
                }
                self.fail("text between parameters", out);
                true
            }
            St::XmlKey => {
                let ArgSyntax::Xml { name_end, value_open, .. } = syn.args else { unreachable!() };
                let Some(p) = self.buf.find(name_end) else {
                    self.st = St::XmlKey;
                    if self.buf.len() > 256 {
                        self.fail("no end to a parameter name", out);
                        return true;
                    }
                    return false;
                };
                let key = self.consume(p).trim().to_string();
                self.consume(name_end.len());
                self.st = if value_open.is_empty() { self.open_value(key, out) } else { St::XmlValueOpen { key } };
                true
            }
            St::XmlValueOpen { key } => {
                let ArgSyntax::Xml { value_open, .. } = syn.args else { unreachable!() };
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.consume(ws);
                if self.buf.starts_with(value_open) {
                    self.consume(value_open.len());
                    self.st = self.open_value(key, out);
                    return true;
                }
                self.st = St::XmlValueOpen { key };
                if self.buf.is_empty() || could_be(&self.buf, value_open) {
                    return false;
                }
                self.fail("no value after a parameter name", out);
                true
            }
            St::XmlValue { key, string, mut started } => {
                let ArgSyntax::Xml { close, .. } = syn.args else { unreachable!() };
                // One newline after the open tag and one before the close are layout.
                if !started {
                    if self.buf.is_empty() {
                        self.st = St::XmlValue { key, string, started };
                        return false;
                    }
                    if self.buf.starts_with('\n') {
                        self.consume(1);
                    }
                    started = true;
                }
                if let Some(p) = self.buf.find(close) {
                    let mut value = self.consume(p);
                    self.consume(close.len());
                    if value.ends_with('\n') {
                        value.pop();
                    }
                    if string {
                        self.emit_args(&format!("{}\"", json_escape(&value)), out);
                    } else {
                        let v = match serde_json::from_str::<Value>(value.trim()) {
                            // A number as the model wrote it: serde_json reads
                            // "-0" as the float -0.0, which would turn an
                            // integer argument into "-0.0".
                            Ok(Value::Number(_)) => value.trim().to_string(),
                            Ok(v) => v.to_string(),
                            Err(_) => Value::String(value.clone()).to_string(),
                        };
                        self.emit_args(&format!("\"{}\": {v}", json_escape(&key)), out);
                    }
                    self.st = St::XmlBetween;
                    return true;
                }
                if string {
                    let keep = held_back(&self.buf, &[close]);
                    // A newline just before the close is layout: held until known.
                    let mut cut = self.buf.len() - keep;
                    if cut > 0 && self.buf[..cut].ends_with('\n') {
                        cut -= 1;
                    }
                    let s = self.consume(cut);
                    self.emit_args(&json_escape(&s), out);
                }
                self.st = St::XmlValue { key, string, started };
                false
            }
        }
    }

    /// Starts a parameter's value: strings open their JSON string at once.
    fn open_value(&mut self, key: String, out: &mut Vec<Piece>) -> St {
        let sep = if self.params == 0 { "{" } else { ", " };
        self.params += 1;
        let string = self.tools.is_string(&self.name, &key);
        if string {
            self.emit_args(&format!("{sep}\"{}\": \"", json_escape(&key)), out);
        } else {
            self.emit_args(sep, out);
        }
        St::XmlValue { key, string, started: false }
    }
}

impl CallParser for Sectioned {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        while self.step(out) {}
        match std::mem::replace(&mut self.st, St::Text) {
            St::Text => {
                let rest = std::mem::take(&mut self.buf);
                push_text(out, &rest);
            }
            // All calls closed; a group left open at the end of output is fine.
            St::Group => {}
            // A call cut before its close (max_tokens, a stop string): it is
            // not known to be whole, so it fails (non-streamed answers give it
            // back as text).
            st @ (St::Json { .. } | St::AfterJson | St::XmlBetween) => {
                let rest = std::mem::take(&mut self.buf);
                self.raw.push_str(&rest);
                if matches!(st, St::Json { .. }) {
                    self.emit_args(rest.trim_end(), out);
                }
                self.st = st;
                self.fail("the call was cut before its close", out);
            }
            st => {
                let rest = std::mem::take(&mut self.buf);
                self.raw.push_str(&rest);
                self.st = st;
                self.fail("unclosed markup at the end of the output", out);
            }
        }
        let rest = std::mem::take(&mut self.buf);
        push_text(out, &rest);
    }
}

#[cfg(test)]
pub mod testing {
    //! Runs a parser over a text cut at every byte (and in one piece) and checks
    //! that all cuts give the same pieces, merged, as the whole text.
    use super::*;

    /// Text, reasoning and (name, arguments, valid) per call.
    #[derive(Debug, Clone, PartialEq, Default)]
    pub struct Outcome {
        pub text: String,
        pub reasoning: String,
        pub calls: Vec<(String, String, bool)>,
        /// Argument fragments seen (to check that arguments stream).
        pub fragments: usize,
    }

    pub fn collect(pieces: Vec<Piece>) -> Outcome {
        let mut o = Outcome::default();
        for p in pieces {
            match p {
                Piece::Text(t) => o.text.push_str(&t),
                Piece::Reasoning(r) => o.reasoning.push_str(&r),
                Piece::CallStart { name } => o.calls.push((name, String::new(), true)),
                Piece::CallArgs(a) => {
                    o.fragments += 1;
                    o.calls.last_mut().expect("args after a start").1.push_str(&a);
                }
                Piece::CallEnd { valid, .. } => o.calls.last_mut().expect("end after a start").2 = valid,
            }
        }
        o
    }

    pub fn run(make: &dyn Fn() -> Box<dyn CallParser>, chunks: &[&str]) -> Outcome {
        let mut p = make();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out);
            // No markup in any text piece given so far.
        }
        p.finish(&mut out);
        let mut o = collect(out);
        o.fragments = o.fragments.min(1);
        o
    }

    /// Splits `text` at every char boundary (two chunks) and byte by byte; every
    /// run must equal the one-piece run, and text pieces never hold `forbidden`.
    pub fn every_split(make: &dyn Fn() -> Box<dyn CallParser>, text: &str, forbidden: &[&str]) -> Outcome {
        let whole = run(make, &[text]);
        for i in 1..text.len() {
            if !text.is_char_boundary(i) {
                continue;
            }
            let got = run(make, &[&text[..i], &text[i..]]);
            assert_eq!(got, whole, "split at byte {i} of {text:?}");
        }
        // One char at a time: every marker split everywhere at once.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        let mut p = make();
        let mut out = Vec::new();
        for c in &refs {
            p.push(c, &mut out);
        }
        p.finish(&mut out);
        for piece in &out {
            if let Piece::Text(t) = piece {
                for f in forbidden {
                    assert!(!t.contains(f), "markup {f:?} leaked into text {t:?}");
                }
            }
        }
        let mut bytewise = collect(out);
        let tiny = whole.calls.iter().all(|c| c.1.len() <= 2);
        assert!(tiny || bytewise.fragments > whole.calls.len(), "arguments did not stream");
        bytewise.fragments = bytewise.fragments.min(1);
        assert_eq!(bytewise, whole, "char by char");
        whole
    }

    pub fn weather_tools() -> Tools {
        let schema = serde_json::json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]}}});
        let search = serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}});
        Tools::new([("get_weather", &schema), ("search", &search)])
    }
}
