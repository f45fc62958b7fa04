//! Anthropic's Messages API (`POST /v1/messages`): the request, the `message` response, the
//! streaming event sequence and the error shape, as Anthropic documents them
//! (docs.anthropic.com: "Messages", "Streaming Messages", "Errors").
//!
//! The request becomes the same [`GenRequest`] the OpenAI endpoints make (the `system` prompt as a
//! leading `system` message, rendered by the model's chat template); generation, batching,
//! cancellation and the KV cache are shared. What Anthropic's API can ask but coli cannot do
//! (tool use, images, documents, extended thinking, a prefilled assistant turn) is refused with a
//! 400 naming the field.

use super::api::{ApiError, GenRequest, Prompt};
use super::tool_use::{self, ToolRequest};
use super::worker::{Event, Finish};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use coli_engine::tool_calls::ParsedCall;
use coli_engine::ChatMessage;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use tokio::sync::mpsc;

/// Most stop sequences a request may give.
pub const MAX_STOP_SEQUENCES: usize = 64;

/// Anthropic's error `type` for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The error body `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// `e` as an Anthropic error response (its status; `Retry-After` kept).
pub fn error_response(e: &ApiError) -> Response {
    let mut r = (e.status, axum::Json(error_body(e))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!("{param}: {what} is not supported by coli serve."),
    )
}

/// The text of a content value: a string, or text blocks (`{"type": "text", "text"}`; a
/// `cache_control` on a block is accepted and ignored). Other block types are refused.
fn content_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                out.push_str(&block_text(b, &format!("{param}[{j}]"))?);
            }
            Ok(out)
        }
        other => Err(ApiError::wrong_type(
            param,
            "a string or an array of content blocks",
            other,
        )),
    }
}

/// The text of one text block `p`; other block types are refused.
fn block_text(b: &Value, p: &str) -> Result<String, ApiError> {
    match b.get("type").and_then(Value::as_str) {
        Some("text") => match b.get("text") {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(t) => Err(ApiError::wrong_type(&format!("{p}.text"), "a string", t)),
            None => Err(ApiError::invalid(
                &format!("{p}.text"),
                format!("{p}.text: Field required"),
            )),
        },
        Some(other) => Err(unsupported(
            &format!("{p}.type"),
            &format!("a content block of type \"{other}\" (only \"text\", \"tool_use\" and \"tool_result\")"),
        )),
        None => Err(ApiError::invalid(
            &format!("{p}.type"),
            format!("{p}.type: Field required"),
        )),
    }
}

fn number_in(
    obj: &Map<String, Value>,
    name: &str,
    lo: f64,
    hi: f64,
) -> Result<Option<f32>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if (lo..=hi).contains(&x) {
                Ok(Some(x as f32))
            } else {
                Err(ApiError::invalid(
                    name,
                    format!("{name}: Input should be between {lo} and {hi}, got {x}"),
                ))
            }
        }
        Some(v) => Err(ApiError::wrong_type(name, "a number", v)),
    }
}

/// Parses and validates a `POST /v1/messages` body: `model`, `max_tokens` and `messages`
/// required; `system`, `stop_sequences`, `temperature` (0..=1, default 1), `top_p`, `top_k`,
/// `metadata`, `stream`, `tools`, `tool_choice` (`auto`, `any`, `tool`, `none`), `tool_use` and
/// `tool_result` blocks and `output_config.format` (a JSON schema) honoured.
///
/// # Errors
/// 400 [`ApiError`] naming the field: missing, of the wrong type, out of range, a bad tool or
/// tool choice (a name not in `tools`, a `tool_result` for an unknown id, a schema that is not
/// an object schema), or asking for what coli cannot do (`thinking`, server tools, MCP servers,
/// image blocks, a last message from the assistant).
pub fn parse_request(body: &[u8]) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(ApiError::malformed)?;
    let Value::Object(obj) = v else {
        return Err(ApiError::malformed("not a JSON object"));
    };
    let model = match field(&obj, "model") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(ApiError::wrong_type("model", "a string", v)),
        None => return Err(ApiError::invalid("model", "model: Field required")),
    };
    let max_tokens = match field(&obj, "max_tokens") {
        Some(Value::Number(n)) => match n.as_u64() {
            Some(m) if m >= 1 => usize::try_from(m).unwrap_or(usize::MAX),
            _ => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens: Input should be an integer >= 1, got {n}"),
                ))
            }
        },
        Some(v) => return Err(ApiError::wrong_type("max_tokens", "an integer", v)),
        None => {
            return Err(ApiError::invalid(
                "max_tokens",
                "max_tokens: Field required",
            ))
        }
    };
    if field(&obj, "mcp_servers").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(unsupported("mcp_servers", "MCP servers"));
    }
    // Extended thinking: the model's reasoning (`<think>` blocks, harmony's analysis) comes back
    // as `thinking` blocks. `budget_tokens` is checked as Anthropic checks it (at least 1024,
    // below `max_tokens`) but does not cut the thoughts short: `max_tokens` bounds the reply.
    let thinking = match field(&obj, "thinking") {
        None => false,
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("disabled") => false,
            Some("adaptive") => true,
            Some("enabled") => match t.get("budget_tokens") {
                Some(Value::Number(n)) => match n.as_u64() {
                    Some(b) if b >= 1024 && (b as usize) < max_tokens => true,
                    _ => {
                        return Err(ApiError::invalid(
                            "thinking.budget_tokens",
                            format!("thinking.budget_tokens: {n} must be an integer of at least 1024 and below max_tokens ({max_tokens})"),
                        ))
                    }
                },
                Some(v) => {
                    return Err(ApiError::wrong_type(
                        "thinking.budget_tokens",
                        "an integer",
                        v,
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        "thinking.budget_tokens",
                        "thinking.budget_tokens: Field required (an integer)",
                    ))
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    "thinking.type",
                    "thinking.type: Input tag does not match any of the expected tags: 'enabled', 'disabled', 'adaptive'",
                ))
            }
        },
    };
    // `output_config.effort` has no meaning here and is ignored; a `format` (structured
    // outputs: `{"type": "json_schema", "schema"}`) constrains the reply to the schema.
    let json_schema = match field(&obj, "output_config")
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    {
        None => None,
        Some(f) => match (f.get("type").and_then(Value::as_str), f.get("schema")) {
            (Some("json_schema"), Some(Value::Object(s))) => Some(Value::Object(s.clone())),
            (Some("json_schema"), _) => {
                return Err(ApiError::invalid(
                    "output_config.format.schema",
                    "output_config.format.schema: Field required (a JSON Schema object)",
                ))
            }
            _ => {
                return Err(ApiError::invalid(
                    "output_config.format.type",
                    "output_config.format.type: Input tag does not match the expected tag: 'json_schema'",
                ))
            }
        },
    };
    let tool_list = tool_use::anthropic_tools(&obj)?;
    let (choice, parallel) = tool_use::anthropic_choice(&obj, &tool_list)?;
    let tools = ToolRequest {
        tools: tool_list,
        choice,
        parallel,
        json_schema,
    };
    let mut messages = Vec::new();
    if let Some(s) = field(&obj, "system") {
        let text = content_text(s, "system")?;
        if !text.is_empty() {
            messages.push(ChatMessage::new("system", &text));
        }
    }
    let list = match field(&obj, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "messages: at least one message is required",
            ))
        }
        Some(v) => return Err(ApiError::wrong_type("messages", "an array", v)),
        None => return Err(ApiError::invalid("messages", "messages: Field required")),
    };
    let mut call_ids: Vec<String> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = match m.get("role") {
            Some(Value::String(r)) if r == "user" || r == "assistant" => r.as_str(),
            Some(Value::String(r)) => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!(
                        "{p}.role: Input should be 'user' or 'assistant', got '{r}' (a system \
                         prompt goes in the top-level 'system' field)"
                    ),
                ))
            }
            Some(v) => return Err(ApiError::wrong_type(&format!("{p}.role"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!("{p}.role: Field required"),
                ))
            }
        };
        let content = match m.get("content") {
            Some(c) => content_blocks(c, &format!("{p}.content"), role, &mut call_ids)?,
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.content"),
                    format!("{p}.content: Field required"),
                ))
            }
        };
        // Tool results answer the previous turn's calls: they come first, as `tool` messages.
        messages.extend(content.results);
        if !content.text.is_empty() || !content.calls.is_empty() || role == "assistant" {
            let mut msg = ChatMessage::new(role, &content.text);
            msg.tool_calls = content.calls;
            messages.push(msg);
        }
    }
    if list
        .last()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("assistant")
    {
        return Err(unsupported(
            &format!("messages[{}].role", list.len() - 1),
            "a last message from the assistant (prefilling the reply)",
        ));
    }
    let stop = match field(&obj, "stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOP_SEQUENCES {
                return Err(ApiError::invalid(
                    "stop_sequences",
                    format!(
                        "stop_sequences: at most {MAX_STOP_SEQUENCES} sequences, got {}",
                        a.len()
                    ),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(j, s)| match s {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::wrong_type(
                        &format!("stop_sequences[{j}]"),
                        "a string",
                        v,
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(v) => return Err(ApiError::wrong_type("stop_sequences", "an array", v)),
    };
    let mut temperature = number_in(&obj, "temperature", 0.0, 1.0)?.unwrap_or(1.0);
    let mut top_p = number_in(&obj, "top_p", 0.0, 1.0)?.unwrap_or(1.0);
    if top_p == 0.0 {
        // Only the most likely token survives: greedy.
        temperature = 0.0;
        top_p = 1.0;
    }
    let top_k = match field(&obj, "top_k") {
        None => 0,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
            None => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k: Input should be an integer >= 0, got {n}"),
                ))
            }
        },
        Some(v) => return Err(ApiError::wrong_type("top_k", "an integer", v)),
    };
    match field(&obj, "metadata") {
        None | Some(Value::Object(_)) => {}
        Some(v) => return Err(ApiError::wrong_type("metadata", "an object", v)),
    }
    let stream = match field(&obj, "stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(ApiError::wrong_type("stream", "a boolean", v)),
    };
    Ok(GenRequest {
        model,
        prompt: Prompt::Chat(messages),
        max_tokens: Some(max_tokens),
        temperature,
        top_p,
        top_k,
        seed: None,
        stop,
        stream,
        include_usage: false,
        n: 1,
        ignore_eos: false,
        tools,
        thinking,
    })
}

/// A message's content blocks: its text, an assistant's `tool_use` blocks (as template calls)
/// and a user's `tool_result` blocks (as `tool` messages).
struct Blocks {
    text: String,
    calls: Vec<Value>,
    results: Vec<ChatMessage>,
}

/// Reads `content` of a `role` message; `call_ids` holds the ids of the `tool_use` blocks seen
/// so far (a `tool_result` must answer one).
fn content_blocks(
    v: &Value,
    param: &str,
    role: &str,
    call_ids: &mut Vec<String>,
) -> Result<Blocks, ApiError> {
    let mut out = Blocks {
        text: String::new(),
        calls: Vec::new(),
        results: Vec::new(),
    };
    let Value::Array(blocks) = v else {
        out.text = content_text(v, param)?;
        return Ok(out);
    };
    for (j, b) in blocks.iter().enumerate() {
        let p = format!("{param}[{j}]");
        let str_field = |name: &str| -> Result<String, ApiError> {
            match b.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(v) => Err(ApiError::wrong_type(&format!("{p}.{name}"), "a string", v)),
                None => Err(ApiError::invalid(
                    &format!("{p}.{name}"),
                    format!("{p}.{name}: Field required"),
                )),
            }
        };
        match b.get("type").and_then(Value::as_str) {
            Some("tool_use") if role == "assistant" => {
                let id = str_field("id")?;
                let name = str_field("name")?;
                let input = match b.get("input") {
                    Some(Value::Object(o)) => Value::Object(o.clone()),
                    Some(v) => {
                        return Err(ApiError::wrong_type(&format!("{p}.input"), "an object", v))
                    }
                    None => json!({}),
                };
                call_ids.push(id.clone());
                out.calls.push(tool_use::template_call(&id, &name, input));
            }
            Some("tool_result") if role == "user" => {
                let id = str_field("tool_use_id")?;
                if !call_ids.contains(&id) {
                    return Err(ApiError::invalid(
                        &format!("{p}.tool_use_id"),
                        format!("{p}.tool_use_id: no earlier tool_use block has the id '{id}'"),
                    ));
                }
                let text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => content_text(c, &format!("{p}.content"))?,
                };
                let text = if b.get("is_error") == Some(&Value::Bool(true)) {
                    format!("Error: {text}")
                } else {
                    text
                };
                let mut m = ChatMessage::new("tool", &text);
                m.tool_call_id = Some(id);
                out.results.push(m);
            }
            // A previous turn's thoughts sent back (as clients do with extended thinking): the
            // templates drop earlier reasoning, and so does coli.
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            Some(t @ ("tool_use" | "tool_result")) => {
                return Err(ApiError::invalid(
                    &format!("{p}.type"),
                    format!("{p}.type: a {t} block cannot appear in a {role} message"),
                ))
            }
            _ => out.text.push_str(&block_text(b, &p)?),
        }
    }
    Ok(out)
}

/// What a response needs besides the engine's events.
pub struct MessageMeta {
    /// `msg_...`.
    pub id: String,
    /// The served model id.
    pub model: String,
    /// The request's stop sequences (to name the one that ended the reply).
    pub stop: Vec<String>,
    /// Prompt tokens (before the KV cache's reuse is known).
    pub prompt_tokens: usize,
    /// Extended thinking was asked for: reasoning comes back as `thinking` blocks.
    pub thinking: bool,
}

impl MessageMeta {
    /// `stop_reason` and `stop_sequence` of a finished reply: `end_turn` (EOS), `stop_sequence`
    /// (with the sequence), `max_tokens` (the limit, or a shutdown that cut the reply short).
    fn stop(&self, f: &Finish) -> (&'static str, Value) {
        match (f.reason, f.stop_index) {
            ("tool_calls", _) => ("tool_use", Value::Null),
            ("stop", Some(i)) => ("stop_sequence", json!(self.stop.get(i))),
            ("stop", None) => ("end_turn", Value::Null),
            _ => ("max_tokens", Value::Null),
        }
    }

    /// Usage: `input_tokens` excludes the prompt tokens read from the KV cache, which are
    /// `cache_read_input_tokens` (Anthropic's accounting: the three input counts add up).
    fn usage(&self, f: &Finish) -> Value {
        json!({
            "input_tokens": f.prompt_tokens - f.cached_tokens,
            "output_tokens": f.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": f.cached_tokens,
        })
    }

    /// A `tool_use` block of call `k` of the reply.
    fn tool_use(&self, k: usize, c: &ParsedCall) -> Value {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        json!({"type": "tool_use", "id": tool_use::call_id("toolu_", &self.id, 0, k),
               "name": c.name, "input": input})
    }

    /// The `message` object; `content` None for the empty message of `message_start`.
    fn message(&self, content: Option<Vec<Value>>, fin: Option<&Finish>) -> Value {
        let content = Value::Array(content.unwrap_or_default());
        let (reason, seq) = match fin {
            Some(f) => {
                let (r, s) = self.stop(f);
                (json!(r), s)
            }
            None => (Value::Null, Value::Null),
        };
        let usage = match fin {
            Some(f) => self.usage(f),
            None => json!({"input_tokens": self.prompt_tokens, "output_tokens": 0,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
        };
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": reason, "stop_sequence": seq, "usage": usage,
        })
    }
}

/// Collects a whole reply into the `message` response: its reasoning as a `thinking` block when
/// extended thinking was asked for (else dropped), its text, its calls as `tool_use` blocks.
///
/// # Errors
/// The engine's error, or a 500 when the engine stops first.
pub async fn whole(
    meta: &MessageMeta,
    events: &mut mpsc::UnboundedReceiver<Event>,
) -> Result<Value, ApiError> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut text = String::new();
    let mut calls = 0;
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Text(_, t) => text.push_str(&t),
            Event::Reasoning(_, t) if meta.thinking => {
                if !text.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": std::mem::take(&mut text)}));
                }
                text.clear();
                match blocks.last_mut() {
                    Some(b) if b["type"] == "thinking" => {
                        let all = format!("{}{t}", b["thinking"].as_str().unwrap_or_default());
                        b["thinking"] = json!(all);
                    }
                    _ => blocks.push(json!({"type": "thinking", "thinking": t, "signature": ""})),
                }
            }
            Event::Reasoning(..) => {}
            Event::ToolCallStart(..) | Event::ToolCallArgs(..) => {}
            Event::ToolCall(_, c) | Event::ToolCallEnd(_, c) => {
                if !text.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": std::mem::take(&mut text)}));
                }
                text.clear();
                blocks.push(meta.tool_use(calls, &c));
                calls += 1;
            }
            Event::Done(_, f) => {
                let only_thoughts = blocks.iter().all(|b| b["type"] == "thinking");
                if !text.is_empty() && (calls == 0 || !text.trim().is_empty()) || only_thoughts {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                return Ok(meta.message(Some(blocks), Some(&f)));
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before finishing this request",
    ))
}

/// How long a stream may go without an event before it sends a `ping` event.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// One SSE event with its name (Anthropic's streams name every event).
fn sse(name: &'static str, data: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(name).data(data.to_string()))
}

/// The streamed reply: `message_start`, `ping`, then per block (thinking, text, tool_use, in the
/// reply's order) `content_block_start` at its first content, `content_block_delta`
/// (`thinking_delta`, `text_delta`, `input_json_delta`), `content_block_stop`; then
/// `message_delta` (stop reason, usage),
/// `message_stop`; an `error` event if generation fails; a `ping` whenever nothing was sent for
/// 5 s (a long prefill). `guard` (the job's cancel guard) lives
/// as long as the stream, so a client that leaves cancels its job.
pub fn stream<G: Send + 'static>(
    meta: MessageMeta,
    mut events: mpsc::UnboundedReceiver<Event>,
    guard: G,
) -> Response {
    let (out, body) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        let _guard = guard;
        // Blocks open when they get their first content (as the whole reply's blocks are made:
        // no empty text or thinking block beside others).
        let head = [
            (
                "message_start",
                json!({"type": "message_start", "message": meta.message(None, None)}),
            ),
            ("ping", json!({"type": "ping"})),
        ];
        // The open block (index, a thinking block?), the next block's index, calls, and
        // whether a text or tool_use block was sent.
        let mut open: Option<(usize, bool)> = None;
        let mut next_block = 0;
        let mut calls = 0;
        let mut answered = false;
        // The block of the call whose arguments are streaming.
        let mut streaming_call: Option<usize> = None;
        for (name, v) in head {
            if out.send(sse(name, &v)).await.is_err() {
                return;
            }
        }
        // While nothing else is sent (a queued request, a long prefill, a slow token), a `ping`
        // event every PING_EVERY keeps clients that wait for events, not comments, from timing
        // out (Anthropic's clients and agents; the SSE keep-alive comment runs as well).
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = ping.tick() => {
                    if out.send(sse("ping", &json!({"type": "ping"}))).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = out.closed() => return,
            };
            ping.reset();
            // Closes the open block unless it is of the kind wanted, then opens one of that kind
            // if none is open: the index of the block the next delta goes to.
            let mut switch = |v: &mut Vec<(&'static str, Value)>, want: Option<bool>| {
                if let Some((i, kind)) = open {
                    if Some(kind) == want {
                        return i;
                    }
                    v.push((
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                    open = None;
                }
                let Some(thinking) = want else {
                    return usize::MAX;
                };
                let i = next_block;
                next_block += 1;
                open = Some((i, thinking));
                let block = if thinking {
                    json!({"type": "thinking", "thinking": "", "signature": ""})
                } else {
                    json!({"type": "text", "text": ""})
                };
                v.push((
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": block}),
                ));
                i
            };
            let msgs: Vec<(&'static str, Value)> = match ev {
                Some(Event::Text(_, t)) => {
                    let mut v = Vec::new();
                    answered = true;
                    let index = switch(&mut v, Some(false));
                    v.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "text_delta", "text": t}}),
                    ));
                    v
                }
                Some(Event::Reasoning(_, t)) if meta.thinking => {
                    let mut v = Vec::new();
                    let index = switch(&mut v, Some(true));
                    v.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "thinking_delta", "thinking": t}}),
                    ));
                    v
                }
                Some(Event::Reasoning(..)) => continue,
                Some(Event::ToolCallStart(_, name)) => {
                    let mut v = Vec::new();
                    answered = true;
                    switch(&mut v, None);
                    let i = next_block;
                    next_block += 1;
                    let c = ParsedCall {
                        name,
                        arguments: String::new(),
                    };
                    let mut block = meta.tool_use(calls, &c);
                    calls += 1;
                    block["input"] = json!({});
                    streaming_call = Some(i);
                    v.push((
                        "content_block_start",
                        json!({"type": "content_block_start", "index": i, "content_block": block}),
                    ));
                    v
                }
                Some(Event::ToolCallArgs(_, a)) => match streaming_call {
                    Some(i) => vec![(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": a}}),
                    )],
                    None => continue,
                },
                Some(Event::ToolCallEnd(..)) => match streaming_call.take() {
                    Some(i) => vec![(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    )],
                    None => continue,
                },
                Some(Event::ToolCall(_, c)) => {
                    let mut v = Vec::new();
                    answered = true;
                    switch(&mut v, None);
                    let i = next_block;
                    next_block += 1;
                    let mut block = meta.tool_use(calls, &c);
                    calls += 1;
                    block["input"] = json!({});
                    v.push((
                        "content_block_start",
                        json!({"type": "content_block_start", "index": i, "content_block": block}),
                    ));
                    v.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
                    ));
                    v.push((
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                    v
                }
                Some(Event::Done(_, f)) => {
                    let (reason, seq) = meta.stop(&f);
                    let mut v = Vec::new();
                    if !answered {
                        // No text and no call: one empty text block, as the whole reply has.
                        switch(&mut v, Some(false));
                    }
                    switch(&mut v, None);
                    v.extend([
                        (
                            "message_delta",
                            json!({"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": meta.usage(&f)}),
                        ),
                        ("message_stop", json!({"type": "message_stop"})),
                    ]);
                    v
                }
                Some(Event::Error(e)) => vec![("error", error_body(&e))],
                None => vec![(
                    "error",
                    error_body(&ApiError::internal(
                        "the engine stopped before finishing this request",
                    )),
                )],
            };
            let last = msgs
                .last()
                .is_some_and(|(n, _)| *n == "message_stop" || *n == "error");
            for (name, v) in &msgs {
                if out.send(sse(name, v)).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    super::sse_response(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<GenRequest, ApiError> {
        parse_request(v.to_string().as_bytes())
    }

    fn base() -> Value {
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
    }

    #[test]
    fn parses_a_full_request() {
        let r = parse(json!({
            "model": "m", "max_tokens": 32,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                                              {"type": "text", "text": "b"}]}
            ],
            "stop_sequences": ["END", ""], "temperature": 0.5, "top_p": 0.9, "top_k": 40,
            "metadata": {"user_id": "u1"}, "stream": true, "thinking": {"type": "disabled"}
        }))
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Hello"),
                ChatMessage::new("user", "ab"),
            ])
        );
        assert_eq!(r.max_tokens, Some(32));
        assert_eq!(r.stop, vec!["END".to_string(), String::new()]);
        assert_eq!((r.temperature, r.top_p, r.top_k), (0.5, 0.9, 40));
        assert!(r.stream && r.n == 1 && r.seed.is_none());
        // Defaults: temperature 1 (Anthropic's), no stop sequences, not streamed.
        let r = parse(base()).unwrap();
        assert_eq!((r.temperature, r.top_p, r.stream), (1.0, 1.0, false));
    }

    #[test]
    fn tools_tool_use_and_tool_result_blocks() {
        let r = parse(json!({
            "model": "m", "max_tokens": 16,
            "tools": [{"name": "get_weather", "description": "d",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "5 C"}]},
                    {"type": "text", "text": "Thanks"}]}]
        }))
        .unwrap();
        assert_eq!(
            r.tools.choice,
            tool_use::ToolChoice::Named("get_weather".into())
        );
        assert!(!r.tools.parallel && r.tools.forced());
        assert_eq!(
            r.tools.tools,
            vec![
                json!({"type": "function", "function": {"name": "get_weather", "description": "d",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
            ]
        );
        let Prompt::Chat(m) = r.prompt else {
            panic!("a chat")
        };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        assert_eq!(m[1].content, "Checking.");
        assert_eq!(
            m[1].tool_calls,
            vec![json!({"id": "toolu_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]
        );
        assert_eq!(
            (m[2].content.as_str(), m[2].tool_call_id.as_deref()),
            ("5 C", Some("toolu_1"))
        );
        let r = parse(
            json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
        )
        .unwrap();
        assert_eq!(r.tools.json_schema, Some(json!({"type": "object"})));
        // Extended thinking; a previous turn's thinking block is accepted and dropped.
        let r = parse(json!({"model": "m", "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                  {"type": "text", "text": "y"}]},
                {"role": "user", "content": "z"}]}))
        .unwrap();
        assert!(r.thinking);
        let Prompt::Chat(m) = r.prompt else {
            panic!("a chat")
        };
        assert_eq!(m[1].content, "y");
        assert!(!parse(base()).unwrap().thinking);
    }

    #[test]
    fn refuses_what_coli_cannot_do_naming_the_field() {
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            parse(b).unwrap_err()
        };
        let cases = [
            (
                with("tools", json!([{"name": "t"}])),
                "tools.0.input_schema",
            ),
            (
                with("tools", json!([{"name": "a b", "input_schema": {}}])),
                "tools.0.name",
            ),
            (
                with(
                    "tools",
                    json!([{"name": "t", "input_schema": {"type": "string"}}]),
                ),
                "tools.0.input_schema",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "web_search"}]),
                ),
                "tools.0.type",
            ),
            (
                with("tool_choice", json!({"type": "tool", "name": "absent"})),
                "tool_choice",
            ),
            (with("tool_choice", json!({"type": "any"})), "tool_choice"),
            (
                with("thinking", json!({"type": "sometimes"})),
                "thinking.type",
            ),
            (
                with("tool_choice", json!({"type": "sometimes"})),
                "tool_choice.type",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]),
                ),
                "messages[0].content[0].tool_use_id",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "toolu_x", "name": "t", "input": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with(
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": 1024}),
                ),
                "thinking.budget_tokens",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
                ),
                "messages[1].role",
            ),
            (
                with("messages", json!([{"role": "system", "content": "a"}])),
                "messages[0].role",
            ),
            (with("messages", json!([])), "messages"),
            (with("max_tokens", json!(0)), "max_tokens"),
            (with("max_tokens", json!("5")), "max_tokens"),
            (with("temperature", json!(1.5)), "temperature"),
            (with("top_k", json!(-1)), "top_k"),
            (with("stop_sequences", json!("END")), "stop_sequences"),
            (with("stream", json!("yes")), "stream"),
            (
                with("output_config", json!({"format": {"type": "json_schema"}})),
                "output_config.format.schema",
            ),
            (
                with("output_config", json!({"format": {"type": "xml"}})),
                "output_config.format.type",
            ),
        ];
        for (e, param) in cases {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
            assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
            assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
        }
        let mut b = base();
        b.as_object_mut().unwrap().remove("max_tokens");
        assert_eq!(parse(b).unwrap_err().param.as_deref(), Some("max_tokens"));
        let e = parse_request(b"[1]").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    /// The events of a streamed reply of `events` as (event name, data) pairs.
    async fn stream_events(thinking: bool, events: Vec<Event>) -> Vec<(String, Value)> {
        let (tx, rx) = mpsc::unbounded_channel();
        for e in events {
            tx.send(e).unwrap();
        }
        let meta = MessageMeta {
            id: "msg_1".into(),
            model: "m".into(),
            stop: Vec::new(),
            prompt_tokens: 3,
            thinking,
        };
        let body = axum::body::to_bytes(stream(meta, rx, ()).into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let mut out = Vec::new();
        let mut name = String::new();
        for l in text.lines() {
            if let Some(n) = l.strip_prefix("event: ") {
                name = n.to_string();
            } else if let Some(d) = l.strip_prefix("data: ") {
                out.push((name.clone(), serde_json::from_str(d).unwrap()));
            }
        }
        out
    }

    fn fin(reason: &'static str) -> Finish {
        Finish {
            reason,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 5,
            stop_index: None,
        }
    }

    /// Extended thinking, text and a call: a thinking block, a text block, a tool_use block,
    /// each started, filled and stopped in order, then `tool_use` as the stop reason.
    #[tokio::test]
    async fn thinking_text_and_tool_use_blocks_stream_in_order() {
        let call = ParsedCall {
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        };
        let ev = stream_events(
            true,
            vec![
                Event::Reasoning(0, "hm".into()),
                Event::Text(0, "ok".into()),
                Event::ToolCall(0, call.clone()),
                Event::Done(0, fin("tool_calls")),
            ],
        )
        .await;
        let shape: Vec<String> = ev
            .iter()
            .filter(|(n, _)| n != "ping")
            .map(|(n, d)| match n.as_str() {
                "content_block_start" => {
                    format!("start {} {}", d["index"], d["content_block"]["type"])
                }
                "content_block_delta" => format!("delta {} {}", d["index"], d["delta"]["type"]),
                "content_block_stop" => format!("stop {}", d["index"]),
                "message_delta" => format!("end {}", d["delta"]["stop_reason"]),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "message_start",
                "start 0 \"thinking\"",
                "delta 0 \"thinking_delta\"",
                "stop 0",
                "start 1 \"text\"",
                "delta 1 \"text_delta\"",
                "stop 1",
                "start 2 \"tool_use\"",
                "delta 2 \"input_json_delta\"",
                "stop 2",
                "end \"tool_use\"",
                "message_stop"
            ]
        );
        // Without extended thinking, the reasoning is dropped and the text block comes first.
        let ev = stream_events(
            false,
            vec![
                Event::Reasoning(0, "hm".into()),
                Event::Text(0, "ok".into()),
                Event::Done(0, fin("stop")),
            ],
        )
        .await;
        assert!(ev
            .iter()
            .all(|(_, d)| d["delta"]["type"] != "thinking_delta"));
        let first = ev.iter().find(|(n, _)| n == "content_block_start").unwrap();
        assert_eq!(first.1["content_block"]["type"], "text");
        // A reply with no text and no call: one empty text block, as the whole reply has.
        let ev = stream_events(false, vec![Event::Done(0, fin("stop"))]).await;
        let blocks: Vec<&Value> = ev
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| &d["content_block"])
            .collect();
        assert_eq!(blocks, [&json!({"type": "text", "text": ""})]);
        // A call alone: no empty text block before it.
        let only_call = ParsedCall {
            name: "f".into(),
            arguments: "{}".into(),
        };
        let ev = stream_events(
            false,
            vec![
                Event::ToolCall(0, only_call),
                Event::Done(0, fin("tool_calls")),
            ],
        )
        .await;
        let kinds: Vec<&Value> = ev
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| &d["content_block"]["type"])
            .collect();
        assert_eq!(kinds, [&json!("tool_use")]);
        // A whole reply: the same blocks.
        let (tx, mut rx) = mpsc::unbounded_channel();
        for e in [
            Event::Reasoning(0, "h".into()),
            Event::Reasoning(0, "m".into()),
            Event::Text(0, "ok".into()),
            Event::ToolCall(0, call),
            Event::Done(0, fin("tool_calls")),
        ] {
            tx.send(e).unwrap();
        }
        let meta = MessageMeta {
            id: "msg_1".into(),
            model: "m".into(),
            stop: Vec::new(),
            prompt_tokens: 3,
            thinking: true,
        };
        let m = whole(&meta, &mut rx).await.unwrap();
        assert_eq!(
            m["content"][0],
            json!({"type": "thinking", "thinking": "hm", "signature": ""})
        );
        assert_eq!(m["content"][1], json!({"type": "text", "text": "ok"}));
        assert_eq!(m["content"][2]["input"], json!({"a": 1}));
        assert_eq!(m["stop_reason"], "tool_use");
    }

    #[test]
    fn errors_in_anthropic_shape() {
        let e = ApiError::unauthorized(false);
        assert_eq!(
            error_body(&e),
            json!({"type": "error", "error": {"type": "authentication_error", "message": e.message}})
        );
        let q = ApiError::queue_full(2, 7);
        let r = error_response(&q);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        assert_eq!(error_body(&q)["error"]["type"], "rate_limit_error");
        assert_eq!(
            error_body(&ApiError::model_not_found("x", "m"))["error"]["type"],
            "not_found_error"
        );
        assert_eq!(
            error_body(&ApiError::unavailable("gone"))["error"]["type"],
            "overloaded_error"
        );
    }

    #[test]
    fn stop_reasons_and_usage() {
        let meta = MessageMeta {
            id: "msg_1".into(),
            model: "m".into(),
            stop: vec!["".into(), "END".into()],
            prompt_tokens: 10,
            thinking: false,
        };
        let f = |reason, stop_index| Finish {
            reason,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            stop_index,
        };
        let m = meta.message(
            Some(vec![json!({"type": "text", "text": "hi"})]),
            Some(&f("stop", Some(1))),
        );
        assert_eq!(
            (m["stop_reason"].clone(), m["stop_sequence"].clone()),
            (json!("stop_sequence"), json!("END"))
        );
        assert_eq!(m["content"], json!([{"type": "text", "text": "hi"}]));
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 4})
        );
        assert_eq!(
            meta.message(
                Some(vec![json!({"type": "text", "text": ""})]),
                Some(&f("stop", None))
            )["stop_reason"],
            "end_turn"
        );
        assert_eq!(
            meta.message(
                Some(vec![json!({"type": "text", "text": ""})]),
                Some(&f("length", None))
            )["stop_reason"],
            "max_tokens"
        );
        let start = meta.message(None, None);
        assert_eq!(start["content"], json!([]));
        assert!(start["stop_reason"].is_null());
        assert_eq!(start["usage"]["input_tokens"], 10);
    }
}
