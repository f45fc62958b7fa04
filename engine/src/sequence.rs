//! One sequence's state: its KV cache (one [`LayerKv`] per decoder layer) and the token ids
//! whose keys and values it holds. An [`crate::Engine`] runs several sequences in one forward
//! pass ([`crate::Engine::forward_many`]); each is created by [`crate::Engine::new_sequence`],
//! which counts it against the engine's `max_sequences` (the KV memory the engine planned for)
//! until it is dropped.

use crate::layers::LayerKv;
use coli_format::ExpertKey;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A sequence's KV cache and tokens (see the module doc).
pub struct Sequence {
    pub(crate) kv: Vec<LayerKv>,
    pub(crate) tokens: Vec<u32>,
    /// f32 values per position of each layer's cache (`LayerKv::k` row width).
    kv_dims: Vec<usize>,
    /// The routed experts of positions whose usage counts wait (speculative verify rows):
    /// `(position, experts)`, counted by the engine once the position has survived to the
    /// sequence's next pass, dropped when it is rolled back.
    pub(crate) held_usage: Vec<(usize, Vec<ExpertKey>)>,
    /// Returns the sequence's place to the engine's count when dropped.
    _slot: Option<SlotGuard>,
}

/// One place of the engine's live-sequence count, given back on drop.
pub(crate) struct SlotGuard(pub(crate) Arc<AtomicUsize>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Sequence {
    /// An empty sequence for layers whose cache rows are `kv_dims` f32 values wide.
    pub(crate) fn new(kv_dims: Vec<usize>, slot: Option<SlotGuard>) -> Sequence {
        Sequence {
            kv: kv_dims.iter().map(|_| LayerKv::default()).collect(),
            tokens: Vec::new(),
            kv_dims,
            held_usage: Vec::new(),
            _slot: slot,
        }
    }

    /// A copy of the first `len` positions of `self`'s cache and tokens (all when `len` is
    /// larger) holding `slot`.
    pub(crate) fn fork(&self, len: usize, slot: SlotGuard) -> Sequence {
        let len = len.min(self.tokens.len());
        Sequence {
            kv: self
                .kv
                .iter()
                .zip(&self.kv_dims)
                .map(|(l, &dim)| LayerKv {
                    k: l.k[..len * dim].to_vec(),
                    v: l.v[..(len * dim).min(l.v.len())].to_vec(),
                })
                .collect(),
            tokens: self.tokens[..len].to_vec(),
            kv_dims: self.kv_dims.clone(),
            held_usage: Vec::new(),
            _slot: Some(slot),
        }
    }

    /// The token ids whose keys/values are cached, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Makes room for `positions` positions in every layer's cache at once (`v_dims[l]`: the
    /// values per position of layer l's `v` rows, 0 when it has none), so that a cache never
    /// holds more than the planned `context` positions' bytes (growing a `Vec` one pass at a
    /// time could reserve up to twice that). Untouched reserved memory is not resident.
    pub(crate) fn reserve(&mut self, positions: usize, v_dims: &[usize]) {
        for ((kv, &kd), &vd) in self.kv.iter_mut().zip(&self.kv_dims).zip(v_dims) {
            let (k, v) = (positions * kd, positions * vd);
            if kv.k.capacity() < k {
                kv.k.reserve_exact(k - kv.k.len());
            }
            if kv.v.capacity() < v {
                kv.v.reserve_exact(v - kv.v.len());
            }
        }
    }

    /// Positions cached, tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps only the first `len` positions (no effect when `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.tokens.len());
        for (kv, &dim) in self.kv.iter_mut().zip(&self.kv_dims) {
            kv.truncate(len, dim);
        }
        self.tokens.truncate(len);
        self.held_usage.retain(|(pos, _)| *pos < len);
    }

    /// Bytes of KV cache the sequence holds now (f32 keys and values of every layer).
    pub fn kv_bytes(&self) -> u64 {
        let values: usize = self.kv.iter().map(|l| l.k.len() + l.v.len()).sum();
        (values * std::mem::size_of::<f32>()) as u64
    }
}
