//! Router lookahead prefetch.
//!
//! While decoder layer `L` runs, right after its attention's residual add
//! ([`DecoderLayer::forward_spans`]), the engine applies layer `L+1`'s
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
//! on 2 cores). [`crate::placement::PrefetchGate`] turns it off while the share of prefetched
//! experts used stays below [`EngineOptions::prefetch_min_use`](crate::EngineOptions::prefetch_min_use),
//! probing every [`crate::placement::PREFETCH_PROBE_EVERY`] forward passes to notice when it
//! would pay again. Predictions are made and scored on every pass; only the reads pause.
//!
//! The prefetch thread lives for one forward pass ([`with_prefetcher`], a scoped thread: the
//! store is borrowed). Requests are served in order; when the pass ends, requests not started
//! yet are dropped and the read in progress is finished.

use crate::cache::ExpertCache;
use crate::layers::moe::{rank_union, Routing};
use crate::layers::{DecoderLayer, Ffn};
use crate::trace::RoutingTrace;
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
            // A panic in the worker leaves nothing half-done in the cache: its reads fail
            // their slots on the way out (`FailOnDrop` in cache/expert_cache.rs).
            let _ = h.join();
        }
        cache.settle();
        r
    });
    (r, failures.load(Ordering::Relaxed))
}

/// The per-token routing `layer`'s router predicts for hidden states `x` (`[n, H]`, the
/// residual stream, not normalized) and its layer index; None for a dense layer.
pub fn predict_routes(
    layer: &DecoderLayer<'_>,
    x: &[f32],
    n: usize,
) -> Option<(u32, Vec<Routing>)> {
    let normed = || layer.ffn_input(x, n);
    match &layer.ffn {
        Ffn::Moe(m) => Some((m.layer, m.route(&normed(), n))),
        // A hash-routed layer's experts follow the token ids, which the lookahead does not see.
        Ffn::SigmoidMoe(m) if m.routing.hash.is_some() => None,
        Ffn::SigmoidMoe(m) => Some((m.experts.layer, m.route(&normed(), n, &[]).ok()?)),
        Ffn::SinkMoe(m) => Some((m.experts.layer, m.route(&normed(), n).0)),
        Ffn::Dense(_) | Ffn::FusedDense(_) => None,
    }
}

/// Predicts `layer`'s experts for `x` (tokens at positions `pos0..pos0+n`; see
/// [`predict_routes`]; ordered by [`rank_union`]),
/// records the prediction in `cache` (for precision/recall) and in `trace`, and, with a
/// prefetcher (`p`; None when the gate paused the reads), queues the reads of those not in RAM.
pub fn predict_and_request(
    layer: &DecoderLayer<'_>,
    x: &[f32],
    n: usize,
    pos0: usize,
    cache: &ExpertCache,
    trace: Option<&RoutingTrace>,
    p: Option<&Prefetcher<'_, '_>>,
) {
    if let Some((l, routes)) = predict_routes(layer, x, n) {
        if let Some(t) = trace {
            t.predicted(l, pos0, &routes);
        }
        let experts = rank_union(&routes);
        let keys: Vec<ExpertKey> = experts.iter().map(|&e| ExpertKey::new(l, e)).collect();
        cache.set_prediction(l, experts);
        if let Some(p) = p {
            p.request(cache.absent(&keys));
        }
    }
}
