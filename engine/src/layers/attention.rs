//! Causal grouped-query self-attention with RoPE and an f32 KV cache, as transformers'
//! `eager_attention_forward`: `softmax(q k^T * head_dim^-0.5 + mask) v`, softmax in f32.

use crate::layers::{Linear, RmsNorm, Rope, Span};
use coli_kernels::attend;
use rayon::prelude::*;

/// Optional RMSNorm of the projected queries and keys (before RoPE).
pub enum QkNorm {
    /// Mixtral: none.
    None,
    /// Qwen3-MoE: one RMSNorm over each head (`head_dim` values), same weight for every head.
    PerHead {
        /// `self_attn.q_norm.weight` `[head_dim]`.
        q: RmsNorm,
        /// `self_attn.k_norm.weight` `[head_dim]`.
        k: RmsNorm,
    },
    /// OLMoE: one RMSNorm over the whole projected q (`num_heads * head_dim`) and k
    /// (`num_kv_heads * head_dim`) vectors.
    Full {
        /// `self_attn.q_norm.weight`.
        q: RmsNorm,
        /// `self_attn.k_norm.weight`.
        k: RmsNorm,
    },
}

/// The KV cache of one layer: f32 keys and values after RoPE, `[positions, kv_heads * head_dim]`.
///
/// A layer that needs only its last positions (Inkling: a sliding-window layer's keys and
/// values, every layer's short-convolution inputs) drops older rows as it goes
/// ([`crate::layers::inkling`]): `k`/`v` then hold positions `first..` and `conv` positions
/// `conv_first..`, and the state can be truncated exactly to any length from
/// [`LayerKv::min_len`] on (or to 0). Every other layer keeps every position (`first` 0, `conv`
/// empty).
#[derive(Clone, Default)]
pub struct LayerKv {
    /// Keys, row-major by position, from position `first`.
    pub k: Vec<f32>,
    /// Values, row-major by position, from position `first`.
    pub v: Vec<f32>,
    /// MLA only, during a layer-major prefill ([`crate::Engine::forward`]): the `kv_b`
    /// expansion of the positions cached so far (`[positions, heads, nope + v]` f32), so that
    /// each chunk of the prompt expands only its own rows instead of the whole cache. None
    /// otherwise; never part of the sequence's state (dropped when the layer's chunks end).
    pub expanded: Option<Vec<f32>>,
    /// Position of the first row of `k` and `v` (0 unless older rows were dropped).
    pub first: usize,
    /// Inkling: the inputs of the layer's short convolutions, `conv_dim` f32 per position from
    /// position `conv_first` ([`crate::layers::inkling`]); empty for other layers.
    pub conv: Vec<f32>,
    /// Position of the first row of `conv`.
    pub conv_first: usize,
    /// f32 values per position of `conv` (0: no convolution state).
    pub conv_dim: usize,
    /// The shortest length (other than 0) the state can be truncated to exactly: the rows a
    /// later position reads must still be held (0 while nothing was dropped).
    pub min_len: usize,
    /// Whether `k`/`v` drop their older rows (an Inkling sliding-window layer); full layers
    /// keep every key and value.
    pub windowed: bool,
    /// A recurrent layer's fixed-size state after its last position (a Gated DeltaNet's
    /// `[Hv, dk, dv]`, [`crate::layers::gated_delta`]); empty for other layers and before the
    /// first position. Exact only at the state's length (`min_len` says so), or at the
    /// lengths `recurrent_history` holds.
    pub recurrent: Vec<f32>,
    /// A recurrent layer after a verification pass (`Span::as_decode` rows): its state at
    /// each length from the pass's start to its last row but one, `(length, state)`, so that
    /// rolling back rejected drafts is exact ([`LayerKv::truncate`]). Dropped by the next
    /// pass or truncation.
    pub recurrent_history: Vec<(usize, Vec<f32>)>,
    /// A recurrent layer's checkpoints: its exact state at earlier lengths (pass ends,
    /// [`crate::layers::gated_delta`] says which), oldest first, so that a fork, an edited
    /// prompt or a rollback resumes there instead of from the start.
    pub checkpoints: Vec<RecurrentCheckpoint>,
    /// A recurrent layer's convolution rows the next position reads (`K - 1`; 0 elsewhere).
    pub conv_tail: usize,
    /// DeepSeek-V4's compressed layers ([`crate::layers::deepseek_v4`]): one row of
    /// `block_dim` f32 per closed block of `block_rate` positions, from block 0. Never
    /// dropped; cut with the positions (a length `len` keeps `len / block_rate` rows).
    pub blocks: Vec<f32>,
    /// f32 values per row of `blocks` (0: none).
    pub block_dim: usize,
    /// Positions per row of `blocks` (0: none).
    pub block_rate: usize,
}

/// A recurrent layer's exact state at one length ([`LayerKv::checkpoints`]).
#[derive(Clone, Debug, Default)]
pub struct RecurrentCheckpoint {
    /// Positions the state covers.
    pub len: usize,
    /// `LayerKv::recurrent` at that length.
    pub recurrent: Vec<f32>,
    /// The convolution inputs the next position reads: rows from `conv_from` to `len`.
    pub conv: Vec<f32>,
    /// Position of the first row of `conv`.
    pub conv_from: usize,
}

impl LayerKv {
    /// Drops every position from `len` on (row width `kv_dim` for `k` and `v`). A `len` below
    /// [`LayerKv::min_len`] (other than 0) cannot be kept exactly: the caller checks
    /// [`LayerKv::can_truncate`] first ([`crate::Sequence::truncate`] empties the sequence
    /// instead).
    pub fn truncate(&mut self, len: usize, kv_dim: usize) {
        if len == 0 {
            *self = self.emptied();
            return;
        }
        debug_assert!(self.can_truncate(len), "truncate below min_len");
        if !self.recurrent.is_empty() {
            let held = self.recurrent_held();
            if len < held {
                if let Some((_, st)) = self.recurrent_history.iter().find(|(l, _)| *l == len) {
                    // A verification row's state (its convolution rows are still held).
                    self.recurrent = st.clone();
                } else if let Some(c) = self.checkpoints.iter().find(|c| c.len == len) {
                    // Back to a checkpoint: its state and the convolution inputs it reads;
                    // rows the layer dropped since come from the checkpoint's copy.
                    self.recurrent = c.recurrent.clone();
                    if self.conv_first > c.conv_from {
                        self.conv = c.conv.clone();
                        self.conv_first = c.conv_from;
                    }
                }
            }
            // The states of shorter lengths stay valid: the positions before `len` are kept.
            self.checkpoints.retain(|c| c.len <= len);
            self.recurrent_history.retain(|(l, _)| *l < len);
            self.min_len = self
                .recurrent_history
                .first()
                .map_or(len.min(held), |(l, _)| *l);
        }
        self.k.truncate(len.saturating_sub(self.first) * kv_dim);
        self.v.truncate(len.saturating_sub(self.first) * kv_dim);
        self.conv
            .truncate(len.saturating_sub(self.conv_first) * self.conv_dim);
        self.cut_blocks(len);
        self.expanded = None;
    }

    /// Keeps the `blocks` rows of the blocks closed within the first `len` positions.
    pub fn cut_blocks(&mut self, len: usize) {
        if let Some(rows) = len.checked_div(self.block_rate) {
            self.blocks.truncate(rows * self.block_dim);
        }
    }

    /// Positions a recurrent layer's state covers (its convolution rows end there; the
    /// recurrent state is the state after the last of them).
    pub fn recurrent_held(&self) -> usize {
        self.conv_first + self.conv.len() / self.conv_dim.max(1)
    }

    /// An empty state of the same shape (no rows, nothing dropped).
    pub fn emptied(&self) -> LayerKv {
        LayerKv {
            conv_dim: self.conv_dim,
            windowed: self.windowed,
            block_dim: self.block_dim,
            block_rate: self.block_rate,
            ..LayerKv::default()
        }
    }

    /// The same layer's state with rows `k`, `v`, `conv` (its row starts, `min_len`, shape
    /// and recurrent state kept; no MLA expansion, no verification history, no checkpoints, no
    /// compressed `blocks`: the caller copies the ones it keeps).
    pub fn with_rows(&self, k: Vec<f32>, v: Vec<f32>, conv: Vec<f32>) -> LayerKv {
        LayerKv {
            k,
            v,
            conv,
            expanded: None,
            first: self.first,
            conv_first: self.conv_first,
            conv_dim: self.conv_dim,
            min_len: self.min_len,
            windowed: self.windowed,
            recurrent: self.recurrent.clone(),
            recurrent_history: Vec::new(),
            checkpoints: Vec::new(),
            conv_tail: self.conv_tail,
            blocks: Vec::new(),
            block_dim: self.block_dim,
            block_rate: self.block_rate,
        }
    }

    /// Whether [`LayerKv::truncate`] to `len` keeps the state exact. A recurrent state is
    /// exact at the lengths it holds a state for: its own length (and beyond: nothing to cut),
    /// a verification row's, a checkpoint's; whatever `min_len` says (it may lag behind a
    /// pass that failed midway).
    pub fn can_truncate(&self, len: usize) -> bool {
        if len == 0 || self.checkpoints.iter().any(|c| c.len == len) {
            return true;
        }
        if !self.recurrent.is_empty() {
            return len >= self.recurrent_held()
                || self.recurrent_history.iter().any(|(l, _)| *l == len);
        }
        len >= self.min_len
    }

    /// Positions held: `first` plus the rows of `k` (row width `kv_dim`).
    pub fn positions(&self, kv_dim: usize) -> usize {
        self.first + self.k.len() / kv_dim.max(1)
    }
}

/// One attention block.
pub struct Attention<'s> {
    /// `q_proj` `[num_heads * head_dim, hidden]`.
    pub q: Linear<'s>,
    /// `k_proj` `[num_kv_heads * head_dim, hidden]`.
    pub k: Linear<'s>,
    /// `v_proj` `[num_kv_heads * head_dim, hidden]`.
    pub v: Linear<'s>,
    /// `o_proj` `[hidden, num_heads * head_dim]`.
    pub o: Linear<'s>,
    /// q/k normalization.
    pub qk_norm: QkNorm,
    /// OLMoE `clip_qkv`: clamp q, k, v (after the norms) to `[-c, c]`.
    pub clip_qkv: Option<f32>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Sliding window in tokens (None: full causal).
    pub window: Option<usize>,
    /// gpt-oss attention sinks, one logit per query head (`self_attn.sinks`, f32
    /// `[num_heads]`): each head's softmax runs over its key scores plus this logit, whose
    /// probability is dropped (`eager_attention_forward` of `modeling_gpt_oss.py`).
    pub sinks: Option<Vec<f32>>,
    /// Qwen3-Next's output gate: `q` projects to `[2 * num_heads * head_dim]`, each head's
    /// query followed by its gate, and the attention output is multiplied by `sigmoid(gate)`
    /// before `o` (`Qwen3NextAttention`).
    pub output_gate: bool,
}

/// Query rows per attention block: a block's tokens times the query heads of one KV head
/// (about this many rows share each tile of keys and values it reads).
pub const BLOCK_ROWS: usize = 32;

/// One block of [`Attention::forward_spans`]: rows `tokens` of the pass (all of span `span`)
/// with the query heads of KV head `kv_head`.
pub struct HeadBlock {
    /// The span (sequence) the tokens belong to.
    pub span: usize,
    /// The KV head.
    pub kv_head: usize,
    /// The query heads that read it.
    pub heads: std::ops::Range<usize>,
    /// Rows of the pass (consecutive tokens of the span).
    pub tokens: std::ops::Range<usize>,
}

/// The blocks of a pass over `spans` with `kv_heads` KV heads of `group` query heads each:
/// per span and KV head, its tokens in tiles of `max(1, BLOCK_ROWS / group)`.
pub fn head_blocks(spans: &[Span], kv_heads: usize, group: usize) -> Vec<HeadBlock> {
    let tile = (BLOCK_ROWS / group.max(1)).max(1);
    let mut blocks = Vec::new();
    let mut r0 = 0;
    for (span, s) in spans.iter().enumerate() {
        for kv_head in 0..kv_heads {
            let mut t = 0;
            while t < s.n {
                let m = tile.min(s.n - t);
                blocks.push(HeadBlock {
                    span,
                    kv_head,
                    heads: kv_head * group..(kv_head + 1) * group,
                    tokens: r0 + t..r0 + t + m,
                });
                t += m;
            }
        }
        r0 += s.n;
    }
    blocks
}

impl HeadBlock {
    /// Its KV head of `cache` (rows of `kv_dim` f32, heads of `head_dim`) for `queries`, scores
    /// `q.k * scale`.
    pub fn strided<'a>(
        &self,
        queries: Vec<&'a [f32]>,
        cache: &'a LayerKv,
        kv_dim: usize,
        head_dim: usize,
        scale: f32,
    ) -> attend::StridedHead<'a> {
        let off = self.kv_head * head_dim;
        attend::StridedHead::new(
            queries,
            &cache.k,
            &cache.v,
            kv_dim,
            off,
            off,
            head_dim,
            cache.first,
            scale,
        )
    }
}

/// The attention output `[n, heads * head_dim]` of a pass's `blocks` ([`head_blocks`]), run in
/// parallel: block `b`'s rows are its tokens times the query heads of its KV head (query `h`
/// of token `r` is `q[r, h]`, `head_dim` f32), row `(r, h)` attends as `row(r, h)` says, and
/// `source(b, queries, rows)` gives the block's keys and values (`rows`: each row's `(r, h)`).
pub fn attend_head_blocks<'a, K: attend::KeyValues>(
    blocks: &[HeadBlock],
    q: &'a [f32],
    n: usize,
    heads: usize,
    head_dim: usize,
    row: impl Fn(usize, usize) -> attend::Row<'static> + Sync,
    source: impl Fn(&HeadBlock, Vec<&'a [f32]>, &[(usize, usize)]) -> K + Sync,
) -> Vec<f32> {
    let (hd, qd) = (head_dim, heads * head_dim);
    let outs: Vec<Vec<f32>> = blocks
        .par_iter()
        .map(|b| {
            let rows_of = b.tokens.len() * b.heads.len();
            let (mut queries, mut spec, mut rh) = (
                Vec::with_capacity(rows_of),
                Vec::with_capacity(rows_of),
                Vec::with_capacity(rows_of),
            );
            for r in b.tokens.clone() {
                for h in b.heads.clone() {
                    queries.push(&q[r * qd + h * hd..r * qd + (h + 1) * hd]);
                    spec.push(row(r, h));
                    rh.push((r, h));
                }
            }
            let mut kv = source(b, queries, &rh);
            let mut o = vec![0f32; spec.len() * hd];
            attend::attend_block(&mut kv, &spec, hd, &mut o);
            o
        })
        .collect();
    let mut ctx = vec![0f32; n * qd];
    for (b, o) in blocks.iter().zip(&outs) {
        let width = b.heads.len() * hd;
        for (r, o) in b.tokens.clone().zip(o.chunks_exact(width)) {
            let at = r * qd + b.heads.start * hd;
            ctx[at..at + width].copy_from_slice(o);
        }
    }
    ctx
}

impl Attention<'_> {
    /// Width of one KV cache row, `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Attention for `n` tokens at positions `pos0..pos0+n` whose normalized hidden states are
    /// `x` (`[n, hidden]`): appends their keys/values to `kv` (which must hold exactly `pos0`
    /// positions) and writes the o_proj output to `out` (`[n, hidden]`). One span of
    /// [`Attention::forward_spans`].
    pub fn forward(
        &self,
        x: &[f32],
        n: usize,
        pos0: usize,
        rope: &Rope,
        kv: &mut LayerKv,
        out: &mut [f32],
    ) {
        self.forward_spans(x, &[Span::new(pos0, n)], rope, &mut [kv], out);
    }

    /// Attention for several sequences in one pass: `x` (`[N, hidden]`, N = the spans' rows)
    /// holds the rows of `spans[0]`, then those of `spans[1]`, ...; span `i` is `n` tokens at
    /// positions `pos0..pos0+n` of the sequence whose KV cache is `kvs[i]` (holding exactly
    /// `pos0` positions; its keys/values are appended). The q/k/v/o projections run once over
    /// all N rows (row `r` of a matmul is bit-identical to the matvec of that row), RoPE and
    /// the softmax over keys run per row against its own sequence's cache, so each row's output
    /// (`out`, `[N, hidden]`) is bit-identical to running its sequence alone.
    ///
    /// Attention runs in blocks ([`head_blocks`], [`coli_kernels::attend::attend_block`]): each
    /// (row, head) output has the bits of the per-row form in a fixed order, so results depend
    /// neither on the number of threads nor on the blocks.
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        rope: &Rope,
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        debug_assert_eq!(spans.len(), kvs.len());
        let n = Span::rows(spans);
        let (hd, nh, nkv) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut gate = Vec::new();
        if self.output_gate {
            let mut qg = vec![0f32; n * 2 * qd];
            self.q.forward(x, n, &mut qg);
            gate = vec![0f32; n * qd];
            for (r, row) in qg.chunks_exact(2 * hd).enumerate() {
                q[r * hd..(r + 1) * hd].copy_from_slice(&row[..hd]);
                gate[r * hd..(r + 1) * hd].copy_from_slice(&row[hd..]);
            }
        } else {
            self.q.forward(x, n, &mut q);
        }
        self.k.forward(x, n, &mut k);
        self.v.forward(x, n, &mut v);
        match &self.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead { q: qn, k: kn } | QkNorm::Full { q: qn, k: kn } => {
                qn.forward_inplace(&mut q);
                kn.forward_inplace(&mut k);
            }
        }
        if let Some(c) = self.clip_qkv {
            for t in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *t = t.clamp(-c, c);
            }
        }
        let rows = Span::row_positions(spans);
        for (r, &(_, pos)) in rows.iter().enumerate() {
            // The rope's tables cover its rotary dimensions (`2 * cos.len()`): every head
            // dimension, or the leading part of each head under a partial rotary factor
            // (GLM-4.5), the rest passing through as `apply_rotary_pos_emb` leaves it.
            let (cos, sin) = rope.tables(pos);
            let rd = 2 * cos.len();
            for h in q[r * qd..(r + 1) * qd].chunks_exact_mut(hd) {
                Rope::apply(&mut h[..rd], &cos, &sin);
            }
            for h in k[r * kvd..(r + 1) * kvd].chunks_exact_mut(hd) {
                Rope::apply(&mut h[..rd], &cos, &sin);
            }
        }
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            debug_assert_eq!(kv.k.len(), s.pos0 * kvd);
            kv.k.extend_from_slice(&k[r0 * kvd..(r0 + s.n) * kvd]);
            kv.v.extend_from_slice(&v[r0 * kvd..(r0 + s.n) * kvd]);
            r0 += s.n;
        }

        let scale = (hd as f64).powf(-0.5) as f32;
        let group = nh / nkv;
        let window = self.window;
        let caches: Vec<&LayerKv> = kvs.iter().map(|kv| &**kv).collect();
        // Blocked attention (coli_kernels::attend): one block per (span, KV head, tile of
        // tokens), its rows the tile's tokens times the query heads sharing that KV head, so
        // a tile of keys and values is read once per block. Each row's bits are the per-row
        // form's, whatever the blocks.
        let blocks = head_blocks(spans, nkv, group);
        let keys = |r: usize, h: usize| {
            let pos = rows[r].1;
            let lo = match window {
                Some(w) if pos + 1 > w => pos + 1 - w,
                _ => 0,
            };
            attend::Row {
                keys: attend::Keys::Range { lo, hi: pos + 1 },
                sink: self.sinks.as_ref().map(|s| s[h]),
            }
        };
        let mut ctx = attend_head_blocks(&blocks, &q, n, nh, hd, keys, |b, queries, _| {
            b.strided(queries, caches[b.span], kvd, hd, scale)
        });
        for (c, &g) in ctx.iter_mut().zip(&gate) {
            *c *= 1.0 / (1.0 + (-g).exp());
        }
        self.o.forward(&ctx, n, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coli_format::{Encoding, MatrixView};

    /// f32 bytes of a [rows, cols] matrix with ones on the diagonal.
    fn eye(rows: usize, cols: usize) -> Vec<u8> {
        (0..rows * cols)
            .flat_map(|i| if i / cols == i % cols { 1f32 } else { 0f32 }.to_le_bytes())
            .collect()
    }

    fn linear(bytes: &[u8], rows: usize, cols: usize) -> Linear<'_> {
        let w = MatrixView::new(Encoding::F32, rows, cols, bytes, &[]).unwrap();
        Linear {
            name: "identity".into(),
            w,
            bias: None,
        }
    }

    fn run(window: Option<usize>, x: &[f32]) -> Vec<f32> {
        run_with(window, None, x)
    }

    fn run_with(window: Option<usize>, sinks: Option<Vec<f32>>, x: &[f32]) -> Vec<f32> {
        let (sq, kv2) = (eye(4, 4), eye(2, 4));
        let attn = Attention {
            q: linear(&sq, 4, 4),
            k: linear(&kv2, 2, 4),
            v: linear(&kv2, 2, 4),
            o: linear(&sq, 4, 4),
            qk_norm: QkNorm::None,
            clip_qkv: None,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 2,
            window,
            sinks,
            output_gate: false,
        };
        let rope = Rope::new(2, 10_000.0);
        let n = x.len() / 4;
        let mut kv = LayerKv::default();
        let mut out = vec![0f32; x.len()];
        attn.forward(x, n, 0, &rope, &mut kv, &mut out);
        assert_eq!(kv.k.len(), n * 2);
        out
    }

    #[test]
    fn window_of_one_sees_only_itself_and_gqa_shares_the_kv_head() {
        let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin()).collect();
        let out = run(Some(1), &x);
        for t in 0..3 {
            // Both query heads read kv head 0 (the first 2 features): v_t.
            for h in 0..2 {
                for d in 0..2 {
                    assert!((out[t * 4 + h * 2 + d] - x[t * 4 + d]).abs() < 1e-6);
                }
            }
        }
        let full = run(None, &x);
        assert_eq!(
            &full[..4],
            &out[..4],
            "the first position sees only itself either way"
        );
        assert!(
            (full[8] - out[8]).abs() > 1e-4,
            "without a window position 2 mixes earlier values"
        );
    }

    #[test]
    fn sinks_take_probability_mass_and_add_no_value() {
        // One token: its only key gets p = e^s / (e^s + e^sink) with s = q.k / sqrt(2) and the
        // value is scaled by p (the sink carries no value); head 1's sink is -inf (no effect).
        let x = [0.5f32, -1.0, 2.0, 0.25];
        let plain = run(None, &x);
        let sunk = run_with(None, Some(vec![0.7, f32::NEG_INFINITY]), &x);
        // Head 0 sees q = (x0, x1), k = v = (x0, x1) (kv head 0 = first 2 dims).
        let s = (x[0] * x[0] + x[1] * x[1]) / 2f32.sqrt();
        let p = s.exp() / (s.exp() + 0.7f32.exp());
        for c in 0..2 {
            assert!(
                (sunk[c] - plain[c] * p).abs() < 1e-6,
                "{c}: {} vs {}",
                sunk[c],
                plain[c] * p
            );
        }
        assert_eq!(sunk[2..], plain[2..]);
    }
}
