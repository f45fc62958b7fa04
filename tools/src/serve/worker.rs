//! The engine thread: owns the store and the one [`Engine`], takes jobs FIFO from a bounded
//! channel, streams text events back, and stops a generation as soon as its client is gone.

use super::api::ApiError;
use super::metrics::Metrics;
use super::text::TextStream;
use coli_engine::{Engine, EngineError, GenerateParams, StopReason, TextTokenizer};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the engine thread reports about a job.
#[derive(Debug)]
pub enum Event {
    /// Text to append (whole characters, stop strings already cut).
    Text(String),
    /// Generation ended normally.
    Done(Finish),
    /// Generation failed.
    Error(ApiError),
}

/// The end of a generation.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    /// `stop` (EOS or a stop string) or `length` (max_tokens reached).
    pub reason: &'static str,
    /// Tokens of the whole prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the KV cache (not prefilled).
    pub cached_tokens: usize,
    /// Tokens generated (an EOS that ended generation included).
    pub completion_tokens: usize,
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
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters.
    pub params: GenerateParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Where text goes.
    pub events: mpsc::UnboundedSender<Event>,
    /// Set when the client is gone.
    pub cancel: Arc<AtomicBool>,
    /// When the request arrived.
    pub arrived: Instant,
}

impl Job {
    fn cancelled(&self, shutdown: &AtomicBool) -> bool {
        self.cancel.load(Ordering::Relaxed)
            || self.events.is_closed()
            || shutdown.load(Ordering::Relaxed)
    }
}

/// What the engine thread tells the server once the model is loaded.
#[derive(Clone)]
pub struct EngineInfo {
    /// The store's tokenizer, shared with the engine thread.
    pub tok: Arc<TextTokenizer>,
    /// KV-cache capacity, tokens.
    pub context: usize,
    /// Vocabulary size (ids must be below it).
    pub vocab: usize,
    /// Seconds to open the store and load the model.
    pub load_s: f64,
    /// Engine worker threads.
    pub threads: usize,
}

/// Shared between the engine thread and the handlers: a moving average of job durations, for
/// `Retry-After`.
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

/// Where the engine thread reports.
pub struct Shared {
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Job durations, for `Retry-After`.
    pub times: Arc<JobTimes>,
    /// Set when the server shuts down: the running job stops, queued ones are dropped.
    pub shutdown: Arc<AtomicBool>,
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

/// Runs on the engine thread: opens the store, loads the engine, reports through `ready`, then
/// serves jobs in arrival order until every sender is dropped.
pub fn run(
    opts: crate::options::EngineOptions,
    shared: Shared,
    mut jobs: mpsc::Receiver<Job>,
    ready: std::sync::mpsc::Sender<anyhow::Result<EngineInfo>>,
) {
    let Shared {
        metrics,
        times,
        shutdown,
    } = shared;
    let (loaded, tok) = match open(&opts) {
        Ok(x) => x,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let mut eng = match crate::options::engine(&loaded, &opts) {
        Ok((e, load_s)) => {
            let info = EngineInfo {
                tok: tok.clone(),
                context: e.context(),
                vocab: e.spec().vocab_size,
                load_s,
                threads: e.threads(),
            };
            if ready.send(Ok(info)).is_err() {
                return;
            }
            e
        }
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    // Every expert byte the store read, loading (e.g. pinned experts) included.
    let mut bytes_seen = 0u64;
    let mut count_bytes = |eng: &Engine<'_>| {
        let now = eng.store().stats().bytes_read;
        metrics
            .expert_bytes_read
            .inc_by(now.saturating_sub(bytes_seen));
        bytes_seen = bytes_seen.max(now);
    };
    count_bytes(&eng);
    while let Some(job) = jobs.blocking_recv() {
        metrics.queue_depth.dec();
        let t0 = Instant::now();
        metrics
            .queue_wait
            .observe(t0.duration_since(job.arrived).as_secs_f64());
        if job.cancelled(&shutdown) {
            metrics.cancelled.inc();
            continue;
        }
        metrics.running.inc();
        run_job(&mut eng, &tok, &metrics, &shutdown, job);
        count_bytes(&eng);
        metrics.running.dec();
        times.record(t0.elapsed().as_secs_f64());
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

fn run_job(
    eng: &mut Engine<'_>,
    tok: &TextTokenizer,
    m: &Metrics,
    shutdown: &AtomicBool,
    job: Job,
) {
    let started = Instant::now();
    let mut text = TextStream::new(job.stop.clone());
    let mut stopped_by_string = false;
    let result = eng.generate(&job.prompt, &job.params, |id| {
        if job.cancelled(shutdown) {
            return Ok(false);
        }
        let (piece, hit) = text.push(tok, id)?;
        if !piece.is_empty() && job.events.send(Event::Text(piece)).is_err() {
            return Ok(false);
        }
        if hit {
            stopped_by_string = true;
            return Ok(false);
        }
        Ok(true)
    });
    let g = match result {
        Ok(g) => g,
        Err(e) => {
            let _ = job.events.send(Event::Error(engine_error(e)));
            return;
        }
    };
    let s = &g.stats;
    m.prompt_tokens.inc_by(job.prompt.len() as u64);
    m.prefill_tokens.inc_by(s.prompt_tokens as u64);
    m.cached_tokens
        .inc_by((job.prompt.len() - s.prompt_tokens) as u64);
    m.completion_tokens.inc_by(g.tokens.len() as u64);
    m.expert_cache_hits.inc_by(s.cache.hits);
    m.expert_cache_misses.inc_by(s.cache.misses);
    m.expert_cache_hit_rate.set(eng.cache_stats().hit_rate());
    if !g.tokens.is_empty() {
        let queued = started.duration_since(job.arrived).as_secs_f64();
        m.ttft.observe(queued + s.ttft_s);
    }
    if s.decode_steps > 0 {
        let per = s.decode_s / s.decode_steps as f64;
        for _ in 0..s.decode_steps {
            m.decode_step.observe(per);
        }
    }
    if g.stop == StopReason::Callback && !stopped_by_string {
        m.cancelled.inc();
        return;
    }
    if !stopped_by_string {
        match text.finish(tok) {
            Ok((rest, hit)) => {
                stopped_by_string = hit;
                if !rest.is_empty() {
                    let _ = job.events.send(Event::Text(rest));
                }
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(engine_error(e)));
                return;
            }
        }
    }
    let reason = if stopped_by_string || g.stop == StopReason::Eos {
        "stop"
    } else {
        "length"
    };
    let _ = job.events.send(Event::Done(Finish {
        reason,
        prompt_tokens: job.prompt.len(),
        cached_tokens: job.prompt.len() - s.prompt_tokens,
        completion_tokens: g.tokens.len(),
    }));
}
