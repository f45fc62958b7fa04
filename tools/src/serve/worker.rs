//! The engine thread: owns the store and the one [`Engine`], and runs continuous batching.
//!
//! Up to `max_batch` sequences decode together: every step is one forward pass
//! ([`Engine::forward_many`]) holding one token of every running sequence plus, when a request
//! is waiting for its prefill, the next `--prefill-batch` chunk of its prompt (oldest request
//! first; whole chunks of several requests share a step while they fit in one chunk's rows), so
//! a long prompt delays the running streams by one chunk per step at most. Requests join at step boundaries, in arrival order, while sequences are free;
//! a request with `n` choices takes `n` sequences, prefilled once and forked
//! ([`Engine::fork_sequence`]). Each choice samples with its own seeded sampler (choice `i`
//! seeds with `seed + i`), so a seeded request gives the same text alone or in a batch (the
//! engine's logits of a sequence do not depend on the rest of the pass). A finished
//! sequence's KV cache goes to the prefix cache ([`coli_engine::prefix_cache`]: RAM, and a file
//! that survives a restart); the next request reuses the cached state that shares the longest
//! prefix with its prompt, within its API key's scope (a follow-up turn prefills only its new
//! tokens). A client that disconnects frees its sequences at the next step. On shutdown the
//! thread stops admitting requests, lets the running ones go on until the grace period ends,
//! then ends the rest with finish reason `abort`.

use super::api::ApiError;
use super::metrics::Metrics;
use super::text::{Piece, ReplyText, ReplyTools};
use coli_engine::constrain::Constraint;
use coli_engine::prefix_cache::PrefixCache;
use coli_engine::speculative::gate::DraftGate;
use coli_engine::speculative::{self, ngram, Speculate};
use coli_engine::tool_calls::{ParamTypes, ParsedCall, ToolSyntax};
use coli_engine::{
    BatchItem, Engine, EngineError, GenerateParams, Logits, Sampler, SamplingParams, Sequence,
    TextTokenizer,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the engine thread reports about a job.
#[derive(Debug)]
pub enum Event {
    /// Text to append to choice `index` (whole characters, stop strings already cut).
    Text(usize, String),
    /// Reasoning to append to choice `index` (harmony's analysis and commentary channels).
    Reasoning(usize, String),
    /// A tool call of choice `index` (complete: name and JSON arguments).
    ToolCall(usize, ParsedCall),
    /// A streamed tool call of choice `index` starts: its name.
    ToolCallStart(usize, String),
    /// A piece of the streamed tool call's arguments.
    ToolCallArgs(usize, String),
    /// The streamed tool call is complete (the whole call, for replies that are not streamed).
    ToolCallEnd(usize, ParsedCall),
    /// Choice `index` ended normally.
    Done(usize, Finish),
    /// The job failed (every choice ends).
    Error(ApiError),
}

/// The event carrying piece `p` of choice `index`.
fn event(index: usize, p: Piece) -> Event {
    match p {
        Piece::Content(t) => Event::Text(index, t),
        Piece::Reasoning(t) => Event::Reasoning(index, t),
        Piece::ToolCall(c) => Event::ToolCall(index, c),
        Piece::ToolCallStart(n) => Event::ToolCallStart(index, n),
        Piece::ToolCallArgs(a) => Event::ToolCallArgs(index, a),
        Piece::ToolCallEnd(c) => Event::ToolCallEnd(index, c),
    }
}

/// The end of one choice of a generation.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    /// `stop` (EOS or a stop string), `tool_calls` (it ended after tool calls), `length`
    /// (max_tokens reached) or `abort` (the server shut down before the choice finished).
    pub reason: &'static str,
    /// Tokens of the whole prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from a KV cache (not prefilled).
    pub cached_tokens: usize,
    /// Tokens this choice generated (an EOS that ended it included).
    pub completion_tokens: usize,
    /// The index in the request's stop strings of the one that ended the choice, if one did.
    pub stop_index: Option<usize>,
}

/// Sets the cancel flag when dropped: the handler (or the stream feeding a response body) holds
/// it, so a client that disconnects cancels its job.
pub struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One generation request, tokenized and validated.
pub struct Job {
    /// Request id (for the log line).
    pub id: String,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters (the seed is choice 0's; choice `i` uses `seed + i`).
    pub params: GenerateParams,
    /// Choices to generate from the prompt (`n`, at most the batch size).
    pub n: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// How the reply's text splits into content and reasoning (harmony channels, `<think>`
    /// blocks; plain for completions).
    pub reply_format: super::text::ReplyFormat,
    /// Where text goes.
    pub events: mpsc::UnboundedSender<Event>,
    /// Set when the client is gone.
    pub cancel: Arc<AtomicBool>,
    /// When the request arrived.
    pub arrived: Instant,
    /// Whose cached prefixes it may reuse ([`coli_engine::prefix_cache::scope_of`] of its API
    /// key; 0 without keys).
    pub scope: u64,
    /// The request offers tools: how the model writes calls, how their values are typed, and
    /// whether a forced call's arguments stream.
    pub tools: Option<(ToolSyntax, ParamTypes, bool)>,
    /// The grammar every choice must follow (a forced tool call, `response_format`).
    pub constraint: Option<Constraint>,
}

impl Job {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// What the engine thread tells the server once the model is loaded.
#[derive(Clone)]
pub struct EngineInfo {
    /// The store's tokenizer, shared with the engine thread.
    pub tok: Arc<TextTokenizer>,
    /// KV-cache capacity of one sequence, tokens.
    pub context: usize,
    /// Vocabulary size (ids must be below it).
    pub vocab: usize,
    /// The model's end-of-sequence token ids (the first ends a constrained reply).
    pub eos: Vec<u32>,
    /// Seconds to open the store and load the model.
    pub load_s: f64,
    /// Engine worker threads.
    pub threads: usize,
    /// Sequences decoded together at most (`--max-batch`).
    pub max_batch: usize,
    /// KV-cache bytes of one sequence at the context limit.
    pub kv_bytes_per_sequence: u64,
    /// Speculative decoding as it runs (`auto` resolved for this model).
    pub speculation: coli_engine::SpeculationParams,
}

/// Shared between the engine thread and the handlers: a moving average of the time one
/// request holds a batch slot, for `Retry-After`.
#[derive(Default)]
pub struct JobTimes {
    /// Mean seconds per job (exponential moving average, weight 1/4), as f64 bits.
    mean_bits: AtomicU64,
}

impl JobTimes {
    /// Mean seconds per job so far (0 before the first).
    pub fn mean_s(&self) -> f64 {
        f64::from_bits(self.mean_bits.load(Ordering::Relaxed))
    }

    fn record(&self, s: f64) {
        let m = self.mean_s();
        let next = if m == 0.0 { s } else { 0.75 * m + 0.25 * s };
        self.mean_bits.store(next.to_bits(), Ordering::Relaxed);
    }
}

/// When the server shuts down: set once a signal arrives; running generations may go on until
/// the deadline.
#[derive(Default)]
pub struct Shutdown {
    deadline: Mutex<Option<Instant>>,
    started: AtomicBool,
}

impl Shutdown {
    /// Starts the shutdown: no request is admitted from now on; running ones end by `grace`.
    pub fn begin(&self, grace: Duration) {
        let mut d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        d.get_or_insert(Instant::now() + grace);
        self.started.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    fn past_deadline(&self) -> bool {
        let d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        d.is_some_and(|d| Instant::now() >= d)
    }
}

/// Where the engine thread reports.
pub struct Shared {
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Job durations, for `Retry-After`.
    pub times: Arc<JobTimes>,
    /// Set when the server shuts down.
    pub shutdown: Arc<Shutdown>,
    /// Where the engine thread publishes what `coli web` draws (None without `--web`).
    pub view: Option<Arc<super::web::ViewCell>>,
}

/// Opens the store (on this thread, which owns it for the life of the server) and takes out its
/// tokenizer.
fn open(
    opts: &crate::options::EngineOptions,
) -> anyhow::Result<(crate::options::Loaded, Arc<TextTokenizer>)> {
    use anyhow::Context;
    let mut loaded = crate::options::open(opts)?;
    let tok = loaded.tokenizer.take().with_context(|| {
        format!(
            "{} has no tokenizer.json; coli serve needs it to read prompts and write text \
             (convert the checkpoint together with its tokenizer files)",
            opts.store.display()
        )
    })?;
    Ok((loaded, Arc::new(tok)))
}

/// Runs on the engine thread: opens the store, loads the engine with room for `max_batch`
/// sequences (None: chosen from the memory plan, [`load_engine`]), reports through `ready`,
/// then schedules jobs until every sender is dropped (or shutdown ends).
pub fn run(
    opts: crate::options::EngineOptions,
    speculation: coli_engine::SpeculationParams,
    max_batch: Option<usize>,
    kv_disk: crate::options::KvDiskArgs,
    shared: Shared,
    jobs: mpsc::Receiver<Job>,
    ready: std::sync::mpsc::Sender<anyhow::Result<EngineInfo>>,
) {
    let (loaded, tok) = match open(&opts) {
        Ok(x) => x,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let (eng, max_batch, speculation, prefix) = match load_engine(&loaded, &opts, max_batch) {
        Ok((e, load_s, max_batch)) => {
            let prefix = match kv_disk.open(&e) {
                Ok(p) => p,
                Err(err) => {
                    let _ = ready.send(Err(err));
                    return;
                }
            };
            let info = EngineInfo {
                tok: tok.clone(),
                context: e.context(),
                vocab: e.spec().vocab_size,
                eos: e.spec().eos_token_ids.clone(),
                load_s,
                threads: e.threads(),
                max_batch,
                kv_bytes_per_sequence: e.kv_bytes_per_sequence(),
                speculation: coli_engine::SpeculationParams {
                    mode: match speculation.mode.resolve(e.mtp_absence().as_deref()) {
                        Ok(m) => m,
                        Err(err) => {
                            let _ = ready.send(Err(anyhow::anyhow!("{err}")));
                            return;
                        }
                    },
                    ..speculation
                },
            };
            let speculation = info.speculation;
            if ready.send(Ok(info)).is_err() {
                return;
            }
            (e, max_batch, speculation, prefix)
        }
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let (prefill_batch, prefill_align) = (eng.prefill_batch(), eng.prefill_align());
    let mut s = Scheduler {
        eng,
        tok: &tok,
        shared,
        max_batch,
        prefill_batch,
        prefill_align,
        active: Vec::new(),
        prefix,
        prefix_seen: Default::default(),
        speculation,
        bytes_seen: 0,
        drive_seen: Vec::new(),
        view_at: None,
        cache_seen: coli_engine::CacheStats::default(),
    };
    s.count_bytes();
    s.run(jobs);
}

/// Default `--max-batch` when the memory allows it.
const DEFAULT_MAX_BATCH: usize = 8;

/// How many sequences' KV caches (each `kv_bytes_per_sequence` at the context limit) fit beside
/// the dense set and `eng`'s expert budget in the memory limit the placement used, and that
/// limit in bytes (None: no limit could be read, or the budget is unbounded).
fn sequences_fit(eng: &Engine<'_>, store: &coli_store::Store) -> Option<(usize, u64)> {
    use coli_engine::placement::budget;
    let p = eng.placement();
    let limit = p.memory_limit.or_else(budget::memory_limit_bytes)?;
    if p.budget == u64::MAX {
        return None;
    }
    let experts = budget::store_held_bytes(store);
    let fit = budget::sequences_that_fit(
        limit.saturating_sub(eng.kv_cache_budget()),
        store.manifest().dense_file.length,
        p.budget.min(experts),
        eng.kv_bytes_per_sequence(),
    );
    Some((fit, limit))
}

/// Loads the engine for `requested` sequences (`--max-batch`), or for
/// [`DEFAULT_MAX_BATCH`] reduced to what fits when not given. Returns the engine, the load
/// seconds and the batch size.
///
/// # Errors
/// The model cannot be loaded; `--max-batch N` whose N sequences of `--context` do not fit
/// beside the dense set and the expert budget in the memory this process may use (the error
/// names the figures and what to change).
pub fn load_engine<'s>(
    loaded: &'s crate::options::Loaded,
    opts: &crate::options::EngineOptions,
    requested: Option<usize>,
) -> anyhow::Result<(Engine<'s>, f64, usize)> {
    let want = requested.unwrap_or(DEFAULT_MAX_BATCH);
    let (eng, load_s) = crate::options::engine_with_sequences(loaded, opts, want)?;
    let Some((fit, limit)) = sequences_fit(&eng, &loaded.store) else {
        return Ok((eng, load_s, want));
    };
    if fit >= want {
        return Ok((eng, load_s, want));
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let p = eng.placement();
    let what = format!(
        "{want} sequences of {} tokens need {:.1} MiB of KV cache each, but beside the dense set ({:.1} MiB), the expert budget ({:.1} MiB), the prefix cache ({:.1} MiB, --kv-cache-budget) and 512 MiB of reserve only {fit} fit in the {:.1} MiB this process may use",
        eng.context(),
        mib(eng.kv_bytes_per_sequence()),
        mib(loaded.store.manifest().dense_file.length),
        mib(p.budget),
        mib(eng.kv_cache_budget()),
        mib(limit),
    );
    if requested.is_some() || fit == 0 {
        anyhow::bail!(
            "{what}; lower --max-batch, --context, --kv-cache-budget or --ram-budget (`coli plan` shows the memory plan)"
        );
    }
    drop(eng);
    let (eng, load_s) = crate::options::engine_with_sequences(loaded, opts, fit)?;
    eprintln!("coli serve: {what}; --max-batch defaults to {fit}");
    Ok((eng, load_s, fit))
}

/// One choice of a running request.
struct Choice {
    index: usize,
    /// Its sequence (None until the prompt's prefill is done and it is forked).
    seq: Option<Sequence>,
    sampler: Sampler,
    text: ReplyText,
    /// Tokens generated.
    generated: usize,
    /// The token to feed next (sampled, not yet in the KV cache).
    next: Option<u32>,
    /// Drafts fed after `next` by the coming pass (speculative decoding).
    drafts: Vec<u32>,
    /// Whether this choice's passes carry drafts (the measured gain against the cost).
    gate: DraftGate,
    /// Finish reason once it ended.
    finished: Option<&'static str>,
    last_token_at: Option<Instant>,
    /// The grammar its tokens must follow ([`Job::constraint`]), advanced token by token.
    constraint: Option<Constraint>,
}

/// A request admitted to the batch.
struct Request {
    job: Job,
    /// Prompt tokens still to prefill (into choice 0's sequence).
    prefill_from: usize,
    cached: usize,
    choices: Vec<Choice>,
    admitted: Instant,
    first_token_at: Option<Instant>,
    status: &'static str,
}

impl Request {
    fn prefilling(&self) -> bool {
        self.prefill_from < self.job.prompt.len()
    }

    fn done(&self) -> bool {
        self.choices.iter().all(|c| c.finished.is_some())
    }
}

struct Scheduler<'a, 's> {
    eng: Engine<'s>,
    tok: &'a TextTokenizer,
    shared: Shared,
    max_batch: usize,
    prefill_batch: usize,
    /// Where prefill passes may be cut (`Engine::prefill_align`).
    prefill_align: usize,
    active: Vec<Request>,
    /// Finished sequences' KV states, reused by prefix.
    prefix: PrefixCache,
    /// Its counters at the last [`Scheduler::count_bytes`].
    prefix_seen: coli_engine::prefix_cache::PrefixCacheStats,
    /// Speculative decoding of the server (mode resolved).
    speculation: coli_engine::SpeculationParams,
    bytes_seen: u64,
    /// Per drive, bytes read at the last [`Scheduler::count_bytes`].
    drive_seen: Vec<u64>,
    /// When the engine view for `coli web` was last published (None: never).
    view_at: Option<Instant>,
    /// Expert-cache counters at the last [`Scheduler::count_bytes`].
    cache_seen: coli_engine::CacheStats,
}

/// What a step fed for one sequence: (request, choice, prefill chunk or decode token).
#[derive(Clone, Copy)]
enum Feed {
    Prefill { req: usize, end: usize },
    Decode { req: usize, choice: usize },
}

impl Scheduler<'_, '_> {
    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Publishes the prefill progress of the requests now prefilling (`/metrics`, the web
    /// page): their prompt tokens to prefill and, of those, the ones done. Returns
    /// `(done, total)`.
    fn publish_prefill(&self) -> (usize, usize) {
        let (mut done, mut total) = (0, 0);
        for r in self.active.iter().filter(|r| r.prefilling()) {
            total += r.job.prompt.len() - r.cached;
            done += r.prefill_from - r.cached;
        }
        let m = self.metrics();
        m.prefill_total.set(total as i64);
        m.prefill_done.set(done as i64);
        (done, total)
    }

    /// Adds the store's expert bytes read since the last call to the counter (model loading,
    /// e.g. pinned experts, included).
    fn count_bytes(&mut self) {
        let now = self.eng.store().stats().bytes_read;
        self.shared
            .metrics
            .expert_bytes_read
            .inc_by(now.saturating_sub(self.bytes_seen));
        self.bytes_seen = self.bytes_seen.max(now);
        let stats = self.eng.cache_stats();
        let d = stats.since(&self.cache_seen);
        self.shared.metrics.expert_cache_hits.inc_by(d.hits);
        self.shared.metrics.expert_cache_misses.inc_by(d.misses);
        {
            let m = &self.shared.metrics;
            let lru_hits = d.hits.saturating_sub(d.pinned_hits + d.inflight_waits);
            for (result, n) in [
                ("pinned", d.pinned_hits),
                ("cached", lru_hits),
                ("inflight", d.inflight_waits),
                ("miss", d.misses),
            ] {
                m.expert_lookups
                    .get_or_create(&vec![("result", result.to_string())])
                    .inc_by(n);
            }
            m.io_wait_seconds.inc_by(d.io_wait_ns as f64 * 1e-9);
            let store = self.eng.store();
            let drives: Vec<u64> = match store.mirror_stats() {
                Some(ms) => ms.drives.iter().map(|d| d.bytes).collect(),
                None => vec![now],
            };
            self.drive_seen.resize(drives.len(), 0);
            for (k, (&b, seen)) in drives.iter().zip(self.drive_seen.iter_mut()).enumerate() {
                m.drive_read_bytes
                    .get_or_create(&vec![("drive", k.to_string())])
                    .inc_by(b.saturating_sub(*seen));
                *seen = (*seen).max(b);
            }
        }
        self.shared
            .metrics
            .expert_cache_hit_rate
            .set(stats.hit_rate());
        self.cache_seen = stats;
        let p = self.prefix.stats();
        let was = std::mem::replace(&mut self.prefix_seen, p);
        let m = &self.shared.metrics;
        for (result, now, before) in [
            ("ram", p.ram_hits, was.ram_hits),
            ("disk", p.disk_hits, was.disk_hits),
            ("miss", p.misses, was.misses),
        ] {
            m.prefix_lookups
                .get_or_create(&vec![("result", result.to_string())])
                .inc_by(now - before);
        }
        m.kv_file_written
            .inc_by(p.bytes_written - was.bytes_written);
        m.kv_file_read.inc_by(p.bytes_read - was.bytes_read);
        m.kv_file_write_seconds
            .inc_by((p.write_ns - was.write_ns) as f64 * 1e-9);
        m.kv_file_read_seconds
            .inc_by((p.read_ns - was.read_ns) as f64 * 1e-9);
        m.kv_files_bad.inc_by(p.bad_files - was.bad_files);
        self.publish_view(false);
        let gen = self.shared.metrics.completion_tokens.get();
        if gen > 0 {
            self.shared
                .metrics
                .expert_bytes_per_token
                .set(self.shared.metrics.expert_bytes_read.get() as f64 / gen as f64);
        }
    }

    /// Publishes the engine view for `coli web` (expert map, memory plan, drives) when a page
    /// polled lately and the last view is older than [`super::web::VIEW_INTERVAL`], or on
    /// `force` (the batch went idle).
    fn publish_view(&mut self, force: bool) {
        let Some(cell) = &self.shared.view else {
            return;
        };
        if !force
            && (!cell.watched()
                || self
                    .view_at
                    .is_some_and(|t| t.elapsed() < super::web::VIEW_INTERVAL))
        {
            return;
        }
        cell.publish(super::web::EngineView::of(
            &self.eng,
            &self.prefix,
            self.max_batch,
        ));
        self.view_at = Some(Instant::now());
    }

    /// Merges the routing counts into the usage history (a failure is logged, not fatal).
    fn save_usage(&mut self) {
        self.eng.save_usage();
        for w in self.eng.take_warnings() {
            eprintln!("coli serve: warning: {w}");
        }
    }

    /// Sequences no running request holds or will hold: each running
    /// request takes one per choice.
    fn free_sequences(&self) -> usize {
        let reserved: usize = self.active.iter().map(|r| r.choices.len()).sum();
        self.max_batch.saturating_sub(reserved)
    }

    fn run(&mut self, mut jobs: mpsc::Receiver<Job>) {
        let mut closed = false;
        loop {
            let shutting = self.shared.shutdown.started();
            if shutting {
                // No new request: the queued ones end now.
                while let Ok(job) = jobs.try_recv() {
                    self.metrics().queue_depth.dec();
                    let _ = job.events.send(Event::Error(ApiError::unavailable(
                        "the server is shutting down",
                    )));
                }
                if self.shared.shutdown.past_deadline() {
                    self.abort_all();
                }
                if self.active.is_empty() {
                    self.save_usage();
                    return;
                }
            } else if !closed {
                closed = self.admit(&mut jobs);
            }
            if self.active.is_empty() {
                // Idle: the routing counts since the last save go to the usage history.
                self.save_usage();
                self.publish_view(true);
                if closed {
                    return;
                }
                // Wait for a job (or shutdown): the first recv blocks.
                match jobs.blocking_recv() {
                    Some(job) => {
                        self.metrics().queue_depth.dec();
                        if self.shared.shutdown.started() {
                            let _ = job.events.send(Event::Error(ApiError::unavailable(
                                "the server is shutting down",
                            )));
                        } else {
                            self.start(job);
                        }
                    }
                    None => return,
                }
                continue;
            }
            self.step();
        }
    }

    /// Takes queued jobs while sequences are free; true when every sender is gone.
    fn admit(&mut self, jobs: &mut mpsc::Receiver<Job>) -> bool {
        loop {
            let free = self.free_sequences();
            if free == 0 {
                return false;
            }
            // A job needing more sequences than are free waits at the head of the queue
            // (arrival order is kept): peeking is not possible on the channel, so hold it.
            match jobs.try_recv() {
                Ok(job) => {
                    self.metrics().queue_depth.dec();
                    if job.n > free {
                        // Finish the running requests first, then start it.
                        self.drain_until_free(job.n);
                    }
                    if self.shared.shutdown.started() {
                        self.metrics()
                            .queue_wait
                            .observe(job.arrived.elapsed().as_secs_f64());
                        let _ = job.events.send(Event::Error(ApiError::unavailable(
                            "the server is shutting down",
                        )));
                        return false;
                    }
                    self.start(job);
                }
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
    }

    /// Steps the batch until `n` sequences are free (a request with n choices waits for them).
    fn drain_until_free(&mut self, n: usize) {
        while self.free_sequences() < n && !self.active.is_empty() {
            if self.shared.shutdown.past_deadline() {
                self.abort_all();
            }
            self.step();
        }
    }

    /// Admits `job` into the batch: a sequence resumed from the prefix cache's longest common
    /// prefix (or a new one) for its prefill.
    fn start(&mut self, job: Job) {
        let now = Instant::now();
        self.metrics()
            .queue_wait
            .observe(now.duration_since(job.arrived).as_secs_f64());
        if job.cancelled() {
            self.metrics().cancelled.inc();
            eprintln!(
                "coli serve: request {} status=cancelled prompt_tokens={} queue_wait_s={:.3} (the client left while it was queued)",
                job.id,
                job.prompt.len(),
                now.duration_since(job.arrived).as_secs_f64()
            );
            return;
        }
        let seq = match self.take_sequence(&job.prompt, job.scope) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Error(engine_error(e)));
                return;
            }
        };
        let cached = seq.len();
        let choices = (0..job.n)
            .map(|i| Choice {
                index: i,
                seq: None,
                sampler: Sampler::new(SamplingParams {
                    seed: job.params.sampling.seed.wrapping_add(i as u64),
                    ..job.params.sampling
                }),
                text: {
                    let t = ReplyText::for_tokenizer(self.tok, job.stop.clone(), job.reply_format);
                    match &job.tools {
                        Some((syntax, types, stream)) => {
                            t.with_tools(ReplyTools::new(self.tok, *syntax, types.clone(), *stream))
                        }
                        None => t,
                    }
                },
                generated: 0,
                next: None,
                drafts: Vec::new(),
                gate: DraftGate::new(),
                finished: None,
                last_token_at: None,
                constraint: job.constraint.clone(),
            })
            .collect::<Vec<_>>();
        let mut r = Request {
            prefill_from: cached,
            cached,
            choices,
            admitted: now,
            first_token_at: None,
            status: "ok",
            job,
        };
        r.choices[0].seq = Some(seq);
        self.metrics().running.inc();
        self.active.push(r);
        self.publish_prefill();
    }

    /// A sequence for `prompt`: the prefix cache's state that shares the longest prefix with
    /// it in `scope` (at most all but the last prompt token: one is always fed, to get logits),
    /// or a new one.
    fn take_sequence(&mut self, prompt: &[u32], scope: u64) -> coli_engine::Result<Sequence> {
        let hit = self.prefix.take(scope, prompt, prompt.len() - 1);
        self.prefix_warnings();
        let mut seq = match hit {
            Some(h) if self.speculation.mode != Speculate::Mtp || h.state.has_mtp_state() => {
                self.eng.resume_sequence(h.state)?
            }
            _ => self.eng.new_sequence()?,
        };
        if self.speculation.mode != Speculate::Mtp {
            // A state saved by an MTP server: its MTP rows would only grow unplanned.
            seq.disable_mtp();
        } else if !seq.has_mtp_state() {
            // Every sequence of an MTP server tracks MTP state from its first token.
            seq.truncate(0);
            self.eng.enable_mtp(&mut seq)?;
        }
        Ok(seq)
    }

    /// Prints the prefix cache's warnings (files that could not be used or written).
    fn prefix_warnings(&mut self) {
        for w in self.prefix.take_warnings() {
            eprintln!("coli serve: warning: {w}");
        }
    }

    /// One forward pass: every running choice's next token, plus the next prefill chunk of the
    /// oldest request still prefilling.
    fn step(&mut self) {
        let mut feeds: Vec<Feed> = Vec::new();
        for (ri, r) in self.active.iter().enumerate() {
            for (ci, c) in r.choices.iter().enumerate() {
                if c.finished.is_none() && c.next.is_some() {
                    feeds.push(Feed::Decode {
                        req: ri,
                        choice: ci,
                    });
                }
            }
        }
        let decode_rows = feeds.len();
        // Prefill chunks, oldest request first, as many whole chunks as fit in one chunk's
        // worth of rows (`--prefill-batch`): a long prompt adds one chunk per step, short ones
        // (or the uncached tails of follow-up turns) share a step. A chunk is never split, so
        // a request is chunked as when it runs alone (and as `Engine::forward` cuts it:
        // `coli_engine::prefill`).
        let mut prefill_rows = 0;
        for (ri, r) in self.active.iter().enumerate() {
            if !r.prefilling() {
                continue;
            }
            let end = r.prefill_from
                + coli_engine::prefill::next_span(
                    r.prefill_from,
                    r.job.prompt.len() - r.prefill_from,
                    self.prefill_batch,
                    self.prefill_align,
                );
            let rows = end - r.prefill_from;
            if prefill_rows > 0 && prefill_rows + rows > self.prefill_batch {
                break;
            }
            feeds.push(Feed::Prefill { req: ri, end });
            prefill_rows += rows;
        }
        if feeds.is_empty() {
            self.reap();
            return;
        }
        // A prompt whose prefill is the only work (nothing decoding, nothing queued) runs all
        // its remaining chunks in this step, layer by layer (`Engine::prefill_sequence`): each
        // layer's experts are read once for all of them instead of once per step. The same
        // bits; a request arriving meanwhile waits for it. A client that leaves or a shutdown
        // stops it between layers (the sequence rolls back; after a shutdown the prompt goes on
        // one chunk per step, within the grace period).
        let whole = decode_rows == 0
            && self.active.len() == 1
            && self.metrics().queue_depth.get() == 0
            && !self.shared.shutdown.started();
        if whole {
            if let [Feed::Prefill { req, end }] = &mut feeds[..] {
                let len = self.active[*req].job.prompt.len();
                prefill_rows += len - *end;
                *end = len;
            }
        }
        self.draft(&feeds, decode_rows + prefill_rows);
        let t0 = Instant::now();
        let result = {
            // Take the sequences out so that the batch items can borrow them mutably.
            let mut seqs: Vec<Sequence> = feeds
                .iter()
                .map(|f| {
                    let (ri, ci) = match *f {
                        Feed::Prefill { req, .. } => (req, 0),
                        Feed::Decode { req, choice } => (req, choice),
                    };
                    self.active[ri].choices[ci]
                        .seq
                        .take()
                        .expect("a fed choice holds its sequence")
                })
                .collect();
            let ids: Vec<Vec<u32>> = feeds
                .iter()
                .map(|f| match *f {
                    Feed::Prefill { req, end } => {
                        let r = &self.active[req];
                        r.job.prompt[r.prefill_from..end].to_vec()
                    }
                    Feed::Decode { req, choice } => {
                        let c = &self.active[req].choices[choice];
                        let mut ids = vec![c.next.expect("fed")];
                        ids.extend_from_slice(&c.drafts);
                        ids
                    }
                })
                .collect();
            let wants: Vec<Option<Logits>> = feeds
                .iter()
                .map(|f| match *f {
                    Feed::Prefill { req, end } => {
                        (end == self.active[req].job.prompt.len()).then_some(Logits::Last)
                    }
                    Feed::Decode { req, choice } => {
                        Some(match self.active[req].choices[choice].drafts.is_empty() {
                            true => Logits::Last,
                            false => Logits::All,
                        })
                    }
                })
                .collect();
            let mut items: Vec<BatchItem<'_>> = seqs
                .iter_mut()
                .zip(&ids)
                .zip(&wants)
                .map(|((seq, ids), &logits)| BatchItem {
                    seq,
                    ids,
                    logits,
                    verify: ids.len() > 1 && logits == Some(Logits::All),
                })
                .collect();
            let r = match (&feeds[..], &mut items[..]) {
                ([Feed::Prefill { req, .. }], [item]) if whole => {
                    let job = &self.active[*req].job;
                    let shutdown = &self.shared.shutdown;
                    // Progress: `stop` is asked before each layer group after the first.
                    let (done0, _) = self.publish_prefill();
                    let (rows, groups) = (item.ids.len(), self.eng.prefill_layer_groups().max(1));
                    let asked = std::sync::atomic::AtomicUsize::new(0);
                    let m = &self.shared.metrics;
                    let stop = || {
                        let g = asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        m.prefill_done
                            .set((done0 + rows * g.min(groups) / groups) as i64);
                        job.cancelled() || shutdown.started()
                    };
                    self.eng
                        .prefill_sequence(&mut *item.seq, item.ids, Logits::Last, &stop)
                        .map(|l| vec![l])
                }
                _ => self.eng.forward_many(&mut items),
            };
            drop(items);
            for (f, seq) in feeds.iter().zip(seqs) {
                let (ri, ci) = match *f {
                    Feed::Prefill { req, .. } => (req, 0),
                    Feed::Decode { req, choice } => (req, choice),
                };
                self.active[ri].choices[ci].seq = Some(seq);
            }
            r
        };
        let step_s = t0.elapsed().as_secs_f64();
        let prefill = feeds.len() > decode_rows;
        {
            let m = self.metrics();
            m.forward_seconds.inc_by(step_s);
            m.batch_size.observe(feeds.len() as f64);
            let tokens: usize = feeds
                .iter()
                .map(|f| match *f {
                    Feed::Prefill { req, end } => end - self.active[req].prefill_from,
                    Feed::Decode { req, choice } => {
                        1 + self.active[req].choices[choice].drafts.len()
                    }
                })
                .sum();
            m.tokens_per_forward.observe(tokens as f64);
            if prefill {
                m.prefill_step.observe(step_s);
            } else {
                m.decode_step.observe(step_s);
            }
        }
        let logits = match result {
            Ok(l) => l,
            Err(coli_engine::EngineError::Stopped) => {
                // A lone prefill stopped for a client that left or a shutdown: rolled back;
                // reap frees a cancelled request, a shutdown goes on chunk by chunk.
                self.reap();
                return;
            }
            Err(e) => {
                // Every sequence of the pass was rolled back; its requests fail.
                let msg = e.to_string();
                let mut failed: Vec<usize> = feeds
                    .iter()
                    .map(|f| match *f {
                        Feed::Prefill { req, .. } | Feed::Decode { req, .. } => req,
                    })
                    .collect();
                failed.dedup();
                for ri in failed {
                    let r = &mut self.active[ri];
                    let _ = r.job.events.send(Event::Error(ApiError::internal(format!(
                        "generation failed: {msg}"
                    ))));
                    r.status = "error";
                    for c in &mut r.choices {
                        c.finished.get_or_insert("error");
                    }
                }
                self.reap();
                return;
            }
        };
        let now = Instant::now();
        for (f, rows) in feeds.iter().zip(logits) {
            match *f {
                Feed::Prefill { req, end } => {
                    let prompt_len = self.active[req].job.prompt.len();
                    self.active[req].prefill_from = end;
                    self.publish_prefill();
                    if end == prompt_len {
                        let row = rows.into_iter().next().expect("last-token logits");
                        self.prefill_done(req, &row, now);
                    }
                }
                Feed::Decode { req, choice } => {
                    let drafts = std::mem::take(&mut self.active[req].choices[choice].drafts);
                    if drafts.is_empty() {
                        let row = rows.into_iter().next().expect("decode logits");
                        self.sample(req, choice, &row, now);
                        self.shared.metrics.tokens_per_decode_pass.observe(1.0);
                    } else {
                        self.verify(req, choice, &rows, &drafts, now);
                    }
                }
            }
        }
        self.reap();
    }

    /// Chooses the drafts of every decoding choice of the coming pass (prompt lookup on the
    /// choice's own tokens; each choice's gate weighs the pass's `rows` with and without its
    /// drafts against the tokens the whole pass emits: one per decoding choice plus the
    /// expected gain of the drafts already chosen), never past `max_tokens` or the context.
    fn draft(&mut self, feeds: &[Feed], mut rows: usize) {
        let context = self.eng.context();
        let mut pass_tokens = feeds
            .iter()
            .filter(|f| matches!(f, Feed::Decode { .. }))
            .count() as f64;
        for f in feeds {
            let Feed::Decode { req, choice } = *f else {
                continue;
            };
            let r = &mut self.active[req];
            let spec = r.job.params.speculation;
            let c = &mut r.choices[choice];
            c.drafts.clear();
            let (Some(seq), Some(next)) = (c.seq.as_mut(), c.next) else {
                continue;
            };
            let room = r
                .job
                .params
                .max_tokens
                .saturating_sub(c.generated + 1)
                .min(context.saturating_sub(seq.len() + 1));
            let k = spec.draft_tokens.min(room);
            if k == 0 {
                continue;
            }
            let drafts = match spec.mode {
                Speculate::Ngram => {
                    let mut tokens = seq.tokens().to_vec();
                    tokens.push(next);
                    let mut d = ngram::propose(&tokens, spec.max_ngram, k);
                    if spec.gate && !d.is_empty() {
                        d.truncate(c.gate.choose(
                            self.eng.pass_costs(),
                            rows,
                            pass_tokens,
                            d.len(),
                        ));
                    }
                    if d.is_empty() {
                        continue;
                    }
                    d
                }
                Speculate::Mtp => {
                    let k = match spec.gate {
                        true => c.gate.choose(self.eng.pass_costs(), rows, pass_tokens, k),
                        false => k,
                    };
                    if k == 0 {
                        continue;
                    }
                    let t = Instant::now();
                    match self.eng.mtp_draft(seq, next, k) {
                        Ok(d) => {
                            c.gate.record_draft_time(t.elapsed().as_secs_f64());
                            d
                        }
                        Err(e) => {
                            eprintln!("coli serve: warning: request {}: MTP drafting failed, decoding without drafts: {e}", r.job.id);
                            continue;
                        }
                    }
                }
                Speculate::Off | Speculate::Auto => continue,
            };
            let mut drafts = drafts;
            if let Some(k) = c.constraint.as_mut() {
                // Only drafts the grammar allows are worth verifying.
                drafts.truncate(k.valid_prefix(&drafts));
                if drafts.is_empty() {
                    continue;
                }
            }
            rows += drafts.len();
            pass_tokens +=
                coli_engine::speculative::gate::expected_tokens(c.gate.acceptance(), drafts.len())
                    - 1.0;
            c.drafts = drafts;
        }
    }

    /// Verifies choice `ci`'s drafts against its pass's logits `rows` (one per fed token):
    /// samples each row as plain decode would, sends the accepted drafts and the token after
    /// them, and rolls the rejected positions back ([`speculative::accept`]).
    fn verify(&mut self, ri: usize, ci: usize, rows: &[Vec<f32>], drafts: &[u32], now: Instant) {
        let c = &mut self.active[ri].choices[ci];
        let masked;
        let rows = match c.constraint.as_mut() {
            Some(k) => {
                // Each row sampled as plain decode would: masked by the grammar's state after
                // the drafts before it.
                let mut m = rows.to_vec();
                if let Err(e) = k.mask_rows(&mut m, drafts) {
                    self.fail_choice(ri, ci, e);
                    return;
                }
                masked = m;
                &masked[..]
            }
            None => rows,
        };
        let verdict = speculative::accept(&mut c.sampler, rows, drafts);
        let base = c.seq.as_ref().map_or(0, |s| s.len() - rows.len());
        // The fed token stays; each accepted draft emitted stays.
        let mut kept = 1;
        for &d in &drafts[..verdict.accepted] {
            self.emit(ri, ci, d, now);
            kept += 1;
            if self.active[ri].choices[ci].finished.is_some() {
                break;
            }
        }
        let c = &mut self.active[ri].choices[ci];
        let emitted = if c.finished.is_none() {
            self.emit(ri, ci, verdict.next, now);
            kept
        } else {
            kept - 1
        };
        let c = &mut self.active[ri].choices[ci];
        if let Some(seq) = c.seq.as_mut() {
            seq.truncate(base + kept);
        }
        c.gate.record(verdict.accepted, drafts.len());
        let m = &self.shared.metrics;
        m.drafts_proposed.inc_by(drafts.len() as u64);
        m.drafts_accepted.inc_by((kept - 1) as u64);
        m.draft_acceptance_rate
            .set(m.drafts_accepted.get() as f64 / m.drafts_proposed.get().max(1) as f64);
        m.tokens_per_decode_pass.observe(emitted as f64);
    }

    /// The prompt is in choice 0's sequence: fork it for the other choices, and sample every
    /// choice's first token from `logits`.
    fn prefill_done(&mut self, ri: usize, logits: &[f32], now: Instant) {
        for ci in 1..self.active[ri].choices.len() {
            let src = self.active[ri].choices[0].seq.as_ref().expect("prefilled");
            match self.eng.fork_sequence(src, usize::MAX) {
                Ok(s) => self.active[ri].choices[ci].seq = Some(s),
                Err(e) => {
                    let r = &mut self.active[ri];
                    let _ = r.job.events.send(Event::Error(engine_error(e)));
                    r.status = "error";
                    for c in &mut r.choices {
                        c.finished.get_or_insert("error");
                    }
                    return;
                }
            }
        }
        let r = &mut self.active[ri];
        r.first_token_at = Some(now);
        self.shared
            .metrics
            .ttft
            .observe(now.duration_since(r.job.arrived).as_secs_f64());
        for ci in 0..self.active[ri].choices.len() {
            self.sample(ri, ci, logits, now);
        }
    }

    /// Samples choice `ci`'s next token from `logits`, sends its text, and ends the choice on
    /// EOS, a stop string, max_tokens or a cancelled client.
    fn sample(&mut self, ri: usize, ci: usize, logits: &[f32], now: Instant) {
        let c = &mut self.active[ri].choices[ci];
        let id = match c.constraint.as_mut() {
            Some(k) => {
                let mut l = logits.to_vec();
                let t = Instant::now();
                let r = k.mask(&mut l);
                self.shared
                    .metrics
                    .grammar_mask_seconds
                    .observe(t.elapsed().as_secs_f64());
                if let Err(e) = r {
                    self.fail_choice(ri, ci, e);
                    return;
                }
                c.sampler.sample(&l)
            }
            None => c.sampler.sample(logits),
        };
        self.emit(ri, ci, id, now);
    }

    /// Ends request `ri` with an error because choice `ci`'s grammar failed (a 400 naming the
    /// field the grammar comes from); the error ends every choice of the request.
    fn fail_choice(&mut self, ri: usize, ci: usize, e: EngineError) {
        let r = &mut self.active[ri];
        let err = grammar_error(r.choices[ci].constraint.as_ref(), e);
        let _ = r.job.events.send(Event::Error(err));
        r.status = "error";
        for c in &mut r.choices {
            c.finished.get_or_insert("error");
        }
    }

    /// Sends token `id` of choice `ci` (sampled, or an accepted draft) and ends the choice on
    /// EOS, a stop string, max_tokens or a cancelled client.
    fn emit(&mut self, ri: usize, ci: usize, id: u32, now: Instant) {
        let tok = self.tok;
        let metrics = self.shared.metrics.clone();
        let eos = &self.eng.spec().eos_token_ids;
        let r = &mut self.active[ri];
        let c = &mut r.choices[ci];
        c.generated += 1;
        metrics.completion_tokens.inc();
        if let Some(prev) = c.last_token_at {
            metrics
                .inter_token_latency
                .observe(now.duration_since(prev).as_secs_f64());
        }
        c.last_token_at = Some(now);
        c.next = Some(id);
        if let Some(k) = c.constraint.as_mut() {
            if let Err(e) = k.consume(id) {
                let _ = r.job.events.send(Event::Error(grammar_error(Some(k), e)));
                r.status = "error";
                for c in &mut r.choices {
                    c.finished.get_or_insert("error");
                }
                return;
            }
        }
        if r.job.cancelled() {
            c.finished = Some("cancelled");
            return;
        }
        let (piece, hit) = match c.text.push(tok, id) {
            Ok(x) => x,
            Err(e) => {
                let _ = r.job.events.send(Event::Error(engine_error(e)));
                r.status = "error";
                c.finished = Some("error");
                return;
            }
        };
        for p in piece {
            if r.job.events.send(event(c.index, p)).is_err() {
                c.finished = Some("cancelled");
                return;
            }
        }
        if hit || (r.job.params.stop_on_eos && eos.contains(&id)) {
            c.finished = Some("stop");
        } else if c.generated >= r.job.params.max_tokens {
            c.finished = Some("length");
        }
        if let Some(reason) = c.finished {
            Self::finish_choice(tok, &r.job, r.cached, c, reason);
        }
    }

    /// Sends the rest of a choice's text and its Done event.
    fn finish_choice(
        tok: &TextTokenizer,
        job: &Job,
        cached: usize,
        c: &mut Choice,
        mut reason: &'static str,
    ) {
        c.finished = Some(reason);
        match c.text.finish_reply(tok, reason != "stop") {
            Ok((rest, hit)) => {
                if hit {
                    reason = "stop";
                    c.finished = Some(reason);
                }
                for p in rest {
                    let _ = job.events.send(event(c.index, p));
                }
                if reason == "stop" && c.text.tool_calls() > 0 {
                    reason = "tool_calls";
                    c.finished = Some(reason);
                }
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(engine_error(e)));
                c.finished = Some("error");
                return;
            }
        }
        let _ = job.events.send(Event::Done(
            c.index,
            Finish {
                reason,
                prompt_tokens: job.prompt.len(),
                cached_tokens: cached,
                completion_tokens: c.generated,
                stop_index: c.text.matched_stop(),
            },
        ));
    }

    /// Ends every running choice with finish reason `abort` (the shutdown grace period is
    /// over).
    fn abort_all(&mut self) {
        let tok = self.tok;
        for r in &mut self.active {
            if r.status == "ok" {
                r.status = "aborted";
            }
            for c in &mut r.choices {
                if c.finished.is_none() {
                    Self::finish_choice(tok, &r.job, r.cached, c, "abort");
                }
            }
        }
        self.reap();
    }

    /// Removes finished and cancelled requests: their sequences go to the prefix cache, their
    /// log line is written.
    fn reap(&mut self) {
        for r in &mut self.active {
            if !r.done() && r.job.cancelled() {
                for c in &mut r.choices {
                    c.finished.get_or_insert("cancelled");
                }
                if r.status == "ok" {
                    r.status = "cancelled";
                }
            }
        }
        let mut i = 0;
        while i < self.active.len() {
            if !self.active[i].done() {
                i += 1;
                continue;
            }
            // `remove`, not `swap_remove`: admission order decides whose prefill runs first.
            let r = self.active.remove(i);
            self.finish_request(r);
        }
        self.publish_prefill();
        self.count_bytes();
    }

    fn finish_request(&mut self, mut r: Request) {
        if r.choices.iter().any(|c| c.finished == Some("error")) {
            r.status = "error";
        } else if r.status == "ok" && r.choices.iter().any(|c| c.finished == Some("cancelled")) {
            r.status = "cancelled";
        }
        let m = self.shared.metrics.clone();
        m.running.dec();
        let generated: usize = r.choices.iter().map(|c| c.generated).sum();
        m.prompt_tokens.inc_by(r.job.prompt.len() as u64);
        m.prefill_tokens
            .inc_by((r.prefill_from.min(r.job.prompt.len()) - r.cached) as u64);
        m.cached_tokens.inc_by(r.cached as u64);
        if r.status == "cancelled" {
            m.cancelled.inc();
        }
        let now = Instant::now();
        self.shared
            .times
            .record(now.duration_since(r.admitted).as_secs_f64());
        let queue_wait = r.admitted.duration_since(r.job.arrived).as_secs_f64();
        let ttft = r
            .first_token_at
            .map(|t| t.duration_since(r.job.arrived).as_secs_f64());
        let decode_s = r
            .first_token_at
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let tok_s = if decode_s > 0.0 && generated > r.choices.len() {
            (generated - r.choices.len()) as f64 / decode_s
        } else {
            0.0
        };
        let reasons: Vec<&str> = r
            .choices
            .iter()
            .map(|c| c.finished.unwrap_or("none"))
            .collect();
        eprintln!(
            "coli serve: request {} status={} prompt_tokens={} cached_tokens={} completion_tokens={} n={} queue_wait_s={:.3} ttft_s={} tok_s={:.2} finish={}",
            r.job.id,
            r.status,
            r.job.prompt.len(),
            r.cached,
            generated,
            r.choices.len(),
            queue_wait,
            ttft.map_or("-".to_string(), |t| format!("{t:.3}")),
            tok_s,
            reasons.join(","),
        );
        for c in r.choices {
            if let Some(mut seq) = c.seq {
                // Count the usage of its last verified positions (drafts that stayed).
                self.eng.commit_usage(&mut seq);
                // The KV cache holds every fed token; the last sampled one was never fed.
                if seq.len() > self.eng.context() {
                    seq.truncate(self.eng.context());
                }
                self.prefix.put(r.job.scope, seq.into_state());
            }
        }
        self.prefix_warnings();
    }
}

/// A grammar's failure at generation time: a 400 naming the field it comes from.
fn grammar_error(k: Option<&Constraint>, e: EngineError) -> ApiError {
    match k {
        Some(k) => ApiError::invalid(k.param(), e.to_string()),
        None => engine_error(e),
    }
}

/// Maps an engine error to the HTTP error the client gets.
fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::ContextOverflow { needed, context } => ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                "max_tokens",
                format!("This model's maximum context length is {context} tokens, but the request needs {needed}."),
            )
        },
        e @ (EngineError::TokenOutOfRange { .. } | EngineError::Invalid(_)) => {
            ApiError::invalid("prompt", e.to_string())
        }
        e => ApiError::internal(format!("generation failed: {e}")),
    }
}
