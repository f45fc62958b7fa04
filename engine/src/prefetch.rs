//! Router lookahead prefetch.
//!
//! Before decoder layer `L` runs, the engine applies layer `L+1`'s `post_attention_layernorm`
//! and router to layer `L`'s INPUT hidden state (the residual stream entering layer `L`; before
//! layer 0 it also predicts layer 0 from the embeddings) and hands the predicted experts to a
//! prefetch thread, which reads them into the expert cache while layer `L` computes (its
//! attention and its own MoE). The real routing of layer `L+1` sees the residual stream after
//! layer `L` and its own attention, so the prediction is a guess: a wrong guess costs disk
//! bandwidth and cache room, never correctness (the demand request of layer `L+1` reads what
//! is missing; a demand request for an expert whose prefetch read is in flight waits for that
//! read instead of issuing a second one; see [`crate::ExpertCache::get_many`]).
//!
//! Using layer `L`'s input (rather than the state after its attention, which would need a hook
//! inside the decoder layer) gives the reads a whole layer of compute to land in.
//!
//! The prefetch thread lives for one forward pass ([`with_prefetcher`], a scoped thread: the
//! store is borrowed). Requests are served in order; when the pass ends, requests not started
//! yet are dropped and the read in progress is finished.

use crate::cache::ExpertCache;
use crate::layers::{DecoderLayer, Ffn};
use coli_store::{ExpertKey, Store};
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
/// (for precision/recall) and queues their reads.
pub fn predict_and_request(
    layer: &DecoderLayer<'_>,
    x: &[f32],
    n: usize,
    cache: &ExpertCache,
    p: &Prefetcher<'_, '_>,
) {
    if let Some((l, experts)) = predict(layer, x, n) {
        let keys: Vec<ExpertKey> = experts.iter().map(|&e| ExpertKey::new(l, e)).collect();
        cache.set_prediction(l, experts);
        p.request(cache.absent(&keys));
    }
}
