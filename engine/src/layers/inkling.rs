//! Inkling's layer parts, as transformers 5.23 `modeling_inkling.py` computes them (the math in
//! docs/ARCHITECTURES.md, "inkling"):
//!
//! - [`ShortConv`] (`InklingShortConvolution`): a causal depthwise convolution over the last
//!   `kernel` positions of each channel, plus its input: `y_t = x_t + sum_j w[c, j] x_{t-K+1+j}`
//!   (positions before 0 are zero), in f32.
//! - [`InklingAttention`] (`InklingAttention`): q, k, v, r projections; keys and values through
//!   their short convolutions; per-head RMSNorm of q and k; scores `q.k / head_dim` plus the
//!   relative position bias `r_i . proj[:, i - j]` for `0 <= i - j < extent`; on full layers with
//!   log scaling, q and the bias times `tau(i)`; sliding layers see the last `window` positions;
//!   softmax in f32; `o_proj`.
//! - [`SinkMoe`] (`InklingMoE`): the sigmoid-chosen routed experts and the shared experts,
//!   weighted by one softmax over their `logsigmoid` logits; [`FusedMlp`] (`InklingMLP`).
//!
//! **Per-position state.** Besides its keys and values (`LayerKv::k`, `v`: `kv_dim` f32 per
//! position), a layer keeps the inputs of its four short convolutions (`LayerKv::conv`, one row
//! per position: `[k before its convolution (kv_dim) | v before its convolution (kv_dim) |
//! attention output (H) | MLP output (H)]`, [`InklingAttention::conv_dim`]). Only the last
//! positions are ever read again: a sliding layer's keys and values within its window, every
//! layer's convolution inputs within `kernel - 1`. After appending a pass's rows the layer drops
//! what no later position can read ([`trim`]), keeping [`SLACK`] more positions than the pass's
//! end so that a rollback of up to that many (rejected speculative drafts) stays exact. A
//! longer operation that may roll back to its start (a prefill after cached tokens) keeps a
//! copy of the layers' bounded state at that start ([`crate::Sequence`]'s pin). Full layers
//! keep every key and value.

use crate::cache::ExpertCache;
use crate::error::Result;
use crate::layers::attention::{attend_head_blocks, head_blocks};
use crate::layers::moe::{top_k, Routing};
use crate::layers::{LayerKv, Linear, MoeBlock, RmsNorm, Span};
use coli_format::spec::LogScaling;
use coli_format::MatrixView;
use coli_kernels::attend::{self, KeyValues, Run};
use coli_store::Store;

pub use coli_format::spec::inkling::{KV_SLACK as SLACK, KV_TRIM_CHUNK as TRIM_CHUNK};

/// Drops from `kv`, which holds `end` positions, what no position after `end - SLACK` reads:
/// keys and values before the last `window - 1` positions (sliding layers), the convolution
/// inputs before the last `kernel - 1`; updates `kv.min_len`.
pub fn trim(kv: &mut LayerKv, end: usize, kv_dim: usize, window: Option<usize>, kernel: usize) {
    kv.windowed = window.is_some();
    let base = end.saturating_sub(SLACK);
    if let Some(w) = window {
        let bound = base.saturating_sub(w - 1);
        if bound >= kv.first + TRIM_CHUNK {
            let n = bound - kv.first;
            kv.k.drain(..n * kv_dim);
            // Layers whose keys are their values (DeepSeek-V4) keep no value rows.
            kv.v.drain(..(n * kv_dim).min(kv.v.len()));
            kv.first = bound;
        }
    }
    // A layer without convolution rows (DeepSeek-V4's sliding layers) keeps `conv_first` at 0.
    let bound = base.saturating_sub(kernel - 1);
    if kv.conv_dim > 0 && bound >= kv.conv_first + TRIM_CHUNK {
        kv.conv.drain(..(bound - kv.conv_first) * kv.conv_dim);
        kv.conv_first = bound;
    }
    let keys = match window {
        Some(w) if kv.first > 0 => kv.first + w - 1,
        _ => 0,
    };
    let conv = if kv.conv_first > 0 {
        kv.conv_first + kernel - 1
    } else {
        0
    };
    kv.min_len = keys.max(conv);
}

/// A causal depthwise short convolution with a residual: `channels` channels, `kernel` taps,
/// the sum divided by `divisor` (1 for Inkling; `sqrt(K + 1)` for Inkling 2).
pub struct ShortConv {
    /// f32 `[channels, kernel]` (the checkpoint's `[channels, 1, kernel]`).
    pub weight: Vec<f32>,
    /// Channels C.
    pub channels: usize,
    /// Taps K.
    pub kernel: usize,
    /// What `x + conv(x)` is divided by.
    pub divisor: f32,
}

impl ShortConv {
    /// Writes `x` (`[N, C]`, the rows of `spans`) into columns `off..off + C` of its sequence's
    /// convolution rows (`kvs[i].conv`, which already hold a row for every position of span
    /// `i`), then sets `out` (`[N, C]`) to `(x + conv(x)) / divisor` over each position's last
    /// `kernel` inputs (earlier positions of the sequence read from the state).
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        off: usize,
        out: &mut [f32],
    ) {
        let (c, k) = (self.channels, self.kernel);
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            let (width, first) = (kv.conv_dim, kv.conv_first);
            debug_assert!(s.pos0 + 1 >= first + k || first == 0);
            let st = &mut kv.conv;
            for t in 0..s.n {
                let at = (s.pos0 + t - first) * width + off;
                st[at..at + c].copy_from_slice(&x[(r0 + t) * c..(r0 + t + 1) * c]);
            }
            for t in 0..s.n {
                let p = s.pos0 + t;
                let row = r0 + t;
                let o = &mut out[row * c..(row + 1) * c];
                for (ch, o) in o.iter_mut().enumerate() {
                    let w = &self.weight[ch * k..(ch + 1) * k];
                    let mut acc = 0f32;
                    for (j, wj) in w.iter().enumerate() {
                        // Input position p - (K - 1) + j.
                        if let Some(q) = (p + j + 1).checked_sub(k) {
                            acc += wj * st[(q - first) * width + off + ch];
                        }
                    }
                    *o = (acc + x[row * c + ch]) / self.divisor;
                }
            }
            r0 += s.n;
        }
    }
}

/// One Inkling attention block (see the module doc).
pub struct InklingAttention<'s> {
    /// `attn.wq_du` `[heads * head_dim, H]`.
    pub q: Linear<'s>,
    /// `attn.wk_dv` `[kv_heads * head_dim, H]`.
    pub k: Linear<'s>,
    /// `attn.wv_dv` `[kv_heads * head_dim, H]`.
    pub v: Linear<'s>,
    /// `attn.wr_du` `[heads * d_rel, H]`.
    pub r: Linear<'s>,
    /// `attn.wo_ud` `[H, heads * head_dim]`.
    pub o: Linear<'s>,
    /// `attn.q_norm` `[head_dim]`.
    pub q_norm: RmsNorm,
    /// `attn.k_norm` `[head_dim]`.
    pub k_norm: RmsNorm,
    /// `attn.k_sconv`.
    pub k_conv: ShortConv,
    /// `attn.v_sconv`.
    pub v_conv: ShortConv,
    /// `attn.rel_logits_proj.proj`, f32 `[d_rel, extent]`.
    pub rel_proj: Vec<f32>,
    /// Per-head width of the relative states.
    pub d_rel: usize,
    /// Distances the bias covers (`0..extent`).
    pub extent: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Sliding window (None: full causal attention).
    pub window: Option<usize>,
    /// Full layers' logarithmic logit scaling.
    pub log_scaling: Option<LogScaling>,
    /// Hidden size H (the width of the output slots of a state row).
    pub hidden: usize,
}

impl InklingAttention<'_> {
    /// `num_kv_heads * head_dim`.
    fn kvd(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// f32 values per position of `LayerKv::k` and of `LayerKv::v`: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kvd()
    }

    /// f32 values per position of `LayerKv::conv`: `2 * kv_heads * head_dim + 2 * H` (see the
    /// module doc).
    pub fn conv_dim(&self) -> usize {
        2 * self.kvd() + 2 * self.hidden
    }

    /// Offset in a convolution row of the attention output (`+ H`: the MLP output) the
    /// layer's output convolutions read.
    pub fn output_slot(&self) -> usize {
        2 * self.kvd()
    }

    /// Taps of the layer's short convolutions.
    pub fn kernel(&self) -> usize {
        self.k_conv.kernel
    }

    /// Attention for the rows of `spans` (`x` `[N, H]` normalized hidden states; span `i` at
    /// positions `pos0..pos0+n` of the sequence whose state is `kvs[i]`, holding `pos0`
    /// positions). Appends each position's keys, values and convolution row to `kvs[i]`
    /// (output slots zero until the layer fills them) and writes the o_proj output to `out`
    /// (`[N, H]`); the layer drops old rows afterwards ([`InklingAttention::trim_spans`]). Each (row, head) is one task
    /// in a fixed order: results do not depend on the thread count or on the other spans.
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        let n = Span::rows(spans);
        let (hd, nh, nkv) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let (qd, kvd, cd) = (nh * hd, self.kvd(), self.conv_dim());
        let dr = self.d_rel;
        let mut q = vec![0f32; n * qd];
        let mut kraw = vec![0f32; n * kvd];
        let mut vraw = vec![0f32; n * kvd];
        let mut rel = vec![0f32; n * nh * dr];
        self.q.forward(x, n, &mut q);
        self.k.forward(x, n, &mut kraw);
        self.v.forward(x, n, &mut vraw);
        self.r.forward(x, n, &mut rel);
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            kv.conv_dim = cd;
            debug_assert_eq!(kv.positions(kvd), s.pos0);
            kv.conv.resize((s.pos0 + s.n - kv.conv_first) * cd, 0.0);
        }
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        self.k_conv.forward_spans(&kraw, spans, kvs, 0, &mut k);
        self.v_conv.forward_spans(&vraw, spans, kvs, kvd, &mut v);
        self.q_norm.forward_inplace(&mut q);
        self.k_norm.forward_inplace(&mut k);
        let rows = Span::row_positions(spans);
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            kv.k.extend_from_slice(&k[r0 * kvd..(r0 + s.n) * kvd]);
            kv.v.extend_from_slice(&v[r0 * kvd..(r0 + s.n) * kvd]);
            r0 += s.n;
        }
        // Per query position: tau (1 when not log-scaled).
        let tau: Vec<f32> = rows
            .iter()
            .map(|&(_, p)| self.log_scaling.map_or(1.0, |ls| ls.tau(p)))
            .collect();
        if self.log_scaling.is_some() {
            for (r, qr) in q.chunks_exact_mut(qd).enumerate() {
                for x in qr {
                    *x *= tau[r];
                }
            }
        }
        let scale = 1.0 / hd as f32;
        let group = nh / nkv;
        let caches: Vec<&LayerKv> = kvs.iter().map(|kv| &**kv).collect();
        // Blocked as GQA's (`attention::head_blocks`), the relative bias added per key.
        let blocks = head_blocks(spans, nkv, group);
        let keys = |r: usize, _h: usize| {
            let pos = rows[r].1;
            let lo = match self.window {
                Some(win) if pos + 1 > win => pos + 1 - win,
                _ => 0,
            };
            attend::Row {
                keys: attend::Keys::Range { lo, hi: pos + 1 },
                sink: None,
            }
        };
        let ctx = attend_head_blocks(&blocks, &q, n, nh, hd, keys, |b, queries, rh| BiasedHead {
            inner: b.strided(queries, caches[b.span], kvd, hd, scale),
            rels: rh
                .iter()
                .map(|&(r, h)| &rel[(r * nh + h) * dr..(r * nh + h + 1) * dr])
                .collect(),
            at: rh.iter().map(|&(r, _)| (rows[r].1, tau[r])).collect(),
            rel_proj: &self.rel_proj,
            extent: self.extent,
        });
        self.o.forward(&ctx, n, out);
    }

    /// Drops from each span's state what no position after the pass reads ([`trim`]); run
    /// once the whole layer (both output convolutions too) is done with the pass's rows.
    pub fn trim_spans(&self, spans: &[Span], kvs: &mut [&mut LayerKv]) {
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            trim(kv, s.pos0 + s.n, self.kvd(), self.window, self.kernel());
        }
    }
}

/// Inkling's keys and values of one head for a block of rows: the GQA score `q.k / head_dim`
/// plus, for a key `d < extent` positions back, the relative bias
/// `tau * sum_m rel[m] * rel_proj[m, d]` (the sum in the order of `m`).
pub(crate) struct BiasedHead<'a> {
    pub(crate) inner: attend::StridedHead<'a>,
    /// Each row's relative-position features `[d_rel]`.
    pub(crate) rels: Vec<&'a [f32]>,
    /// Each row's position and tau.
    pub(crate) at: Vec<(usize, f32)>,
    /// `rel_proj` `[d_rel, extent]`.
    pub(crate) rel_proj: &'a [f32],
    pub(crate) extent: usize,
}

impl KeyValues for BiasedHead<'_> {
    fn load_keys(&mut self, lo: usize, hi: usize) {
        self.inner.load_keys(lo, hi);
    }

    fn load_values(&mut self, lo: usize, hi: usize) {
        self.inner.load_values(lo, hi);
    }

    fn scores(&self, row: usize, run: Run<'_>, out: &mut [f32]) {
        self.inner.scores(row, run, out);
        let (pos, tau) = self.at[row];
        let rh = self.rels[row];
        for (s, j) in out.iter_mut().zip(run.positions()) {
            let d = pos - j;
            if d < self.extent {
                let b: f32 = rh
                    .iter()
                    .enumerate()
                    .map(|(m, x)| x * self.rel_proj[m * self.extent + d])
                    .sum();
                *s += b * tau;
            }
        }
    }

    fn accumulate(&self, row: usize, run: Run<'_>, p: &[f32], out: &mut [f32]) {
        self.inner.accumulate(row, run, p, out);
    }
}

/// `y = matmul(m, x)` for `n` rows of `x` (matvec for one row: the same bits per row).
fn product(m: &MatrixView<'_>, x: &[f32], n: usize, y: &mut [f32]) {
    if n == 1 {
        coli_kernels::matvec(m, x, y);
    } else {
        coli_kernels::matmul(m, x, n, y);
    }
}

/// `silu(gate) * up * gamma` of an interleaved gate/up product row (`gu[2i]` gate, `gu[2i+1]`
/// up) into `out` (`[I]`).
fn swiglu_interleaved(gu: &[f32], gamma: f32, out: &mut [f32]) {
    for (o, p) in out.iter_mut().zip(gu.chunks_exact(2)) {
        *o = coli_kernels::silu(p[0]) * p[1] * gamma;
    }
}

/// Inkling's dense MLP: `down(silu(gate x) * up x) * global_scale`, gate/up rows interleaved in
/// one matrix.
pub struct FusedMlp<'s> {
    /// `mlp.w13_dn` `[2I, H]`.
    pub gate_up: Linear<'s>,
    /// `mlp.w2_md` `[H, I]`.
    pub down: Linear<'s>,
    /// `mlp.global_scale`.
    pub scale: f32,
}

impl FusedMlp<'_> {
    /// `y[n, H]` for `x[n, H]`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let i2 = self.gate_up.rows();
        let mut gu = vec![0f32; n * i2];
        product(&self.gate_up.w, x, n, &mut gu);
        let mut a = vec![0f32; n * i2 / 2];
        for (g, o) in gu.chunks_exact(i2).zip(a.chunks_exact_mut(i2 / 2)) {
            swiglu_interleaved(g, 1.0, o);
        }
        product(&self.down.w, &a, n, y);
        for v in y.iter_mut() {
            *v *= self.scale;
        }
    }
}

/// Inkling's MoE block (see the module doc).
pub struct SinkMoe<'s> {
    /// The routed experts (their `router` is `mlp.gate.weight` `[E + S, H]`).
    pub experts: MoeBlock<'s>,
    /// `mlp.gate.bias`, f32 `[E]` (choice only).
    pub bias: Vec<f32>,
    /// `route_scale * mlp.gate.global_scale`.
    pub scale: f32,
    /// Shared experts S.
    pub num_shared: usize,
    /// `shared_w13_weight` as `[S * 2I, H]`.
    pub shared_gate_up: MatrixView<'s>,
    /// `shared_w2_weight` as `[S * H, I]`.
    pub shared_down: MatrixView<'s>,
}

/// `logsigmoid(x)` in f32, as torch (`min(x, 0) - log1p(exp(-|x|))`).
fn logsigmoid(x: f32) -> f32 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

impl SinkMoe<'_> {
    /// Routes `n` tokens of `x` (`[n, H]`): each token's routed experts with their weights, and
    /// the shared experts' weights (`[n * S]`).
    pub fn route(&self, x: &[f32], n: usize) -> (Vec<Routing>, Vec<f32>) {
        let (ne, s) = (self.experts.num_experts, self.num_shared);
        let mut logits = vec![0f32; n * (ne + s)];
        self.experts.router.forward_kept(x, n, &mut logits);
        let mut gammas = Vec::with_capacity(n * s);
        let routes = logits
            .chunks_exact(ne + s)
            .map(|l| {
                let choice: Vec<f32> = l[..ne]
                    .iter()
                    .zip(&self.bias)
                    .map(|(&x, b)| 1.0 / (1.0 + (-x).exp()) + b)
                    .collect();
                let top = top_k(&choice, self.experts.top_k);
                let lp: Vec<f32> = top
                    .iter()
                    .map(|&(e, _)| l[e as usize])
                    .chain(l[ne..].iter().copied())
                    .map(logsigmoid)
                    .collect();
                let max = lp.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let lse = max + lp.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
                let w: Vec<f32> = lp.iter().map(|v| (v - lse).exp() * self.scale).collect();
                gammas.extend_from_slice(&w[top.len()..]);
                top.iter().zip(&w).map(|(&(e, _), &g)| (e, g)).collect()
            })
            .collect();
        (routes, gammas)
    }

    /// `out[n, H]` = routed experts (through the expert cache) + shared experts of `x[n, H]`,
    /// with the routing and shared weights of [`SinkMoe::route`].
    ///
    /// # Errors
    /// A failed expert fetch, or an expert whose shape differs from the config.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_routes(
        &self,
        x: &[f32],
        n: usize,
        routes: &[Routing],
        gammas: &[f32],
        store: &Store,
        cache: &mut ExpertCache,
        out: &mut [f32],
    ) -> Result<()> {
        self.experts
            .forward_routes(x, n, routes, store, cache, out)?;
        let (s, h) = (self.num_shared, self.experts.hidden);
        let i2 = self.shared_gate_up.rows() / s;
        let inter = i2 / 2;
        let mut gu = vec![0f32; n * s * i2];
        product(&self.shared_gate_up, x, n, &mut gu);
        let mut shared = vec![0f32; n * h];
        let mut a = vec![0f32; n * inter];
        let mut y = vec![0f32; n * h];
        for e in 0..s {
            for t in 0..n {
                let row = &gu[(t * s + e) * i2..(t * s + e + 1) * i2];
                swiglu_interleaved(row, gammas[t * s + e], &mut a[t * inter..(t + 1) * inter]);
            }
            let down = self
                .shared_down
                .row_range(e * h, (e + 1) * h)
                .expect("shared_w2 rows of one expert (row-scaled dense encodings)");
            product(&down, &a, n, &mut y);
            for (o, v) in shared.iter_mut().zip(&y) {
                *o += v;
            }
        }
        for (o, v) in out.iter_mut().zip(&shared) {
            *o += v;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_conv_reads_earlier_positions_from_the_state_and_adds_its_input() {
        // 1 channel, 3 taps [1, 2, 4]: y_t = x_t + x_{t-2} + 2 x_{t-1} + 4 x_t.
        let conv = ShortConv {
            weight: vec![1.0, 2.0, 4.0],
            channels: 1,
            kernel: 3,
            divisor: 1.0,
        };
        let x = [1.0f32, 10.0, 100.0];
        let mut kv = LayerKv {
            conv: vec![0f32; 3 * 2],
            conv_dim: 2,
            ..LayerKv::default()
        };
        let mut out = vec![0f32; 3];
        conv.forward_spans(&x, &[Span::new(0, 3)], &mut [&mut kv], 1, &mut out);
        assert_eq!(
            out,
            vec![1.0 + 4.0, 10.0 + 2.0 + 40.0, 100.0 + 1.0 + 20.0 + 400.0]
        );
        // Decoding position 3 alone reads positions 1 and 2 from the state, also when the rows
        // before them were dropped.
        kv.conv.resize(4 * 2, 0.0);
        kv.conv.drain(..2);
        kv.conv_first = 1;
        let mut one = [0f32];
        conv.forward_spans(&[7.0], &[Span::new(3, 1)], &mut [&mut kv], 1, &mut one);
        assert_eq!(one[0], 7.0 + 10.0 + 200.0 + 28.0);
        assert_eq!(kv.conv[2 * 2 + 1], 7.0);
        assert_eq!(kv.conv[2 * 2], 0.0, "other slots untouched");
    }

    #[test]
    fn trim_keeps_what_later_positions_and_rollbacks_read() {
        let (kvd, window, kernel) = (2, 5, 4);
        let n = 400;
        let mut kv = LayerKv {
            k: (0..n * kvd).map(|x| x as f32).collect(),
            v: vec![0f32; n * kvd],
            conv: (0..n).map(|x| x as f32).collect(),
            conv_dim: 1,
            ..LayerKv::default()
        };
        trim(&mut kv, n, kvd, Some(window), kernel);
        // Keys from n - SLACK - (window - 1) on, convolution inputs from n - SLACK - 3.
        assert_eq!(kv.first, n - SLACK - (window - 1));
        assert_eq!(
            kv.k[0],
            (kv.first * kvd) as f32,
            "row j holds position j's values"
        );
        assert_eq!(kv.conv_first, n - SLACK - (kernel - 1));
        assert_eq!(kv.conv[0], kv.conv_first as f32);
        assert_eq!(kv.min_len, n - SLACK);
        assert!(kv.can_truncate(n - SLACK) && !kv.can_truncate(n - SLACK - 1));
        assert!(kv.can_truncate(0));
        // Fewer than TRIM_CHUNK droppable rows: nothing moves.
        let before = (kv.first, kv.k.len());
        trim(&mut kv, n + 1, kvd, Some(window), kernel);
        assert_eq!((kv.first, kv.k.len()), before);
        // Full layers keep every key.
        let mut full = LayerKv {
            k: vec![0f32; n * kvd],
            v: vec![0f32; n * kvd],
            ..LayerKv::default()
        };
        trim(&mut full, n, kvd, None, kernel);
        assert_eq!((full.first, full.k.len()), (0, n * kvd));
    }

    #[test]
    fn logsigmoid_matches_its_definition() {
        for x in [-30.0f32, -2.0, 0.0, 0.5, 20.0] {
            let want = (1.0 / (1.0 + (-x as f64).exp())).ln() as f32;
            assert!((logsigmoid(x) - want).abs() < 1e-6, "{x}");
        }
    }
}
