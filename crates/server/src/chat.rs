//! The one request shape every API is converted into (`ChatRequest`), and the
//! running generation seen as `Delta`s: text, complete tool calls, the end.

use crate::error::ApiError;
use crate::reasoning::{Part, ThinkSplitter};
use crate::toolfmt::Piece;
use crate::tools::ToolSplitter;
use crate::worker::Event;
use engine::generate::FinishReason;
use engine::sampler::SamplingParams;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Debug, Clone)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

#[derive(Debug, Clone)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema(Value),
}

/// A chat request in OpenAI's message form (what HF templates expect):
/// `{"role", "content", "tool_calls"?: [{"id", "type", "function": {"name",
/// "arguments"}}], "tool_call_id"?}`; content is a string, parts or null.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    pub response_format: ResponseFormat,
    /// As asked; `None` = the server default or the room left in the context.
    pub max_tokens: Option<i64>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Which field `max_tokens` came from, for error messages.
    pub max_tokens_field: &'static str,
    /// Ask a reasoning template to think (`enable_thinking`); `None` = its default.
    pub thinking: Option<bool>,
    /// Generate to `max_tokens` past end-of-sequence (a benchmarking extension).
    pub ignore_eos: bool,
    /// Speculative decoding for this request (an extension: [`DraftFields`]).
    pub draft: engine::draft::DraftChoice,
}

/// The speculative-decoding extension fields of a request body: `"draft"`
/// (`"ngram"` or `"model"`: on, with the server's drafter, its
/// `--draft-model` when it has one; `"none"`: off; absent: the server's
/// `--draft`), `"draft_max"` and `"draft_min"` (bounds of the draft length;
/// either alone turns drafting on, the other bound at its default).
#[derive(serde::Deserialize, Debug, Default, Clone)]
pub struct DraftFields {
    pub draft: Option<String>,
    pub draft_max: Option<i64>,
    pub draft_min: Option<i64>,
}

impl DraftFields {
    /// The request's choice; a 400 naming the field when a value is out of range.
    pub fn choice(&self) -> Result<engine::draft::DraftChoice, crate::error::ApiError> {
        use engine::draft::{DraftChoice, DraftParams};
        let bad = |field: &str, msg: String| crate::error::ApiError::bad_request(Some(field), msg);
        let on = match self.draft.as_deref() {
            None => self.draft_max.is_some() || self.draft_min.is_some(),
            // Either drafts with the server's drafter: its `--draft-model`
            // when it has one, else the n-gram lookup.
            Some("ngram" | "model") => true,
            Some("none") => false,
            Some(other) => {
                return Err(bad("draft", format!("unknown draft '{other}' (use \"ngram\", \"model\" or \"none\")")))
            }
        };
        if !on {
            return Ok(if self.draft.is_some() { DraftChoice::Off } else { DraftChoice::Default });
        }
        let base = DraftParams::default();
        let bound = |v: Option<i64>, d: usize, field: &str| -> Result<usize, crate::error::ApiError> {
            match v {
                None => Ok(d),
                Some(v) => usize::try_from(v).map_err(|_| bad(field, format!("{field} must be ≥ 1, got {v}"))),
            }
        };
        let max = bound(self.draft_max, base.max, "draft_max")?;
        let min = bound(self.draft_min, base.min.min(max), "draft_min")?;
        let p = DraftParams { max, min };
        p.validate().map_err(|e| bad(if e.starts_with("draft-max") { "draft_max" } else { "draft_min" }, e))?;
        Ok(DraftChoice::On(p))
    }
}

/// Why generation ended, in OpenAI's words (each API maps it to its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
}

impl Finish {
    pub fn openai(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }

    pub fn anthropic(self, stop_sequence_hit: bool) -> &'static str {
        match self {
            Finish::Stop if stop_sequence_hit => "stop_sequence",
            Finish::Stop => "end_turn",
            Finish::Length => "max_tokens",
            Finish::ToolCalls => "tool_use",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// All prompt tokens, cached or not.
    pub prompt_tokens: usize,
    /// The part of `prompt_tokens` served from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    /// Prompt tokens that were prefilled (Anthropic's `input_tokens`).
    pub fn uncached_prompt_tokens(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}

#[derive(Debug, Clone)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The id in Anthropic's form (`toolu_…`).
    pub fn anthropic_id(id: &str) -> String {
        id.replace("call_", "toolu_")
    }
}

#[derive(Debug)]
pub enum Delta {
    Text(String),
    /// Reasoning text (`<think>` of reasoning templates, Harmony's analysis channel).
    Reasoning(String),
    /// A tool call opens; its arguments follow as `CallArgs` fragments of JSON.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    CallArgs {
        index: usize,
        fragment: String,
    },
    /// `valid: false`: the arguments did not parse; non-streamed answers give
    /// `raw` (the call as written) back as text instead of the call.
    CallEnd {
        index: usize,
        valid: bool,
        raw: String,
    },
    End {
        finish: Finish,
        usage: Usage,
    },
    Error(String),
}

/// A fresh id with a prefix (`call_…`, `chatcmpl-…`, `msg_…`): time and a counter.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mix = (t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    format!("{prefix}{mix:016x}{n:04x}")
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A running generation. Dropping it cancels the engine job.
pub struct Generation {
    events: UnboundedReceiver<Event>,
    splitter: ToolSplitter,
    /// Set for reasoning templates.
    think: Option<ThinkSplitter>,
    ready: VecDeque<Delta>,
    /// Calls opened so far, and how many ended valid.
    calls: usize,
    valid_calls: usize,
    done: bool,
    pub prompt_tokens: usize,
    /// Stop strings were asked for (to tell Anthropic's `stop_sequence` from `end_turn`).
    pub stop_strings: bool,
    /// The guide ended the output (forced call / JSON); a cut JSON would be `Length`.
    guided: bool,
    /// The lazy guide took hold of the call the parser will open next.
    next_call_guided: bool,
    /// An unguided call, held back until it closes: it goes out as a call if
    /// its arguments parse, as text if not (a started stream cannot take a
    /// call back, so only calls the guide holds stream as they come).
    held: Option<Vec<Delta>>,
    pub text: String,
    pub reasoning: String,
    /// The stop string that ended the output (known after `End`).
    pub stop_sequence: Option<String>,
    /// Longest wait for the engine's next event (a token, the end): past it
    /// the request fails with an error delta, which each API sends in its own
    /// format, and dropping the generation cancels the job. Guards against a
    /// cluster that stalls (a stopped rank, a dead link) and never re-forms.
    pub stall_timeout: Option<std::time::Duration>,
    /// The stall timeout ended the request.
    pub timed_out: bool,
}

impl Generation {
    pub fn new(
        events: UnboundedReceiver<Event>,
        splitter: ToolSplitter,
        think: Option<ThinkSplitter>,
        prompt_tokens: usize,
        guided: bool,
    ) -> Self {
        Generation {
            events,
            splitter,
            think,
            ready: VecDeque::new(),
            calls: 0,
            valid_calls: 0,
            done: false,
            prompt_tokens,
            stop_strings: false,
            guided,
            next_call_guided: false,
            held: None,
            text: String::new(),
            reasoning: String::new(),
            stop_sequence: None,
            stall_timeout: None,
            timed_out: false,
        }
    }

    fn take_pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            if let Piece::CallStart { .. } = p {
                if !self.guided && !std::mem::take(&mut self.next_call_guided) {
                    self.held = Some(Vec::new());
                }
            }
            let d = match p {
                Piece::Text(t) => {
                    self.text.push_str(&t);
                    Delta::Text(t)
                }
                Piece::Reasoning(r) => {
                    self.reasoning.push_str(&r);
                    Delta::Reasoning(r)
                }
                Piece::CallStart { name } => {
                    self.calls += 1;
                    Delta::CallStart { index: self.calls - 1, id: new_id("call_"), name }
                }
                Piece::CallArgs(fragment) => Delta::CallArgs { index: self.calls.saturating_sub(1), fragment },
                Piece::CallEnd { valid, raw } => {
                    if let Some(held) = self.held.take() {
                        self.release_held(held, valid, raw);
                        continue;
                    }
                    self.valid_calls += usize::from(valid);
                    Delta::CallEnd { index: self.calls.saturating_sub(1), valid, raw }
                }
            };
            match self.held.as_mut() {
                Some(held) => held.push(d),
                None => self.ready.push_back(d),
            }
        }
    }

    /// An unguided call has closed: out as a call when valid, else as its text.
    fn release_held(&mut self, held: Vec<Delta>, valid: bool, raw: String) {
        if valid {
            self.valid_calls += 1;
            self.ready.extend(held);
            self.ready.push_back(Delta::CallEnd { index: self.calls.saturating_sub(1), valid, raw });
            return;
        }
        tracing::warn!("a tool call did not parse; returned as text: {raw:?}");
        self.calls = self.calls.saturating_sub(1);
        self.text.push_str(&raw);
        self.ready.push_back(Delta::Text(raw));
    }

    /// The next delta; `None` after `End` or `Error`.
    pub async fn next(&mut self) -> Option<Delta> {
        loop {
            if let Some(d) = self.ready.pop_front() {
                return Some(d);
            }
            if self.done {
                return None;
            }
            let mut pieces = Vec::new();
            let event = match self.stall_timeout {
                Some(t) => match tokio::time::timeout(t, self.events.recv()).await {
                    Ok(e) => e,
                    Err(_) => {
                        let msg = format!(
                            "the request made no progress for {} s (--request-timeout) and was cancelled; \
                             the cluster may be degraded (see /health)",
                            t.as_secs_f64()
                        );
                        tracing::warn!("{msg}");
                        self.timed_out = true;
                        self.ready.push_back(Delta::Error(msg));
                        self.done = true;
                        continue;
                    }
                },
                None => self.events.recv().await,
            };
            match event {
                Some(Event::Text(t)) => self.split_reasoning(&t, false, &mut pieces),
                Some(Event::Guided) => self.next_call_guided = true,
                Some(Event::Done(f)) => {
                    self.split_reasoning("", true, &mut pieces);
                    self.splitter.finish(&mut pieces);
                    self.take_pieces(pieces);
                    pieces = Vec::new();
                    // Parsers end every call they open; should one not, it goes out as it stands.
                    if let Some(held) = self.held.take() {
                        self.release_held(held, true, String::new());
                    }
                    let finish = if self.valid_calls > 0 {
                        Finish::ToolCalls
                    } else if f.finish == FinishReason::Length && !(self.guided && f.guide_complete) {
                        Finish::Length
                    } else {
                        Finish::Stop
                    };
                    self.stop_sequence = f.stop_sequence.clone();
                    let usage = Usage {
                        prompt_tokens: f.prompt_tokens,
                        // Clamped: a cache can never cover more than the prompt.
                        cached_tokens: f.cached_tokens.min(f.prompt_tokens),
                        completion_tokens: f.completion_tokens,
                    };
                    self.ready.push_back(Delta::End { finish, usage });
                    self.done = true;
                }
                Some(Event::Error(e)) => {
                    self.ready.push_back(Delta::Error(e));
                    self.done = true;
                }
                None => {
                    self.ready.push_back(Delta::Error("the engine stopped".into()));
                    self.done = true;
                }
            }
            self.take_pieces(pieces);
        }
    }

    /// Routes reasoning straight out and the answer text through the tool splitter.
    fn split_reasoning(&mut self, text: &str, last: bool, pieces: &mut Vec<Piece>) {
        let Some(think) = self.think.as_mut() else {
            self.splitter.push(text, pieces);
            return;
        };
        let mut parts = Vec::new();
        think.push(text, &mut parts);
        if last {
            think.finish(&mut parts);
        }
        for p in parts {
            match p {
                Part::Reasoning(r) => crate::toolfmt::push_reasoning(pieces, &r),
                Part::Text(t) => self.splitter.push(&t, pieces),
            }
        }
    }

    /// Runs to the end: all text, all calls, and how it ended. A call whose
    /// arguments did not parse comes back as its text.
    pub async fn collect(&mut self) -> Result<Collected, ApiError> {
        let mut calls: Vec<ToolCall> = Vec::new();
        let mut text = String::new();
        while let Some(d) = self.next().await {
            match d {
                Delta::Text(t) => text.push_str(&t),
                Delta::Reasoning(_) => {}
                Delta::CallStart { id, name, .. } => calls.push(ToolCall { id, name, arguments: String::new() }),
                Delta::CallArgs { fragment, .. } => {
                    if let Some(c) = calls.last_mut() {
                        c.arguments.push_str(&fragment);
                    }
                }
                Delta::CallEnd { valid, raw, .. } => {
                    if !valid {
                        calls.pop();
                        text.push_str(&raw);
                    }
                }
                Delta::End { finish, usage } => {
                    let reasoning = std::mem::take(&mut self.reasoning);
                    return Ok(Collected { text, reasoning, calls, finish, usage });
                }
                Delta::Error(e) => {
                    let code = if self.timed_out {
                        axum::http::StatusCode::GATEWAY_TIMEOUT
                    } else {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    };
                    return Err(ApiError::new(code, e));
                }
            }
        }
        Err(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "generation ended without a result"))
    }
}

pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    pub finish: Finish,
    pub usage: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Finished;

    #[tokio::test]
    async fn usage_carries_cached_tokens_clamped_to_the_prompt() {
        // (reported by the engine, expected in the usage)
        for (cached, want) in [(0, 0), (64, 64), (500, 100)] {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let mut g = Generation::new(rx, ToolSplitter::new_plain(), None, 100, false);
            tx.send(Event::Text("hi".into())).expect("open");
            tx.send(Event::Done(Finished {
                finish: FinishReason::Stop,
                prompt_tokens: 100,
                cached_tokens: cached,
                completion_tokens: 1,
                guide_complete: false,
                stop_sequence: None,
            }))
            .expect("open");
            let out = g.collect().await.expect("finished");
            assert_eq!(out.text, "hi");
            assert_eq!((out.usage.prompt_tokens, out.usage.cached_tokens), (100, want));
            assert_eq!(out.usage.uncached_prompt_tokens(), 100 - want);
        }
    }

    fn done() -> Event {
        Event::Done(Finished {
            finish: FinishReason::Stop,
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 5,
            guide_complete: false,
            stop_sequence: None,
        })
    }

    #[tokio::test]
    async fn harmony_reasoning_and_calls_become_deltas_and_bad_calls_text() {
        use crate::toolfmt::testing::weather_tools;
        use crate::tools::ToolFormat;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let splitter = ToolSplitter::new(ToolFormat::Harmony, weather_tools(), "");
        let mut g = Generation::new(rx, splitter, None, 10, false);
        for t in [
            "<|channel|>anal",
            "ysis<|message|>think",
            "ing<|end|><|start|>assistant<|channel|>commentary to=func",
            "tions.search <|constrain|>json<|message|>{\"q\":",
            " \"x\"}",
        ] {
            tx.send(Event::Text(t.into())).expect("open");
        }
        tx.send(done()).expect("open");
        let mut kinds = Vec::new();
        while let Some(d) = g.next().await {
            kinds.push(match d {
                Delta::Reasoning(_) => "reasoning",
                Delta::CallStart { .. } => "start",
                Delta::CallArgs { .. } => "args",
                Delta::CallEnd { valid: true, .. } => "end",
                Delta::End { finish: Finish::ToolCalls, .. } => "tool_calls",
                other => panic!("unexpected {other:?}"),
            });
        }
        kinds.dedup();
        assert_eq!(kinds, ["reasoning", "start", "args", "end", "tool_calls"]);

        // A call with broken arguments comes back as its text in a collected answer.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let splitter = ToolSplitter::new(ToolFormat::Kimi, weather_tools(), "");
        let mut g = Generation::new(rx, splitter, None, 10, false);
        let bad = "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{q<|tool_call_end|>";
        tx.send(Event::Text(format!("ok {bad}"))).expect("open");
        tx.send(done()).expect("open");
        let out = g.collect().await.expect("finished");
        assert!(out.calls.is_empty());
        assert_eq!(out.finish, Finish::Stop);
        assert!(out.text.starts_with("ok ") && out.text.contains("functions.search"), "{}", out.text);
    }

    /// Calls the lazy guide holds stream as they come; a call it does not hold
    /// is kept back until it closes, and goes out as text when it is bad, even
    /// in a stream.
    #[tokio::test]
    async fn guided_calls_stream_and_unguided_bad_calls_are_text() {
        use crate::toolfmt::testing::weather_tools;
        use crate::tools::ToolFormat;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut g = Generation::new(rx, ToolSplitter::new(ToolFormat::Hermes, weather_tools(), ""), None, 10, false);
        tx.send(Event::Guided).expect("open");
        tx.send(Event::Text("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a".into())).expect("open");
        // The call opens before the rest of it has been generated.
        assert!(matches!(g.next().await, Some(Delta::CallStart { .. })));
        assert!(matches!(g.next().await, Some(Delta::CallArgs { .. })));
        tx.send(Event::Text("b\"}}\n</tool_call>".into())).expect("open");
        tx.send(done()).expect("open");
        let mut rest = Vec::new();
        while let Some(d) = g.next().await {
            rest.push(d);
        }
        assert!(matches!(rest.last(), Some(Delta::End { finish: Finish::ToolCalls, .. })), "{rest:?}");

        // Unguided and broken: no call at all in the stream, only its text.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut g = Generation::new(rx, ToolSplitter::new(ToolFormat::Hermes, weather_tools(), ""), None, 10, false);
        let bad = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": 1, }}\n</tool_call>";
        tx.send(Event::Text(format!("see {bad}"))).expect("open");
        tx.send(done()).expect("open");
        let mut text = String::new();
        while let Some(d) = g.next().await {
            match d {
                Delta::Text(t) => text.push_str(&t),
                Delta::End { finish, .. } => assert_eq!(finish, Finish::Stop),
                other => panic!("a bad call leaked into the stream: {other:?}"),
            }
        }
        assert_eq!(text, format!("see {bad}"));

        // Unguided and good: held, then out whole as a call.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut g = Generation::new(rx, ToolSplitter::new(ToolFormat::Hermes, weather_tools(), ""), None, 10, false);
        tx.send(Event::Text("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"z\"}}\n</tool_call>".into()))
            .expect("open");
        tx.send(done()).expect("open");
        let out = g.collect().await.expect("finished");
        assert_eq!((out.calls.len(), out.finish), (1, Finish::ToolCalls));
        assert_eq!(out.calls[0].arguments, r#"{"q": "z"}"#);
    }

    /// An engine that goes silent (a stopped rank) ends the request with an
    /// error delta after the stall timeout, instead of a stream that hangs.
    #[tokio::test]
    async fn a_silent_engine_ends_the_request_with_an_error() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut g = Generation::new(rx, ToolSplitter::new_plain(), None, 10, false);
        g.stall_timeout = Some(std::time::Duration::from_millis(50));
        tx.send(Event::Text("partial".into())).expect("open");
        assert!(matches!(g.next().await, Some(Delta::Text(_))));
        match g.next().await {
            Some(Delta::Error(e)) => assert!(e.contains("no progress") && e.contains("--request-timeout"), "{e}"),
            other => panic!("expected an error, got {other:?}"),
        }
        assert!(g.next().await.is_none());
        drop(tx);
    }

    #[test]
    fn draft_fields_choose_speculation_per_request() {
        use engine::draft::{DraftChoice, DraftParams};
        let f = |v: serde_json::Value| serde_json::from_value::<DraftFields>(v).unwrap().choice();
        assert_eq!(f(serde_json::json!({})).unwrap(), DraftChoice::Default);
        assert_eq!(f(serde_json::json!({"draft": "none"})).unwrap(), DraftChoice::Off);
        assert_eq!(f(serde_json::json!({"draft": "ngram"})).unwrap(), DraftChoice::On(DraftParams::default()));
        // "model": the server's drafter too (its --draft-model when it has one).
        assert_eq!(f(serde_json::json!({"draft": "model"})).unwrap(), DraftChoice::On(DraftParams::default()));
        let got = f(serde_json::json!({"draft_max": 4})).unwrap();
        assert_eq!(got, DraftChoice::On(DraftParams { max: 4, min: 1 }));
        for (bad, field) in [
            (serde_json::json!({"draft": "eagle"}), "draft"),
            (serde_json::json!({"draft": "ngram", "draft_max": 99}), "draft_max"),
            (serde_json::json!({"draft_max": 4, "draft_min": 5}), "draft_min"),
            (serde_json::json!({"draft_min": -1}), "draft_min"),
        ] {
            let e = f(bad.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{bad}: {}", e.message);
        }
    }
}
