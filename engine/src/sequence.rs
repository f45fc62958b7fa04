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
    /// What MTP drafting needs, when it is on for this sequence.
    pub(crate) mtp: Option<MtpState>,
    /// [`Sequence::pin`]: the length it was pinned at and a copy of the layers' bounded state
    /// then.
    pinned: Option<(usize, Vec<LayerKv>)>,
    /// The last pin's copies, kept after [`Sequence::unpin`] so the next pin of a recurrent
    /// layer fills the same buffers (a fresh allocation per pass costs page faults).
    spare_pin: Vec<LayerKv>,
    /// Returns the sequence's place to the engine's count when dropped.
    _slot: Option<SlotGuard>,
}

/// A sequence's multi-token-prediction state (MTP drafts, [`crate::speculative`]): the MTP
/// layer's own KV cache for positions `0..fed`, and the main model's hidden states (after
/// `model.norm`) of the positions `fed..len` it has not run on yet. Every pass over the
/// sequence appends its rows' hidden states; drafting runs the MTP layer over them.
#[derive(Clone)]
pub(crate) struct MtpState {
    pub(crate) kv: LayerKv,
    /// f32 values per position of `kv.k`.
    pub(crate) kv_dim: usize,
    /// `[len - fed, H]` f32.
    pub(crate) hidden: Vec<f32>,
    pub(crate) hidden_size: usize,
}

impl MtpState {
    /// Positions in the MTP layer's KV cache.
    pub(crate) fn fed(&self) -> usize {
        self.kv.positions(self.kv_dim)
    }

    /// Keeps positions `0..len` of a sequence now `seq_len` long.
    pub(crate) fn truncate(&mut self, len: usize, seq_len: usize) {
        let fed = self.fed();
        if len < fed {
            self.kv.truncate(len, self.kv_dim);
            self.hidden.clear();
        } else if len < seq_len {
            self.hidden.truncate((len - fed) * self.hidden_size);
        }
    }
}

/// A sequence's KV cache and tokens held outside the engine's count of live sequences: an
/// entry of the prefix cache ([`crate::prefix_cache`]), in RAM or read back from disk. It runs
/// again once [`crate::Engine::resume_sequence`] has made it a [`Sequence`].
pub struct KvState {
    pub(crate) seq: Sequence,
}

impl KvState {
    /// Wraps `seq`, which must hold no slot.
    pub(crate) fn new(seq: Sequence) -> KvState {
        debug_assert!(seq._slot.is_none());
        KvState { seq }
    }

    /// The token ids whose keys and values are held, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.seq.tokens
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.seq.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }

    /// Bytes of f32 keys, values and MTP state held ([`Sequence::kv_bytes`]).
    pub fn bytes(&self) -> u64 {
        self.seq.kv_bytes()
    }

    /// Whether an MTP state is held (MTP drafting can continue from it).
    pub fn has_mtp_state(&self) -> bool {
        self.seq.mtp.is_some()
    }

    /// A copy of the first `len` positions (all when `len` is larger; none when they cannot
    /// be kept exactly, [`KvState::can_truncate`]).
    pub fn copy_prefix(&self, len: usize) -> KvState {
        KvState {
            seq: self.seq.fork(len, None),
        }
    }

    /// Keeps only the first `len` positions (none when they cannot be kept exactly).
    pub fn truncate(&mut self, len: usize) {
        self.seq.truncate(len);
    }

    /// Whether the first `len` positions can be kept exactly ([`Sequence::can_truncate`]).
    pub fn can_truncate(&self, len: usize) -> bool {
        self.seq.can_truncate(len)
    }

    /// The longest exact prefix of at most `len` positions ([`Sequence::exact_at_most`]).
    pub fn exact_at_most(&self, len: usize) -> usize {
        self.seq.exact_at_most(len)
    }
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
            pinned: None,
            spare_pin: Vec::new(),
            mtp: None,
            _slot: slot,
        }
    }

    /// A copy of the first `len` positions of `self`'s cache and tokens (all when `len` is
    /// larger) holding `slot`.
    pub(crate) fn fork(&self, len: usize, slot: Option<SlotGuard>) -> Sequence {
        let len = self.exact_at_most(len);
        Sequence {
            kv: self
                .kv
                .iter()
                .zip(&self.kv_dims)
                .map(|(l, &dim)| {
                    if len == 0 {
                        return l.emptied();
                    }
                    if !l.recurrent.is_empty() {
                        // A recurrent layer (no keys or values): its state, history and
                        // checkpoints are bounded; the copy goes back as truncate does.
                        let mut kv = l.clone();
                        kv.expanded = None;
                        kv.truncate(len, dim);
                        return kv;
                    }
                    let rows = len.saturating_sub(l.first);
                    let conv_rows = len.saturating_sub(l.conv_first);
                    let mut kv = l.with_rows(
                        l.k[..rows * dim].to_vec(),
                        l.v[..(rows * dim).min(l.v.len())].to_vec(),
                        l.conv[..conv_rows * l.conv_dim].to_vec(),
                    );
                    if let Some(rows) = len.checked_div(l.block_rate) {
                        kv.blocks = l.blocks[..rows * l.block_dim].to_vec();
                    }
                    kv
                })
                .collect(),
            tokens: self.tokens[..len].to_vec(),
            kv_dims: self.kv_dims.clone(),
            held_usage: Vec::new(),
            pinned: None,
            spare_pin: Vec::new(),
            mtp: self.mtp.clone().map(|mut m| {
                m.truncate(len, self.tokens.len());
                m
            }),
            _slot: slot,
        }
    }

    /// The sequence's KV state without its place in the engine's count of live sequences
    /// (for the prefix cache); verify rows' usage counts still held are dropped.
    pub fn into_state(mut self) -> KvState {
        self._slot = None;
        self.held_usage.clear();
        KvState { seq: self }
    }

    /// Gives the sequence a place in the engine's count.
    pub(crate) fn set_slot(&mut self, slot: SlotGuard) {
        self._slot = Some(slot);
    }

    /// f32 values per position of each layer's cache.
    pub(crate) fn kv_dims(&self) -> &[usize] {
        &self.kv_dims
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

    /// Whether [`Sequence::truncate`] to `len` keeps the state exact: always for 0, and for
    /// every length when no layer dropped rows; a layer that dropped its older rows (Inkling's
    /// sliding windows and convolution inputs, [`crate::layers::inkling::trim`]) can go back
    /// only so far.
    pub fn can_truncate(&self, len: usize) -> bool {
        // Layers are asked even for `len >= self.len()`: a layer-major prefill that failed
        // midway has layers ahead of the tokens.
        self.kv.iter().all(|l| l.can_truncate(len))
            && self
                .mtp
                .as_ref()
                .is_none_or(|m| m.kv.can_truncate(len.min(m.fed())))
    }

    /// The longest prefix of at most `len` positions the state can be cut back to exactly
    /// ([`Sequence::can_truncate`]): `len` itself, else the longest recurrent checkpoint
    /// below it that every layer can restore, else 0. A fork, an edited prompt or a reused
    /// prefix resumes there and recomputes the rest.
    pub fn exact_at_most(&self, len: usize) -> usize {
        let len = len.min(self.tokens.len());
        if self.can_truncate(len) {
            return len;
        }
        let mut cands: Vec<usize> = self
            .kv
            .iter()
            .flat_map(|l| l.checkpoints.iter().map(|c| c.len))
            .filter(|&c| c < len)
            .collect();
        cands.sort_unstable_by(|a, b| b.cmp(a));
        cands.dedup();
        cands
            .into_iter()
            .find(|&c| self.can_truncate(c))
            .unwrap_or(0)
    }

    /// Keeps a copy of what the layers that drop their older rows hold now (Inkling: the
    /// sliding layers' keys and values, every layer's convolution inputs; bounded by their
    /// windows), so that [`Sequence::truncate`] back to the current length stays exact
    /// whatever an operation of many positions drops meanwhile, until [`Sequence::unpin`].
    /// Nothing is copied for an empty sequence (going back to 0 is always exact) or a model
    /// whose layers keep every row.
    pub(crate) fn pin(&mut self) {
        let start = self.tokens.len();
        if start == 0
            || self
                .kv
                .iter()
                .all(|l| l.conv_dim == 0 && !l.windowed && l.recurrent.is_empty())
        {
            return;
        }
        let mut spare = std::mem::take(&mut self.spare_pin);
        let layers = self
            .kv
            .iter()
            .enumerate()
            .map(|(i, l)| {
                if !l.recurrent.is_empty() {
                    // A recurrent layer: its state and the convolution rows the next position
                    // reads (its checkpoints survive a rollback as they are), copied into the
                    // last pin's buffers.
                    let from = l.conv_first.max(start.saturating_sub(l.conv_tail));
                    let mut snap = spare.get_mut(i).map(std::mem::take).unwrap_or_default();
                    snap.recurrent.clear();
                    snap.recurrent.extend_from_slice(&l.recurrent);
                    snap.conv.clear();
                    snap.conv
                        .extend_from_slice(&l.conv[(from - l.conv_first) * l.conv_dim..]);
                    snap.k.clear();
                    snap.v.clear();
                    snap.recurrent_history.clear();
                    snap.checkpoints.clear();
                    snap.expanded = None;
                    snap.first = l.first;
                    snap.conv_first = from;
                    snap.conv_dim = l.conv_dim;
                    snap.conv_tail = l.conv_tail;
                    snap.windowed = l.windowed;
                    snap.min_len = start;
                    return snap;
                }
                let keys = |x: &Vec<f32>| if l.windowed { x.clone() } else { Vec::new() };
                l.with_rows(keys(&l.k), keys(&l.v), l.conv.clone())
            })
            .collect();
        self.pinned = Some((start, layers));
    }

    /// Whether an operation feeding `n` positions must [`Sequence::pin`] first to roll back
    /// exactly: when `n` exceeds the rows bounded layers keep beyond what they read
    /// ([`crate::layers::inkling::SLACK`]), and always when a layer holds a recurrent state
    /// (exact only at its length).
    pub(crate) fn needs_pin(&self, n: usize) -> bool {
        n > crate::layers::inkling::SLACK || self.kv.iter().any(|l| !l.recurrent.is_empty())
    }

    /// Whether [`Sequence::pin`] holds a copy.
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// Ends [`Sequence::pin`].
    pub(crate) fn unpin(&mut self) {
        if let Some((_, layers)) = self.pinned.take() {
            self.spare_pin = layers;
        }
    }

    /// Marks which layers' keys and values drop their older rows (`windowed[l]`), as a state
    /// read back from a file does not say.
    pub(crate) fn set_windowed(&mut self, windowed: &[bool]) {
        for (l, &w) in self.kv.iter_mut().zip(windowed) {
            l.windowed = w;
        }
    }

    /// Keeps only the first `len` positions (no effect when `len >= self.len()`). When that
    /// cannot be kept exactly ([`Sequence::can_truncate`]), the sequence goes back to where it
    /// was pinned (a long operation's start, at most `len`), else it is emptied: callers that
    /// continue from `len` check first.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.tokens.len());
        if !self.can_truncate(len) && self.pinned.as_ref().is_some_and(|p| p.0 <= len) {
            // Back to the pinned start, the nearest exact state (a failed pass inside a pinned
            // operation, which then rolls back there itself): the bounded state comes from the
            // copy, the rest (full layers' keys and values) is cut.
            let (len, layers) = self.pinned.take().expect("checked");
            if let Some(m) = self.mtp.as_mut() {
                m.truncate(len, self.tokens.len());
            }
            for ((kv, &dim), snap) in self.kv.iter_mut().zip(&self.kv_dims).zip(layers) {
                let (k, v) = if snap.windowed {
                    (snap.k, snap.v)
                } else {
                    let mut k = std::mem::take(&mut kv.k);
                    let mut v = std::mem::take(&mut kv.v);
                    k.truncate(len.saturating_sub(snap.first) * dim);
                    v.truncate(len.saturating_sub(snap.first) * dim);
                    (k, v)
                };
                let checkpoints = std::mem::take(&mut kv.checkpoints);
                let recurrent = !snap.recurrent.is_empty();
                // Compressed entries are never dropped: the ones of the first `len` positions
                // are still held (the pin copies none).
                let blocks = std::mem::take(&mut kv.blocks);
                *kv = LayerKv {
                    k,
                    v,
                    blocks,
                    ..snap
                };
                kv.cut_blocks(len);
                if recurrent {
                    kv.checkpoints = checkpoints.into_iter().filter(|c| c.len <= len).collect();
                }
            }
            self.tokens.truncate(len);
            self.held_usage.retain(|(pos, _)| *pos < len);
            return;
        }
        let len = if self.can_truncate(len) { len } else { 0 };
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(len, self.tokens.len());
        }
        for (kv, &dim) in self.kv.iter_mut().zip(&self.kv_dims) {
            kv.truncate(len, dim);
        }
        self.tokens.truncate(len);
        self.held_usage.retain(|(pos, _)| *pos < len);
    }

    /// Turns MTP drafting off for this sequence, dropping its MTP state (e.g. a state resumed
    /// from the prefix cache by an engine that does not draft with the MTP layer).
    pub fn disable_mtp(&mut self) {
        self.mtp = None;
    }

    /// Whether MTP drafting is on for this sequence ([`crate::Engine::enable_mtp`]).
    pub fn has_mtp_state(&self) -> bool {
        self.mtp.is_some()
    }

    /// Bytes of KV cache the sequence holds now (f32 keys and values of every layer, the MTP
    /// layer's and the pending MTP hidden states included).
    pub fn kv_bytes(&self) -> u64 {
        let mtp = self.mtp.as_ref().map_or(0, |m| {
            m.kv.k.len() + m.kv.v.len() + m.kv.conv.len() + m.hidden.len()
        });
        let values: usize = mtp
            + self
                .kv
                .iter()
                .map(|l| {
                    l.k.len()
                        + l.v.len()
                        + l.conv.len()
                        + l.blocks.len()
                        + l.recurrent.len()
                        + l.recurrent_history.iter().map(|h| h.1.len()).sum::<usize>()
                        + l.checkpoints
                            .iter()
                            .map(|c| c.recurrent.len() + c.conv.len())
                            .sum::<usize>()
                })
                .sum::<usize>();
        (values * std::mem::size_of::<f32>()) as u64
    }
}
