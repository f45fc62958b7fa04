//! `coli serve --web` (`coli web`): the web page and the JSON endpoints it polls.
//!
//! The page is plain files in `tools/web/` (HTML, CSS, JavaScript; no build step), embedded in
//! the binary with `include_str!` and served from it: nothing is fetched from the network. It
//! chats over the same OpenAI endpoints as any client and draws what the server measures:
//!
//! - `GET /web/api/state`: the server's counters and histogram sums since it started
//!   (tokens, expert lookups by tier, bytes read per drive, I/O wait and forward seconds,
//!   TTFT, inter-token latency, batch size), the queue, and the memory plan. Counters only
//!   grow; the page turns two polls into rates (tok/s, GiB/s, hit rate over the last seconds).
//! - `GET /web/api/experts`: the [`ExpertMap`]: per layer and expert, the tokens routed to it
//!   and where it is now (pinned, cached, being read, on which drive).
//!
//! Both need the API key when the server has one (the page asks for it); the page, its
//! assets and `GET /web/api/info` (`{"needs_key": bool}`) load without it. The engine thread owns the engine, so it publishes what the
//! handlers read into a [`ViewCell`]: after a step at most every [`VIEW_INTERVAL`], and
//! whenever the batch goes idle. See docs/WEB.md.

use super::{check_key, App};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use coli_engine::expert_map::ExpertMap;
use coli_engine::prefix_cache::PrefixCache;
use coli_engine::Engine;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shortest time between two views the engine thread publishes while the batch runs.
pub const VIEW_INTERVAL: Duration = Duration::from_millis(250);

/// The page's files, embedded (`tools/web/`).
const INDEX_HTML: &str = include_str!("../../web/index.html");
const APP_JS: &str = include_str!("../../web/app.js");
const STYLE_CSS: &str = include_str!("../../web/style.css");
const FAVICON_SVG: &str = include_str!("../../web/favicon.svg");

/// Everything the page may load or call comes from this server (the page makes no request
/// elsewhere; the policy makes the browser refuse one if it tried).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The latest [`EngineView`] the engine thread published (None until the model is loaded and
/// the first one is out).
#[derive(Default)]
pub struct ViewCell {
    view: Mutex<Option<Arc<EngineView>>>,
    /// When a page last asked for data, ms since the Unix epoch (0: never).
    polled_ms: std::sync::atomic::AtomicU64,
}

/// While no page has asked for data for this long, the engine thread publishes views only when
/// the batch goes idle (building one costs a pass over every expert).
pub const VIEW_IDLE_AFTER: Duration = Duration::from_secs(10);

impl ViewCell {
    /// Notes that a page asked for data now.
    pub fn touch(&self) {
        self.polled_ms
            .store(unix_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a page asked for data within [`VIEW_IDLE_AFTER`].
    pub fn watched(&self) -> bool {
        let at = self.polled_ms.load(std::sync::atomic::Ordering::Relaxed);
        unix_ms().saturating_sub(at) < VIEW_IDLE_AFTER.as_millis() as u64
    }

    /// Replaces the view.
    pub fn publish(&self, view: EngineView) {
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(view));
    }

    /// The latest view.
    pub fn get(&self) -> Option<Arc<EngineView>> {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Where memory goes, as the page draws it: one bar from 0 to the memory limit. Bytes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryPlan {
    /// The memory the process could use at start (MemAvailable capped by its cgroup), if read.
    pub memory_limit: Option<u64>,
    /// dense.bin (resident).
    pub dense: u64,
    /// Experts pinned (part of the expert budget).
    pub pinned: u64,
    /// The expert budget (pinned + LRU tiers); None when unbounded.
    pub expert_budget: Option<u64>,
    /// Experts held now (pinned + LRU tiers).
    pub expert_cache_used: u64,
    /// KV cache of one sequence at the context limit.
    pub kv_per_sequence: u64,
    /// Sequences decoded together at most (`--max-batch`).
    pub max_batch: usize,
    /// Sequences holding KV cache now.
    pub sequences_in_use: usize,
    /// The prefix cache's RAM budget (`--kv-cache-budget`).
    pub prefix_cache_budget: u64,
    /// Prefix-cache states held in RAM now.
    pub prefix_cache_used: u64,
    /// Every expert record of the store (what lives on disk).
    pub experts_on_disk: u64,
}

/// One drive the store reads experts from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DriveView {
    /// 0 the primary, k the k-th mirror.
    pub drive: usize,
    /// Its directory.
    pub dir: String,
    /// False once it left the rotation after repeated faults.
    pub in_rotation: bool,
}

/// What the engine thread publishes for the page.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EngineView {
    /// Routing counts and residency of every expert.
    pub experts: ExpertMap,
    /// Where memory goes.
    pub plan: MemoryPlan,
    /// The drives experts are read from (the primary alone without mirrors).
    pub drives: Vec<DriveView>,
    /// The I/O engine reading expert records, as `coli run` describes it.
    pub io_engine: String,
    /// Milliseconds since the Unix epoch when it was taken.
    pub at_ms: u64,
}

impl EngineView {
    /// Takes the view of `eng` (and the server's prefix cache and batch size).
    pub fn of(eng: &Engine<'_>, prefix: &PrefixCache, max_batch: usize) -> EngineView {
        let store = eng.store();
        let (budget, used) = eng.cache_usage();
        let p = eng.placement();
        let drives = match store.mirror_stats() {
            Some(ms) => ms
                .drives
                .iter()
                .enumerate()
                .map(|(k, d)| DriveView {
                    drive: k,
                    dir: d.dir.display().to_string(),
                    in_rotation: d.in_rotation,
                })
                .collect(),
            None => vec![DriveView {
                drive: 0,
                dir: store.dir().display().to_string(),
                in_rotation: true,
            }],
        };
        EngineView {
            experts: eng.expert_map(),
            plan: MemoryPlan {
                memory_limit: p.memory_limit,
                dense: store.manifest().dense_file.length,
                pinned: p.pinned_bytes,
                expert_budget: (budget != u64::MAX).then_some(budget),
                expert_cache_used: used,
                kv_per_sequence: eng.kv_bytes_per_sequence(),
                max_batch,
                sequences_in_use: eng.sequences_in_use(),
                prefix_cache_budget: eng.kv_cache_budget(),
                prefix_cache_used: prefix.ram_bytes(),
                experts_on_disk: store.index().iter().map(|r| r.length.get()).sum(),
            },
            drives,
            io_engine: store.io_engine_description(),
            at_ms: unix_ms(),
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The page's routes: `/`, its assets under `/web/`, and `/web/api/{state,experts}`.
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/web/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/web/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route(
            "/web/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route("/web/api/info", get(info))
        .route("/web/api/state", get(state))
        .route("/web/api/experts", get(experts))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Whether the page must ask for a key (answered without one, so that the page need not
/// make a request it knows will be refused).
async fn info(State(app): State<Arc<App>>) -> Response {
    Json(json!({"needs_key": !app.api_keys.is_empty()})).into_response()
}

/// `{sum, count}` of a histogram.
fn sum_count(h: &super::metrics::Observed) -> serde_json::Value {
    json!({"sum": h.sum(), "count": h.count()})
}

async fn state(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    let m = &app.metrics;
    if let Some(c) = &app.view {
        c.touch();
    }
    let view = app.view.as_ref().and_then(|c| c.get());
    let lookups = |result: &str| {
        m.expert_lookups
            .get_or_create(&vec![("result", result.to_string())])
            .get()
    };
    let drives: Vec<serde_json::Value> = view
        .as_ref()
        .map(|v| {
            v.drives
                .iter()
                .map(|d| {
                    let bytes = m
                        .drive_read_bytes
                        .get_or_create(&vec![("drive", d.drive.to_string())])
                        .get();
                    json!({"drive": d.drive, "dir": d.dir, "in_rotation": d.in_rotation,
                           "bytes_read": bytes})
                })
                .collect()
        })
        .unwrap_or_default();
    Json(json!({
        "model": app.model_id,
        "at_ms": unix_ms(),
        "server": {
            "context": app.info.context,
            "max_batch": app.info.max_batch,
            "threads": app.info.threads,
            "load_s": app.info.load_s,
            "speculation": app.speculation.mode.to_string(),
            "chat_template": app.tok.chat_template.is_some(),
            "io_engine": view.as_ref().map(|v| v.io_engine.clone()),
        },
        "counters": {
            "prompt_tokens": m.prompt_tokens.get(),
            "prefill_tokens": m.prefill_tokens.get(),
            "cached_tokens": m.cached_tokens.get(),
            "completion_tokens": m.completion_tokens.get(),
            "expert_bytes_read": m.expert_bytes_read.get(),
            "lookups": {
                "pinned": lookups("pinned"),
                "cached": lookups("cached"),
                "inflight": lookups("inflight"),
                "miss": lookups("miss"),
            },
            "io_wait_s": m.io_wait_seconds.get(),
            "forward_s": m.forward_seconds.get(),
            "drafts_proposed": m.drafts_proposed.get(),
            "drafts_accepted": m.drafts_accepted.get(),
        },
        "histograms": {
            "ttft_s": sum_count(&m.ttft),
            "inter_token_latency_s": sum_count(&m.inter_token_latency),
            "queue_wait_s": sum_count(&m.queue_wait),
            "batch_size": sum_count(&m.batch_size),
            "tokens_per_forward": sum_count(&m.tokens_per_forward),
        },
        "gauges": {
            "queue_depth": m.queue_depth.get(),
            "running": m.running.get(),
            "prefill_done": m.prefill_done.get(),
            "prefill_total": m.prefill_total.get(),
        },
        "drives": drives,
        "plan": view.as_ref().map(|v| &v.plan),
        "view_at_ms": view.as_ref().map(|v| v.at_ms),
    }))
    .into_response()
}

async fn experts(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_key(&app, &headers) {
        return e.into_response();
    }
    if let Some(c) = &app.view {
        c.touch();
    }
    match app.view.as_ref().and_then(|c| c.get()) {
        Some(v) => Json(json!({"at_ms": v.at_ms, "map": &v.experts})).into_response(),
        None => Json(json!({"at_ms": null, "map": null})).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element the script looks up by id exists in the page.
    #[test]
    fn the_script_finds_every_element_it_uses() {
        let mut rest = APP_JS;
        let mut ids = Vec::new();
        while let Some(i) = rest.find("$(\"") {
            rest = &rest[i + 3..];
            let end = rest.find('"').expect("closing quote");
            ids.push(&rest[..end]);
        }
        assert!(ids.len() > 20, "{ids:?}");
        for id in ids {
            assert!(
                INDEX_HTML.contains(&format!("id=\"{id}\"")),
                "app.js uses #{id}, which index.html lacks"
            );
        }
    }

    /// The page, its script and its style name nothing outside the server (the SVG's XML
    /// namespace is a name, not a request).
    #[test]
    fn the_assets_fetch_nothing_from_elsewhere() {
        for (name, text) in [
            ("index.html", INDEX_HTML),
            ("app.js", APP_JS),
            ("style.css", STYLE_CSS),
            ("favicon.svg", FAVICON_SVG),
        ] {
            let text = text.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
            for scheme in [
                "http://",
                "https://",
                "url(",
                "@import",
                "src=\"//",
                "href=\"//",
            ] {
                assert!(!text.contains(scheme), "{name} contains {scheme}");
            }
        }
        for asset in ["/web/app.js", "/web/style.css", "/web/favicon.svg"] {
            assert!(INDEX_HTML.contains(asset), "index.html loads {asset}");
        }
    }
}
