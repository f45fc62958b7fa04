//! `coli serve`: an OpenAI-compatible HTTP server on the engine (axum + tokio).
//!
//! Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` (both
//! streaming as server-sent events and not), `GET /health`, `GET /metrics`. One engine runs on a
//! dedicated thread that owns the store and batches: up to `--max-batch` sequences decode
//! together, one forward pass per step, new requests joining at step boundaries
//! (serve/worker.rs has the scheduler). Handlers tokenize and validate, then queue a job FIFO on
//! a bounded channel (`--max-queue` waiting jobs; a full queue answers 429 with `Retry-After`).
//! A client that disconnects drops its `CancelOnDrop` (serve/worker.rs) guard, which frees its
//! sequences at the next step (or skips it while queued). Finished sequences keep their KV
//! cache, so a prompt that extends an earlier conversation prefills only its new tokens. On
//! SIGTERM or Ctrl-C the server stops admitting requests, lets running ones finish for up to
//! `--shutdown-grace` seconds, ends the rest with finish reason `abort`, and exits 0.
//! With `--web` (`coli web`) it also serves a page at `/` and its JSON endpoints
//! (serve/web.rs, docs/WEB.md). See `docs/SERVE.md`.

mod anthropic;
mod api;
pub mod limits;
mod metrics;
pub mod text;
mod tool_use;
mod web;
mod worker;

use anyhow::{bail, Context, Result};
use api::{ApiError, Endpoint, GenRequest, Prompt};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use coli_engine::constrain::{Constraint, Grammars};
use coli_engine::tool_calls::grammar::{self, ToolSpec};
use coli_engine::tool_calls::{ParamTypes, ParsedCall, ToolSyntax};

use coli_engine::{ChatMessage, GenerateParams, SamplingParams, TextTokenizer};
use metrics::Metrics;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use text::ReplyFormat;
use tokio::sync::mpsc;
use worker::{CancelOnDrop, EngineInfo, Event, Finish, Job, JobTimes, Shutdown};

/// `coli serve` options.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The engine options (as `coli run`).
    #[command(flatten)]
    pub engine: crate::options::EngineOptions,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port (0 = any free port; the chosen address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints and the web page's data
    /// (/web/api/state, /web/api/experts). Repeat it for several clients: a prefix cached for
    /// one key is never reused for another. (COLI_API_KEY: one key.)
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "COLI_API_KEY",
        hide_env_values = true
    )]
    api_keys: Vec<String>,
    /// Requests that may wait for the engine while one runs; more are answered 429.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_queue: u32,
    /// Model id of /v1/models and the `model` field (default: the store directory's name).
    #[arg(long, value_name = "NAME")]
    model_id: Option<String>,
    /// Sequences decoded together in one forward pass (continuous batching; a request with
    /// `n` choices takes n). Default: 8, or fewer when fewer sequences' KV caches at
    /// `--context` fit beside the dense set and the expert budget in the memory this process
    /// may use (MemAvailable capped by its memory cgroup; see `coli plan`); a given N that does
    /// not fit is refused.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    max_batch: Option<u32>,
    /// Seconds running generations may go on after SIGTERM or Ctrl-C before they are ended
    /// with finish reason `abort`.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    shutdown_grace: f64,
    /// A reasoning model's `<think>...</think>` block: `separate` returns it as the message's
    /// `reasoning_content` (as vLLM and llama.cpp do), `inline` leaves it in the content.
    /// gpt-oss's harmony channels are always separated.
    #[arg(long, value_enum, default_value_t = ReasoningArg::Separate)]
    reasoning: ReasoningArg,
    #[command(flatten)]
    speculation: crate::options::SpeculationArgs,
    #[command(flatten)]
    kv_disk: crate::options::KvDiskArgs,
    #[command(flatten)]
    limits: limits::LimitArgs,
    /// Also serve the web page at `/`: chat, live figures (tok/s, TTFT, hit rate by tier,
    /// bytes per token, I/O wait, disk GiB/s per drive), the heat map of expert routing and
    /// residency, and the memory plan (docs/WEB.md). `coli web` is this option's shorthand.
    #[arg(long)]
    pub web: bool,
}

/// `--reasoning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningArg {
    /// `reasoning_content` apart from `content`.
    Separate,
    /// Thoughts left in `content`, tags included.
    Inline,
}

/// State shared by the handlers.
struct App {
    model_id: String,
    created: u64,
    /// Accepted API keys (empty: no key needed).
    api_keys: Vec<String>,
    tok: Arc<TextTokenizer>,
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    times: Arc<JobTimes>,
    info: EngineInfo,
    max_queue: usize,
    /// Speculative decoding of every request.
    speculation: coli_engine::SpeculationParams,
    /// `--reasoning separate`: `<think>` blocks go to `reasoning_content`.
    split_think: bool,
    next_id: AtomicU64,
    shutdown: Arc<Shutdown>,
    /// What the engine thread publishes for the web page (`--web`; None without it).
    view: Option<Arc<web::ViewCell>>,
    /// Grammars over the model's tokens (constrained decoding), built on first use; the
    /// error when the tokenizer's tokens cannot be read as bytes.
    grammars: std::sync::OnceLock<std::result::Result<Arc<Grammars>, String>>,
}

impl App {
    /// The grammar compiler, built on first use.
    fn grammars(&self, param: &str) -> std::result::Result<Arc<Grammars>, ApiError> {
        self.grammars
            .get_or_init(|| {
                let eos = self.info.eos.first().copied().unwrap_or(0);
                Grammars::new(self.tok.clone(), self.info.vocab, eos)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| {
                ApiError::unsupported(
                    param,
                    &format!("(constrained decoding with this tokenizer: {e})"),
                )
            })
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parses a request body as the server does for `path` (`/v1/chat/completions`,
/// `/v1/completions` or `/v1/messages`), for the fuzz tests of request parsing
/// (tests/tests/fuzz_parsers.rs): `Ok` when the server would accept it, else the message of the
/// 400 it would answer. Never panics, whatever the bytes.
///
/// # Panics
/// For another path.
pub fn parse_request_body(path: &str, body: &[u8]) -> std::result::Result<(), String> {
    let endpoint = match path {
        "/v1/chat/completions" => api::Endpoint::Chat,
        "/v1/completions" => api::Endpoint::Completions,
        "/v1/messages" => api::Endpoint::Messages,
        other => panic!("{other} takes no body"),
    };
    api::parse_request(body, endpoint)
        .map(|_| ())
        .map_err(|e| e.message)
}

/// Runs the server until Ctrl-C or SIGTERM.
///
/// # Errors
/// The store or model cannot be loaded, the store has no tokenizer, the address cannot be bound.
pub fn run(a: ServeArgs) -> Result<()> {
    let model_id = match &a.model_id {
        Some(m) => m.clone(),
        None => a
            .engine
            .store
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "coli".to_string()),
    };
    let metrics = Arc::new(Metrics::new());
    let times = Arc::new(JobTimes::default());
    let max_queue = a.max_queue as usize;
    let (jobs_tx, jobs_rx) = mpsc::channel(max_queue);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    if a.api_keys.iter().any(|k| k.trim().is_empty()) {
        bail!("--api-key (or COLI_API_KEY) is empty: give a non-empty key, or leave the option out to serve without keys");
    }
    if !(a.shutdown_grace >= 0.0 && a.shutdown_grace.is_finite()) {
        bail!(
            "--shutdown-grace {}: expected a number of seconds >= 0",
            a.shutdown_grace
        );
    }
    let limits = a.limits.limits()?;
    limits::raise_open_file_limit(limits.max_connections)?;
    let shutdown = Arc::new(Shutdown::default());
    let view = a.web.then(|| Arc::new(web::ViewCell::default()));
    let worker = {
        let shared = worker::Shared {
            metrics: metrics.clone(),
            times: times.clone(),
            shutdown: shutdown.clone(),
            view: view.clone(),
        };
        let opts = a.engine;
        let speculation = a.speculation.params();
        let max_batch = a.max_batch.map(|n| n as usize);
        let kv_disk = a.kv_disk;
        std::thread::Builder::new()
            .name("coli-engine".into())
            .spawn(move || {
                worker::run(
                    opts,
                    speculation,
                    max_batch,
                    kv_disk,
                    shared,
                    jobs_rx,
                    ready_tx,
                )
            })
            .context("starting the engine thread")?
    };
    let info = match ready_rx.recv() {
        Ok(r) => r?,
        Err(_) => bail!("the engine thread stopped while loading the model"),
    };
    let speculation = info.speculation;
    let app = Arc::new(App {
        model_id,
        created: unix_now(),
        api_keys: a.api_keys.iter().map(|k| k.trim().to_string()).collect(),
        tok: info.tok.clone(),
        jobs: jobs_tx,
        metrics,
        times,
        info,
        max_queue,
        speculation,
        split_think: a.reasoning == ReasoningArg::Separate,
        next_id: AtomicU64::new(1),
        shutdown: shutdown.clone(),
        view,
        grammars: std::sync::OnceLock::new(),
    });
    let grace = Duration::from_secs_f64(a.shutdown_grace);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let served = rt.block_on(serve(app, &a.host, a.port, limits, shutdown, grace));
    drop(rt);
    // Every job sender is gone with the app: the engine thread finishes its job and returns.
    let _ = worker.join();
    served
}

async fn serve(
    app: Arc<App>,
    host: &str,
    port: u16,
    limits: limits::Limits,
    shutdown: Arc<Shutdown>,
    grace: Duration,
) -> Result<()> {
    let listener = limits::bind(host, port)
        .await
        .with_context(|| format!("binding {host}:{port}; pick another --port or --host"))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    eprintln!(
        "coli serve: model '{}' loaded in {:.2} s (context {} tokens, max batch {} sequences, {:.1} MiB of KV cache each at full context, {} threads, numerics {}, speculative decoding {}{}); listening on http://{addr}",
        app.model_id,
        app.info.load_s,
        app.info.context,
        app.info.max_batch,
        app.info.kv_bytes_per_sequence as f64 / (1u64 << 20) as f64,
        app.info.threads,
        coli_kernels::numerics().name(),
        app.speculation.mode,
        match app.speculation.mode {
            coli_engine::Speculate::Off => String::new(),
            _ => format!(" with up to {} drafts", app.speculation.draft_tokens),
        },
    );
    if app.view.is_some() {
        eprintln!("coli serve: web page on http://{addr}/");
    }
    if app.api_keys.is_empty() && !addr.ip().is_loopback() {
        eprintln!(
            "coli serve: warning: listening on {} without --api-key: anyone who can reach this address can use the model and read /metrics; give --api-key KEY (or bind --host 127.0.0.1)",
            addr.ip()
        );
    }
    let mut router = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text));
    if app.view.is_some() {
        router = router.merge(web::routes());
    }
    let metrics = app.metrics.clone();
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The body limits are limits::limit_body's (--max-body-bytes and the rates).
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(limits.clone()),
            limits::limit_body,
        ))
        .layer(axum::middleware::from_fn(log_refusals))
        .with_state(app);
    let signal = async move {
        shutdown_signal().await;
        // No request is admitted from now on; running generations end within the grace
        // period (then with finish reason `abort`), and their responses with them.
        shutdown.begin(grace);
        eprintln!(
            "coli serve: shutting down (running requests may finish for {:.1} s)",
            grace.as_secs_f64()
        );
    };
    // Responses end within the grace period; a few seconds more for them to be written.
    let drain = grace + Duration::from_secs(5);
    limits::serve(listener, router, limits, metrics, signal, drain)
        .await
        .context("serving HTTP")?;
    eprintln!("coli serve: shut down");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Checks the request's API key; returns the scope of its cached prefixes
/// ([`coli_engine::prefix_cache::scope_of`]: 0 when the server needs no key).
fn check_key(app: &App, headers: &HeaderMap) -> Result<u64, ApiError> {
    if app.api_keys.is_empty() {
        return Ok(0);
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The auth scheme is case-insensitive (RFC 9110 section 11.1).
        .and_then(|v| {
            let (scheme, key) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(key)
        });
    // Anthropic's clients send the key as `x-api-key`; either header may carry it (a proxy
    // may add an Authorization of its own).
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    for g in [given, x_api_key].into_iter().flatten() {
        if let Some(k) = app.api_keys.iter().find(|k| k.trim() == g.trim()) {
            return Ok(coli_engine::prefix_cache::scope_of(Some(k.trim())));
        }
    }
    Err(ApiError::unauthorized(
        given.is_some() || x_api_key.is_some(),
    ))
}

fn model_object(app: &App) -> Value {
    json!({"id": app.model_id, "object": "model", "created": app.created, "owned_by": "coli"})
}

async fn list_models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

async fn get_model(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    if id != app.model_id {
        return ApiError::model_not_found(&id, &app.model_id).into_response();
    }
    Json(model_object(&app)).into_response()
}

/// `GET /health`: open to every client. With `--api-key`, a request without the key learns
/// only whether the server serves (no model id, no figures); with the key, everything.
async fn health(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.jobs.is_closed() {
        return ApiError::unavailable("the engine thread has stopped").into_response();
    }
    if check_key(&app, &headers).is_err() {
        return Json(json!({"status": "ok"})).into_response();
    }
    Json(json!({
        "status": "ok",
        "model": app.model_id,
        "queue_depth": app.metrics.queue_depth.get(),
        "running": app.metrics.running.get(),
    }))
    .into_response()
}

/// `GET /metrics`: with `--api-key` it needs the key as every API route does (Prometheus
/// sends it as a bearer token: `authorization` in its scrape config).
async fn metrics_text(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

/// Logs every refused request (status 400 and above) to stderr with its method, path, status
/// and reason (the [`api::RefusalReason`] its error set, else the status's own name), so that
/// bad requests, missing keys and overload are visible in the server log.
async fn log_refusals(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let r = next.run(req).await;
    let status = r.status();
    if status.is_client_error() || status.is_server_error() {
        let reason = r.extensions().get::<api::RefusalReason>().map_or_else(
            || status.canonical_reason().unwrap_or("").to_string(),
            |x| x.0.clone(),
        );
        eprintln!(
            "coli serve: {method} {} -> {}: {}",
            clip(&path, 200),
            status.as_u16(),
            clip(&reason, 400)
        );
    }
    r
}

/// `s` cut to at most `max` bytes (at a character boundary) with `...` when cut: a log line
/// about a request must not be as long as the request.
fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len()).into()
}

async fn not_found(uri: Uri) -> Response {
    ApiError::route_not_found(uri.path()).into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}

/// The body, or the extractor's rejection (e.g. 413 over the size limit) in OpenAI's shape.
fn body_or_error(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| ApiError::body_rejected(r.status(), &r.body_text()))
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(app, headers, body_or_error(body), Endpoint::Chat).await
}

async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(app, headers, body_or_error(body), Endpoint::Completions).await
}

/// Anthropic's Messages API (`anthropic.rs`); the `anthropic-version` header is accepted and
/// not checked.
async fn messages(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(app, headers, body_or_error(body), Endpoint::Messages).await
}

/// A validated, tokenized request ready to queue.
struct Prepared {
    req: GenRequest,
    prompt: Vec<u32>,
    params: GenerateParams,
    /// How a chat reply's text splits into content and reasoning (plain for completions).
    reply_format: ReplyFormat,
    /// The model's call syntax and the tools' parameter types, when replies are parsed for
    /// tool calls.
    tools: Option<ReplySyntax>,
    /// The grammar a forced tool call or `response_format` compiled to.
    constraint: Option<Constraint>,
}

/// Messages for a chat template that does not handle tools itself: the tools described in the
/// system message when it never reads `tools` (in `syntax`'s own call format); the assistant's
/// calls written out in `syntax` and tool results as user turns in `<tool_response>` tags when
/// it never reads `tool_calls` (Qwen2.5's and Hermes' conventions).
fn messages_for_template(
    messages: &[ChatMessage],
    tools: &[Value],
    syntax: ToolSyntax,
    reads_tools: bool,
    reads_calls: bool,
) -> Vec<ChatMessage> {
    let describe = !reads_tools && !tools.is_empty();
    let desc = || coli_engine::tool_calls::describe_tools(syntax, tools);
    let mut out = Vec::with_capacity(messages.len() + 1);
    if describe && messages.first().is_none_or(|m| m.role != "system") {
        out.push(ChatMessage::new("system", &desc()));
    }
    for (i, m) in messages.iter().enumerate() {
        let mut m = m.clone();
        if i == 0 && m.role == "system" && describe {
            m.content = format!("{}\n\n{}", m.content, desc());
        }
        if !reads_calls {
            for c in std::mem::take(&mut m.tool_calls) {
                let args = c["function"]["arguments"].to_string();
                let name = c["function"]["name"].as_str().unwrap_or_default();
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content
                    .push_str(&coli_engine::tool_calls::write_call(syntax, name, &args));
            }
            if m.role == "tool" {
                m = ChatMessage::new(
                    "user",
                    &format!("<tool_response>\n{}\n</tool_response>", m.content),
                );
            }
        }
        out.push(m);
    }
    out
}

/// How a reply's tool calls are written and typed, and whether a forced call's arguments stream.
type ReplySyntax = (ToolSyntax, ParamTypes, bool);

/// What a chat request `req` needs for tools: the reply parser's syntax and types (when tools
/// are offered) and the grammar its reply must follow: a forced call, or `response_format`
/// (which, beside tools the model may call, lets the reply be calls instead); `syntax` is the one
/// the model's chat template writes. A grammar that does not compile is a 400 naming the tool's
/// schema when one tool's schema alone fails, else the field that asked for the grammar.
fn tool_setup(
    app: &App,
    req: &GenRequest,
    syntax: ToolSyntax,
    ep: Endpoint,
) -> Result<(Option<ReplySyntax>, Option<Constraint>), ApiError> {
    let t = &req.tools;
    let parse = t
        .active()
        .then(|| (syntax, ParamTypes::from_tools(&t.tools), t.forced()));
    let (param, calls, json) = if t.forced() {
        ("tool_choice", true, None)
    } else if let Some(schema) = t.json_schema.as_ref() {
        let param = match ep {
            Endpoint::Messages => "output_config.format",
            _ => "response_format",
        };
        (param, t.active(), Some(schema))
    } else {
        return Ok((parse, None));
    };
    let g = app.grammars(param)?;
    let compile_error = |param: &str, e: String| {
        ApiError::invalid(
            param,
            format!("Invalid '{param}': the grammar library cannot compile it: {e}"),
        )
    };
    let lark = if calls {
        let specs: Vec<ToolSpec> = t
            .callable()
            .into_iter()
            .filter_map(ToolSpec::from_tool)
            .collect();
        let special = |m: &str| g.special_token(m);
        let lark = grammar::tool_call_grammar(syntax, &specs, t.parallel, &special, json)
            .map_err(|e| ApiError::invalid(param, e))?;
        let e = match g.compile(&lark) {
            Ok(c) => return Ok((parse, Some(c.with_param(param)))),
            Err(e) => e,
        };
        // It does not compile: a tool whose schema alone does not is named.
        for (i, tool) in t.tools.iter().enumerate() {
            let Some(spec) =
                ToolSpec::from_tool(tool).filter(|s| specs.iter().any(|c| c.name == s.name))
            else {
                continue;
            };
            let one = grammar::tool_call_grammar(syntax, &[spec], false, &special, None)
                .map_err(|e| ApiError::invalid(param, e))?;
            if let Err(e) = g.compile(&one) {
                let field = match ep {
                    Endpoint::Messages => format!("tools.{i}.input_schema"),
                    _ => format!("tools[{i}].function.parameters"),
                };
                return Err(compile_error(&field, e));
            }
        }
        return Err(compile_error(param, e));
    } else {
        grammar::json_grammar(json.expect("a schema when no call"))
    };
    let constraint = g.compile(&lark).map_err(|e| compile_error(param, e))?;
    Ok((parse, Some(constraint.with_param(param))))
}

/// Tokenizes the prompt and checks it against the context.
fn prepare(app: &App, req: GenRequest, ep: Endpoint) -> Result<Prepared, ApiError> {
    if req.model != app.model_id {
        return Err(ApiError::model_not_found(&req.model, &app.model_id));
    }
    let tok = &app.tok;
    let mut reply_format = ReplyFormat::Plain;
    let (mut tools, mut constraint) = (None, None);
    let prompt = match &req.prompt {
        Prompt::Chat(messages) => {
            let Some(template) = tok.chat_template.as_ref() else {
                return Err(ApiError::invalid(
                    "messages",
                    "The served model has no chat template; use /v1/completions.",
                ));
            };
            // Kimi K3's XTML format renders tools, but its replies' tool calls and structured
            // output are neither parsed nor constrained yet (the other syntaxes' grammars would
            // force text K3 does not write): refused rather than answered wrongly.
            if template.xtml && (!req.tools.tools.is_empty() || req.tools.json_schema.is_some()) {
                let param = if req.tools.tools.is_empty() {
                    "response_format"
                } else {
                    "tools"
                };
                return Err(ApiError::invalid(
                    param,
                    format!("The served model chats in Kimi K3's XTML format, whose tool calls and structured output coli does not parse or constrain yet; send the request without '{param}'."),
                ));
            }
            let offered = if req.tools.active() {
                &req.tools.tools[..]
            } else {
                &[]
            };
            let syntax = ToolSyntax::detect(&template.source);
            let reads_tools = template.has_tools_branch();
            let reads_calls = template.reads_tool_calls();
            let rendered = if reads_tools && reads_calls {
                tok.chat_ids_with_tools(messages, true, Some(offered))
            } else {
                let m = messages_for_template(messages, offered, syntax, reads_tools, reads_calls);
                tok.chat_ids_with_tools(&m, true, Some(offered))
            };
            let (text, ids) = rendered.map_err(|e| {
                ApiError::invalid("messages", format!("Applying the chat template: {e}"))
            })?;
            (tools, constraint) = tool_setup(app, &req, syntax, ep)?;
            // Anthropic's endpoint keeps `<think>` blocks inline in the text unless extended
            // thinking is asked for; harmony is always split (its channel names would otherwise
            // run into the text).
            let split_think = match ep {
                Endpoint::Messages => req.thinking,
                _ => app.split_think,
            };
            reply_format = text::reply_format(tok, &text, split_think);
            ids
        }
        Prompt::Text(t) => tok
            .encode(t, true)
            .map_err(|e| ApiError::invalid("prompt", format!("Tokenizing the prompt: {e}")))?,
        Prompt::Ids(ids) => {
            if let Some(&bad) = ids.iter().find(|&&i| i as usize >= app.info.vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!(
                        "Token id {bad} is outside the vocabulary (size {}).",
                        app.info.vocab
                    ),
                ));
            }
            ids.clone()
        }
    };
    let param = if matches!(req.prompt, Prompt::Chat(_)) {
        "messages"
    } else {
        "prompt"
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "The prompt has no tokens."));
    }
    // Ids from the tokenizer or the chat template must fit the model too: one bad prompt must
    // not fail the forward pass it would share with other requests.
    if let Some(&bad) = prompt.iter().find(|&&i| i as usize >= app.info.vocab) {
        return Err(ApiError::invalid(
            param,
            format!(
                "The prompt holds token id {bad}, outside the model's vocabulary (size {}); the tokenizer does not match the model.",
                app.info.vocab
            ),
        ));
    }
    let context = app.info.context;
    if prompt.len() > context {
        return Err(ApiError {
            param: Some(param.into()),
            ..ApiError::context_length(context, prompt.len(), 0)
        });
    }
    // The engine keeps prompt + max_tokens - 1 positions (the last token is never fed back).
    let room = context + 1 - prompt.len();
    let max_tokens = match req.max_tokens {
        Some(n) if n > room => return Err(ApiError::context_length(context, prompt.len(), n)),
        Some(n) => n,
        None => room,
    };
    let seed = req.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ app.next_id.load(Ordering::Relaxed).rotate_left(32)
    });
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: req.temperature,
            top_k: req.top_k,
            top_p: req.top_p,
            seed,
        },
        stop_on_eos: !req.ignore_eos,
        speculation: app.speculation,
    };
    Ok(Prepared {
        req,
        prompt,
        params,
        reply_format,
        tools,
        constraint,
    })
}

async fn generate(
    app: Arc<App>,
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
    ep: Endpoint,
) -> Response {
    let arrived = Instant::now();
    let r = match check_key(&app, &headers).and_then(|scope| Ok((scope, body?))) {
        Ok((scope, body)) => generate_checked(&app, body, ep, arrived, scope).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(resp) => resp,
        Err(e) => {
            app.metrics.count_request(ep.label(), e.status.as_u16());
            if ep == Endpoint::Messages {
                anthropic::error_response(&e)
            } else {
                e.into_response()
            }
        }
    }
}

/// The ids, creation time and model of one OpenAI response.
struct Meta {
    id: String,
    /// Choices of the request.
    n: usize,
    created: u64,
    model: String,
    ep: Endpoint,
}

impl Meta {
    /// One choice of a whole response; `reasoning` (harmony's analysis and commentary) becomes
    /// the message's `reasoning_content` when not empty.
    fn choice(
        &self,
        index: usize,
        text: &str,
        reasoning: &str,
        calls: &[ParsedCall],
        reason: &str,
    ) -> Value {
        match self.ep {
            // Messages responses are built by anthropic.rs, never from a Meta.
            Endpoint::Chat | Endpoint::Messages => {
                let mut message = json!({"role": "assistant", "content": text, "refusal": null});
                if !reasoning.is_empty() {
                    message["reasoning_content"] = json!(reasoning);
                }
                if !calls.is_empty() {
                    let list: Vec<Value> = calls
                        .iter()
                        .enumerate()
                        .map(|(k, c)| self.call(index, k, c))
                        .collect();
                    message["tool_calls"] = Value::Array(list);
                    if text.trim().is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({
                    "index": index, "message": message, "logprobs": null, "finish_reason": reason,
                })
            }
            Endpoint::Completions => {
                json!({"index": index, "text": text, "logprobs": null, "finish_reason": reason})
            }
        }
    }

    /// Call `k` of choice `index` as a message's `tool_calls` entry.
    fn call(&self, index: usize, k: usize, c: &ParsedCall) -> Value {
        json!({"id": tool_use::call_id("call_", &self.id, index, k), "type": "function",
               "function": {"name": c.name, "arguments": c.arguments}})
    }

    /// The streamed deltas of call `k` of chat choice `index`: its id and name, then its
    /// arguments.
    fn call_deltas(&self, index: usize, k: usize, c: &ParsedCall) -> [Value; 2] {
        let mut head = self.call(index, k, c);
        head["index"] = json!(k);
        head["function"]["arguments"] = json!("");
        let delta = |d: Value| {
            json!({"index": index, "delta": {"tool_calls": [d]}, "logprobs": null,
                   "finish_reason": null})
        };
        [
            delta(head),
            delta(json!({"index": k, "function": {"arguments": c.arguments}})),
        ]
    }

    /// One streamed piece of reasoning of chat choice `index` (`delta.reasoning_content`).
    fn reasoning_delta(&self, index: usize, text: &str) -> Value {
        json!({"index": index, "delta": {"reasoning_content": text}, "logprobs": null,
               "finish_reason": null})
    }

    /// One streamed piece of choice `index`: `text` (None: the role-only first chat chunk) and
    /// the finish reason.
    fn delta(&self, index: usize, text: Option<&str>, reason: Option<&str>) -> Value {
        match self.ep {
            // Messages responses are built by anthropic.rs, never from a Meta.
            Endpoint::Chat | Endpoint::Messages => {
                let delta = match (text, reason) {
                    (None, None) => json!({"role": "assistant", "content": ""}),
                    (Some(t), _) => json!({"content": t}),
                    (None, Some(_)) => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
            Endpoint::Completions => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason,
            }),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.ep, chunk) {
            (Endpoint::Chat | Endpoint::Messages, false) => "chat.completion",
            (Endpoint::Chat | Endpoint::Messages, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn response(&self, choices: Value, usage: Option<Value>, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            // OpenAI's "backend configuration that the model runs with": the kernels' numerics
            // id, under which the same request gives the same tokens (docs/ENGINE.md).
            "model": self.model,
            "system_fingerprint": coli_kernels::numerics_id(coli_kernels::detected_isa()),
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// Usage of a request whose choices ended with `fins`: the prompt once, the completions of
/// every choice.
fn usage(fins: &[Finish]) -> Value {
    let prompt = fins.first().map_or(0, |f| f.prompt_tokens);
    let cached = fins.first().map_or(0, |f| f.cached_tokens);
    let completion: usize = fins.iter().map(|f| f.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// 429 with `Retry-After`: the mean time a request holds a batch slot times the requests
/// ahead (the queue and the running batch) over the batch size, 1 to 600 s.
fn queue_full(app: &App) -> ApiError {
    let ahead = (app.max_queue + app.info.max_batch) as f64 / app.info.max_batch as f64;
    let secs = (app.times.mean_s() * ahead).ceil().clamp(1.0, 600.0) as u64;
    ApiError::queue_full(app.max_queue, secs)
}

async fn generate_checked(
    app: &Arc<App>,
    body: Bytes,
    ep: Endpoint,
    arrived: Instant,
    scope: u64,
) -> Result<Response, ApiError> {
    let req = api::parse_request(&body, ep)?;
    if app.shutdown.started() {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    if req.n > app.info.max_batch {
        return Err(ApiError::invalid(
            "n",
            format!(
                "Invalid 'n': this server decodes at most {} sequences together (--max-batch), got {}.",
                app.info.max_batch, req.n
            ),
        ));
    }
    if app.jobs.capacity() == 0 {
        // Full already: refuse before spending time on the chat template and the tokenizer.
        return Err(queue_full(app));
    }
    let p = prepare(app, req, ep)?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match ep {
        Endpoint::Chat => format!("chatcmpl-{:x}{n:06x}", app.created),
        Endpoint::Completions => format!("cmpl-{:x}{n:06x}", app.created),
        Endpoint::Messages => format!("msg_{:x}{n:06x}", app.created),
    };
    let choices = p.req.n;
    let prompt_tokens = p.prompt.len();
    // A forced call is markup throughout: stop strings are not applied to it.
    let stop = if p.req.tools.forced() {
        Vec::new()
    } else {
        p.req.stop.clone()
    };
    let job = Job {
        id: id.clone(),
        prompt: p.prompt,
        params: p.params,
        n: choices,
        stop,
        reply_format: p.reply_format,
        events: events_tx,
        cancel,
        arrived,
        scope,
        tools: p.tools,
        constraint: p.constraint,
    };
    app.metrics.queue_depth.inc();
    if let Err(e) = app.jobs.try_send(job) {
        app.metrics.queue_depth.dec();
        return Err(match e {
            mpsc::error::TrySendError::Full(_) => queue_full(app),
            mpsc::error::TrySendError::Closed(_) => {
                ApiError::unavailable("the engine thread has stopped; restart coli serve")
            }
        });
    }
    if ep == Endpoint::Messages {
        let meta = anthropic::MessageMeta {
            id,
            model: app.model_id.clone(),
            stop: p.req.stop.clone(),
            prompt_tokens,
            thinking: p.req.thinking,
        };
        if p.req.stream {
            app.metrics.count_request(ep.label(), 200);
            return Ok(anthropic::stream(meta, events, guard));
        }
        let _guard = guard;
        let v = anthropic::whole(&meta, &mut events).await?;
        app.metrics.count_request(ep.label(), 200);
        return Ok(Json(v).into_response());
    }
    let meta = Meta {
        id,
        n: choices,
        created: unix_now(),
        model: app.model_id.clone(),
        ep,
    };
    if p.req.stream {
        app.metrics.count_request(ep.label(), 200);
        return Ok(stream_response(meta, events, guard, p.req.include_usage));
    }
    // Not streaming: the guard lives in this future, which hyper drops if the client goes away.
    let _guard = guard;
    let mut texts = vec![String::new(); choices];
    let mut reasoning = vec![String::new(); choices];
    let mut calls: Vec<Vec<ParsedCall>> = vec![Vec::new(); choices];
    let mut done: Vec<Option<Finish>> = vec![None; choices];
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Text(i, t) => texts[i].push_str(&t),
            Event::Reasoning(i, t) => reasoning[i].push_str(&t),
            Event::ToolCall(i, c) | Event::ToolCallEnd(i, c) => calls[i].push(c),
            Event::ToolCallStart(..) | Event::ToolCallArgs(..) => {}
            Event::Done(i, f) => {
                done[i] = Some(f);
                if done.iter().all(Option::is_some) {
                    app.metrics.count_request(ep.label(), 200);
                    let fins: Vec<Finish> = done.into_iter().flatten().collect();
                    let list: Vec<Value> = fins
                        .iter()
                        .zip(texts.iter().zip(&reasoning))
                        .enumerate()
                        .map(|(i, (f, (t, r)))| meta.choice(i, t, r, &calls[i], f.reason))
                        .collect();
                    let v = meta.response(Value::Array(list), Some(usage(&fins)), false);
                    return Ok(Json(v).into_response());
                }
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before finishing this request",
    ))
}

/// The SSE response: a task turns engine events into chunks; it ends (dropping the cancel
/// guard) when generation ends or when the response body is dropped because the client left.
fn stream_response(
    meta: Meta,
    mut events: mpsc::UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    include_usage: bool,
) -> Response {
    let (out, body) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        let _guard = guard;
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        let null_usage = include_usage.then_some(Value::Null);
        let chunk = |choice: Value| meta.response(json!([choice]), null_usage.clone(), true);
        if meta.ep == Endpoint::Chat {
            for i in 0..meta.n {
                if out
                    .send(data(chunk(meta.delta(i, None, None))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        let mut fins: Vec<Finish> = Vec::new();
        let mut calls = vec![0usize; meta.n];
        loop {
            let ev = tokio::select! {
                ev = events.recv() => ev,
                () = out.closed() => return,
            };
            let last = match &ev {
                Some(
                    Event::Text(..)
                    | Event::Reasoning(..)
                    | Event::ToolCall(..)
                    | Event::ToolCallStart(..)
                    | Event::ToolCallArgs(..)
                    | Event::ToolCallEnd(..),
                ) => false,
                Some(Event::Done(..)) => fins.len() + 1 == meta.n,
                _ => true,
            };
            let msgs: Vec<Value> = match ev {
                Some(Event::Text(i, t)) => vec![chunk(meta.delta(i, Some(&t), None))],
                Some(Event::Reasoning(i, t)) => vec![chunk(meta.reasoning_delta(i, &t))],
                Some(Event::ToolCall(i, c)) => {
                    let k = calls[i];
                    calls[i] += 1;
                    meta.call_deltas(i, k, &c).into_iter().map(chunk).collect()
                }
                Some(Event::ToolCallStart(i, name)) => {
                    let k = calls[i];
                    let c = ParsedCall {
                        name,
                        arguments: String::new(),
                    };
                    vec![chunk(meta.call_deltas(i, k, &c)[0].clone())]
                }
                Some(Event::ToolCallArgs(i, a)) => {
                    let k = calls[i];
                    let c = ParsedCall {
                        name: String::new(),
                        arguments: a,
                    };
                    vec![chunk(meta.call_deltas(i, k, &c)[1].clone())]
                }
                Some(Event::ToolCallEnd(i, _)) => {
                    calls[i] += 1;
                    continue;
                }
                Some(Event::Done(i, f)) => {
                    fins.push(f);
                    let mut v = vec![chunk(meta.delta(i, None, Some(f.reason)))];
                    if include_usage && last {
                        v.push(meta.response(json!([]), Some(usage(&fins)), true));
                    }
                    v
                }
                Some(Event::Error(e)) => vec![e.body()],
                None => {
                    vec![
                        ApiError::internal("the engine stopped before finishing this request")
                            .body(),
                    ]
                }
            };
            for m in msgs {
                if out.send(data(m)).await.is_err() {
                    return;
                }
            }
            if last {
                let _ = out.send(Ok(SseEvent::default().data("[DONE]"))).await;
                return;
            }
        }
    });
    sse_response(body)
}

/// The SSE response of the events a task sends on `body`'s channel, with a keep-alive comment
/// every 5 s (while a request waits in the queue).
fn sse_response(body: mpsc::Receiver<Result<SseEvent, Infallible>>) -> Response {
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(body))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ep: Endpoint) -> Meta {
        Meta {
            id: "id-1".into(),
            n: 1,
            created: 1,
            model: "m".into(),
            ep,
        }
    }

    /// The `data:` payloads of an SSE response body.
    async fn sse_data(resp: Response) -> Vec<String> {
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "text/event-stream",
            "SSE content type"
        );
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = String::from_utf8(body.to_vec()).expect("UTF-8 body");
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    #[tokio::test]
    async fn chat_stream_chunks_usage_and_done() {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        for piece in ["hé", "世", "🎉"] {
            tx.send(Event::Text(0, piece.into())).expect("send");
        }
        tx.send(Event::Done(
            0,
            Finish {
                reason: "length",
                prompt_tokens: 3,
                cached_tokens: 1,
                completion_tokens: 4,
                stop_index: None,
            },
        ))
        .expect("send");
        let resp = stream_response(meta(Endpoint::Chat), rx, CancelOnDrop(cancel.clone()), true);
        let data = sse_data(resp).await;
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).expect("each chunk is JSON"))
            .collect();
        assert_eq!(chunks.len(), 1 + 3 + 1 + 1, "role, 3 pieces, finish, usage");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks[1..4]
            .iter()
            .map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .expect("content")
            })
            .collect();
        assert_eq!(text, "hé世🎉");
        for c in &chunks[..5] {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert!(c["usage"].is_null(), "usage is null before the last chunk");
        }
        assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[5]["choices"], json!([]));
        assert_eq!(chunks[5]["usage"]["total_tokens"], 7);
        assert_eq!(
            chunks[5]["usage"]["prompt_tokens_details"]["cached_tokens"],
            1
        );
        // The stream is over, so its guard was dropped.
        assert!(cancel.load(Ordering::Relaxed));
    }

    /// Tool calls stream as `delta.tool_calls` (id and name, then the arguments) and end the
    /// choice with `tool_calls`; the whole response carries them with `content` null.
    #[tokio::test]
    async fn chat_tool_call_deltas() {
        let call = |n: &str, a: &str| ParsedCall {
            name: n.into(),
            arguments: a.into(),
        };
        let fin = Finish {
            reason: "tool_calls",
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 9,
            stop_index: None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Event::ToolCall(0, call("f", "{\"a\":1}")))
            .expect("send");
        tx.send(Event::ToolCall(0, call("g", "{}"))).expect("send");
        tx.send(Event::Done(0, fin)).expect("send");
        let cancel = Arc::new(AtomicBool::new(false));
        let data = sse_data(stream_response(
            meta(Endpoint::Chat),
            rx,
            CancelOnDrop(cancel),
            false,
        ))
        .await;
        let deltas: Vec<Value> = data[1..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0].clone())
            .collect();
        assert_eq!(deltas.len(), 5, "{deltas:?}");
        let tc = |i: usize| deltas[i]["delta"]["tool_calls"][0].clone();
        assert_eq!(
            (tc(0)["index"].clone(), tc(0)["function"]["name"].clone()),
            (json!(0), json!("f"))
        );
        assert!(tc(0)["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(tc(1)["function"]["arguments"], "{\"a\":1}");
        assert!(tc(1).get("id").is_none());
        assert_eq!(
            (
                tc(2)["index"].clone(),
                tc(3)["function"]["arguments"].clone()
            ),
            (json!(1), json!("{}"))
        );
        assert_ne!(tc(0)["id"], tc(2)["id"]);
        assert_eq!(deltas[4]["finish_reason"], "tool_calls");
        // A streamed call (a forced one): its name, then each argument piece as it comes.
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Event::ToolCallStart(0, "f".into())).expect("send");
        tx.send(Event::ToolCallArgs(0, "{\"a\":".into()))
            .expect("send");
        tx.send(Event::ToolCallArgs(0, " 1}".into())).expect("send");
        tx.send(Event::ToolCallEnd(0, call("f", "{\"a\": 1}")))
            .expect("send");
        tx.send(Event::ToolCallStart(0, "g".into())).expect("send");
        tx.send(Event::ToolCallEnd(0, call("g", ""))).expect("send");
        tx.send(Event::Done(0, fin)).expect("send");
        let cancel = Arc::new(AtomicBool::new(false));
        let data = sse_data(stream_response(
            meta(Endpoint::Chat),
            rx,
            CancelOnDrop(cancel),
            false,
        ))
        .await;
        let tcs: Vec<Value> = data[1..data.len() - 2]
            .iter()
            .map(|d| {
                serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["tool_calls"][0]
                    .clone()
            })
            .collect();
        assert_eq!(tcs.len(), 4, "{tcs:?}");
        assert_eq!(
            (tcs[0]["index"].clone(), tcs[0]["function"]["name"].clone()),
            (json!(0), json!("f"))
        );
        assert_eq!(tcs[1]["function"]["arguments"], "{\"a\":");
        assert_eq!(tcs[2]["function"]["arguments"], " 1}");
        assert_eq!(
            (tcs[3]["index"].clone(), tcs[3]["function"]["name"].clone()),
            (json!(1), json!("g"))
        );
        let m = meta(Endpoint::Chat).choice(0, " ", "", &[call("f", "{}")], "tool_calls");
        assert!(m["message"]["content"].is_null());
        assert_eq!(
            m["message"]["tool_calls"][0]["function"],
            json!({"name": "f", "arguments": "{}"})
        );
    }

    /// A harmony reply (gpt-oss): reasoning streams as `delta.reasoning_content`, the final
    /// channel as `delta.content`; a whole response carries both in the message.
    #[tokio::test]
    async fn chat_reasoning_and_content() {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Event::Reasoning(0, "think".into())).expect("send");
        tx.send(Event::Text(0, "answer".into())).expect("send");
        let fin = Finish {
            reason: "stop",
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 9,
            stop_index: None,
        };
        tx.send(Event::Done(0, fin)).expect("send");
        let guard = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let data = sse_data(stream_response(meta(Endpoint::Chat), rx, guard, false)).await;
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).expect("JSON"))
            .collect();
        assert_eq!(
            chunks.len(),
            4,
            "role, reasoning, content, finish: {data:?}"
        );
        assert_eq!(
            chunks[1]["choices"][0]["delta"],
            json!({"reasoning_content": "think"})
        );
        assert_eq!(
            chunks[2]["choices"][0]["delta"],
            json!({"content": "answer"})
        );
        let m = meta(Endpoint::Chat);
        let c = m.choice(0, "answer", "think", &[], "stop");
        assert_eq!(c["message"]["content"], "answer");
        assert_eq!(c["message"]["reasoning_content"], "think");
        // Without reasoning the message has no such field (as before).
        let c = m.choice(0, "answer", "", &[], "stop");
        assert!(c["message"].get("reasoning_content").is_none(), "{c}");
    }

    #[tokio::test]
    async fn completion_stream_error_then_done() {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Event::Text(0, "a".into())).expect("send");
        tx.send(Event::Error(ApiError::internal("boom")))
            .expect("send");
        let guard = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let data = sse_data(stream_response(
            meta(Endpoint::Completions),
            rx,
            guard,
            false,
        ))
        .await;
        assert_eq!(data.len(), 3, "{data:?}");
        let first: Value = serde_json::from_str(&data[0]).expect("JSON");
        assert_eq!(
            (first["object"].clone(), first["choices"][0]["text"].clone()),
            (json!("text_completion"), json!("a"))
        );
        assert!(
            first.get("usage").is_none(),
            "no usage field without include_usage"
        );
        let err: Value = serde_json::from_str(&data[1]).expect("JSON");
        assert_eq!(err["error"]["message"], "boom");
        assert_eq!(data[2], "[DONE]");
    }

    #[tokio::test]
    async fn dropping_the_response_cancels_the_job() {
        let (_tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let resp = stream_response(
            meta(Endpoint::Chat),
            rx,
            CancelOnDrop(cancel.clone()),
            false,
        );
        assert!(!cancel.load(Ordering::Relaxed));
        drop(resp);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cancel.load(Ordering::Relaxed) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            cancel.load(Ordering::Relaxed),
            "a dropped body cancels its job"
        );
    }
}
