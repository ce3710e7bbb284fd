//! OpenAI: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//! Unknown fields and non-function tools are ignored, never refused.

use crate::chat::{new_id, unix_now, ChatRequest, Delta, ResponseFormat, ToolChoice, ToolDef, Usage};
use crate::error::ApiError;
use crate::http::{sse, ApiJson};
use crate::prompt::{prepare_chat, prepare_text, start};
use crate::state::SharedState;
use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::sampler::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(s: Option<Stop>) -> Vec<String> {
        match s {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        }
    }
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Deserialize, Debug)]
pub struct ChatCompletionRequest {
    pub messages: Vec<Value>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
    /// "none" | "minimal" | "low" | "medium" | "high": turns a reasoning template's thinking off or on.
    pub reasoning_effort: Option<String>,
    /// Extension (vLLM, llama.cpp): keep generating past end-of-sequence until
    /// `max_tokens`, for benchmarks that need a fixed output length.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Choices per request: only 1 is served (see [`one_choice`]).
    pub n: Option<i64>,
    /// Extension: speculative decoding (`draft`, `draft_max`, `draft_min`).
    #[serde(flatten)]
    pub draft: crate::chat::DraftFields,
}

/// `n` other than 1 is refused with a 400 naming the field, instead of
/// answering one choice where the client asked for several.
pub fn one_choice(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_request(
            Some("n"),
            format!("n = {n} is not supported: this server returns one choice per request (send {n} requests instead)"),
        )),
    }
}

/// `reasoning_effort` → `enable_thinking` for reasoning templates.
pub fn thinking_from_effort(effort: Option<&str>) -> Option<bool> {
    effort.map(|e| !matches!(e, "none" | "minimal"))
}

pub fn sampling(
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
) -> SamplingParams {
    SamplingParams {
        temperature: temperature.unwrap_or(1.0),
        top_k: top_k.unwrap_or(0).max(0) as usize,
        top_p: top_p.unwrap_or(1.0),
        min_p: min_p.unwrap_or(0.0),
        repetition_penalty: repetition_penalty.unwrap_or(1.0),
        seed: seed.map_or_else(rand_seed, |s| s as u64),
    }
}

fn rand_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// OpenAI `tools` → function definitions; other tool types are skipped.
pub fn function_tools(tools: &[Value]) -> Vec<ToolDef> {
    tools
        .iter()
        .filter_map(|t| {
            if t.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
                return None;
            }
            // Chat Completions nests under `function`; the Responses API does not.
            let f = t.get("function").unwrap_or(t);
            Some(ToolDef {
                name: f.get("name")?.as_str()?.to_string(),
                description: f.get("description").and_then(Value::as_str).map(str::to_string),
                parameters: f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
            })
        })
        .collect()
}

/// `tool_choice`: "auto" | "none" | "required" | {"type": "function", "function": {"name"}} (or `{"name"}`).
pub fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    Ok(match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" | "any" => ToolChoice::Required,
            other => return Err(ApiError::bad_request(Some("tool_choice"), format!("unknown tool_choice '{other}'"))),
        },
        Some(v) => {
            let name = v.pointer("/function/name").or_else(|| v.get("name")).and_then(Value::as_str);
            match (name, v.get("type").and_then(Value::as_str)) {
                (Some(n), _) => ToolChoice::Named(n.to_string()),
                (None, Some("auto")) => ToolChoice::Auto,
                (None, Some("none")) => ToolChoice::None,
                (None, Some("any" | "required")) => ToolChoice::Required,
                _ => ToolChoice::Auto,
            }
        }
    })
}

pub fn response_format(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(ResponseFormat::Text) };
    Ok(match v.get("type").and_then(Value::as_str) {
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => {
            // Chat Completions: {json_schema: {schema}}; Responses: {schema} inline.
            let schema = v.pointer("/json_schema/schema").or_else(|| v.get("schema")).cloned();
            match schema {
                Some(s) => ResponseFormat::JsonSchema(s),
                None => {
                    return Err(ApiError::bad_request(
                        Some("response_format.json_schema.schema"),
                        "json_schema needs a schema",
                    ))
                }
            }
        }
        _ => ResponseFormat::Text,
    })
}

/// Checks each message's role and content type (the errors name `messages[i]…`).
pub fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(Some("messages"), "messages must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        match role {
            Some("system" | "developer" | "user" | "assistant" | "tool" | "function") => {}
            Some(r) => {
                return Err(ApiError::bad_request(Some(&format!("messages[{i}].role")), format!("unknown role '{r}'")))
            }
            None => {
                return Err(ApiError::bad_request(
                    Some(&format!("messages[{i}].role")),
                    "each message needs a string role",
                ))
            }
        }
        match m.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    Some(&format!("messages[{i}].content")),
                    "content must be a string or an array of parts",
                ))
            }
        }
    }
    Ok(())
}

impl ChatCompletionRequest {
    fn into_chat(self) -> Result<(ChatRequest, bool, bool), ApiError> {
        check_messages(&self.messages)?;
        let (max_tokens, field) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => (Some(n), "max_completion_tokens"),
            (None, n) => (n, "max_tokens"),
        };
        let include_usage = self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
        let req = ChatRequest {
            tools: function_tools(self.tools.as_deref().unwrap_or_default()),
            tool_choice: tool_choice(self.tool_choice.as_ref())?,
            response_format: response_format(self.response_format.as_ref())?,
            max_tokens,
            max_tokens_field: field,
            thinking: thinking_from_effort(self.reasoning_effort.as_deref()),
            sampling: sampling(
                self.temperature,
                self.top_p,
                self.top_k,
                self.min_p,
                self.repetition_penalty,
                self.seed,
            ),
            stop: Stop::into_vec(self.stop),
            ignore_eos: self.ignore_eos,
            draft: self.draft.choice()?,
            messages: self.messages,
        };
        Ok((req, self.stream, include_usage))
    }
}

/// OpenAI usage; `prompt_tokens` counts cached tokens too, as OpenAI's does.
fn usage_json(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens}})
}

pub async fn chat_completions(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    one_choice(body.n)?;
    let (req, stream, include_usage) = body.into_chat()?;
    let prepared = prepare_chat(&state, &req)?;
    let mut generation = start(&state, prepared)?;
    let id = new_id("chatcmpl-");
    let created = unix_now();
    let model = state.cfg.served_model_name.clone();
    if !stream {
        let out = generation.collect().await?;
        let calls: Vec<Value> = out
            .calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": if out.text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(out.text) }});
        if !out.reasoning.is_empty() {
            message["reasoning_content"] = Value::String(out.reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        return Ok(Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": out.finish.openai(), "logprobs": null}],
            "usage": usage_json(out.usage),
            "system_fingerprint": "shardlm",
        }))
        .into_response());
    }
    Ok(sse(&state, move |sink| async move {
        let chunk = |delta: Value, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": "shardlm",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        };
        if !sink.data(&chunk(json!({"role": "assistant", "content": ""}), None)).await {
            return;
        }
        while let Some(d) = sink.next(&mut generation).await {
            let ok = match d {
                Delta::Text(t) => sink.data(&chunk(json!({"content": t}), None)).await,
                Delta::Reasoning(r) => sink.data(&chunk(json!({"reasoning_content": r}), None)).await,
                Delta::CallStart { index, id, name } => {
                    let delta = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                        "function": {"name": name, "arguments": ""}}]});
                    sink.data(&chunk(delta, None)).await
                }
                Delta::CallArgs { index, fragment } => {
                    let delta = json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]});
                    sink.data(&chunk(delta, None)).await
                }
                Delta::CallEnd { .. } => true,
                Delta::End { finish, usage } => {
                    sink.data(&chunk(json!({}), Some(finish.openai()))).await;
                    if include_usage {
                        let mut last = chunk(json!({}), None);
                        last["choices"] = json!([]);
                        last["usage"] = usage_json(usage);
                        sink.data(&last).await;
                    }
                    break;
                }
                Delta::Error(e) => {
                    sink.data(&json!({"error": {"message": e, "type": "server_error", "param": null, "code": "500"}}))
                        .await;
                    break;
                }
            };
            if !ok {
                return;
            }
        }
        sink.send(Event::default().data("[DONE]")).await;
    }))
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Value,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub echo: bool,
    /// As in chat completions: run to `max_tokens` whatever the model says.
    #[serde(default)]
    pub ignore_eos: bool,
    pub n: Option<i64>,
    /// Extension: speculative decoding (`draft`, `draft_max`, `draft_min`).
    #[serde(flatten)]
    pub draft: crate::chat::DraftFields,
}

pub async fn completions(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    one_choice(body.n)?;
    let prompt = match &body.prompt {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
        _ => return Err(ApiError::bad_request(Some("prompt"), "prompt must be a string (or a list of one string)")),
    };
    let sampling = sampling(body.temperature, body.top_p, body.top_k, body.min_p, body.repetition_penalty, body.seed);
    // Legacy completions default to 16 tokens, as OpenAI's do.
    let max_tokens = body.max_tokens.or(Some(16));
    let mut prepared = prepare_text(&state, &prompt, max_tokens, sampling, Stop::into_vec(body.stop))?;
    prepared.request.ignore_eos = body.ignore_eos;
    prepared.request.draft = body.draft.choice()?;
    let mut generation = start(&state, prepared)?;
    let id = new_id("cmpl-");
    let created = unix_now();
    let model = state.cfg.served_model_name.clone();
    let echo = if body.echo { prompt } else { String::new() };
    if !body.stream {
        let out = generation.collect().await?;
        return Ok(Json(json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": format!("{echo}{}", out.text), "finish_reason": out.finish.openai(), "logprobs": null}],
            "usage": usage_json(out.usage),
        }))
        .into_response());
    }
    let include_usage = body.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    Ok(sse(&state, move |sink| async move {
        let chunk = |text: &str, finish: Option<&str>| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": null}]})
        };
        if !echo.is_empty() && !sink.data(&chunk(&echo, None)).await {
            return;
        }
        while let Some(d) = sink.next(&mut generation).await {
            match d {
                Delta::Reasoning(_) | Delta::CallStart { .. } | Delta::CallEnd { .. } => {}
                Delta::Text(t) | Delta::CallArgs { fragment: t, .. } => {
                    if !sink.data(&chunk(&t, None)).await {
                        return;
                    }
                }
                Delta::End { finish, usage } => {
                    sink.data(&chunk("", Some(finish.openai()))).await;
                    if include_usage {
                        let mut last = chunk("", None);
                        last["choices"] = json!([]);
                        last["usage"] = usage_json(usage);
                        sink.data(&last).await;
                    }
                    break;
                }
                Delta::Error(e) => {
                    sink.data(&json!({"error": {"message": e, "type": "server_error"}})).await;
                    break;
                }
            }
        }
        sink.send(Event::default().data("[DONE]")).await;
    }))
}

fn model_json(state: &SharedState) -> Value {
    json!({"id": state.cfg.served_model_name, "object": "model", "created": state.started, "owned_by": "shardlm",
           "context_length": state.cfg.context,
           // Anthropic's model list fields, so both SDKs can read it.
           "type": "model", "display_name": state.cfg.served_model_name,
           "created_at": chrono_like(state.started)})
}

/// RFC 3339 (UTC) from unix seconds, without a date library.
fn chrono_like(secs: u64) -> String {
    let days = secs / 86400;
    let rem = secs % 86400;
    // Civil-from-days (Howard Hinnant).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

pub async fn models(State(state): State<SharedState>) -> Json<Value> {
    let m = model_json(&state);
    Json(json!({"object": "list", "data": [m], "has_more": false, "first_id": state.cfg.served_model_name,
                "last_id": state.cfg.served_model_name}))
}

/// `GET /v1/models/{id}`: any name answers with the one model, as the requests do.
pub async fn model(State(state): State<SharedState>, Path(_id): Path<String>) -> Json<Value> {
    Json(model_json(&state))
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_reports_cached_prompt_tokens() {
        let u = super::usage_json(super::Usage { prompt_tokens: 100, cached_tokens: 64, completion_tokens: 5 });
        assert_eq!(u["prompt_tokens"], 100);
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 64);
        assert_eq!(u["total_tokens"], 105);
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::chrono_like(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::chrono_like(1_800_000_000), "2027-01-15T08:00:00Z");
    }
}
