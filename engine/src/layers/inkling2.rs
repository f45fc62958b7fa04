//! Inkling 2's attention, as transformers 5.25 `modeling_inkling2.py` computes it
//! (`Inkling2SlidingAttention`, `Inkling2FullAttention`; the math in docs/ARCHITECTURES.md,
//! "inkling2"). For `n` rows with query input `xq` and key/value inputs `xk`, `xv` (the same
//! rows on sliding layers; three attention-residual mixes on full layers), all normalized:
//!
//! - `q = clip(wq_du(xq) * q_scale, qk_clip)` per head, times `tau(i)` on full layers, where
//!   `clip(x, c) = x * min(c / (|x| + 1e-6), 1)` (`Inkling2ScaledL2Clip`, `Inkling2LogScale`);
//! - `k = clip(conv_k(wk_dv(xk)), qk_clip)`, `v = rmsnorm(conv_v(wv_dv(xv)))` per head (no
//!   weight, `rms_norm_eps`); sliding layers' convolutions are [`ShortConv`]s ending in
//!   `/ sqrt(K + 1)`, full layers' are [`DynamicConv`]s whose taps add per-token, per-head taps
//!   `weight_proj(x)` to `static_w`, ending in `/ sqrt(2K + 1)`;
//! - relative states `r = clip(wr_du(xq) * rel_scale, rel_clip)` (times `tau(i)` on full layers),
//!   the bias of a key `d < extent` positions back `r . rel_proj[:, d]`;
//! - scores `q.k / sqrt(head_dim) + bias`, a sink logit `attn_sink_proj(xq)` per row and head in
//!   the softmax's denominator, the output gated `* sigmoid(gate_attn(xq))`, then `wo_ud`.
//!
//! The per-position state is Inkling's ([`crate::layers::inkling`]): keys and values (after
//! convolution and normalization) and the four convolutions' inputs per position, trimmed the
//! same way.

use crate::layers::attention::{attend_head_blocks, head_blocks};
use crate::layers::inkling::{trim, BiasedHead, ShortConv};
use crate::layers::{LayerKv, Linear, Span};
use coli_format::spec::LogScaling;
use coli_kernels::attend;

/// A full layer's key or value convolution (`Inkling2DynamicShortConvolution`).
pub struct DynamicConv<'s> {
    /// `static_w`, f32 `[kernel, channels]` (row `lag` weights the input `lag` positions back).
    pub static_w: Vec<f32>,
    /// `weight_proj` `[heads * kernel, H]`: per-token taps of each head.
    pub proj: Linear<'s>,
    /// Heads sharing one set of per-token taps.
    pub heads: usize,
    /// Channels C (`heads * head_dim`).
    pub channels: usize,
    /// Taps K.
    pub kernel: usize,
}

impl DynamicConv<'_> {
    /// As [`ShortConv::forward_spans`], with the taps
    /// `static_w[lag, c] + proj(input)[head(c) * K + lag]` of each row and the sum divided by
    /// `sqrt(2K + 1)`; `input` (`[N, H]`) is the layer's normalized key (value) input.
    pub fn forward_spans(
        &self,
        x: &[f32],
        input: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        off: usize,
        out: &mut [f32],
    ) {
        let (c, k) = (self.channels, self.kernel);
        let n = Span::rows(spans);
        let mut dynamic = vec![0f32; n * self.heads * k];
        self.proj.forward(input, n, &mut dynamic);
        let divisor = ((2 * k + 1) as f32).sqrt();
        let per_head = c / self.heads;
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            let (width, first) = (kv.conv_dim, kv.conv_first);
            let st = &mut kv.conv;
            for t in 0..s.n {
                let at = (s.pos0 + t - first) * width + off;
                st[at..at + c].copy_from_slice(&x[(r0 + t) * c..(r0 + t + 1) * c]);
            }
            for t in 0..s.n {
                let (p, row) = (s.pos0 + t, r0 + t);
                let dy = &dynamic[row * self.heads * k..(row + 1) * self.heads * k];
                for ch in 0..c {
                    let taps = &dy[(ch / per_head) * k..(ch / per_head + 1) * k];
                    let mut acc = 0f32;
                    for (lag, d) in taps.iter().enumerate() {
                        if let Some(q) = p.checked_sub(lag) {
                            let w = self.static_w[lag * c + ch] + d;
                            acc += st[(q - first) * width + off + ch] * w;
                        }
                    }
                    out[row * c + ch] = (acc + x[row * c + ch]) / divisor;
                }
            }
            r0 += s.n;
        }
    }
}

/// A key or value convolution.
pub enum KvConv<'s> {
    /// Sliding layers.
    Static(ShortConv),
    /// Full layers.
    Dynamic(DynamicConv<'s>),
}

impl KvConv<'_> {
    fn kernel(&self) -> usize {
        match self {
            KvConv::Static(c) => c.kernel,
            KvConv::Dynamic(c) => c.kernel,
        }
    }

    fn forward_spans(
        &self,
        x: &[f32],
        input: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        off: usize,
        out: &mut [f32],
    ) {
        match self {
            KvConv::Static(c) => c.forward_spans(x, spans, kvs, off, out),
            KvConv::Dynamic(c) => c.forward_spans(x, input, spans, kvs, off, out),
        }
    }
}

/// `x * min(c / (|x| + 1e-6), 1)` for each `d`-long row of `x` (`|x|` the L2 norm, summed in
/// f64 and rounded to f32).
fn clip_rows(x: &mut [f32], d: usize, c: f32) {
    for r in x.chunks_exact_mut(d) {
        let norm = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
        let f = (c / (norm + 1e-6)).min(1.0);
        for v in r {
            *v *= f;
        }
    }
}

/// Each row of `x` (`[rows, d]`) times `scale` (`[heads * d]`, repeating every `heads` rows).
fn scale_heads(x: &mut [f32], scale: &[f32]) {
    for r in x.chunks_exact_mut(scale.len()) {
        for (v, s) in r.iter_mut().zip(scale) {
            *v *= s;
        }
    }
}

/// One Inkling 2 attention block (see the module doc).
pub struct Inkling2Attention<'s> {
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
    /// `attn.gate_attn` `[heads * head_dim, H]`.
    pub gate: Linear<'s>,
    /// `attn.attn_sink_proj` `[heads, H]`.
    pub sink: Linear<'s>,
    /// `attn.q_l2_clip.scale`, f32 `[heads * head_dim]`.
    pub q_scale: Vec<f32>,
    /// `attn.rel_l2_clip.scale`, f32 `[heads * d_rel]`.
    pub rel_scale: Vec<f32>,
    /// The key convolution.
    pub k_conv: KvConv<'s>,
    /// The value convolution.
    pub v_conv: KvConv<'s>,
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
    /// Sliding window (None: a full layer).
    pub window: Option<usize>,
    /// Full layers' logarithmic scaling of queries and relative states.
    pub log_scaling: Option<LogScaling>,
    /// `qk_l2_clip_threshold`.
    pub qk_clip: f32,
    /// `rel_l2_clip_threshold`.
    pub rel_clip: f32,
    /// The values' RMSNorm epsilon (`rms_norm_eps`).
    pub eps: f32,
    /// Hidden size H.
    pub hidden: usize,
}

impl Inkling2Attention<'_> {
    /// `num_kv_heads * head_dim`: f32 values per position of `LayerKv::k` and `LayerKv::v`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// f32 values per position of `LayerKv::conv`: `2 * kv_dim + 2 * H` (Inkling's layout).
    pub fn conv_dim(&self) -> usize {
        2 * self.kv_dim() + 2 * self.hidden
    }

    /// Offset in a convolution row of the attention output (`+ H`: the MLP output).
    pub fn output_slot(&self) -> usize {
        2 * self.kv_dim()
    }

    /// Taps of the layer's short convolutions.
    pub fn kernel(&self) -> usize {
        self.k_conv.kernel()
    }

    /// Attention for the rows of `spans` (see the module doc): `xq`, `xk`, `xv` `[N, H]`, span
    /// `i` at positions `pos0..pos0+n` of the sequence whose state is `kvs[i]`. Appends each
    /// position's keys, values and convolution row (output slots zero until the layer fills
    /// them) and writes the `wo_ud` output to `out` (`[N, H]`). Each (row, head) is one task
    /// in a fixed order: results depend neither on the thread count nor on the other spans.
    pub fn forward_spans(
        &self,
        [xq, xk, xv]: [&[f32]; 3],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        let n = Span::rows(spans);
        let (hd, nh, nkv, dr) = (self.head_dim, self.num_heads, self.num_kv_heads, self.d_rel);
        let (qd, kvd, cd) = (nh * hd, self.kv_dim(), self.conv_dim());
        let mut q = vec![0f32; n * qd];
        let mut kraw = vec![0f32; n * kvd];
        let mut vraw = vec![0f32; n * kvd];
        let mut rel = vec![0f32; n * nh * dr];
        let mut sinks = vec![0f32; n * nh];
        let mut gate = vec![0f32; n * qd];
        self.q.forward(xq, n, &mut q);
        self.k.forward(xk, n, &mut kraw);
        self.v.forward(xv, n, &mut vraw);
        self.r.forward(xq, n, &mut rel);
        self.sink.forward(xq, n, &mut sinks);
        self.gate.forward(xq, n, &mut gate);
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            kv.conv_dim = cd;
            debug_assert_eq!(kv.positions(kvd), s.pos0);
            kv.conv.resize((s.pos0 + s.n - kv.conv_first) * cd, 0.0);
        }
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        self.k_conv.forward_spans(&kraw, xk, spans, kvs, 0, &mut k);
        self.v_conv
            .forward_spans(&vraw, xv, spans, kvs, kvd, &mut v);
        scale_heads(&mut q, &self.q_scale);
        clip_rows(&mut q, hd, self.qk_clip);
        clip_rows(&mut k, hd, self.qk_clip);
        let unit = crate::layers::RmsNorm {
            weight: vec![1.0; hd],
            eps: self.eps,
        };
        unit.forward_inplace(&mut v);
        scale_heads(&mut rel, &self.rel_scale);
        clip_rows(&mut rel, dr, self.rel_clip);
        let rows = Span::row_positions(spans);
        if let Some(ls) = self.log_scaling {
            for (r, &(_, p)) in rows.iter().enumerate() {
                let tau = ls.tau(p);
                for x in &mut q[r * qd..(r + 1) * qd] {
                    *x *= tau;
                }
                for x in &mut rel[r * nh * dr..(r + 1) * nh * dr] {
                    *x *= tau;
                }
            }
        }
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            kv.k.extend_from_slice(&k[r0 * kvd..(r0 + s.n) * kvd]);
            kv.v.extend_from_slice(&v[r0 * kvd..(r0 + s.n) * kvd]);
            r0 += s.n;
        }
        let scale = (hd as f32).powf(-0.5);
        let caches: Vec<&LayerKv> = kvs.iter().map(|kv| &**kv).collect();
        let blocks = head_blocks(spans, nkv, nh / nkv);
        let keys = |r: usize, h: usize| {
            let pos = rows[r].1;
            let lo = match self.window {
                Some(win) if pos + 1 > win => pos + 1 - win,
                _ => 0,
            };
            attend::Row {
                keys: attend::Keys::Range { lo, hi: pos + 1 },
                sink: Some(sinks[r * nh + h]),
            }
        };
        let mut ctx =
            attend_head_blocks(&blocks, &q, n, nh, hd, keys, |b, queries, rh| BiasedHead {
                inner: b.strided(queries, caches[b.span], kvd, hd, scale),
                rels: rh
                    .iter()
                    .map(|&(r, h)| &rel[(r * nh + h) * dr..(r * nh + h + 1) * dr])
                    .collect(),
                at: rh.iter().map(|&(r, _)| (rows[r].1, 1.0)).collect(),
                rel_proj: &self.rel_proj,
                extent: self.extent,
            });
        for (c, g) in ctx.iter_mut().zip(&gate) {
            *c *= 1.0 / (1.0 + (-g).exp());
        }
        self.o.forward(&ctx, n, out);
    }

    /// Drops from each span's state what no position after the pass reads (Inkling's
    /// [`trim`]); run once the whole layer (both output convolutions too) is done.
    pub fn trim_spans(&self, spans: &[Span], kvs: &mut [&mut LayerKv]) {
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            trim(kv, s.pos0 + s.n, self.kv_dim(), self.window, self.kernel());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_scales_long_rows_down_to_the_threshold_and_keeps_short_ones() {
        let mut x = [3.0f32, 4.0, 0.3, 0.4];
        clip_rows(&mut x, 2, 1.0);
        assert!(
            (x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6,
            "{x:?}"
        );
        assert_eq!(&x[2..], &[0.3, 0.4]);
    }
}
