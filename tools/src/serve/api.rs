//! The OpenAI request and error shapes: parsing and validation of `/v1/chat/completions` and
//! `/v1/completions` bodies, and errors as `{"error": {"message", "type", "param", "code"}}`.
//!
//! Fields that change what the model would produce but that coli cannot honour (tools,
//! response_format other than text, logprobs, n > 1, ...) are refused with a 400 naming the field;
//! unknown other fields are ignored, as OpenAI does.

use super::tool_use::{self, ToolRequest};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use coli_engine::ChatMessage;
use serde_json::{json, Map, Value};

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// An error answered in OpenAI's JSON error shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's `type` (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`, if any.
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503 only).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_request_error` about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 for a field of the wrong JSON type.
    pub fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
        ApiError {
            code: Some("invalid_type"),
            ..ApiError::invalid(
                param,
                format!(
                    "Invalid type for '{param}': expected {expected}, but got {}.",
                    type_name(got)
                ),
            )
        }
    }

    /// 400 for a field this server cannot honour.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid(
                param,
                format!("Unsupported parameter: '{param}' {what} is not supported by coli serve."),
            )
        }
    }

    /// 400 for a body that is not JSON.
    pub fn malformed(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("We could not parse the JSON body of your request ({detail}). The body must be a JSON object."),
        )
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(context: usize, prompt: usize, completion: usize) -> ApiError {
        let param = if completion == 0 {
            "messages"
        } else {
            "max_tokens"
        };
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {context} tokens. However, you requested \
                     {} tokens ({prompt} in the prompt, {completion} for the completion). Please \
                     reduce the length of the prompt or of max_tokens, or restart the server with a \
                     larger --context.",
                    prompt + completion
                ),
            )
        }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized(present: bool) -> ApiError {
        let msg = if present {
            "Incorrect API key provided. Pass the key given to `coli serve --api-key` as `Authorization: Bearer KEY` (or `x-api-key: KEY`)."
        } else {
            "You didn't provide an API key. Pass the key given to `coli serve --api-key` as `Authorization: Bearer KEY` (or `x-api-key: KEY`)."
        };
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", msg)
        }
    }

    /// 404 for a model id other than the served one.
    pub fn model_not_found(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model '{asked}' does not exist; this server serves '{served}'."),
            )
        }
    }

    /// 404 for an unknown path.
    pub fn route_not_found(path: &str) -> ApiError {
        ApiError {
            code: Some("not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("Unknown request URL: {path}. Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/messages, GET /health, GET /metrics."),
            )
        }
    }

    /// 405 for a known path with another method (e.g. `GET /v1/chat/completions`).
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            code: Some("method_not_allowed"),
            ..ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{method} is not allowed on {path}. Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/messages, GET /health, GET /metrics."),
            )
        }
    }

    /// A request body that could not be read (413 when over the size limit), with the status
    /// the body extractor chose.
    pub fn body_rejected(status: StatusCode, detail: &str) -> ApiError {
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request_too_large"
        } else {
            "invalid_body"
        };
        ApiError {
            code: Some(code),
            ..ApiError::new(
                status,
                "invalid_request_error",
                format!("The request body could not be read: {detail}"),
            )
        }
    }

    /// 429 when the request queue is full, with `Retry-After: seconds`.
    pub fn queue_full(max_queue: usize, seconds: u64) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(seconds),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "The request queue is full ({max_queue} waiting); retry after {seconds} s."
                ),
            )
        }
    }

    /// 408 when a request body arrives too slowly (`--body-timeout`, `--body-min-rate`).
    pub fn request_timeout(detail: &str) -> ApiError {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("The request body could not be read: {detail}"),
            )
        }
    }

    /// 503 with `Retry-After: 1` for a connection beyond `--max-connections` when no open
    /// connection can make room.
    pub fn too_many_connections(max: usize) -> ApiError {
        ApiError {
            code: Some("too_many_connections"),
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("The server has {max} connections open, each handling a request (--max-connections); retry after 1 s."),
            )
        }
    }

    /// 503 when the engine thread is gone.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Why a request was refused, as its [`ApiError`] said it (a response extension that the
/// server's log line reads).
#[derive(Clone, Debug)]
pub struct RefusalReason(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        // The reason, for the server log's line about this refusal (`log_refusals`).
        r.extensions_mut()
            .insert(RefusalReason(self.message.clone()));
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a decimal",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic's Messages API, `super::anthropic`).
    Messages,
}

impl Endpoint {
    /// Label used in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Messages => "messages",
        }
    }
}

/// The prompt of a request, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Chat messages, rendered with the model's chat template (generation prompt added).
    Chat(Vec<ChatMessage>),
    /// Completion text, tokenized as the tokenizer does (BOS added if it adds one).
    Text(String),
    /// Token ids, fed exactly.
    Ids(Vec<u32>),
}

/// A validated generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// Requested model id.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// `max_completion_tokens` or `max_tokens` (tokens); None = fill the context.
    pub max_tokens: Option<usize>,
    /// Sampling temperature in [0, 2]; 0 = greedy. OpenAI's default is 1.
    pub temperature: f32,
    /// Nucleus probability in (0, 1].
    pub top_p: f32,
    /// Keep the k most likely tokens (0 = off); an extension (vLLM's), not an OpenAI field.
    pub top_k: usize,
    /// RNG seed; None = a fresh one per request.
    pub seed: Option<u64>,
    /// Up to [`MAX_STOP_STRINGS`] non-empty stop strings.
    pub stop: Vec<String>,
    /// Server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage`.
    pub include_usage: bool,
    /// `n`: choices generated from the prompt (1..=[`MAX_N`]; the server also caps it at its
    /// batch size). The prompt is prefilled once; choice `i` samples with `seed + i`.
    pub n: usize,
    /// Keep generating past an EOS token (vLLM's `ignore_eos` extension; benchmarks use it to
    /// get a fixed number of tokens).
    pub ignore_eos: bool,
    /// Tools offered, the tool choice and `response_format`.
    pub tools: ToolRequest,
    /// Anthropic's extended thinking: the reasoning comes back as `thinking` blocks.
    pub thinking: bool,
}

/// Most choices one request may ask for (`n`).
pub const MAX_N: usize = 128;

/// A field that is absent or JSON null reads as absent.
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn get_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::wrong_type(name, "a boolean", v)),
    }
}

fn get_f32(obj: &Map<String, Value>, name: &str) -> Result<Option<f32>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64().map(|f| f as f32)),
        Some(v) => Err(ApiError::wrong_type(name, "a number", v)),
    }
}

fn get_count(obj: &Map<String, Value>, name: &str) -> Result<Option<usize>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) => Err(ApiError::invalid(
                name,
                format!("Invalid '{name}': integer below minimum value. Expected a value >= 1, but got 0 instead."),
            )),
            Some(c) => Ok(Some(usize::try_from(c).unwrap_or(usize::MAX))),
            None => Err(ApiError::invalid(
                name,
                format!("Invalid '{name}': expected a positive integer, got {n}."),
            )),
        },
        Some(v) => Err(ApiError::wrong_type(name, "an integer", v)),
    }
}

/// Refuses the fields whose effect coli cannot produce, unless they hold their neutral value.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let non_empty = |v: &Value| match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    // The deprecated `functions` / `function_call`: `tools` / `tool_choice` replace them.
    for name in ["functions", "logit_bias"] {
        if field(obj, name).is_some_and(non_empty) {
            return Err(ApiError::unsupported(name, "(non-empty)"));
        }
    }
    match field(obj, "function_call") {
        None => {}
        Some(Value::String(s)) if s == "none" || s == "auto" => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "function_call",
                "(deprecated: use tool_choice)",
            ))
        }
    }
    match field(obj, "logprobs") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Number(n)) if n.as_u64() == Some(0) => {}
        Some(_) => return Err(ApiError::unsupported("logprobs", "(log probabilities)")),
    }
    if let Some(v) = field(obj, "top_logprobs") {
        if v.as_u64() != Some(0) {
            return Err(ApiError::unsupported("top_logprobs", "(log probabilities)"));
        }
    }
    for name in ["best_of"] {
        if let Some(v) = field(obj, name) {
            match v.as_u64() {
                Some(1) => {}
                _ if v.is_number() => {
                    return Err(ApiError::unsupported(name, "with a value other than 1"))
                }
                _ => return Err(ApiError::wrong_type(name, "an integer", v)),
            }
        }
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = field(obj, name) {
            match v.as_f64() {
                Some(0.0) => {}
                Some(_) => return Err(ApiError::unsupported(name, "with a value other than 0")),
                None => return Err(ApiError::wrong_type(name, "a number", v)),
            }
        }
    }
    if get_bool(obj, "echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "(true)"));
    }
    if field(obj, "suffix").is_some_and(non_empty) {
        return Err(ApiError::unsupported("suffix", "(insertion)"));
    }
    if let Some(v) = field(obj, "modalities") {
        if v.as_array()
            .is_none_or(|a| a.iter().any(|m| m.as_str() != Some("text")))
        {
            return Err(ApiError::unsupported(
                "modalities",
                "(other than [\"text\"])",
            ));
        }
    }
    if field(obj, "audio").is_some() {
        return Err(ApiError::unsupported("audio", "(audio output)"));
    }
    Ok(())
}

fn parse_content(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text") {
                        Some(Value::String(s)) => out.push_str(s),
                        Some(t) => {
                            return Err(ApiError::wrong_type(&format!("{pp}.text"), "a string", t))
                        }
                        None => {
                            return Err(ApiError::invalid(
                                &pp,
                                format!("Missing required parameter: '{pp}.text'."),
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::unsupported(
                            &format!("{pp}.type"),
                            &format!("(content part type \"{other}\"; only \"text\")"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            &pp,
                            format!("Missing required parameter: '{pp}.type'."),
                        ))
                    }
                }
            }
            Ok(out)
        }
        other => Err(ApiError::wrong_type(
            param,
            "a string or an array of text parts",
            other,
        )),
    }
}

fn parse_messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match field(obj, "messages") {
        None => {
            return Err(ApiError::invalid(
                "messages",
                "Missing required parameter: 'messages'.",
            ))
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("messages", "an array", v)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut call_ids: Vec<String> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Some(m) = m.as_object() else {
            return Err(ApiError::wrong_type(&p, "an object", m));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            Some(v) => return Err(ApiError::wrong_type(&format!("{p}.role"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!("Missing required parameter: '{p}.role'."),
                ))
            }
        };
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            "function" => {
                return Err(ApiError::unsupported(
                    &format!("{p}.role"),
                    "(\"function\" messages are deprecated: use \"tool\")",
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!("Invalid value: '{other}'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'."),
                ))
            }
        };
        let mut tool_calls = Vec::new();
        if let Some(v) = m.get("tool_calls").filter(|v| !v.is_null()) {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    &format!("{p}.tool_calls"),
                    format!("Invalid '{p}.tool_calls': only assistant messages carry tool calls."),
                ));
            }
            tool_calls = tool_use::openai_tool_calls(v, &format!("{p}.tool_calls"))?;
            for c in &tool_calls {
                call_ids.push(c["id"].as_str().unwrap_or_default().to_string());
            }
        }
        let mut tool_call_id = None;
        if role == "tool" {
            let id = match m.get("tool_call_id") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => {
                    return Err(ApiError::wrong_type(
                        &format!("{p}.tool_call_id"),
                        "a string",
                        v,
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        &format!("{p}.tool_call_id"),
                        format!("Missing required parameter: '{p}.tool_call_id'."),
                    ))
                }
            };
            if !call_ids.contains(&id) {
                return Err(ApiError::invalid(
                    &format!("{p}.tool_call_id"),
                    format!("Invalid '{p}.tool_call_id': no earlier assistant message has a tool call with id '{id}'."),
                ));
            }
            tool_call_id = Some(id);
        }
        let content = match m.get("content") {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    &format!("{p}.content"),
                    format!("Missing required parameter: '{p}.content'."),
                ))
            }
            Some(v) => parse_content(v, &format!("{p}.content"))?,
        };
        let mut msg = ChatMessage::new(role, &content);
        msg.tool_calls = tool_calls;
        msg.tool_call_id = tool_call_id;
        out.push(msg);
    }
    Ok(out)
}

fn parse_ids(list: &[Value], param: &str) -> Result<Vec<u32>, ApiError> {
    list.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    ApiError::wrong_type(param, "an array of token ids (integers >= 0)", v)
                })
        })
        .collect()
}

fn parse_prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let v = field(obj, "prompt")
        .ok_or_else(|| ApiError::invalid("prompt", "Missing required parameter: 'prompt'."))?;
    let batch = || {
        ApiError::unsupported(
            "prompt",
            "(a batch of several prompts; send one request per prompt)",
        )
    };
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(a) if a.is_empty() => Err(ApiError::invalid(
            "prompt",
            "Invalid 'prompt': empty array.",
        )),
        Value::Array(a) => match &a[0] {
            Value::Number(_) => Ok(Prompt::Ids(parse_ids(a, "prompt")?)),
            Value::String(s) if a.len() == 1 => Ok(Prompt::Text(s.clone())),
            Value::Array(inner) if a.len() == 1 => Ok(Prompt::Ids(parse_ids(inner, "prompt")?)),
            Value::String(_) | Value::Array(_) => Err(batch()),
            other => Err(ApiError::wrong_type(
                "prompt",
                "a string, an array of token ids, or an array of one string",
                other,
            )),
        },
        other => Err(ApiError::wrong_type(
            "prompt",
            "a string or an array of token ids",
            other,
        )),
    }
}

fn parse_stop(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::wrong_type("stop", "a string or an array of strings", v)
                })
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::wrong_type(
                "stop",
                "a string or an array of strings",
                v,
            ))
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "Invalid 'stop': array too long. Expected at most {MAX_STOP_STRINGS} strings, but got {}.",
                list.len()
            ),
        ));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Parses and validates a request body for `endpoint`.
///
/// # Errors
/// 400 [`ApiError`] for a body that is not a JSON object, a field of the wrong type or out of
/// range, a missing `model`/`messages`/`prompt`, or a field coli cannot honour.
pub fn parse_request(body: &[u8], endpoint: Endpoint) -> Result<GenRequest, ApiError> {
    if endpoint == Endpoint::Messages {
        return super::anthropic::parse_request(body);
    }
    let v: Value = serde_json::from_slice(body).map_err(ApiError::malformed)?;
    let Value::Object(obj) = v else {
        return Err(ApiError::malformed(format!("got {}", type_name(&v))));
    };
    let model = match field(&obj, "model") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(ApiError::wrong_type("model", "a string", v)),
        None => {
            return Err(ApiError::invalid(
                "model",
                "Missing required parameter: 'model'.",
            ))
        }
    };
    refuse_unsupported(&obj)?;
    let tools = if endpoint == Endpoint::Chat {
        let list = tool_use::openai_tools(&obj)?;
        let (choice, parallel) = tool_use::openai_choice(&obj, &list)?;
        ToolRequest {
            tools: list,
            choice,
            parallel,
            json_schema: tool_use::response_format(&obj)?,
        }
    } else {
        for name in ["tools", "tool_choice", "response_format"] {
            if field(&obj, name).is_some() {
                return Err(ApiError::unsupported(name, "(chat completions only)"));
            }
        }
        ToolRequest::default()
    };
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(parse_messages(&obj)?),
        Endpoint::Completions => parse_prompt(&obj)?,
        Endpoint::Messages => unreachable!("dispatched to anthropic::parse_request above"),
    };
    // max_completion_tokens supersedes max_tokens (OpenAI deprecated the latter for chat).
    let max_tokens = match get_count(&obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => get_count(&obj, "max_tokens")?,
    };
    let temperature = get_f32(&obj, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("Invalid 'temperature': expected a value in [0, 2], got {temperature}."),
        ));
    }
    let mut top_p = get_f32(&obj, "top_p")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&top_p) {
        return Err(ApiError::invalid(
            "top_p",
            format!("Invalid 'top_p': expected a value in [0, 1], got {top_p}."),
        ));
    }
    let mut temperature = temperature;
    if top_p == 0.0 {
        // Only the most likely token survives: greedy.
        temperature = 0.0;
        top_p = 1.0;
    }
    let top_k = match field(&obj, "top_k") {
        None => 0,
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => 0,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
            None => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("Invalid 'top_k': expected an integer >= 0 (or -1 for off), got {n}."),
                ))
            }
        },
        Some(v) => return Err(ApiError::wrong_type("top_k", "an integer", v)),
    };
    let seed = match field(&obj, "seed") {
        None => None,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Some(u),
            (None, Some(i)) => Some(i as u64),
            _ => {
                return Err(ApiError::wrong_type(
                    "seed",
                    "an integer",
                    &Value::Number(n.clone()),
                ))
            }
        },
        Some(v) => return Err(ApiError::wrong_type("seed", "an integer", v)),
    };
    let stop = parse_stop(&obj)?;
    let n = get_count(&obj, "n")?.unwrap_or(1);
    if n > MAX_N {
        return Err(ApiError::invalid(
            "n",
            format!("Invalid 'n': expected a value <= {MAX_N}, got {n}."),
        ));
    }
    let ignore_eos = get_bool(&obj, "ignore_eos")?.unwrap_or(false);
    let stream = get_bool(&obj, "stream")?.unwrap_or(false);
    let include_usage = match field(&obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => get_bool(o, "include_usage")
            .map_err(|_| {
                ApiError::wrong_type(
                    "stream_options.include_usage",
                    "a boolean",
                    &o["include_usage"],
                )
            })?
            .unwrap_or(false),
        Some(v) => return Err(ApiError::wrong_type("stream_options", "an object", v)),
    };
    Ok(GenRequest {
        model,
        prompt,
        max_tokens,
        temperature,
        top_p,
        top_k,
        seed,
        stop,
        stream,
        include_usage,
        n,
        ignore_eos,
        tools,
        thinking: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<GenRequest, ApiError> {
        parse_request(body.to_string().as_bytes(), Endpoint::Chat)
    }

    fn completion(body: Value) -> Result<GenRequest, ApiError> {
        parse_request(body.to_string().as_bytes(), Endpoint::Completions)
    }

    #[test]
    fn chat_request_fields() {
        let r = chat(json!({
            "model": "m", "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "max_tokens": 7, "max_completion_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": -1,
            "stop": ["x", "", "yz"], "stream": true, "stream_options": {"include_usage": true},
            "n": 1, "logprobs": false, "user": "ignored", "unknown_field": {"deep": 1},
            "tools": [], "response_format": {"type": "text"}, "presence_penalty": 0,
        }))
        .unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "ab"),
                ChatMessage::new("assistant", ""),
            ])
        );
        assert_eq!(r.max_tokens, Some(5));
        assert_eq!((r.temperature, r.top_p, r.seed), (0.0, 0.5, Some(u64::MAX)));
        assert_eq!(r.top_k, 0);
        assert_eq!(r.stop, vec!["x".to_string(), "yz".to_string()]);
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn defaults_follow_openai() {
        let r = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                             "temperature": null, "stop": "END"}),
        )
        .unwrap();
        assert_eq!(
            (r.temperature, r.top_p, r.seed, r.max_tokens),
            (1.0, 1.0, None, None)
        );
        let k = |v: Value| {
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": v}))
                .map(|r| r.top_k)
        };
        assert_eq!((k(json!(40)).unwrap(), k(json!(-1)).unwrap()), (40, 0));
        assert_eq!(k(json!(-2)).unwrap_err().param.as_deref(), Some("top_k"));
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert!(!r.stream && !r.include_usage);
        // top_p 0 keeps only the most likely token.
        let r = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}),
        )
        .unwrap();
        assert_eq!((r.temperature, r.top_p), (0.0, 1.0));
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| completion(json!({"model": "m", "prompt": v})).map(|r| r.prompt);
        assert_eq!(p(json!("hello")).unwrap(), Prompt::Text("hello".into()));
        assert_eq!(p(json!(["hello"])).unwrap(), Prompt::Text("hello".into()));
        assert_eq!(p(json!([1, 2, 3])).unwrap(), Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(p(json!([[4, 5]])).unwrap(), Prompt::Ids(vec![4, 5]));
        let e = p(json!(["a", "b"])).unwrap_err();
        assert_eq!(e.code, Some("unsupported_parameter"));
        let e = p(json!([1, -2])).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, Some("invalid_type"))
        );
        assert!(p(json!([])).is_err());
        assert!(p(json!(3)).is_err());
        assert!(completion(json!({"model": "m"}))
            .unwrap_err()
            .message
            .contains("'prompt'"));
    }

    #[test]
    fn malformed_and_wrong_types_are_400() {
        for body in ["{", "[1]", "\"x\"", ""] {
            let e = parse_request(body.as_bytes(), Endpoint::Chat).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert!(e.message.contains("parse the JSON body"), "{}", e.message);
        }
        let cases = [
            (json!({"model": 3, "messages": []}), "model"),
            (json!({"model": "m", "messages": "hi"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 1.5}),
                "top_p",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": "s"}),
                "seed",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
                "stream",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}),
                "stop",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}),
                "stop",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            let b = e.body();
            assert_eq!(b["error"]["type"], "invalid_request_error");
            assert!(b["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn tools_and_structured_output() {
        let tool = json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let r = chat(json!({"model": "m", "tools": [tool], "tool_choice": "required",
            "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "5 C"}]}))
        .unwrap();
        assert!(r.tools.forced() && !r.tools.parallel);
        let Prompt::Chat(m) = &r.prompt else {
            panic!("a chat")
        };
        assert_eq!(
            m[1].tool_calls,
            vec![json!({"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]
        );
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
        let r = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "p",
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
        )
        .unwrap();
        assert_eq!(
            r.tools.json_schema,
            Some(json!({"type": "object", "properties": {"a": {"type": "integer"}}}))
        );
        // Bad tools, choices and formats: a 400 naming the field.
        let many: Vec<Value> = (0..1000)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        let msgs = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"tools": many}), "tools"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": 3}}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tools": [tool, tool]}), "tools"),
            (
                json!({"tools": [{"type": "code_interpreter"}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "absent"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [tool], "tool_choice": "always"}),
                "tool_choice",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "call_9", "content": "r"}]}),
                "messages[1].tool_call_id",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": "{oops"}}]}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
        ];
        for (extra, param) in cases {
            let mut b = json!({"model": "m", "messages": msgs});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            let e = chat(b).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{param}");
            assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        }
    }

    #[test]
    fn unsupported_fields_are_refused_not_ignored() {
        let base = || json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let cases = [
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!({"name": "f"})),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(2)),
            ("best_of", json!(2)),
            ("logit_bias", json!({"42": 1})),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(-1)),
            ("echo", json!(true)),
            ("suffix", json!("tail")),
            ("modalities", json!(["audio"])),
        ];
        for (name, value) in cases {
            let mut b = base();
            b[name] = value;
            let e = chat(b).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{name}");
            assert_eq!(e.param.as_deref(), Some(name));
            assert_eq!(e.code, Some("unsupported_parameter"));
        }
        let e = chat(json!({"model": "m", "messages": [{"role": "function", "content": "x"}]}))
            .unwrap_err();
        assert_eq!(e.code, Some("unsupported_parameter"));
        let e = completion(json!({"model": "m", "prompt": "x", "tools": []})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools"));
        let e = chat(json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}))
            .unwrap_err();
        assert_eq!(e.code, Some("unsupported_parameter"));
        let e = completion(json!({"model": "m", "prompt": "x", "best_of": 3})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
    }

    #[test]
    fn error_shapes() {
        let e = ApiError::queue_full(2, 3);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let r = e.clone().into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(e.body()["error"]["type"], "rate_limit_error");
        let e = ApiError::model_not_found("gpt-4", "demo");
        assert_eq!(
            (e.status, e.body()["error"]["code"].clone()),
            (StatusCode::NOT_FOUND, json!("model_not_found"))
        );
        assert_eq!(
            ApiError::unauthorized(true).status,
            StatusCode::UNAUTHORIZED
        );
        let e = ApiError::context_length(100, 90, 20);
        assert!(e.message.contains("110 tokens"), "{}", e.message);
        assert_eq!(e.code, Some("context_length_exceeded"));
    }
}
