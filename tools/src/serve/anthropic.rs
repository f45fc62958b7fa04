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
use super::worker::{Event, Finish};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
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
                let p = format!("{param}[{j}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => match b.get("text") {
                        Some(Value::String(s)) => out.push_str(s),
                        Some(t) => {
                            return Err(ApiError::wrong_type(&format!("{p}.text"), "a string", t))
                        }
                        None => {
                            return Err(ApiError::invalid(
                                &format!("{p}.text"),
                                format!("{p}.text: Field required"),
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(unsupported(
                            &format!("{p}.type"),
                            &format!("a content block of type \"{other}\" (only \"text\")"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            &format!("{p}.type"),
                            format!("{p}.type: Field required"),
                        ))
                    }
                }
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
/// `metadata`, `stream` honoured.
///
/// # Errors
/// 400 [`ApiError`] naming the field: missing, of the wrong type, out of range, or asking for
/// what coli cannot do (`tools`, `tool_choice`, `thinking`, `output_config.format`, non-text
/// content blocks, a last message from the assistant).
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
    for name in ["tools", "mcp_servers"] {
        if field(&obj, name).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(unsupported(name, "tool use"));
        }
    }
    if field(&obj, "tool_choice").is_some() {
        return Err(unsupported("tool_choice", "tool use"));
    }
    if let Some(t) = field(&obj, "thinking") {
        if t.get("type").and_then(Value::as_str) != Some("disabled") {
            return Err(unsupported("thinking", "extended thinking"));
        }
    }
    // `output_config.effort` has no meaning here and is ignored; a `format` (structured
    // outputs) would constrain decoding, which coli does not do.
    if field(&obj, "output_config")
        .and_then(|c| c.get("format"))
        .is_some_and(|f| !f.is_null())
    {
        return Err(unsupported("output_config.format", "structured output"));
    }
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
            Some(c) => content_text(c, &format!("{p}.content"))?,
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.content"),
                    format!("{p}.content: Field required"),
                ))
            }
        };
        messages.push(ChatMessage::new(role, &content));
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
    })
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
}

impl MessageMeta {
    /// `stop_reason` and `stop_sequence` of a finished reply: `end_turn` (EOS), `stop_sequence`
    /// (with the sequence), `max_tokens` (the limit, or a shutdown that cut the reply short).
    fn stop(&self, f: &Finish) -> (&'static str, Value) {
        match (f.reason, f.stop_index) {
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

    /// The `message` object; `text` None for the empty message of `message_start`.
    fn message(&self, text: Option<&str>, fin: Option<&Finish>) -> Value {
        let content = match text {
            Some(t) => json!([{"type": "text", "text": t}]),
            None => json!([]),
        };
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

/// Collects a whole reply (the reasoning of a harmony model is dropped: extended thinking was
/// not asked for) into the `message` response.
///
/// # Errors
/// The engine's error, or a 500 when the engine stops first.
pub async fn whole(
    meta: &MessageMeta,
    events: &mut mpsc::UnboundedReceiver<Event>,
) -> Result<Value, ApiError> {
    let mut text = String::new();
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Text(_, t) => text.push_str(&t),
            Event::Reasoning(..) => {}
            Event::Done(_, f) => return Ok(meta.message(Some(&text), Some(&f))),
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

/// The streamed reply: `message_start`, `content_block_start`, `ping`, `content_block_delta`
/// (`text_delta`) per piece, `content_block_stop`, `message_delta` (stop reason, usage),
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
        let head = [
            (
                "message_start",
                json!({"type": "message_start", "message": meta.message(None, None)}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
        ];
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
            let msgs: Vec<(&'static str, Value)> = match ev {
                Some(Event::Text(_, t)) => vec![(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": t}}),
                )],
                Some(Event::Reasoning(..)) => continue,
                Some(Event::Done(_, f)) => {
                    let (reason, seq) = meta.stop(&f);
                    vec![
                        (
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ),
                        (
                            "message_delta",
                            json!({"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": meta.usage(&f)}),
                        ),
                        ("message_stop", json!({"type": "message_stop"})),
                    ]
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
    fn refuses_what_coli_cannot_do_naming_the_field() {
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            parse(b).unwrap_err()
        };
        let cases = [
            (with("tools", json!([{"name": "t"}])), "tools"),
            (with("tool_choice", json!({"type": "auto"})), "tool_choice"),
            (
                with(
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": 1024}),
                ),
                "thinking",
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
                "output_config.format",
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
        };
        let f = |reason, stop_index| Finish {
            reason,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            stop_index,
        };
        let m = meta.message(Some("hi"), Some(&f("stop", Some(1))));
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
            meta.message(Some(""), Some(&f("stop", None)))["stop_reason"],
            "end_turn"
        );
        assert_eq!(
            meta.message(Some(""), Some(&f("length", None)))["stop_reason"],
            "max_tokens"
        );
        let start = meta.message(None, None);
        assert_eq!(start["content"], json!([]));
        assert!(start["stop_reason"].is_null());
        assert_eq!(start["usage"]["input_tokens"], 10);
    }
}
