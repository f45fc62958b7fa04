//! The pre-norm decoder layer shared by Mixtral, Qwen3-MoE and OLMoE:
//! `h = h + attn(input_layernorm(h)); h = h + ffn(post_attention_layernorm(h))`.

use crate::cache::ExpertCache;
use crate::error::Result;
use crate::layers::attn_res::{BlockStream, LayerAttnRes};
use crate::layers::deepseek_v4::DeepseekV4Attention;
use crate::layers::hyper::{HyperConn, Mix};
use crate::layers::inkling::{FusedMlp, InklingAttention, ShortConv, SinkMoe};
use crate::layers::inkling2::Inkling2Attention;
use crate::layers::moe::Routing;
use crate::layers::{
    Attention, GatedDeltaNet, LayerKv, Mla, Mlp, MoeBlock, RmsNorm, Rope, SigmoidMoe,
};
use crate::trace::RoutingTrace;
use coli_format::ExpertKey;
use coli_store::Store;
use std::collections::BTreeMap;

/// The feed-forward part of a layer.
// One per decoder layer: the variants' size difference costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
pub enum Ffn<'s> {
    /// Routed experts.
    Moe(MoeBlock<'s>),
    /// A dense SwiGLU MLP (Qwen3-MoE `mlp_only_layers` / `decoder_sparse_step`).
    Dense(Mlp<'s>),
    /// DeepSeek-V3 grouped sigmoid routing with shared experts.
    SigmoidMoe(SigmoidMoe<'s>),
    /// Inkling's routed experts with the shared-expert sink.
    SinkMoe(SinkMoe<'s>),
    /// Inkling's dense MLP (fused gate/up, global scale).
    FusedDense(FusedMlp<'s>),
}

/// The attention part of a layer.
pub enum SelfAttn<'s> {
    /// Grouped-query attention (Mixtral, Qwen3-MoE, OLMoE).
    Gqa(Attention<'s>),
    /// Multi-head latent attention (DeepSeek-V3).
    Mla(Mla<'s>),
    /// Inkling's attention (short convolutions, relative position bias).
    Inkling(InklingAttention<'s>),
    /// Inkling 2's attention (clipped queries and keys, dynamic convolutions, sinks, gate).
    Inkling2(Box<Inkling2Attention<'s>>),
    /// A gated delta rule linear-attention layer (Qwen3-Next's Gated DeltaNet, Kimi-Linear's
    /// KDA): a recurrent state, no keys or values per position.
    GatedDelta(Box<GatedDeltaNet<'s>>),
    /// DeepSeek-V4's attention (a sliding window plus compressed entries).
    DeepseekV4(Box<DeepseekV4Attention<'s>>),
}

impl SelfAttn<'_> {
    /// f32 values per token in this layer's KV cache (`LayerKv::k` row width; `v` rows have
    /// the same width for GQA and are empty for MLA).
    pub fn kv_dim(&self) -> usize {
        match self {
            SelfAttn::Gqa(a) => a.kv_dim(),
            SelfAttn::Mla(a) => a.kv_dim(),
            SelfAttn::Inkling(a) => a.kv_dim(),
            SelfAttn::Inkling2(a) => a.kv_dim(),
            SelfAttn::GatedDelta(_) => 0,
            SelfAttn::DeepseekV4(a) => a.kv_dim(),
        }
    }

    /// f32 values per token in this layer's `LayerKv::conv` rows (Inkling's short-convolution
    /// inputs; 0 elsewhere).
    pub fn conv_dim(&self) -> usize {
        match self {
            SelfAttn::Inkling(a) => a.conv_dim(),
            SelfAttn::Inkling2(a) => a.conv_dim(),
            SelfAttn::GatedDelta(a) => a.conv_dim(),
            SelfAttn::DeepseekV4(a) => a.conv_dim(),
            SelfAttn::Gqa(_) | SelfAttn::Mla(_) => 0,
        }
    }

    /// How far back the layer's rows reach: `(window, kernel)`, its keys and values kept for
    /// the last `window` positions (None: every position) and its convolution inputs for the
    /// last `kernel - 1` (1: none); what a state's `min_len` must cover after rows were dropped.
    pub fn row_bounds(&self) -> (Option<usize>, usize) {
        match self {
            SelfAttn::Inkling(a) => (a.window, a.kernel()),
            SelfAttn::Inkling2(a) => (a.window, a.kernel()),
            SelfAttn::GatedDelta(a) => (None, a.kernel),
            SelfAttn::DeepseekV4(a) => (Some(a.window), a.kernel()),
            SelfAttn::Gqa(_) | SelfAttn::Mla(_) => (None, 1),
        }
    }

    /// f32 values of this layer's fixed-size recurrent state (`LayerKv::recurrent`: a Gated
    /// DeltaNet's `Hv dk dv`; 0 elsewhere).
    pub fn recurrent_len(&self) -> usize {
        match self {
            SelfAttn::GatedDelta(a) => a.recurrent_len(),
            SelfAttn::Gqa(_)
            | SelfAttn::Mla(_)
            | SelfAttn::Inkling(_)
            | SelfAttn::Inkling2(_)
            | SelfAttn::DeepseekV4(_) => 0,
        }
    }

    /// f32 values of one sequence's state in this layer that do not grow with its length
    /// (a Gated DeltaNet's state, convolution rows and checkpoints at most,
    /// `coli_format::spec::GatedDeltaSpec::held_values`; 0 for layers whose state is rows per
    /// position: Inkling's bounded rows are counted by its spec).
    pub fn held_state_values(&self) -> usize {
        match self {
            SelfAttn::GatedDelta(a) => a.spec().held_values(),
            SelfAttn::Gqa(_)
            | SelfAttn::Mla(_)
            | SelfAttn::Inkling(_)
            | SelfAttn::Inkling2(_)
            | SelfAttn::DeepseekV4(_) => 0,
        }
    }

    /// f32 values per token in this layer's `LayerKv::v` rows: GQA's and Inkling's `kv_dim`,
    /// none for MLA.
    pub fn v_dim(&self) -> usize {
        match self {
            SelfAttn::Gqa(a) => a.kv_dim(),
            SelfAttn::Mla(_) | SelfAttn::GatedDelta(_) | SelfAttn::DeepseekV4(_) => 0,
            SelfAttn::Inkling(a) => a.kv_dim(),
            SelfAttn::Inkling2(a) => a.kv_dim(),
        }
    }

    /// Inkling's and Inkling 2's output convolutions' slots in a convolution row: the
    /// attention output's offset (the MLP output's is `+ H`); None elsewhere.
    fn output_slot(&self) -> Option<usize> {
        match self {
            SelfAttn::Inkling(a) => Some(a.output_slot()),
            SelfAttn::Inkling2(a) => Some(a.output_slot()),
            SelfAttn::Gqa(_)
            | SelfAttn::Mla(_)
            | SelfAttn::GatedDelta(_)
            | SelfAttn::DeepseekV4(_) => None,
        }
    }
}

/// Inkling's (and Inkling 2's) short convolutions over a layer's two sublayer outputs (`attn_sconv`,
/// `mlp_sconv`), applied before each residual add; their inputs are kept in the layer's state
/// rows ([`crate::layers::inkling`]).
pub struct OutputConvs {
    /// `attn_sconv` `[H, 1, K]`.
    pub attn: ShortConv,
    /// `mlp_sconv` `[H, 1, K]`.
    pub mlp: ShortConv,
}

/// What a layer needs besides its weights: the rotary tables, the store and the expert cache.
pub struct LayerCtx<'a, 's> {
    /// Rotary frequencies.
    pub rope: &'a Rope,
    /// The store (experts are fetched from it).
    pub store: &'s Store,
    /// The expert cache.
    pub cache: &'a mut ExpertCache,
    /// Where to record each token's routing, if anywhere ([`crate::trace`]).
    pub trace: Option<&'a RoutingTrace>,
    /// Rows whose expert usage counts wait for the caller (speculative verify rows, some of
    /// which are rolled back); None: every row counts at once.
    pub held_usage: Option<&'a mut HeldUsage>,
    /// The token id of each row of the pass (`[N]`, in row order), which DeepSeek-V4's
    /// hash-routed layers read; empty where the caller has none (a hash layer then fails).
    pub ids: &'a [u32],
}

/// The routed experts of the rows of a forward pass whose usage counts are held back
/// ([`LayerCtx::held_usage`]): the engine adds them to the usage counts only for rows that stay
/// in their sequence, so rolled-back speculative rows are never counted.
#[derive(Debug, Default)]
pub struct HeldUsage {
    /// Per row of the pass: whether its usage is held (`[N]`).
    pub hold: Vec<bool>,
    /// Per row of the pass: the experts it routed to, every MoE layer, in layer order (held
    /// rows only).
    pub experts: Vec<Vec<ExpertKey>>,
}

impl LayerCtx<'_, '_> {
    /// Counts one MoE layer's routing in the usage counts (tokens routed per expert), except
    /// for held rows, whose experts go to [`LayerCtx::held_usage`].
    pub fn record_usage(&mut self, layer: u32, routes: &[Routing]) {
        let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
        for (t, r) in routes.iter().enumerate() {
            match self.held_usage.as_deref_mut() {
                Some(h) if h.hold.get(t).copied().unwrap_or(false) => {
                    h.experts[t].extend(r.iter().map(|&(e, _)| ExpertKey::new(layer, e)))
                }
                _ => {
                    for &(e, _) in r {
                        *counts.entry(e).or_insert(0) += 1;
                    }
                }
            }
        }
        self.cache.record_usage(
            counts
                .into_iter()
                .map(|(e, n)| (ExpertKey::new(layer, e), n)),
        );
    }
}

/// One decoder layer.
pub struct DecoderLayer<'s> {
    /// `input_layernorm` `[H]`.
    pub input_norm: RmsNorm,
    /// Self-attention.
    pub attn: SelfAttn<'s>,
    /// `post_attention_layernorm` `[H]`.
    pub post_norm: RmsNorm,
    /// MoE block or dense MLP.
    pub ffn: Ffn<'s>,
    /// Inkling's output convolutions (None for every other family).
    pub output_convs: Option<OutputConvs>,
    /// The hyper-connections around the attention and the feed-forward block when the residual
    /// stream is several streams (GLM-5.3-Flash; [`crate::layers::hyper`]); None: `h` is one
    /// stream and the sublayers' outputs are added to it.
    pub hyper: Option<Box<LayerHyper<'s>>>,
    /// The attention residuals when the residual stream is blocks (Inkling 2;
    /// [`crate::layers::attn_res`]): the stream's shape and the layer's queries.
    pub attn_res: Option<(std::sync::Arc<BlockStream>, LayerAttnRes)>,
    /// Inkling 2's full layers: the RMSNorms of the key and value inputs (`k_input_norm`,
    /// `v_input_norm`; the query's is `input_norm`); None elsewhere.
    pub kv_input_norms: Option<(RmsNorm, RmsNorm)>,
}

/// A layer's two hyper-connections.
pub struct LayerHyper<'s> {
    /// `hc_attn_*`.
    pub attn: HyperConn<'s>,
    /// `hc_ffn_*`.
    pub ffn: HyperConn<'s>,
}

/// The rows of one sequence in a forward pass over several sequences: `n` consecutive rows of
/// the activations, the tokens at positions `pos0..pos0+n` of that sequence (its KV cache
/// holds `pos0` positions before the pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Position of the span's first token in its sequence.
    pub pos0: usize,
    /// Tokens (rows) of the span.
    pub n: usize,
    /// Compute every row exactly as a one-token decode would (MLA: the absorbed form per row
    /// instead of the expanded prefill form), so that verifying speculative drafts gives each
    /// position the bits decode gives it. Other attention kinds compute rows the same way
    /// either way.
    pub as_decode: bool,
}

impl Span {
    /// A span of `n` rows from `pos0`, in the prefill form (`as_decode` false).
    pub fn new(pos0: usize, n: usize) -> Span {
        Span {
            pos0,
            n,
            as_decode: false,
        }
    }

    /// Total rows of `spans`.
    pub fn rows(spans: &[Span]) -> usize {
        spans.iter().map(|s| s.n).sum()
    }

    /// `(span index, position)` of every row of `spans`, in row order.
    pub fn row_positions(spans: &[Span]) -> Vec<(usize, usize)> {
        spans
            .iter()
            .enumerate()
            .flat_map(|(i, s)| (s.pos0..s.pos0 + s.n).map(move |p| (i, p)))
            .collect()
    }
}

impl DecoderLayer<'_> {
    /// f32 values per position of the layer's MLA `kv_b` expansion (heads x (nope + v)), None
    /// for GQA.
    pub fn mla_expansion_width(&self) -> Option<usize> {
        match &self.attn {
            SelfAttn::Mla(m) => Some(m.num_heads * (m.nope + m.v_dim)),
            SelfAttn::Gqa(_)
            | SelfAttn::Inkling(_)
            | SelfAttn::Inkling2(_)
            | SelfAttn::GatedDelta(_)
            | SelfAttn::DeepseekV4(_) => None,
        }
    }

    /// Whether the layer reads state the layer before it published for the same rows (GLM-5's
    /// shared DSA layers reuse the previous full layer's selection): a layer-major prefill
    /// keeps such a layer in its predecessor's group.
    pub fn reads_previous_layer(&self) -> bool {
        match &self.attn {
            SelfAttn::Mla(m) => matches!(m.dsa, Some(crate::layers::mla::Dsa::Shared { .. })),
            SelfAttn::Gqa(_)
            | SelfAttn::Inkling(_)
            | SelfAttn::Inkling2(_)
            | SelfAttn::GatedDelta(_)
            | SelfAttn::DeepseekV4(_) => false,
        }
    }

    /// Runs the layer on `h` (`[n, H]`, updated in place) for tokens at positions
    /// `pos0..pos0+n`, appending to this layer's KV cache.
    ///
    /// # Errors
    /// Expert fetch failures.
    pub fn forward(
        &self,
        h: &mut [f32],
        n: usize,
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
    ) -> Result<()> {
        self.forward_spans(h, &[Span::new(pos0, n)], &mut [kv], ctx, |_| {})
    }

    /// Runs the layer on the rows of several sequences at once: `h` (`[N, H]`, updated in
    /// place) holds the rows of `spans[0]`, then `spans[1]`, ...; `kvs[i]` is span i's KV
    /// cache of this layer. Norms, projections, the router and the experts run over all N rows
    /// (the experts the rows route to are fetched once, as their union); attention runs per
    /// sequence. `after_attention` sees the residual stream after the attention's residual
    /// add, before the feed-forward part (`[N, H]`; the engine's router lookahead predicts the
    /// next layer's experts from it). The routing trace, if any, is written only for a pass of
    /// one span.
    ///
    /// Every row's result is bit-identical to running its sequence alone: per row the same
    /// kernels (a matmul row equals the matvec), and each row's expert outputs are summed in
    /// ascending expert index whatever else the pass holds.
    ///
    /// # Errors
    /// Expert fetch failures.
    pub fn forward_spans(
        &self,
        h: &mut [f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        ctx: &mut LayerCtx<'_, '_>,
        after_attention: impl FnOnce(&[f32]),
    ) -> Result<()> {
        if let Some((stream, res)) = &self.attn_res {
            return self.forward_blocks(stream, res, h, spans, kvs, ctx, after_attention);
        }
        let n = Span::rows(spans);
        let mut normed = vec![0f32; n * self.post_norm.weight.len()];
        let mut delta = vec![0f32; normed.len()];
        let mix = self.sublayer_input(h, n, true, &mut normed);
        match &self.attn {
            SelfAttn::Gqa(a) => a.forward_spans(&normed, spans, ctx.rope, kvs, &mut delta),
            SelfAttn::Mla(a) => a.forward_spans(&normed, spans, ctx.rope, kvs, &mut delta),
            SelfAttn::Inkling(a) => a.forward_spans(&normed, spans, kvs, &mut delta),
            SelfAttn::Inkling2(a) => {
                a.forward_spans([&normed, &normed, &normed], spans, kvs, &mut delta)
            }
            SelfAttn::GatedDelta(a) => a.forward_spans(&normed, spans, kvs, &mut delta),
            SelfAttn::DeepseekV4(a) => a.forward_spans(&normed, spans, kvs, &mut delta),
        }
        self.output_conv(spans, kvs, true, &mut delta);
        self.residual_add(h, mix, true, &delta);
        after_attention(h);
        let mix = self.sublayer_input(h, n, false, &mut normed);
        self.ffn_forward(&normed, spans, ctx, &mut delta)?;
        self.output_conv(spans, kvs, false, &mut delta);
        self.trim_spans(spans, kvs);
        self.residual_add(h, mix, false, &delta);
        Ok(())
    }

    /// [`DecoderLayer::forward_spans`] of a layer whose residual stream is blocks (`h`
    /// `[N, stream.width()]`; the flow in [`crate::layers::attn_res`]).
    #[allow(clippy::too_many_arguments)]
    fn forward_blocks(
        &self,
        stream: &BlockStream,
        res: &LayerAttnRes,
        h: &mut [f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        ctx: &mut LayerCtx<'_, '_>,
        after_attention: impl FnOnce(&[f32]),
    ) -> Result<()> {
        let n = Span::rows(spans);
        let hid = stream.hidden;
        let blocks = stream.blocks_before(res.layer);
        let inputs = match &res.attn {
            Some(q) => stream.mix(h, n, blocks, q),
            None => vec![(0..n).flat_map(|t| stream.partial(h, t).to_vec()).collect()],
        };
        let norm = |x: &[f32], norm: &RmsNorm| {
            let mut y = vec![0f32; x.len()];
            norm.forward(x, &mut y);
            y
        };
        let mut delta = vec![0f32; n * hid];
        let xq = norm(&inputs[0], &self.input_norm);
        match (&self.attn, &self.kv_input_norms) {
            (SelfAttn::Inkling2(a), Some((kn, vn))) => {
                // Three mixes, or (layer 0) the one input through the three norms.
                let (ik, iv) = match &inputs[..] {
                    [_, k, v] => (k, v),
                    _ => (&inputs[0], &inputs[0]),
                };
                let (xk, xv) = (norm(ik, kn), norm(iv, vn));
                a.forward_spans([&xq, &xk, &xv], spans, kvs, &mut delta)
            }
            (SelfAttn::Inkling2(a), _) => a.forward_spans([&xq, &xq, &xq], spans, kvs, &mut delta),
            (SelfAttn::Gqa(a), _) => a.forward_spans(&xq, spans, ctx.rope, kvs, &mut delta),
            (SelfAttn::Mla(a), _) => a.forward_spans(&xq, spans, ctx.rope, kvs, &mut delta),
            (SelfAttn::Inkling(a), _) => a.forward_spans(&xq, spans, kvs, &mut delta),
            (SelfAttn::GatedDelta(a), _) => a.forward_spans(&xq, spans, kvs, &mut delta),
            (SelfAttn::DeepseekV4(a), _) => a.forward_spans(&xq, spans, kvs, &mut delta),
        }
        self.output_conv(spans, kvs, true, &mut delta);
        let boundary = stream.is_boundary(res.layer);
        if boundary {
            stream.close_block(h, n, res.layer);
        }
        for t in 0..n {
            let p = stream.partial_mut(h, t);
            let d = &delta[t * hid..(t + 1) * hid];
            if boundary {
                p.copy_from_slice(d);
            } else {
                for (a, b) in p.iter_mut().zip(d) {
                    *a += b;
                }
            }
        }
        after_attention(h);
        let normed = self.ffn_input(h, n);
        self.ffn_forward(&normed, spans, ctx, &mut delta)?;
        self.output_conv(spans, kvs, false, &mut delta);
        self.trim_spans(spans, kvs);
        for t in 0..n {
            for (a, b) in stream
                .partial_mut(h, t)
                .iter_mut()
                .zip(&delta[t * hid..(t + 1) * hid])
            {
                *a += b;
            }
        }
        Ok(())
    }

    /// Drops the rows of Inkling's and the gated delta layers' bounded state no later
    /// position reads (nothing for other layers).
    fn trim_spans(&self, spans: &[Span], kvs: &mut [&mut LayerKv]) {
        match &self.attn {
            SelfAttn::Inkling(a) => a.trim_spans(spans, kvs),
            SelfAttn::Inkling2(a) => a.trim_spans(spans, kvs),
            SelfAttn::GatedDelta(a) => a.trim_spans(spans, kvs),
            SelfAttn::DeepseekV4(a) => a.trim_spans(spans, kvs),
            SelfAttn::Gqa(_) | SelfAttn::Mla(_) => {}
        }
    }

    /// The feed-forward block on `normed` (`[N, H]`, the rows of `spans`) into `delta`,
    /// recording the routing (trace, usage counts).
    fn ffn_forward(
        &self,
        normed: &[f32],
        spans: &[Span],
        ctx: &mut LayerCtx<'_, '_>,
        delta: &mut [f32],
    ) -> Result<()> {
        let n = Span::rows(spans);
        let trace = match spans {
            [one] => ctx.trace.map(|t| (t, one.pos0)),
            _ => None,
        };
        match &self.ffn {
            Ffn::Moe(m) => {
                let routes = m.route(normed, n);
                if let Some((t, pos0)) = trace {
                    t.routed(m.layer, pos0, &routes);
                }
                ctx.record_usage(m.layer, &routes);
                m.forward_routes(normed, n, &routes, ctx.store, ctx.cache, delta)?
            }
            Ffn::Dense(m) => m.forward(normed, n, delta),
            Ffn::SigmoidMoe(m) => {
                let routes = m.route(normed, n, ctx.ids)?;
                if let Some((t, pos0)) = trace {
                    t.routed(m.experts.layer, pos0, &routes);
                }
                ctx.record_usage(m.experts.layer, &routes);
                m.forward_routes(normed, n, &routes, ctx.store, ctx.cache, delta)?
            }
            Ffn::SinkMoe(m) => {
                let (routes, gammas) = m.route(normed, n);
                if let Some((t, pos0)) = trace {
                    t.routed(m.experts.layer, pos0, &routes);
                }
                ctx.record_usage(m.experts.layer, &routes);
                m.forward_routes(normed, n, &routes, &gammas, ctx.store, ctx.cache, delta)?
            }
            Ffn::FusedDense(m) => m.forward(normed, n, delta),
        }
        Ok(())
    }

    /// The normalized input of the attention (`attention`) or the feed-forward block of `n`
    /// rows of the residual stream `h` into `normed` (`[n, H]`): `input_layernorm` /
    /// `post_attention_layernorm` of `h`, or of the streams mixed by the layer's
    /// hyper-connection (whose weights are returned for [`DecoderLayer::residual_add`]).
    fn sublayer_input(
        &self,
        h: &[f32],
        n: usize,
        attention: bool,
        normed: &mut [f32],
    ) -> Option<Mix> {
        let norm = if attention {
            &self.input_norm
        } else {
            &self.post_norm
        };
        match &self.hyper {
            Some(hc) => {
                let c = if attention { &hc.attn } else { &hc.ffn };
                let (mix, input) = c.collapse(h, n);
                norm.forward(&input, normed);
                Some(mix)
            }
            None => {
                norm.forward(h, normed);
                None
            }
        }
    }

    /// Adds a sublayer's output `delta` (`[n, H]`) to the residual stream `h`: a plain add, or
    /// the hyper-connection's expansion with the weights `mix` of [`DecoderLayer::sublayer_input`].
    fn residual_add(&self, h: &mut [f32], mix: Option<Mix>, attention: bool, delta: &[f32]) {
        match (&self.hyper, mix) {
            (Some(hc), Some(mix)) => {
                let c = if attention { &hc.attn } else { &hc.ffn };
                c.expand(h, &mix, delta);
            }
            _ => {
                for (a, d) in h.iter_mut().zip(delta) {
                    *a += d;
                }
            }
        }
    }

    /// The feed-forward block's normalized input for `n` rows of the residual stream `x`
    /// taken after the attention's residual add (what the router sees; the prefetcher's
    /// prediction of the next layer's experts).
    pub fn ffn_input(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut normed = vec![0f32; n * self.post_norm.weight.len()];
        match &self.attn_res {
            Some((stream, res)) => {
                let blocks = stream.blocks_after(res.layer);
                let mixed = stream.mix(x, n, blocks, &res.mlp);
                self.post_norm.forward(&mixed[0], &mut normed);
            }
            None => {
                self.sublayer_input(x, n, false, &mut normed);
            }
        }
        normed
    }

    /// Inkling: replaces a sublayer's output `delta` (`[N, H]`) by its short convolution
    /// (`attn_sconv` when `attention`, else `mlp_sconv`), keeping the inputs in the layer's
    /// convolution rows (`LayerKv::conv`). Nothing for other layers.
    fn output_conv(
        &self,
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        attention: bool,
        delta: &mut [f32],
    ) {
        let (Some(c), Some(slot)) = (&self.output_convs, self.attn.output_slot()) else {
            return;
        };
        let input = delta.to_vec();
        let (conv, off) = if attention {
            (&c.attn, slot)
        } else {
            (&c.mlp, slot + c.attn.channels)
        };
        conv.forward_spans(&input, spans, kvs, off, delta);
    }
}
