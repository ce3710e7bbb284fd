//! OpenAI Responses API (`POST /v1/responses`), as Codex CLI speaks it: input
//! items (messages, `function_call`, `function_call_output`), function tools
//! (other tool types ignored), streaming events that always end in
//! `response.completed`. `reasoning`, `include`, `store`, `prompt_cache_key`,
//! `parallel_tool_calls` are accepted; nothing is stored, so
//! `previous_response_id` is not followed.

use crate::chat::{new_id, unix_now, ChatRequest, Collected, Delta, Finish, ToolCall, Usage};
use crate::error::ApiError;
use crate::http::{sse, ApiJson, SseSink};
use crate::openai::{function_tools, response_format, sampling, tool_choice};
use crate::prompt::{content_text, prepare_chat, start};
use crate::state::SharedState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Debug)]
pub struct ResponsesRequest {
    pub input: Value,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub text: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning: Option<Value>,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(param), msg)
}

/// Input items → OpenAI chat messages.
fn to_messages(req: &ResponsesRequest) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(i) = &req.instructions {
        out.push(json!({"role": "system", "content": i}));
    }
    let items = match &req.input {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": s})],
        Value::Array(a) => a.clone(),
        _ => return Err(bad("input", "input must be a string or an array of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(&format!("input[{i}].role"), format!("unknown role '{role}'")));
                }
                let content = content_text(item.get("content"));
                match out.last_mut() {
                    // The reasoning item before it belongs to this message.
                    Some(last) if role == "assistant" && last["role"] == "assistant" && last["content"] == "" => {
                        last["content"] = Value::String(content);
                    }
                    _ => out.push(json!({"role": role, "content": content})),
                }
            }
            "function_call" => {
                let call = json!({"id": item.get("call_id").cloned().unwrap_or(Value::Null), "type": "function",
                    "function": {"name": item.get("name").cloned().unwrap_or(Value::Null),
                                 "arguments": item.get("arguments").cloned().unwrap_or_else(|| json!("{}"))}});
                // Calls join the assistant turn just before them.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if !last["tool_calls"].is_array() {
                            last["tool_calls"] = json!([]);
                        }
                        last["tool_calls"].as_array_mut().expect("array").push(call);
                    }
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => content_text(Some(v)),
                    None => String::new(),
                };
                out.push(json!({"role": "tool", "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
                                "content": output}));
            }
            // Earlier reasoning joins the assistant turn that follows it.
            "reasoning" => {
                let text: String = item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("text").and_then(Value::as_str))
                    .collect();
                if !text.is_empty() {
                    out.push(json!({"role": "assistant", "content": "", "reasoning_content": text}));
                }
            }
            // web_search_call, local_shell_call…: nothing this model can use.
            _ => {}
        }
    }
    if out.iter().all(|m| m["role"] == "system") {
        return Err(bad("input", "input has no message"));
    }
    Ok(out)
}

fn to_chat(req: &ResponsesRequest) -> Result<ChatRequest, ApiError> {
    Ok(ChatRequest {
        messages: to_messages(req)?,
        tools: function_tools(req.tools.as_deref().unwrap_or_default()),
        tool_choice: tool_choice(req.tool_choice.as_ref())?,
        response_format: response_format(req.text.as_ref().and_then(|t| t.get("format")))?,
        max_tokens: req.max_output_tokens,
        max_tokens_field: "max_output_tokens",
        thinking: crate::openai::thinking_from_effort(
            req.reasoning.as_ref().and_then(|r| r.get("effort")).and_then(Value::as_str),
        ),
        sampling: sampling(req.temperature, req.top_p, None, None, None, None),
        stop: Vec::new(),
        ignore_eos: false,
        draft: Default::default(),
    })
}

/// The `response` object; `output` and `usage` filled at the end.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: bool,
}

impl Envelope {
    fn json(&self, status: &str, output: &[Value], usage: Option<Usage>, finish: Option<Finish>) -> Value {
        let incomplete = (finish == Some(Finish::Length)).then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "error": null, "incomplete_details": incomplete,
            "instructions": null, "metadata": {}, "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": null, "top_p": null, "tools": self.tools, "tool_choice": self.tool_choice,
            "reasoning": {"effort": null, "summary": null}, "store": false, "text": {"format": {"type": "text"}},
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens}, "output_tokens_details": {"reasoning_tokens": 0}})),
        })
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "output_text", "text": text, "annotations": []}])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, c: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": c.id, "name": c.name, "arguments": arguments, "status": status})
}

/// A reasoning item: the text as `reasoning_text` content (nothing is encrypted).
fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": content})
}

fn status_of(finish: Finish) -> &'static str {
    if finish == Finish::Length {
        "incomplete"
    } else {
        "completed"
    }
}

pub async fn responses(
    State(state): State<SharedState>,
    ApiJson(body): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let chat = to_chat(&body)?;
    let prepared = prepare_chat(&state, &chat)?;
    let mut generation = start(&state, prepared)?;
    let env = Envelope {
        id: new_id("resp_"),
        created: unix_now(),
        model: state.cfg.served_model_name.clone(),
        tools: Value::Array(body.tools.clone().unwrap_or_default()),
        tool_choice: body.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: body.parallel_tool_calls.unwrap_or(true),
    };
    if !body.stream {
        let Collected { text, calls, finish, usage, reasoning } = generation.collect().await?;
        let mut output = Vec::new();
        if !reasoning.is_empty() {
            output.push(reasoning_item(&new_id("rs_"), &reasoning, "completed"));
        }
        if !text.is_empty() || calls.is_empty() {
            output.push(message_item(&new_id("msg_"), &text, status_of(finish)));
        }
        output.extend(calls.iter().map(|c| call_item(&new_id("fc_"), c, &c.arguments, "completed")));
        return Ok(Json(env.json(status_of(finish), &output, Some(usage), Some(finish))).into_response());
    }
    Ok(sse(&state, move |sink| async move {
        let mut out = Emitter { sink, seq: 0 };
        if !out.send("response.created", json!({"response": env.json("in_progress", &[], None, None)})).await
            || !out.send("response.in_progress", json!({"response": env.json("in_progress", &[], None, None)})).await
        {
            return;
        }
        let mut output: Vec<Value> = Vec::new();
        // The open message item: (id, output index, text so far).
        let mut open: Option<(String, usize, String)> = None;
        // The open reasoning item and function call.
        let mut thinking: Option<(String, usize, String)> = None;
        let mut call: Option<(String, usize, ToolCall)> = None;
        while let Some(d) = out.sink.next(&mut generation).await {
            match d {
                Delta::Reasoning(r) => {
                    if thinking.is_none() {
                        let id = new_id("rs_");
                        let idx = output.len();
                        output.push(Value::Null);
                        out.send(
                            "response.output_item.added",
                            json!({"output_index": idx, "item": reasoning_item(&id, "", "in_progress")}),
                        )
                        .await;
                        thinking = Some((id, idx, String::new()));
                    }
                    let (id, idx, text) = thinking.as_mut().expect("opened");
                    text.push_str(&r);
                    let delta = json!({"item_id": id, "output_index": idx, "content_index": 0, "delta": r});
                    if !out.send("response.reasoning_text.delta", delta).await {
                        return;
                    }
                }
                Delta::Text(t) => {
                    if let Some((id, idx, text)) = thinking.take() {
                        out.close_reasoning(&mut output, &id, idx, &text).await;
                    }
                    if open.is_none() {
                        let id = new_id("msg_");
                        let idx = output.len();
                        output.push(Value::Null);
                        out.send(
                            "response.output_item.added",
                            json!({"output_index": idx, "item": message_item(&id, "", "in_progress")}),
                        )
                        .await;
                        out.send(
                            "response.content_part.added",
                            json!({"item_id": id, "output_index": idx,
                            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
                        )
                        .await;
                        open = Some((id, idx, String::new()));
                    }
                    let (id, idx, text) = open.as_mut().expect("opened");
                    text.push_str(&t);
                    let delta =
                        json!({"item_id": id, "output_index": idx, "content_index": 0, "delta": t, "logprobs": []});
                    if !out.send("response.output_text.delta", delta).await {
                        return;
                    }
                }
                Delta::CallStart { id: call_id, name, .. } => {
                    if let Some((id, idx, text)) = open.take() {
                        out.close_message(&mut output, &id, idx, &text, "completed").await;
                    }
                    if let Some((id, idx, text)) = thinking.take() {
                        out.close_reasoning(&mut output, &id, idx, &text).await;
                    }
                    let c = ToolCall { id: call_id, name, arguments: String::new() };
                    let id = new_id("fc_");
                    let idx = output.len();
                    output.push(Value::Null);
                    if !out
                        .send(
                            "response.output_item.added",
                            json!({"output_index": idx, "item": call_item(&id, &c, "", "in_progress")}),
                        )
                        .await
                    {
                        return;
                    }
                    call = Some((id, idx, c));
                }
                Delta::CallArgs { fragment, .. } => {
                    if let Some((id, idx, c)) = call.as_mut() {
                        c.arguments.push_str(&fragment);
                        let delta = json!({"item_id": id, "output_index": idx, "delta": fragment});
                        if !out.send("response.function_call_arguments.delta", delta).await {
                            return;
                        }
                    }
                }
                Delta::CallEnd { .. } => {
                    if let Some((id, idx, c)) = call.take() {
                        out.close_call(&mut output, &id, idx, &c).await;
                    }
                }
                Delta::End { finish, usage } => {
                    let status = status_of(finish);
                    if let Some((id, idx, text)) = thinking.take() {
                        out.close_reasoning(&mut output, &id, idx, &text).await;
                    }
                    if let Some((id, idx, c)) = call.take() {
                        out.close_call(&mut output, &id, idx, &c).await;
                    }
                    if let Some((id, idx, text)) = open.take() {
                        out.close_message(&mut output, &id, idx, &text, status).await;
                    }
                    // Codex waits for `response.completed` whatever the status.
                    let done = env.json(status, &output, Some(usage), Some(finish));
                    out.send("response.completed", json!({"response": done})).await;
                    return;
                }
                Delta::Error(e) => {
                    let mut failed = env.json("failed", &output, None, None);
                    failed["error"] = json!({"code": "server_error", "message": e});
                    out.send("response.failed", json!({"response": failed})).await;
                    return;
                }
            }
        }
    }))
}

/// Numbers the events (`sequence_number`) as it sends them.
struct Emitter {
    sink: SseSink,
    seq: u64,
}

impl Emitter {
    async fn send(&mut self, name: &'static str, mut v: Value) -> bool {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.sink.event(name, &v).await
    }

    async fn close_reasoning(&mut self, output: &mut [Value], id: &str, idx: usize, text: &str) {
        self.send(
            "response.reasoning_text.done",
            json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text}),
        )
        .await;
        let item = reasoning_item(id, text, "completed");
        output[idx] = item.clone();
        self.send("response.output_item.done", json!({"output_index": idx, "item": item})).await;
    }

    async fn close_call(&mut self, output: &mut [Value], id: &str, idx: usize, c: &ToolCall) {
        self.send(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": idx, "arguments": c.arguments}),
        )
        .await;
        let item = call_item(id, c, &c.arguments, "completed");
        output[idx] = item.clone();
        self.send("response.output_item.done", json!({"output_index": idx, "item": item})).await;
    }

    /// Emits the done events of a message item and records it in `output`.
    async fn close_message(&mut self, output: &mut [Value], id: &str, idx: usize, text: &str, status: &str) {
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.send(
            "response.output_text.done",
            json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text, "logprobs": []}),
        )
        .await;
        self.send(
            "response.content_part.done",
            json!({"item_id": id, "output_index": idx, "content_index": 0, "part": part}),
        )
        .await;
        let item = message_item(id, text, status);
        output[idx] = item.clone();
        self.send("response.output_item.done", json!({"output_index": idx, "item": item})).await;
    }
}
