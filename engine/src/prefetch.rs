//! Router lookahead prefetch.
//!
//! While decoder layer `L` runs, right after its attention's residual add
//! ([`DecoderLayer::forward_observed`]), the engine applies layer `L+1`'s
//! `post_attention_layernorm` and router to that residual stream (before layer 0 it predicts
//! layer 0 from the embeddings) and hands the predicted experts to a prefetch thread, which
//! reads them into the expert cache while layer `L`'s MoE and layer `L+1`'s attention compute.
//! The real routing of layer `L+1` sees the stream after layer `L`'s MoE and layer `L+1`'s
//! attention, so the prediction is a guess: a wrong guess costs disk bandwidth and cache room,
//! never correctness (the demand request of layer `L+1` reads what is missing; a demand request
//! for an expert whose prefetch read is in flight waits for that read instead of issuing a
//! second one; see [`crate::ExpertCache::get_many`]).
//!
//! Why after the attention: on the OLMoE-shaped benchmark model (random weights, 2 cores) the
//! prediction from layer `L`'s INPUT (one attention earlier, a whole layer of compute for the
//! reads) had precision 0.569; from the state after layer `L`'s attention 0.663, with 1.04x
//! the tok/s (engine/bench/results/2026-11-30-olmoe-int4-lookahead.txt). A 3.4 MiB record
//! lands in under 2 ms at 2 GiB/s; layer `L`'s MoE plus layer `L+1`'s attention take ~6 ms.
//!
//! Prefetch pays only when its reads are used: on a model whose lookahead predictions mostly
//! miss experts that are already cached, it reads the wrong ones (the generated OLMoE-shaped
//! benchmark model: 9% of prefetched experts used, 4.5x the bytes per token, 0.69x the tok/s
//! on 2 cores). [`PrefetchGate`] turns it off while the share of prefetched experts used stays
//! below [`EngineOptions::prefetch_min_use`](crate::EngineOptions::prefetch_min_use), probing
//! every [`PREFETCH_PROBE_EVERY`] forward passes to notice when it would pay again. Predictions
//! are made and scored on every pass; only the reads pause.
//!
//! The prefetch thread lives for one forward pass ([`with_prefetcher`], a scoped thread: the
//! store is borrowed). Requests are served in order; when the pass ends, requests not started
//! yet are dropped and the read in progress is finished.

use crate::cache::ExpertCache;
use crate::layers::{DecoderLayer, Ffn};
use coli_format::ExpertKey;
use coli_store::Store;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

/// Sends prefetch requests to the prefetch thread of the current forward pass. The thread is
/// started by the first request (a forward pass whose predicted experts are all in RAM never
/// starts one: on a VM every thread start and wake-up is a costly system call).
pub struct Prefetcher<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    store: &'env Store,
    cache: &'env ExpertCache,
    stop: &'env AtomicBool,
    failures: &'env AtomicU64,
    tx: OnceLock<mpsc::Sender<Vec<ExpertKey>>>,
    worker: Mutex<Option<std::thread::ScopedJoinHandle<'scope, ()>>>,
}

impl Prefetcher<'_, '_> {
    /// Queues a read of `keys` (most wanted first); returns at once. Starts the prefetch
    /// thread on first use; if it cannot be started the experts are read on demand instead.
    pub fn request(&self, keys: Vec<ExpertKey>) {
        if keys.is_empty() {
            return;
        }
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Vec<ExpertKey>>();
            let (store, cache, stop, failures) = (self.store, self.cache, self.stop, self.failures);
            let worker = std::thread::Builder::new()
                .name("coli-prefetch".into())
                .spawn_scoped(self.scope, move || {
                    while let Ok(keys) = rx.recv() {
                        if stop.load(Ordering::Acquire) {
                            continue;
                        }
                        if cache.prefetch(store, &keys).is_err() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            if let Ok(h) = worker {
                *self.worker.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
            }
            tx
        });
        // The receiver lives until the worker ends, after `with_prefetcher`'s `f` returns (a
        // worker that failed to start dropped it: the send fails and demand reads take over).
        let _ = tx.send(keys);
    }
}

/// Runs `f` with a prefetch thread serving its requests through `cache`, then stops the
/// thread (requests not started are dropped) and returns `f`'s result with the number of
/// prefetch requests that failed (their experts are read on demand instead).
pub fn with_prefetcher<R>(
    store: &Store,
    cache: &ExpertCache,
    f: impl FnOnce(&Prefetcher<'_, '_>) -> R,
) -> (R, u64) {
    let stop = AtomicBool::new(false);
    let failures = AtomicU64::new(0);
    let r = std::thread::scope(|s| {
        let p = Prefetcher {
            scope: s,
            store,
            cache,
            stop: &stop,
            failures: &failures,
            tx: OnceLock::new(),
            worker: Mutex::new(None),
        };
        let r = f(&p);
        stop.store(true, Ordering::Release);
        let Prefetcher { tx, worker, .. } = p;
        drop(tx);
        let worker = worker.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = worker {
            // A panic in the worker leaves nothing half-done in the cache (see cache.rs).
            let _ = h.join();
        }
        cache.settle();
        r
    });
    (r, failures.load(Ordering::Relaxed))
}

/// The experts `layer`'s router predicts for hidden states `x` (`[n, H]`, the residual stream,
/// not normalized), most wanted first; None for a dense layer.
pub fn predict(layer: &DecoderLayer<'_>, x: &[f32], n: usize) -> Option<(u32, Vec<u32>)> {
    let normed = || {
        let mut v = vec![0f32; x.len()];
        layer.post_norm.forward(x, &mut v);
        v
    };
    match &layer.ffn {
        Ffn::Moe(m) => Some((m.layer, m.predict_experts(&normed(), n))),
        Ffn::SigmoidMoe(m) => Some((m.experts.layer, m.predict_experts(&normed(), n))),
        Ffn::Dense(_) => None,
    }
}

/// Predicts `layer`'s experts for `x` (see [`predict`]), records the prediction in `cache`
/// (for precision/recall) and, with a prefetcher (`p`; None when the gate paused the reads),
/// queues the reads of those not in RAM.
pub fn predict_and_request(
    layer: &DecoderLayer<'_>,
    x: &[f32],
    n: usize,
    cache: &ExpertCache,
    p: Option<&Prefetcher<'_, '_>>,
) {
    if let Some((l, experts)) = predict(layer, x, n) {
        let keys: Vec<ExpertKey> = experts.iter().map(|&e| ExpertKey::new(l, e)).collect();
        cache.set_prediction(l, experts);
        if let Some(p) = p {
            p.request(cache.absent(&keys));
        }
    }
}

/// While prefetch is gated off, every this many forward passes still prefetches, to keep the
/// use estimate current.
pub const PREFETCH_PROBE_EVERY: u64 = 32;

/// Weight of the latest forward pass in the moving estimate of the share of prefetched experts
/// used.
pub const USE_EMA_WEIGHT: f64 = 0.5;

/// Decides, before each forward pass, whether the lookahead prefetches (see the module doc).
///
/// The estimate starts at 1 (prefetch on) and moves, after every pass that prefetched, toward
/// that pass's `prefetched experts used / prefetched experts read` (exponential moving
/// average, weight [`USE_EMA_WEIGHT`]). A pass prefetches when the estimate is at least
/// `min_use`, or every [`PREFETCH_PROBE_EVERY`]-th pass. `min_use` 0 keeps prefetch always on.
/// Only reads and cache contents change, never results.
#[derive(Clone, Debug)]
pub struct PrefetchGate {
    min_use: f64,
    estimate: f64,
    passes: u64,
    last_reads: u64,
    last_used: u64,
    skipped: u64,
}

impl PrefetchGate {
    /// A gate with threshold `min_use` (share of prefetched experts used, 0..=1).
    pub fn new(min_use: f64) -> PrefetchGate {
        PrefetchGate {
            min_use,
            estimate: 1.0,
            passes: 0,
            last_reads: 0,
            last_used: 0,
            skipped: 0,
        }
    }

    /// Whether the next forward pass prefetches, given the cache's counters of prefetch reads
    /// and of those used so far (cumulative).
    pub fn allow(&mut self, prefetch_reads: u64, prefetch_used: u64) -> bool {
        let reads = prefetch_reads.saturating_sub(self.last_reads);
        let used = prefetch_used.saturating_sub(self.last_used);
        (self.last_reads, self.last_used) = (prefetch_reads, prefetch_used);
        if reads > 0 {
            let share = (used as f64 / reads as f64).min(1.0);
            self.estimate = (1.0 - USE_EMA_WEIGHT) * self.estimate + USE_EMA_WEIGHT * share;
        }
        self.passes += 1;
        let on = self.estimate >= self.min_use || self.passes.is_multiple_of(PREFETCH_PROBE_EVERY);
        if !on {
            self.skipped += 1;
        }
        on
    }

    /// The current estimate of the share of prefetched experts used.
    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    /// Forward passes that ran without prefetch because of the gate.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_turns_off_when_prefetch_is_unused_and_probes() {
        let mut g = PrefetchGate::new(0.25);
        assert!(g.allow(0, 0), "on at start");
        // Every pass reads 10 experts and uses 1: the estimate falls below 0.25.
        let (mut r, mut u) = (0, 0);
        let mut on = Vec::new();
        for _ in 0..40 {
            if on.last().copied().unwrap_or(true) {
                r += 10;
                u += 1;
            }
            on.push(g.allow(r, u));
        }
        assert!(g.estimate() < 0.25, "estimate {}", g.estimate());
        let off = on.iter().filter(|&&x| !x).count();
        assert!(off > 20, "gated off most passes: {on:?}");
        assert!(on[20..].iter().any(|&x| x), "still probes: {on:?}");
        assert_eq!(g.skipped(), off as u64);
        // When the probes' reads are all used again, the estimate recovers and prefetch stays on.
        for _ in 0..40 {
            r += 10;
            u += 10;
            g.allow(r, u);
        }
        assert!(g.estimate() > 0.9 && g.allow(r + 10, u + 10));
    }

    #[test]
    fn min_use_zero_never_gates() {
        let mut g = PrefetchGate::new(0.0);
        for i in 0..100u64 {
            assert!(g.allow(10 * i, 0));
        }
        assert_eq!(g.skipped(), 0);
    }
}
