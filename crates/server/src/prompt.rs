//! From a `ChatRequest` to what the engine runs: messages rendered with the
//! model's chat template (tools passed to it, or described in the system prompt
//! when it has no tool support), tokenized, `max_tokens` clamped to the room
//! left in the context, the JSON guide built for forced calls and schemas.

use crate::chat::{ChatRequest, Generation, ResponseFormat, ToolChoice, ToolDef};
use crate::error::ApiError;
use crate::guide::JsonGuide;
use crate::guide_schema::{CallAlt, CallArgs, XmlParam};
use crate::lazy_guide::LazyCalls;
use crate::reasoning::ThinkSplitter;
use crate::state::AppState;
use crate::toolfmt::Tools;
use crate::tools::{ForcedArgs, ForcedForm, ToolFormat, ToolSplitter};
use crate::Schema;
use axum::http::StatusCode;
use engine::generate::GenerateRequest;
use engine::sampler::SamplingParams;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What to submit to the engine for one request.
pub struct Prepared {
    pub request: GenerateRequest,
    pub guide: Option<JsonGuide>,
    /// Guides calls the model opens on its own (tools offered, `tool_choice` auto).
    pub lazy: Option<LazyCalls>,
    pub splitter: ToolSplitter,
    pub think: Option<ThinkSplitter>,
}

impl Prepared {
    pub fn prompt_tokens(&self) -> usize {
        self.request.prompt_ids.len()
    }
}

/// The tools as the OpenAI `tools` array templates expect.
fn tools_json(tools: &[ToolDef]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description.clone().unwrap_or_default(), "parameters": t.parameters}})
            })
            .collect(),
    )
}

/// The Hermes tool prompt (as Qwen 2.5's template writes it) for templates that
/// ignore `tools`.
fn injected_tool_prompt(tools: &[ToolDef]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools_json(tools).as_array().into_iter().flatten() {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments \
         within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    s
}

/// Text of a message's content (string, parts or null).
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                _ => p.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Messages as the template gets them. Native tool templates get `tool_calls`
/// with arguments as objects (what HF templates `tojson`); the others get the
/// calls and results written out in the Hermes format. `developer` → `system`.
fn template_messages(req: &ChatRequest, format: ToolFormat, extra_system: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(req.messages.len() + 1);
    for m in &req.messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let role = if role == "developer" { "system" } else { role };
        let mut msg = json!({"role": role, "content": content_text(m.get("content"))});
        if let (true, Some(Value::Array(parts))) = (role == "user", m.get("content")) {
            msg["content"] = Value::Array(parts.clone());
        }
        // Earlier reasoning goes to the template, which keeps or drops it as its model expects.
        if let (true, true, Some(Value::String(r))) = (role == "assistant", format.native(), m.get("reasoning_content"))
        {
            msg["reasoning_content"] = Value::String(r.clone());
        }
        let calls: Vec<&Value> = m.get("tool_calls").and_then(Value::as_array).into_iter().flatten().collect();
        if role == "tool" && !format.native() {
            let text = content_text(m.get("content"));
            msg = json!({"role": "user", "content": format!("<tool_response>\n{text}\n</tool_response>")});
        } else if role == "tool" {
            if let Some(id) = m.get("tool_call_id") {
                msg["tool_call_id"] = id.clone();
            }
            if let Some(name) = m.get("name") {
                msg["name"] = name.clone();
            }
        }
        if !calls.is_empty() {
            let as_object = |c: &Value| {
                let f = c.get("function").unwrap_or(c);
                let args = match f.get("arguments") {
                    Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
                    Some(v) => v.clone(),
                    None => json!({}),
                };
                (f.get("name").cloned().unwrap_or(Value::Null), args)
            };
            if format.native() {
                let list: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let (name, args) = as_object(c);
                        json!({"id": c.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                               "function": {"name": name, "arguments": args}})
                    })
                    .collect();
                msg["tool_calls"] = Value::Array(list);
            } else {
                let mut text = msg["content"].as_str().unwrap_or_default().to_string();
                for c in calls {
                    let (name, args) = as_object(c);
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": args})));
                }
                msg["content"] = Value::String(text);
            }
        }
        // Consecutive tool results become one user turn for the injected format.
        let merge = !format.native()
            && role == "tool"
            && out.last().is_some_and(|p: &Value| {
                p["role"] == "user" && p["content"].as_str().is_some_and(|c| c.ends_with("</tool_response>"))
            });
        if merge {
            let prev = out.last_mut().expect("checked");
            let joined = format!(
                "{}\n{}",
                prev["content"].as_str().unwrap_or_default(),
                msg["content"].as_str().unwrap_or_default()
            );
            prev["content"] = Value::String(joined);
        } else {
            out.push(msg);
        }
    }
    if !extra_system.is_empty() {
        match out.first_mut() {
            Some(first) if first["role"] == "system" => {
                let text = format!("{}\n\n{extra_system}", content_text(first.get("content")));
                first["content"] = Value::String(text);
            }
            _ => out.insert(0, json!({"role": "system", "content": extra_system})),
        }
    }
    out
}

/// A minimal prompt for models without a chat template.
fn plain_prompt(messages: &[Value]) -> String {
    let mut s = String::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("user");
        s.push_str(&format!("{role}: {}\n", content_text(m.get("content"))));
    }
    s.push_str("assistant:");
    s
}

/// A rendered chat: the prompt, the guide's target, and the markup the prompt
/// ends with on the model's behalf (the parser reads it first).
struct Rendered {
    text: String,
    /// The tools a forced call picks from.
    forced: Option<Vec<ToolDef>>,
    /// JSON output (`response_format`).
    schema: Option<Value>,
    prime: String,
}

fn render(state: &AppState, req: &ChatRequest) -> Result<Rendered, ApiError> {
    let format = state.tool_format;
    let use_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
    let tools: Vec<ToolDef> = match &req.tool_choice {
        ToolChoice::Named(name) => {
            let t: Vec<ToolDef> = req.tools.iter().filter(|t| &t.name == name).cloned().collect();
            if t.is_empty() {
                return Err(ApiError::bad_request(
                    Some("tool_choice"),
                    format!("tool_choice names '{name}', which is not in tools"),
                ));
            }
            t
        }
        _ => req.tools.clone(),
    };
    let forced = use_tools && matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
    let mut extra = String::new();
    if use_tools && !format.native() {
        extra.push_str(&injected_tool_prompt(&tools));
    }
    let schema = match &req.response_format {
        _ if forced => None,
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => {
            if !extra.is_empty() {
                extra.push_str("\n\n");
            }
            extra.push_str("Respond with a JSON object only.");
            Some(json!({"type": "object"}))
        }
        ResponseFormat::JsonSchema(s) => {
            if !extra.is_empty() {
                extra.push_str("\n\n");
            }
            extra.push_str(&format!("Respond with JSON only, matching this JSON schema:\n{s}"));
            Some(s.clone())
        }
    };
    let messages = template_messages(req, format, &extra);
    let mut text = match &state.template {
        Some(t) => {
            let tools_arg = (use_tools && format.native()).then(|| tools_json(&tools));
            let extra = req.thinking.map(|on| json!({"enable_thinking": on}));
            t.render(&Value::Array(messages), tools_arg.as_ref(), true, extra.as_ref())
                .map_err(|e| ApiError::bad_request(Some("messages"), format!("the chat template failed: {e}")))?
        }
        None => plain_prompt(&messages),
    };
    let mut prime = String::new();
    if forced {
        // The family's opening markup ends the prompt; with one tool its name too.
        let form = format.forced(&tools[0].name);
        prime.push_str(form.prefix);
        if tools.len() == 1 {
            prime.push_str(&form.head);
        }
    } else if schema.is_some() && format == ToolFormat::Harmony {
        prime.push_str("<|channel|>final<|message|>");
    }
    text.push_str(&prime);
    Ok(Rendered { text, forced: forced.then_some(tools), schema, prime })
}

/// The guide's grammar for one forced call in `format`'s markup (the prompt
/// already holds the prefix, and the head when there is one tool).
fn forced_call_grammar(format: ToolFormat, tools: &[ToolDef]) -> Result<Schema, crate::SchemaError> {
    let one = tools.len() == 1;
    call_grammar(tools, |name| vec![format.forced(name)], |form| if one { String::new() } else { form.head.clone() })
        .map(|s| s.with_stops(format.string_stops()))
}

/// The lazy guide's grammar: one call of any tool, whole, in any of the
/// family's shapes ([`ToolFormat::lazy_forms`]).
fn lazy_call_grammar(format: ToolFormat, tools: &[ToolDef]) -> Result<Schema, crate::SchemaError> {
    call_grammar(tools, |name| format.lazy_forms(name), |form| form.head.clone())
        .map(|s| s.with_stops(format.string_stops()))
}

fn call_grammar(
    tools: &[ToolDef],
    forms: impl Fn(&str) -> Vec<ForcedForm>,
    head: impl Fn(&ForcedForm) -> String,
) -> Result<Schema, crate::SchemaError> {
    let any = json!({"type": "object"});
    let alts: Vec<CallAlt> = tools
        .iter()
        .flat_map(|t| forms(&t.name).into_iter().map(move |form| (t, form)))
        .map(|(t, form)| {
            let params = if t.parameters.is_object() { &t.parameters } else { &any };
            let args = match form.args {
                ForcedArgs::Json => CallArgs::Json(params),
                ForcedArgs::Xml { open, close, after } => {
                    let required: Vec<&str> = params
                        .get("required")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    let props = params.get("properties").and_then(Value::as_object);
                    CallArgs::Xml(
                        props
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| XmlParam {
                                open: open(k),
                                schema: v,
                                close: close.to_string(),
                                after: after.to_string(),
                                required: required.contains(&k.as_str()),
                            })
                            .collect(),
                    )
                }
            };
            CallAlt { head: head(&form), args, tail: form.tail.to_string() }
        })
        .collect();
    Schema::calls(&alts)
}

/// Tokenizes prompt text (BOS added unless the template wrote it).
pub fn tokenize(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    let has_bos = state.bos_token.as_deref().is_some_and(|b| !b.is_empty() && text.starts_with(b));
    state.tokenizer.encode(text, !has_bos).map_err(|e| ApiError::bad_request(Some("messages"), e.to_string()))
}

/// The prompt's token count (Anthropic `count_tokens`).
pub fn count_chat_tokens(state: &AppState, req: &ChatRequest) -> Result<usize, ApiError> {
    Ok(tokenize(state, &render(state, req)?.text)?.len())
}

/// `max_tokens` checked (> 0) and clamped to the room left in the context.
fn clamp_max_tokens(
    state: &AppState,
    asked: Option<i64>,
    field: &str,
    prompt: usize,
    param: &str,
) -> Result<usize, ApiError> {
    let ctx = state.cfg.context;
    if prompt >= ctx {
        return Err(ApiError::bad_request(
            Some(param),
            format!("the prompt is {prompt} tokens, which does not fit the context of {ctx} tokens"),
        ));
    }
    let room = ctx - prompt;
    match asked {
        Some(n) if n <= 0 => Err(ApiError::bad_request(Some(field), format!("{field} must be at least 1, got {n}"))),
        Some(n) => Ok((n as usize).min(room)),
        None => Ok(state.cfg.max_tokens_default.unwrap_or(room).min(room)),
    }
}

pub fn prepare_chat(state: &AppState, req: &ChatRequest) -> Result<Prepared, ApiError> {
    req.sampling.validate().map_err(|e| ApiError::bad_request(Some(sampling_field(&e)), e))?;
    let Rendered { text, forced, schema, prime } = render(state, req)?;
    let prompt_ids = tokenize(state, &text)?;
    let max_tokens = clamp_max_tokens(state, req.max_tokens, req.max_tokens_field, prompt_ids.len(), "messages")?;
    let compiled = match (&forced, &schema) {
        (Some(tools), _) => Some(
            forced_call_grammar(state.tool_format, tools)
                .map_err(|e| ApiError::bad_request(Some("tools"), e.to_string()))?,
        ),
        (None, Some(s)) => {
            let compiled =
                Schema::compile(s).map_err(|e| ApiError::bad_request(Some("response_format"), e.to_string()))?;
            // Harmony's parser reads even a plain answer, and ends it at its markers.
            let stops = if state.tool_format.structured_output() { state.tool_format.string_stops() } else { &[] };
            Some(compiled.with_stops(stops))
        }
        (None, None) => None,
    };
    let guide = compiled.map(|c| JsonGuide::new(Arc::new(c), state.vocab.clone()));
    let parse_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
    // Unforced calls: guided from their first marker on (`lazy_guide`). A tool
    // set the guide cannot compile leaves them free (the parser still reads them).
    let lazy = if parse_tools && guide.is_none() {
        match lazy_call_grammar(state.tool_format, &req.tools) {
            Ok(g) => Some(LazyCalls::new(state.tool_format.lazy_triggers(), Arc::new(g), state.vocab.clone())),
            Err(e) => {
                tracing::warn!("calls the model opens will not be guided: {e}");
                None
            }
        }
    } else {
        None
    };
    let tools = Tools::new(req.tools.iter().map(|t| (t.name.as_str(), &t.parameters)));
    let splitter = if parse_tools || state.tool_format.structured_output() {
        ToolSplitter::new(state.tool_format, tools, &prime)
    } else {
        ToolSplitter::new_plain()
    };
    // Reasoning templates: split `<think>` text out (not when the output is guided).
    let think = (state.reasoning && guide.is_none()).then(|| ThinkSplitter::new(text.trim_end().ends_with("<think>")));
    Ok(Prepared {
        request: GenerateRequest {
            prompt_ids,
            max_tokens,
            sampling: req.sampling.clone(),
            stop_strings: req.stop.clone(),
            ignore_eos: req.ignore_eos,
            want_prompt_logits: false,
            draft: req.draft,
        },
        guide,
        lazy,
        splitter,
        think,
    })
}

/// A raw-text prompt (`/v1/completions`).
pub fn prepare_text(
    state: &AppState,
    prompt: &str,
    max_tokens: Option<i64>,
    sampling: SamplingParams,
    stop: Vec<String>,
) -> Result<Prepared, ApiError> {
    sampling.validate().map_err(|e| ApiError::bad_request(Some(sampling_field(&e)), e))?;
    let prompt_ids =
        state.tokenizer.encode(prompt, true).map_err(|e| ApiError::bad_request(Some("prompt"), e.to_string()))?;
    if prompt_ids.is_empty() {
        return Err(ApiError::bad_request(Some("prompt"), "the prompt is empty"));
    }
    let max_tokens = clamp_max_tokens(state, max_tokens, "max_tokens", prompt_ids.len(), "prompt")?;
    Ok(Prepared {
        request: GenerateRequest {
            prompt_ids,
            max_tokens,
            sampling,
            stop_strings: stop,
            ignore_eos: false,
            want_prompt_logits: false,
            draft: Default::default(),
        },
        guide: None,
        lazy: None,
        splitter: ToolSplitter::new_plain(),
        think: None,
    })
}

/// The request field a sampling validation message is about.
fn sampling_field(msg: &str) -> &'static str {
    if msg.starts_with("temperature") {
        "temperature"
    } else if msg.starts_with("top-p") {
        "top_p"
    } else if msg.starts_with("min-p") {
        "min_p"
    } else {
        "repetition_penalty"
    }
}

/// Submits a prepared request (429 when `--max-concurrency` requests are in).
/// While the cluster re-forms after losing a rank, a new request waits in the
/// queue, its wait bounded by `--request-timeout`; once the cluster has been
/// degraded for `--degraded-wait`, new ones get 503 with `Retry-After`.
pub fn start(state: &AppState, p: Prepared) -> Result<Generation, ApiError> {
    if let Some(d) = state.metrics.degraded_for().filter(|d| *d >= state.cfg.degraded_wait) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the cluster has been degraded for {:.0} s and is re-forming ({}); retry later",
                d.as_secs_f64(),
                state.metrics.degraded().unwrap_or_default()
            ),
        ));
    }
    if state.metrics.active.load(Relaxed) >= state.cfg.max_concurrency as i64 {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the server is at --max-concurrency ({}); retry later", state.cfg.max_concurrency),
        ));
    }
    let prompt_tokens = p.prompt_tokens();
    let guided = p.guide.is_some();
    let stops = !p.request.stop_strings.is_empty();
    let rx = state
        .engine
        .submit(p.request, p.guide, p.lazy)
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e))?;
    let mut g = Generation::new(rx, p.splitter, p.think, prompt_tokens, guided);
    g.stop_strings = stops;
    g.stall_timeout = Some(state.cfg.request_timeout);
    Ok(g)
}

#[cfg(test)]
#[path = "forced_tests.rs"]
mod forced_tests;
