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
//! **Per-position state.** A layer's cache row holds more than its keys and values: the short
//! convolutions need the last `kernel - 1` inputs of each of the layer's four convolutions. Each
//! row of `LayerKv::k` is `[k (kv_dim) | k before its convolution (kv_dim) | attention output
//! (H)]` and each row of `LayerKv::v` is `[v | v before its convolution | MLP output]`
//! ([`InklingAttention::row_width`]), so truncating, saving and restoring a sequence keep the
//! convolutions' state exact with the keys'.

use crate::cache::ExpertCache;
use crate::error::Result;
use crate::layers::moe::{top_k, Routing};
use crate::layers::{LayerKv, Linear, MoeBlock, RmsNorm, Span};
use coli_format::spec::LogScaling;
use coli_format::MatrixView;
use coli_store::Store;
use rayon::prelude::*;

/// A causal depthwise short convolution with a residual: `channels` channels, `kernel` taps.
pub struct ShortConv {
    /// f32 `[channels, kernel]` (the checkpoint's `[channels, 1, kernel]`).
    pub weight: Vec<f32>,
    /// Channels C.
    pub channels: usize,
    /// Taps K.
    pub kernel: usize,
}

impl ShortConv {
    /// Writes `x` (`[N, C]`, the rows of `spans`) into column `off..off + C` of its sequence's
    /// state rows (`states[i]`, rows of width `width`, which already hold a row for every
    /// position of span `i`), then sets `out` (`[N, C]`) to `x + conv(x)` over each position's
    /// last `kernel` inputs (earlier positions of the sequence read from the state).
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        states: &mut [&mut Vec<f32>],
        width: usize,
        off: usize,
        out: &mut [f32],
    ) {
        let (c, k) = (self.channels, self.kernel);
        let mut r0 = 0;
        for (s, st) in spans.iter().zip(states.iter_mut()) {
            for t in 0..s.n {
                let at = (s.pos0 + t) * width + off;
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
                            acc += wj * st[q * width + off + ch];
                        }
                    }
                    *o = acc + x[row * c + ch];
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

    /// f32 values per position of each of the layer's two state rows (`LayerKv::k` and `v`):
    /// `2 * kv_heads * head_dim + H` (see the module doc).
    pub fn row_width(&self) -> usize {
        2 * self.kvd() + self.hidden
    }

    /// Offset in a state row of the sublayer output slot (attention output in `k` rows, MLP
    /// output in `v` rows) the layer's output convolutions read.
    pub fn output_slot(&self) -> usize {
        2 * self.kvd()
    }

    /// Attention for the rows of `spans` (`x` `[N, H]` normalized hidden states; span `i` at
    /// positions `pos0..pos0+n` of the sequence whose state is `kvs[i]`, holding `pos0`
    /// positions). Appends a state row per position to each `kvs[i]` (output slots zero until
    /// the layer fills them) and writes the o_proj output to `out` (`[N, H]`). Each (row, head)
    /// is one task in a fixed order: results do not depend on the thread count or on the other
    /// spans.
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        let n = Span::rows(spans);
        let (hd, nh, nkv) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let (qd, kvd, w) = (nh * hd, self.kvd(), self.row_width());
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
            debug_assert_eq!(kv.k.len(), s.pos0 * w);
            kv.k.resize((s.pos0 + s.n) * w, 0.0);
            kv.v.resize((s.pos0 + s.n) * w, 0.0);
        }
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        {
            let mut ks: Vec<&mut Vec<f32>> = kvs.iter_mut().map(|kv| &mut kv.k).collect();
            self.k_conv
                .forward_spans(&kraw, spans, &mut ks, w, kvd, &mut k);
        }
        {
            let mut vs: Vec<&mut Vec<f32>> = kvs.iter_mut().map(|kv| &mut kv.v).collect();
            self.v_conv
                .forward_spans(&vraw, spans, &mut vs, w, kvd, &mut v);
        }
        self.q_norm.forward_inplace(&mut q);
        self.k_norm.forward_inplace(&mut k);
        let rows = Span::row_positions(spans);
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            for t in 0..s.n {
                let at = (s.pos0 + t) * w;
                kv.k[at..at + kvd].copy_from_slice(&k[(r0 + t) * kvd..(r0 + t + 1) * kvd]);
                kv.v[at..at + kvd].copy_from_slice(&v[(r0 + t) * kvd..(r0 + t + 1) * kvd]);
            }
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
        let mut ctx = vec![0f32; n * qd];
        ctx.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
            let (r, h) = (i / nh, i % nh);
            let (seq, pos) = rows[r];
            let (keys, values) = (&caches[seq].k, &caches[seq].v);
            let lo = match self.window {
                Some(win) if pos + 1 > win => pos + 1 - win,
                _ => 0,
            };
            let qh = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
            let rh = &rel[(r * nh + h) * dr..(r * nh + h + 1) * dr];
            let kvh = h / group;
            let mut scores: Vec<f32> = (lo..=pos)
                .map(|j| {
                    let s = coli_kernels::dot(qh, &keys[j * w + kvh * hd..j * w + (kvh + 1) * hd])
                        * scale;
                    let d = pos - j;
                    if d < self.extent {
                        let b: f32 = rh
                            .iter()
                            .enumerate()
                            .map(|(m, x)| x * self.rel_proj[m * self.extent + d])
                            .sum();
                        s + b * tau[r]
                    } else {
                        s
                    }
                })
                .collect();
            coli_kernels::softmax_inplace(&mut scores);
            o.fill(0.0);
            for (j, p) in (lo..=pos).zip(&scores) {
                coli_kernels::axpy(*p, &values[j * w + kvh * hd..j * w + (kvh + 1) * hd], o);
            }
        });
        self.o.forward(&ctx, n, out);
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
        self.experts.router.forward(x, n, &mut logits);
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
        };
        let x = [1.0f32, 10.0, 100.0];
        let mut state = vec![0f32; 3 * 2];
        let mut out = vec![0f32; 3];
        conv.forward_spans(&x, &[Span::new(0, 3)], &mut [&mut state], 2, 1, &mut out);
        assert_eq!(
            out,
            vec![1.0 + 4.0, 10.0 + 2.0 + 40.0, 100.0 + 1.0 + 20.0 + 400.0]
        );
        // Decoding position 3 alone reads positions 1 and 2 from the state.
        state.resize(4 * 2, 0.0);
        let mut one = [0f32];
        conv.forward_spans(
            &[7.0],
            &[Span::new(3, 1)],
            &mut [&mut state],
            2,
            1,
            &mut one,
        );
        assert_eq!(one[0], 7.0 + 10.0 + 200.0 + 28.0);
        assert_eq!(state[3 * 2 + 1], 7.0);
        assert_eq!(state[3 * 2], 0.0, "other slots untouched");
    }

    #[test]
    fn logsigmoid_matches_its_definition() {
        for x in [-30.0f32, -2.0, 0.0, 0.5, 20.0] {
            let want = (1.0 / (1.0 + (-x as f64).exp())).ln() as f32;
            assert!((logsigmoid(x) - want).abs() < 1e-6, "{x}");
        }
    }
}
