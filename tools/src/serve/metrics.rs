//! `/metrics`: the server's counters in Prometheus/OpenMetrics text format (prometheus-client).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

/// A histogram that also keeps its sum and count readable (prometheus-client exposes them only
/// to tests), for the web page's means over a window.
#[derive(Clone, Debug)]
pub struct Observed {
    hist: Histogram,
    sum: Counter<f64, AtomicU64>,
    count: Counter,
}

impl Observed {
    fn new(hist: Histogram) -> Observed {
        Observed {
            hist,
            sum: Counter::default(),
            count: Counter::default(),
        }
    }

    /// Adds one observation.
    pub fn observe(&self, v: f64) {
        self.hist.observe(v);
        self.sum.inc_by(v);
        self.count.inc();
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum.get()
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.get()
    }
}

/// Labels of `coli_requests`: endpoint and HTTP status.
pub type RequestLabels = Vec<(&'static str, String)>;

/// Every metric of the server (all thread-safe; shared by the handlers and the engine thread).
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and HTTP status (429s included).
    pub requests: Family<RequestLabels, Counter>,
    /// Prompt tokens of finished generations (the whole prompt, reused or not).
    pub prompt_tokens: Counter,
    /// Prompt tokens actually prefilled (those not reused from the KV cache).
    pub prefill_tokens: Counter,
    /// Prompt tokens reused from the KV cache.
    pub cached_tokens: Counter,
    /// Tokens generated.
    pub completion_tokens: Counter,
    /// Generations cancelled because the client went away (queued or running).
    pub cancelled: Counter,
    /// Seconds from request arrival to the first generated token, queue wait included.
    pub ttft: Observed,
    /// Seconds spent waiting in the queue.
    pub queue_wait: Observed,
    /// Seconds per decode step (one generated token fed back).
    pub decode_step: Observed,
    pub prefill_step: Observed,
    pub inter_token_latency: Observed,
    pub batch_size: Observed,
    pub tokens_per_forward: Observed,
    pub expert_bytes_per_token: Gauge<f64, AtomicU64>,
    /// Bytes of expert records read from disk.
    pub expert_bytes_read: Counter,
    /// Expert-cache hits.
    pub expert_cache_hits: Counter,
    /// Expert-cache misses.
    pub expert_cache_misses: Counter,
    /// Expert-cache hit rate since the server started (0..1).
    pub expert_cache_hit_rate: Gauge<f64, AtomicU64>,
    /// Draft tokens proposed and verified (speculative decoding).
    pub drafts_proposed: Counter,
    /// Draft tokens accepted.
    pub drafts_accepted: Counter,
    /// Accepted / proposed drafts since the server started (0..1).
    pub draft_acceptance_rate: Gauge<f64, AtomicU64>,
    /// Tokens a sequence's decode pass emitted (1 without drafts; accepted drafts + 1 with).
    pub tokens_per_decode_pass: Observed,
    /// Seconds computing one grammar mask (constrained decoding: forced tool calls,
    /// `response_format`).
    pub grammar_mask_seconds: Observed,
    /// Prefix-cache lookups by result: `ram`, `disk` (a prefix reused from that tier) or
    /// `miss`.
    pub prefix_lookups: Family<RequestLabels, Counter>,
    /// Bytes of KV cache files written.
    pub kv_file_written: Counter,
    /// Bytes of KV cache files read back.
    pub kv_file_read: Counter,
    /// Seconds writing KV cache files (fsync and rename included).
    pub kv_file_write_seconds: Counter<f64, AtomicU64>,
    /// Seconds reading KV cache files back (checks included).
    pub kv_file_read_seconds: Counter<f64, AtomicU64>,
    /// KV cache files found damaged, foreign or unreadable (each reported once on stderr).
    pub kv_files_bad: Counter,
    /// Expert lookups by result: `pinned`, `cached` (LRU tier), `inflight` (waited for a read
    /// already under way) or `miss` (a demand read).
    pub expert_lookups: Family<RequestLabels, Counter>,
    /// Seconds forward passes waited for expert reads (the engine's compute thread stalled).
    pub io_wait_seconds: Counter<f64, AtomicU64>,
    /// Seconds of forward passes (I/O wait included; compute = this minus `io_wait_seconds`).
    pub forward_seconds: Counter<f64, AtomicU64>,
    /// Bytes of expert records read, by drive (`0` the primary, `k` the k-th mirror).
    pub drive_read_bytes: Family<RequestLabels, Counter>,
    /// Requests waiting for the engine.
    pub queue_depth: Gauge,
    /// Prompt tokens to prefill of the requests now prefilling (those reused from the KV cache
    /// not counted); 0 when none is.
    pub prefill_total: Gauge,
    /// Of those, tokens already prefilled (during a layer-major prefill of a whole prompt, its
    /// tokens times the share of layer groups done).
    pub prefill_done: Gauge,
    /// Generations running (0 or 1).
    pub running: Gauge,
    /// HTTP connections open (at most `--max-connections`).
    pub connections_open: Gauge,
    /// Connections beyond `--max-connections` answered 503.
    pub connections_refused: Counter,
    /// Connections that waited for a request head, closed to make room for a new one.
    pub connections_evicted: Counter,
    /// Connections closed by `--header-timeout` (a slow head, or idle keep-alive).
    pub header_timeouts: Counter,
    /// Connections closed by `--send-timeout` (the client stopped taking its response).
    pub send_timeouts: Counter,
}

impl Metrics {
    /// A registry with every metric at zero. Histogram buckets are powers of two: TTFT and queue
    /// wait from 5 ms to ~82 s, decode steps from 1 ms to ~16 s.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("coli");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint and status",
            requests.clone(),
        );
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            registry.register(name, help, c.clone());
            c
        };
        let prompt_tokens = counter(
            &mut registry,
            "prompt_tokens",
            "Prompt tokens of finished generations",
        );
        let prefill_tokens = counter(
            &mut registry,
            "prefill_tokens",
            "Prompt tokens prefilled (not reused from the KV cache)",
        );
        let cached_tokens = counter(
            &mut registry,
            "cached_prompt_tokens",
            "Prompt tokens reused from the KV cache",
        );
        let completion_tokens = counter(&mut registry, "completion_tokens", "Tokens generated");
        let cancelled = counter(
            &mut registry,
            "cancelled_requests",
            "Generations cancelled because the client disconnected",
        );
        let drafts_proposed = counter(
            &mut registry,
            "speculative_drafts_proposed",
            "Draft tokens proposed and verified (speculative decoding)",
        );
        let drafts_accepted = counter(
            &mut registry,
            "speculative_drafts_accepted",
            "Draft tokens accepted (speculative decoding)",
        );
        let expert_cache_hits = counter(&mut registry, "expert_cache_hits", "Expert-cache hits");
        let expert_cache_misses =
            counter(&mut registry, "expert_cache_misses", "Expert-cache misses");
        let expert_bytes_read = Counter::default();
        registry.register_with_unit(
            "expert_read",
            "Bytes of expert records read from disk (store counter, model loading included)",
            Unit::Bytes,
            expert_bytes_read.clone(),
        );
        let histogram = |registry: &mut Registry, name: &str, help: &str, start: f64| {
            let h = Histogram::new(exponential_buckets(start, 2.0, 15));
            registry.register_with_unit(name, help, Unit::Seconds, h.clone());
            Observed::new(h)
        };
        let ttft = histogram(
            &mut registry,
            "time_to_first_token",
            "Time from request arrival to the first generated token (TTFT), queue wait included",
            0.005,
        );
        let queue_wait = histogram(
            &mut registry,
            "queue_wait",
            "Time requests waited for the engine",
            0.005,
        );
        let decode_step = histogram(
            &mut registry,
            "decode_step",
            "Time of one batched forward pass that carries no prefill chunk (one token of every running sequence)",
            0.001,
        );
        let prefill_step = histogram(
            &mut registry,
            "prefill_step",
            "Time of one batched forward pass that carries a prefill chunk (the running sequences' tokens plus up to --prefill-batch prompt tokens)",
            0.001,
        );
        let inter_token_latency = histogram(
            &mut registry,
            "inter_token_latency",
            "Time between two consecutive tokens of one sequence (ITL)",
            0.001,
        );
        let grammar_mask_seconds = histogram(
            &mut registry,
            "grammar_mask",
            "Time computing one token mask of a constrained sequence (forced tool call, response_format)",
            0.00001,
        );
        let count_histogram = |registry: &mut Registry, name: &str, help: &str| {
            let h = Histogram::new(exponential_buckets(1.0, 2.0, 10));
            registry.register(name, help, h.clone());
            Observed::new(h)
        };
        let batch_size =
            count_histogram(&mut registry, "batch_size", "Sequences in one forward pass");
        let tokens_per_forward = count_histogram(
            &mut registry,
            "tokens_per_forward",
            "Tokens (rows) in one forward pass: decode tokens plus prefill-chunk tokens",
        );
        let tokens_per_decode_pass = count_histogram(
            &mut registry,
            "tokens_per_decode_pass",
            "Tokens one sequence's decode pass emitted: 1 without drafts, accepted drafts + 1 with",
        );
        let draft_acceptance_rate = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "speculative_acceptance_rate",
            "Accepted / proposed draft tokens since the server started (0..1)",
            draft_acceptance_rate.clone(),
        );
        let expert_bytes_per_token = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "expert_bytes_per_generated_token",
            "Expert bytes read from disk per generated token since the server started (model loading included)",
            expert_bytes_per_token.clone(),
        );
        let expert_cache_hit_rate = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "expert_cache_hit_rate",
            "Expert-cache hit rate since the server started (0..1)",
            expert_cache_hit_rate.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests waiting for the engine",
            queue_depth.clone(),
        );
        let prefill_total = Gauge::default();
        registry.register(
            "prefill_total_tokens",
            "Prompt tokens to prefill of the requests now prefilling",
            prefill_total.clone(),
        );
        let prefill_done = Gauge::default();
        registry.register(
            "prefill_done_tokens",
            "Of the prompt tokens to prefill of the requests now prefilling, those done",
            prefill_done.clone(),
        );
        let running = Gauge::default();
        registry.register("running_requests", "Generations running", running.clone());
        let connections_open = Gauge::default();
        registry.register(
            "http_connections_open",
            "HTTP connections open (at most --max-connections)",
            connections_open.clone(),
        );
        let connections_refused = counter(
            &mut registry,
            "http_connections_refused",
            "Connections beyond --max-connections answered 503",
        );
        let connections_evicted = counter(
            &mut registry,
            "http_connections_evicted",
            "Connections waiting for a request head closed to make room for a new one",
        );
        let header_timeouts = counter(
            &mut registry,
            "http_header_timeouts",
            "Connections closed by --header-timeout (slow request head or idle keep-alive)",
        );
        let send_timeouts = counter(
            &mut registry,
            "http_send_timeouts",
            "Connections closed by --send-timeout (the client stopped taking its response)",
        );
        let prefix_lookups = Family::<RequestLabels, Counter>::default();
        registry.register(
            "prefix_cache_lookups",
            "Prefix-cache lookups by result (ram or disk: a prefix reused from that tier; miss)",
            prefix_lookups.clone(),
        );
        let kv_file_written = Counter::default();
        registry.register_with_unit(
            "kv_file_written",
            "Bytes of KV cache files written",
            Unit::Bytes,
            kv_file_written.clone(),
        );
        let kv_file_read = Counter::default();
        registry.register_with_unit(
            "kv_file_read",
            "Bytes of KV cache files read back",
            Unit::Bytes,
            kv_file_read.clone(),
        );
        let kv_file_write_seconds = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "kv_file_write",
            "Seconds writing KV cache files (fsync and rename included)",
            Unit::Seconds,
            kv_file_write_seconds.clone(),
        );
        let kv_file_read_seconds = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "kv_file_read",
            "Seconds reading KV cache files back (checks included)",
            Unit::Seconds,
            kv_file_read_seconds.clone(),
        );
        let kv_files_bad = counter(
            &mut registry,
            "kv_files_bad",
            "KV cache files found damaged, foreign or unreadable (quarantined or left in place)",
        );
        let expert_lookups = Family::<RequestLabels, Counter>::default();
        registry.register(
            "expert_lookups",
            "Expert lookups by result: pinned, cached (LRU tier), inflight (waited for a read under way), miss (demand read)",
            expert_lookups.clone(),
        );
        let io_wait_seconds = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "expert_io_wait",
            "Seconds forward passes waited for expert reads",
            Unit::Seconds,
            io_wait_seconds.clone(),
        );
        let forward_seconds = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "forward",
            "Seconds of forward passes, expert I/O wait included",
            Unit::Seconds,
            forward_seconds.clone(),
        );
        let drive_read_bytes = Family::<RequestLabels, Counter>::default();
        registry.register_with_unit(
            "drive_read",
            "Bytes of expert records read, by drive (0 the primary, k the k-th mirror)",
            Unit::Bytes,
            drive_read_bytes.clone(),
        );
        Metrics {
            registry,
            requests,
            prompt_tokens,
            prefill_tokens,
            cached_tokens,
            completion_tokens,
            cancelled,
            ttft,
            queue_wait,
            decode_step,
            prefill_step,
            inter_token_latency,
            batch_size,
            tokens_per_forward,
            expert_bytes_per_token,
            expert_bytes_read,
            expert_cache_hits,
            expert_cache_misses,
            expert_cache_hit_rate,
            drafts_proposed,
            drafts_accepted,
            draft_acceptance_rate,
            tokens_per_decode_pass,
            grammar_mask_seconds,
            prefix_lookups,
            kv_file_written,
            kv_file_read,
            kv_file_write_seconds,
            kv_file_read_seconds,
            kv_files_bad,
            expert_lookups,
            io_wait_seconds,
            forward_seconds,
            drive_read_bytes,
            queue_depth,
            prefill_total,
            prefill_done,
            running,
            connections_open,
            connections_refused,
            connections_evicted,
            header_timeouts,
            send_timeouts,
        }
    }

    /// Counts one answered request.
    pub fn count_request(&self, endpoint: &'static str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("endpoint", endpoint.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
    }

    /// The text exposition (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &self.registry);
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::new();
        m.count_request("chat_completions", 200);
        m.count_request("chat_completions", 200);
        m.count_request("completions", 429);
        m.ttft.observe(0.02);
        m.expert_bytes_read.inc_by(4096);
        m.expert_cache_hit_rate.set(0.75);
        m.queue_depth.set(2);
        let t = m.render();
        assert!(
            t.contains("coli_requests_total{endpoint=\"chat_completions\",status=\"200\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("coli_requests_total{endpoint=\"completions\",status=\"429\"} 1"),
            "{t}"
        );
        assert!(
            t.contains("coli_time_to_first_token_seconds_count 1"),
            "{t}"
        );
        assert!(t.contains("coli_expert_read_bytes_total 4096"), "{t}");
        assert!(t.contains("coli_expert_cache_hit_rate 0.75"), "{t}");
        assert!(t.contains("coli_queue_depth 2"), "{t}");
        assert!(
            t.contains("# TYPE coli_decode_step_seconds histogram"),
            "{t}"
        );
        assert!(t.trim_end().ends_with("# EOF"));
    }
}
