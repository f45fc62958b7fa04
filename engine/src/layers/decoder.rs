//! The pre-norm decoder layer shared by Mixtral, Qwen3-MoE and OLMoE:
//! `h = h + attn(input_layernorm(h)); h = h + ffn(post_attention_layernorm(h))`.

use crate::cache::ExpertCache;
use crate::error::Result;
use crate::layers::{Attention, LayerKv, Mla, Mlp, MoeBlock, RmsNorm, Rope, SigmoidMoe};
use crate::trace::RoutingTrace;
use coli_store::Store;

/// The feed-forward part of a layer.
pub enum Ffn<'s> {
    /// Routed experts.
    Moe(MoeBlock<'s>),
    /// A dense SwiGLU MLP (Qwen3-MoE `mlp_only_layers` / `decoder_sparse_step`).
    Dense(Mlp<'s>),
    /// DeepSeek-V3 grouped sigmoid routing with shared experts.
    SigmoidMoe(SigmoidMoe<'s>),
}

/// The attention part of a layer.
pub enum SelfAttn<'s> {
    /// Grouped-query attention (Mixtral, Qwen3-MoE, OLMoE).
    Gqa(Attention<'s>),
    /// Multi-head latent attention (DeepSeek-V3).
    Mla(Mla<'s>),
}

impl SelfAttn<'_> {
    /// f32 values per token in this layer's KV cache (`LayerKv::k` row width; `v` rows have
    /// the same width for GQA and are empty for MLA).
    pub fn kv_dim(&self) -> usize {
        match self {
            SelfAttn::Gqa(a) => a.kv_dim(),
            SelfAttn::Mla(a) => a.kv_dim(),
        }
    }
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
}

impl DecoderLayer<'_> {
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
        self.forward_observed(h, n, pos0, kv, ctx, |_| {})
    }

    /// [`DecoderLayer::forward`] that shows `after_attention` the residual stream after the
    /// attention's residual add, before the feed-forward part (`[n, H]`; the engine's router
    /// lookahead predicts the next layer's experts from it).
    ///
    /// # Errors
    /// Expert fetch failures.
    pub fn forward_observed(
        &self,
        h: &mut [f32],
        n: usize,
        pos0: usize,
        kv: &mut LayerKv,
        ctx: &mut LayerCtx<'_, '_>,
        after_attention: impl FnOnce(&[f32]),
    ) -> Result<()> {
        let mut normed = vec![0f32; h.len()];
        let mut delta = vec![0f32; h.len()];
        self.input_norm.forward(h, &mut normed);
        match &self.attn {
            SelfAttn::Gqa(a) => a.forward(&normed, n, pos0, ctx.rope, kv, &mut delta),
            SelfAttn::Mla(a) => a.forward(&normed, n, pos0, ctx.rope, kv, &mut delta),
        }
        for (a, d) in h.iter_mut().zip(&delta) {
            *a += d;
        }
        after_attention(h);
        self.post_norm.forward(h, &mut normed);
        match &self.ffn {
            Ffn::Moe(m) => {
                let routes = m.route(&normed, n);
                if let Some(t) = ctx.trace {
                    t.routed(m.layer, pos0, &routes);
                }
                m.forward_routes(&normed, n, &routes, ctx.store, ctx.cache, &mut delta)?
            }
            Ffn::Dense(m) => m.forward(&normed, n, &mut delta),
            Ffn::SigmoidMoe(m) => {
                let routes = m.route(&normed, n);
                if let Some(t) = ctx.trace {
                    t.routed(m.experts.layer, pos0, &routes);
                }
                m.forward_routes(&normed, n, &routes, ctx.store, ctx.cache, &mut delta)?
            }
        }
        for (a, d) in h.iter_mut().zip(&delta) {
            *a += d;
        }
        Ok(())
    }
}
