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
use std::sync::mpsc;

/// Sends prefetch requests to the prefetch thread of the current forward pass.
pub struct Prefetcher {
    tx: mpsc::Sender<Vec<ExpertKey>>,
}

impl Prefetcher {
    /// Queues a read of `keys` (most wanted first); returns at once.
    pub fn request(&self, keys: Vec<ExpertKey>) {
        if !keys.is_empty() {
            // The receiver lives until the scope of `with_prefetcher` ends, after `f` returns.
            let _ = self.tx.send(keys);
        }
    }
}

/// Runs `f` with a prefetch thread serving its requests through `cache`, then stops the
/// thread (requests not started are dropped) and returns `f`'s result with the number of
/// prefetch requests that failed (their experts are read on demand instead).
pub fn with_prefetcher<R>(
    store: &Store,
    cache: &ExpertCache,
    f: impl FnOnce(&Prefetcher) -> R,
) -> (R, u64) {
    let (tx, rx) = mpsc::channel::<Vec<ExpertKey>>();
    let stop = AtomicBool::new(false);
    let failures = AtomicU64::new(0);
    let (stop_ref, failures_ref) = (&stop, &failures);
    let r = std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("coli-prefetch".into())
            .spawn_scoped(s, move || {
                while let Ok(keys) = rx.recv() {
                    if stop_ref.load(Ordering::Acquire) {
                        continue;
                    }
                    if cache.prefetch(store, &keys).is_err() {
                        failures_ref.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        let p = Prefetcher { tx };
        let r = f(&p);
        stop.store(true, Ordering::Release);
        drop(p);
        if let Ok(h) = worker {
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
    p: &Prefetcher,
) {
    if let Some((l, experts)) = predict(layer, x, n) {
        let keys = experts.iter().map(|&e| ExpertKey::new(l, e)).collect();
        cache.set_prediction(l, experts);
        p.request(keys);
    }
}
