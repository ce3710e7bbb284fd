//! gpt-oss (Harmony): the output is a run of messages, each a header up to
//! `<|message|>` and a body up to `<|end|>`, `<|call|>` or `<|return|>` (the
//! last two end generation, so the body may also run to the end of output).
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants…<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
//! <|channel|>final<|message|>It is sunny.<|return|>
//! ```
//!
//! `analysis` is reasoning, a header with `to=functions.NAME` is a call (its body
//! the JSON arguments), anything else (`final`, a `commentary` preamble) is text.
//! Output that does not start like a header is plain text.

use super::{held_back, is_json_object, push_args, push_reasoning, push_text, CallParser, Piece, Tools};

const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];
const HEADER_STARTS: [&str; 4] = ["<|start|>", "<|channel|>", " to=", "to="];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Body {
    Reasoning,
    Text,
    Call,
}

#[derive(Debug)]
enum St {
    Header,
    Body(Body),
    /// Not Harmony: everything is text.
    Plain,
}

pub struct Harmony {
    tools: Tools,
    st: St,
    buf: String,
    /// The open call's markup and arguments.
    raw: String,
    args: String,
}

impl Harmony {
    pub fn new(tools: Tools) -> Harmony {
        Harmony { tools, st: St::Header, buf: String::new(), raw: String::new(), args: String::new() }
    }

    /// `(channel, recipient)` of a header.
    fn parse_header(h: &str) -> (String, Option<String>) {
        let word = |after: &str| -> Option<String> {
            let i = h.find(after)? + after.len();
            let rest = &h[i..];
            let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
            Some(rest[..end].to_string())
        };
        let channel = word("<|channel|>").unwrap_or_default();
        let to = word("to=").map(|r| r.strip_prefix("functions.").unwrap_or(&r).to_string());
        (channel, to)
    }

    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.st {
            St::Plain => {
                let t = std::mem::take(&mut self.buf);
                push_text(out, &t);
                false
            }
            St::Header => {
                let trimmed = self.buf.trim_start_matches(['\n', '\r']);
                if trimmed.is_empty() || HEADER_STARTS.iter().any(|h| h.starts_with(trimmed)) {
                    return false;
                }
                if !HEADER_STARTS.iter().any(|h| trimmed.starts_with(h)) {
                    self.st = St::Plain;
                    return true;
                }
                let Some(p) = self.buf.find(MESSAGE) else {
                    if self.buf.len() > 512 {
                        self.st = St::Plain;
                        return true;
                    }
                    return false;
                };
                let header: String = self.buf.drain(..p + MESSAGE.len()).collect();
                let (channel, to) = Harmony::parse_header(&header[..p]);
                self.st = match to {
                    Some(name) if self.tools.knows(&name) => {
                        out.push(Piece::CallStart { name });
                        self.raw = header;
                        self.args.clear();
                        St::Body(Body::Call)
                    }
                    Some(name) => {
                        tracing::warn!("gpt-oss called unknown function '{name}'; its arguments are returned as text");
                        St::Body(Body::Text)
                    }
                    None if channel == "analysis" => St::Body(Body::Reasoning),
                    None => St::Body(Body::Text),
                };
                true
            }
            St::Body(kind) => {
                let found = ENDS.iter().filter_map(|m| self.buf.find(m).map(|p| (p, *m))).min();
                let (cut, consume, done) = match found {
                    Some((p, m)) => (p, p + if m == "<|start|>" { 0 } else { m.len() }, true),
                    None => {
                        let keep = held_back(&self.buf, &ENDS);
                        let mut cut = self.buf.len() - keep;
                        if kind == Body::Call {
                            cut = self.buf[..cut].trim_end().len();
                        }
                        (cut, cut, false)
                    }
                };
                let mut content = self.buf[..cut].to_string();
                self.buf.drain(..consume);
                match kind {
                    Body::Reasoning => push_reasoning(out, &content),
                    Body::Text => push_text(out, &content),
                    Body::Call => {
                        if self.args.is_empty() {
                            content = content.trim_start().to_string();
                        }
                        if done {
                            content = content.trim_end().to_string();
                        }
                        self.raw.push_str(&content);
                        self.args.push_str(&content);
                        push_args(out, &content);
                    }
                }
                if done {
                    if kind == Body::Call {
                        self.end_call(out);
                    }
                    self.st = St::Header;
                }
                done
            }
        }
    }

    fn end_call(&mut self, out: &mut Vec<Piece>) {
        let valid = is_json_object(&self.args);
        if !valid {
            tracing::warn!("gpt-oss call arguments are not a JSON object: {:?}", self.args);
        }
        out.push(Piece::CallEnd { valid, raw: std::mem::take(&mut self.raw) });
        self.args.clear();
    }
}

impl CallParser for Harmony {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.st {
            St::Body(Body::Call) => {
                let rest = rest.trim_end();
                self.args.push_str(rest);
                self.raw.push_str(rest);
                push_args(out, rest);
                self.end_call(out);
            }
            St::Body(Body::Reasoning) => push_reasoning(out, &rest),
            _ => push_text(out, &rest),
        }
        self.st = St::Header;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{every_split, weather_tools};
    use super::*;

    fn make() -> Box<dyn CallParser> {
        Box::new(Harmony::new(weather_tools()))
    }

    #[test]
    fn analysis_call_and_final_split_everywhere() {
        let out = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        let o = every_split(&make, out, &["<|", "|>", "commentary", "analysis"]);
        assert_eq!(o.reasoning, "Need weather.");
        assert_eq!(o.text, "");
        assert_eq!(o.calls, vec![("get_weather".into(), r#"{"city": "Paris"}"#.into(), true)]);
        let out = "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final<|message|>Four.";
        let o = every_split(&make, out, &["<|", "final"]);
        assert_eq!((o.reasoning.as_str(), o.text.as_str()), ("easy", "Four."));
    }

    #[test]
    fn recipient_before_channel_and_two_calls() {
        let out = "<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{\"q\": \"a\"}<|call|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}";
        let o = every_split(&make, out, &["<|", "to="]);
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[1], ("get_weather".into(), "{}".into(), true));
    }

    #[test]
    fn plain_output_and_bad_json() {
        let o = every_split(&make, "Hello there", &[]);
        assert_eq!(o.text, "Hello there");
        let o = every_split(&make, "<|channel|>commentary to=functions.search<|message|>{oops", &[]);
        assert!(!o.calls[0].2);
    }
}
