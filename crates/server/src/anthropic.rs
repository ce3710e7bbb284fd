//! Anthropic: `POST /v1/messages` (also with `?beta=true`; `anthropic-beta`
//! headers are accepted whatever they say) and `/v1/messages/count_tokens`.
//! Messages become the OpenAI form (`chat::ChatRequest`): `tool_use` blocks →
//! assistant `tool_calls`, `tool_result` blocks → `tool` messages. A `thinking`
//! request is accepted and, on models without reasoning, answered without
//! thinking blocks.

use crate::chat::{new_id, ChatRequest, Delta, ToolCall, ToolDef, Usage};
use crate::error::{ApiError, Dialect};
use crate::http::{sse, ApiJson};
use crate::openai::{response_format, sampling, tool_choice};
use crate::prompt::{count_chat_tokens, prepare_chat, start};
use crate::state::SharedState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Debug)]
pub struct MessagesRequest {
    pub messages: Vec<AnthropicMessage>,
    pub system: Option<Value>,
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// Structured output: `{"format": {"type": "json_schema", "schema": {…}}}`.
    pub output_config: Option<Value>,
    /// The older spelling of the same (`{"type": "json_schema", "schema": {…}}`).
    pub output_format: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}`: reasoning templates think; others answer plainly.
    pub thinking: Option<Value>,
    /// Extension: speculative decoding (`draft`, `draft_max`, `draft_min`).
    #[serde(flatten)]
    pub draft: crate::chat::DraftFields,
}

#[derive(Deserialize, Debug)]
pub struct AnthropicMessage {
    pub role: String,
    pub content: Value,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), msg).in_dialect(Dialect::Anthropic)
}

/// Text of a block list or string (`system`, `tool_result.content`).
fn blocks_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

/// Anthropic messages → OpenAI messages.
fn to_openai(req: &MessagesRequest) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = &req.system {
        if !matches!(system, Value::String(_) | Value::Array(_)) {
            return Err(bad("system", "system must be a string or an array of text blocks"));
        }
        let text = blocks_text(system);
        if !text.is_empty() {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    if req.messages.is_empty() {
        return Err(bad("messages", "messages must not be empty"));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let blocks: Vec<Value> = match &m.content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => return Err(bad(&format!("messages[{i}].content"), "content must be a string or an array of blocks")),
        };
        let mut text = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        let mut thinking = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            match b.get("type").and_then(Value::as_str) {
                Some("thinking") => thinking.push(b.get("thinking").and_then(Value::as_str).unwrap_or_default()),
                Some("text") => text.push(b.get("text").and_then(Value::as_str).unwrap_or_default().to_string()),
                Some("tool_use") => {
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(&format!("messages[{i}].content[{j}].name"), "tool_use needs a name"))?;
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                                      "function": {"name": name, "arguments": input.to_string()}}));
                }
                Some("tool_result") => {
                    let mut content = b.get("content").map(blocks_text).unwrap_or_default();
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    results.push(
                        json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                                        "content": content}),
                    );
                }
                // redacted_thinking, image, document…: not for this model.
                _ => {}
            }
        }
        match m.role.as_str() {
            "user" => {
                out.extend(results);
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                }
            }
            "assistant" => {
                let mut msg = json!({"role": "assistant", "content": text.join("\n")});
                if !thinking.is_empty() {
                    // The template keeps or drops it, as its model expects.
                    msg["reasoning_content"] = Value::String(thinking.concat());
                }
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
            r => return Err(bad(&format!("messages[{i}].role"), format!("role must be user or assistant, got '{r}'"))),
        }
    }
    Ok(out)
}

/// Client tools (those with an `input_schema`); server tools are skipped.
fn tools(req: &MessagesRequest) -> Vec<ToolDef> {
    req.tools
        .iter()
        .flatten()
        .filter_map(|t| {
            Some(ToolDef {
                name: t.get("name")?.as_str()?.to_string(),
                description: t.get("description").and_then(Value::as_str).map(str::to_string),
                parameters: t.get("input_schema")?.clone(),
            })
        })
        .collect()
}

fn to_chat(req: MessagesRequest) -> Result<ChatRequest, ApiError> {
    let messages = to_openai(&req)?;
    let format = req.output_config.as_ref().and_then(|c| c.get("format")).or(req.output_format.as_ref());
    Ok(ChatRequest {
        tools: tools(&req),
        tool_choice: tool_choice(req.tool_choice.as_ref()).map_err(|e| e.in_dialect(Dialect::Anthropic))?,
        response_format: response_format(format).map_err(|e| e.in_dialect(Dialect::Anthropic))?,
        max_tokens: req.max_tokens,
        max_tokens_field: "max_tokens",
        thinking: Some(req.thinking.as_ref().and_then(|t| t.get("type")).and_then(Value::as_str) == Some("enabled")),
        // Anthropic's default temperature is 1.
        sampling: sampling(req.temperature, req.top_p, req.top_k, None, None, None),
        stop: req.stop_sequences.unwrap_or_default(),
        ignore_eos: false,
        draft: req.draft.choice().map_err(|e| e.in_dialect(Dialect::Anthropic))?,
        messages,
    })
}

/// Anthropic usage. Their total input is the sum of `input_tokens`,
/// `cache_creation_input_tokens` and `cache_read_input_tokens`, so `input_tokens`
/// is only the prefilled part; the prefix cache fills itself without being
/// asked, so nothing counts as a cache write.
fn usage(u: Usage) -> Value {
    json!({"input_tokens": u.uncached_prompt_tokens(), "output_tokens": u.completion_tokens,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens})
}

/// A tool call's arguments as the `input` object.
fn input_of(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

pub async fn messages(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<MessagesRequest>,
) -> Result<Response, ApiError> {
    let stream = body.stream;
    let chat = to_chat(body)?;
    let prepared = prepare_chat(&state, &chat).map_err(|e| e.in_dialect(Dialect::Anthropic))?;
    let mut generation = start(&state, prepared).map_err(|e| e.in_dialect(Dialect::Anthropic))?;
    let id = new_id("msg_");
    let model = state.cfg.served_model_name.clone();
    if !stream {
        let out = generation.collect().await.map_err(|e| e.in_dialect(Dialect::Anthropic))?;
        let mut content = Vec::new();
        if !out.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": out.reasoning, "signature": ""}));
        }
        if !out.text.is_empty() || out.calls.is_empty() {
            content.push(json!({"type": "text", "text": out.text}));
        }
        for c in &out.calls {
            content.push(json!({"type": "tool_use", "id": ToolCall::anthropic_id(&c.id), "name": c.name,
                                "input": input_of(&c.arguments)}));
        }
        let stop_sequence = generation.stop_sequence.clone();
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": out.finish.anthropic(stop_sequence.is_some()), "stop_sequence": stop_sequence,
            "usage": usage(out.usage),
        }))
        .into_response());
    }
    let prompt_tokens = generation.prompt_tokens;
    Ok(sse(&state, move |sink| async move {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            // How much of the prompt was cached is known only at the end: until
            // then it all counts as input; `message_delta` carries the split.
            "usage": usage(Usage { prompt_tokens, cached_tokens: 0, completion_tokens: 0 })}});
        if !sink.event("message_start", &start).await || !sink.event("ping", &json!({"type": "ping"})).await {
            return;
        }
        // Index of the open block, if it is a text block.
        let mut index = 0usize;
        let mut text_open = false;
        let mut thinking_open = false;
        let mut any_block = false;
        // A tool_use block is open (its CallEnd has not come).
        let mut call_open = false;
        while let Some(d) = sink.next(&mut generation).await {
            let ok = match d {
                Delta::Reasoning(r) => {
                    let mut ok = true;
                    if !thinking_open {
                        thinking_open = true;
                        any_block = true;
                        ok = sink
                            .event(
                                "content_block_start",
                                &json!({"type": "content_block_start", "index": index,
                                    "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                            )
                            .await;
                    }
                    ok && sink
                        .event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "thinking_delta", "thinking": r}}),
                        )
                        .await
                }
                Delta::Text(t) => {
                    if thinking_open {
                        close_thinking(&sink, index).await;
                        thinking_open = false;
                        index += 1;
                    }
                    let mut ok = true;
                    if !text_open {
                        text_open = true;
                        any_block = true;
                        ok = sink
                            .event(
                                "content_block_start",
                                &json!({"type": "content_block_start", "index": index,
                                    "content_block": {"type": "text", "text": ""}}),
                            )
                            .await;
                    }
                    ok && sink
                        .event(
                            "content_block_delta",
                            &json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "text_delta", "text": t}}),
                        )
                        .await
                }
                Delta::CallStart { id, name, .. } => {
                    if thinking_open {
                        close_thinking(&sink, index).await;
                        thinking_open = false;
                        index += 1;
                    }
                    if text_open {
                        sink.event("content_block_stop", &json!({"type": "content_block_stop", "index": index})).await;
                        text_open = false;
                        index += 1;
                    }
                    any_block = true;
                    call_open = true;
                    sink.event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": index,
                            "content_block": {"type": "tool_use", "id": ToolCall::anthropic_id(&id), "name": name, "input": {}}}),
                    )
                    .await
                }
                Delta::CallArgs { fragment, .. } => {
                    sink.event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                    )
                    .await
                }
                Delta::CallEnd { .. } => {
                    call_open = false;
                    let ok =
                        sink.event("content_block_stop", &json!({"type": "content_block_stop", "index": index})).await;
                    index += 1;
                    ok
                }
                Delta::End { finish, usage: u } => {
                    if call_open {
                        sink.event("content_block_stop", &json!({"type": "content_block_stop", "index": index})).await;
                        index += 1;
                    }
                    if thinking_open {
                        close_thinking(&sink, index).await;
                        index += 1;
                    }
                    if !any_block {
                        sink.event(
                            "content_block_start",
                            &json!({"type": "content_block_start", "index": 0,
                                "content_block": {"type": "text", "text": ""}}),
                        )
                        .await;
                        text_open = true;
                    }
                    if text_open {
                        sink.event("content_block_stop", &json!({"type": "content_block_stop", "index": index})).await;
                    }
                    let stop_sequence = generation.stop_sequence.clone();
                    sink.event("message_delta", &json!({"type": "message_delta",
                        "delta": {"stop_reason": finish.anthropic(stop_sequence.is_some()), "stop_sequence": stop_sequence},
                        "usage": usage(u)}))
                        .await;
                    sink.event("message_stop", &json!({"type": "message_stop"})).await;
                    return;
                }
                Delta::Error(e) => {
                    sink.event("error", &json!({"type": "error", "error": {"type": "api_error", "message": e}})).await;
                    return;
                }
            };
            if !ok {
                return;
            }
        }
    }))
}

/// Ends a thinking block (an empty signature: nothing to verify here).
async fn close_thinking(sink: &crate::http::SseSink, index: usize) {
    sink.event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "signature_delta", "signature": ""}}),
    )
    .await;
    sink.event("content_block_stop", &json!({"type": "content_block_stop", "index": index})).await;
}

#[derive(Deserialize, Debug)]
pub struct CountTokensRequest {
    pub messages: Vec<AnthropicMessage>,
    pub system: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
}

pub async fn count_tokens(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<CountTokensRequest>,
) -> Result<Json<Value>, ApiError> {
    let req = MessagesRequest {
        messages: body.messages,
        system: body.system,
        max_tokens: Some(1),
        stop_sequences: None,
        temperature: None,
        top_p: None,
        top_k: None,
        stream: false,
        tools: body.tools,
        tool_choice: body.tool_choice,
        output_config: None,
        output_format: None,
        thinking: None,
        draft: Default::default(),
    };
    let chat = to_chat(req)?;
    let n = count_chat_tokens(&state, &chat).map_err(|e| e.in_dialect(Dialect::Anthropic))?;
    Ok(Json(json!({"input_tokens": n})))
}

#[cfg(test)]
mod tests {
    #[test]
    fn usage_splits_the_prompt_into_input_and_cache_read() {
        let u = super::usage(super::Usage { prompt_tokens: 100, cached_tokens: 64, completion_tokens: 5 });
        assert_eq!(u["input_tokens"], 36);
        assert_eq!(u["cache_read_input_tokens"], 64);
        assert_eq!(u["cache_creation_input_tokens"], 0);
        assert_eq!(u["output_tokens"], 5);
    }
}
