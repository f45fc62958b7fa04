//! The supported architectures. The model spec (`coli_format::spec`, one file per family) names
//! every tensor and its shape; each file here says how one family's spec maps onto the shared
//! blocks of [`crate::layers`] (which q/k norm, which router) and loads them through
//! [`Weights`], the one narrow loading API. [`Model`] is the result.

pub mod deepseek_v3;
pub mod deepseek_v4;
pub mod glm4_moe;
pub mod glm5_next;
pub mod gpt_oss;
pub mod inkling;
pub mod inkling2;
pub mod kimi_linear;
pub mod minimax_m2;
pub mod mixtral;
pub mod mtp;
pub mod olmoe;
pub mod qwen3_moe;
pub mod qwen3_next;

use crate::error::{EngineError, Result};
use crate::layers::{
    Attention, DecoderLayer, Ffn, GatedDeltaNet, GatedDeltaProjections, Glu, Mlp, MoeBlock, QkNorm,
    RmsNorm, Rope, SelfAttn,
};
use crate::weights::Weights;
use coli_format::spec::{
    AttentionSpec, Family, GatedDeltaInput, GatedDeltaNetSpec, GatedDeltaSpec, LayerSpec, MlpSpec,
    ModelSpec, MoeSpec, Routing, TensorSpec,
};
use coli_format::MatrixView;
use coli_store::Store;
use std::collections::BTreeSet;

/// A loaded model: dense weights borrowed from the store's memory map (norms copied to f32),
/// routed experts left in the store (read through the expert cache).
pub struct Model<'s> {
    /// The spec it was built from.
    pub spec: ModelSpec,
    /// `model.embed_tokens.weight` `[vocab, H]`.
    pub embed: MatrixView<'s>,
    /// An RMSNorm of every embedding row (Inkling's `embed_norm`), None elsewhere.
    pub embed_norm: Option<RmsNorm>,
    /// How the final hidden state becomes logits besides `lm_head` (Inkling's muP divisor and
    /// unpadded vocabulary).
    pub output: OutputScaling,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<'s>>,
    /// `model.norm.weight`.
    pub final_norm: RmsNorm,
    /// `lm_head.weight` `[vocab, H]`, or the embedding when tied and the store has none.
    pub lm_head: MatrixView<'s>,
    /// Rotary frequencies.
    pub rope: Rope,
    /// The multi-token-prediction layer (DeepSeek-V3, GLM-5, DeepSeek-V3.2, GLM-4.5 stores that
    /// hold it).
    pub mtp: Option<mtp::MtpLayer<'s>>,
    /// The MTP layers after the first, in chain order (Inkling's `model.mtp.layers.{1..}`; see
    /// [`crate::Engine::mtp_chain_logits`]); empty elsewhere.
    pub mtp_chain: Vec<mtp::MtpLayer<'s>>,
    /// Every dense tensor the model loaded (names as in the store).
    pub tensors_read: BTreeSet<String>,
    /// What the load could not use and went on without (an incomplete MTP layer of a store
    /// written by an older converter), for the caller to show.
    pub warnings: Vec<String>,
    /// The weighted collapse of the streams into the final hidden state (DeepSeek-V4's
    /// `hc_head_*`); None: one stream, or their mean (GLM-5.3-Flash).
    pub hyper_head: Option<crate::layers::hyper::HyperHead<'s>>,
    /// A residual stream of blocks (Inkling 2's attention residuals) and the output's query
    /// (`model.llm.attn_res.output_query`, f32 `[H]`); None elsewhere.
    pub blocks: Option<(
        std::sync::Arc<crate::layers::attn_res::BlockStream>,
        Vec<f32>,
    )>,
}

impl<'s> Model<'s> {
    /// Builds the model `spec` describes from `store`.
    ///
    /// # Errors
    /// Missing or misshapen tensors (named), or a store whose MANIFEST disagrees with the
    /// spec (its family, layer count, expert layers or dense shapes: `ModelSpec::of_store`;
    /// its expert records' widths: `ModelSpec::check_records`).
    pub fn load(store: &'s Store, spec: ModelSpec) -> Result<Model<'s>> {
        ModelSpec::of_store(store.manifest())?.check_records(store.index())?;
        let mut w = Weights::new(store);
        let mut warnings = Vec::new();
        let parts = match spec.family {
            Family::Mixtral => mixtral::load(&mut w, &spec)?,
            Family::Qwen3Moe => qwen3_moe::load(&mut w, &spec)?,
            Family::Olmoe => olmoe::load(&mut w, &spec)?,
            Family::DeepseekV3 | Family::GlmMoeDsa | Family::DeepseekV32 => {
                deepseek_v3::load(&mut w, &spec, &mut warnings)?
            }
            Family::GptOss => gpt_oss::load(&mut w, &spec)?,
            Family::Glm4Moe => glm4_moe::load(&mut w, &spec, &mut warnings)?,
            Family::MinimaxM2 => minimax_m2::load(&mut w, &spec)?,
            Family::Inkling => inkling::load(&mut w, &spec)?,
            Family::Inkling2 => inkling2::load(&mut w, &spec)?,
            Family::Qwen3Next | Family::Qwen35Moe => {
                qwen3_next::load(&mut w, &spec, &mut warnings)?
            }
            Family::KimiLinear => kimi_linear::load(&mut w, &spec)?,
            Family::Glm5Next => glm5_next::load(&mut w, &spec)?,
            Family::DeepseekV4 => deepseek_v4::load(&mut w, &spec)?,
        };
        let hyper_head = match (&spec.tensors.hyper_head, spec.hyper) {
            (Some(t), Some(hc)) => Some(hyper_head(&mut w, &spec, &hc, t)?),
            _ => None,
        };
        Ok(Model {
            embed: parts.embed,
            embed_norm: parts.embed_norm,
            output: parts.output,
            layers: parts.layers,
            final_norm: parts.final_norm,
            lm_head: parts.lm_head,
            rope: parts.rope,
            mtp: parts.mtp,
            mtp_chain: parts.mtp_chain,
            tensors_read: w.into_read(),
            warnings,
            blocks: parts.blocks,
            hyper_head,
            spec,
        })
    }

    /// Residual streams per token: `hc_mult` with hyper-connections (GLM-5.3-Flash), else 1.
    pub fn streams(&self) -> usize {
        self.spec.hyper.map_or(1, |h| h.mult)
    }

    /// f32 values per token of the residual stream the decoder layers update: `streams() * H`,
    /// or a block stream's width.
    pub fn residual_width(&self) -> usize {
        let w = self.spec.residual_values();
        debug_assert!(self.blocks.as_ref().is_none_or(|(b, _)| b.width() == w));
        w
    }

    /// The residual stream (`[n, residual_width()]`) of `n` embedding rows `x` (`[n, H]`):
    /// the rows, copied to every stream (hyper-connections), or a block stream's partial sum.
    pub fn residual_of_embeddings(&self, x: Vec<f32>, n: usize) -> Vec<f32> {
        let h = self.spec.hidden_size;
        match (&self.blocks, self.streams()) {
            (Some((b, _)), _) => b.from_embeddings(&x, n),
            (None, 1) => x,
            (None, s) => crate::layers::hyper::expand_embeddings(&x, h, s),
        }
    }

    /// The hidden states (`[n, H]`) of `n` rows of the residual stream `x` (`[n, streams() H]`):
    /// the rows themselves, their streams' mean (GLM-5.3-Flash's `Glm5NextTextHyperHead`), or
    /// a block stream's mix with the output query (Inkling 2's `final_input`).
    pub fn hidden_of_residual<'x>(&self, x: &'x [f32], n: usize) -> std::borrow::Cow<'x, [f32]> {
        if let Some((b, q)) = &self.blocks {
            let mut mixes = b.mix(x, n, b.slots, q);
            return std::borrow::Cow::Owned(mixes.swap_remove(0));
        }
        if let Some(hh) = &self.hyper_head {
            return std::borrow::Cow::Owned(hh.collapse(x, n));
        }
        match self.streams() {
            1 => std::borrow::Cow::Borrowed(x),
            s => std::borrow::Cow::Owned(crate::layers::hyper::mean_streams(
                x,
                n,
                s,
                self.spec.hidden_size,
            )),
        }
    }

    /// Every `(layer, experts)` whose routed experts the model reads (main layers, then the
    /// MTP layer when loaded).
    pub fn expert_layers(&self) -> Vec<(u32, usize)> {
        let moe = |l: &DecoderLayer<'_>| match &l.ffn {
            Ffn::Moe(m) => Some((m.layer, m.num_experts)),
            Ffn::SigmoidMoe(m) => Some((m.experts.layer, m.experts.num_experts)),
            Ffn::SinkMoe(m) => Some((m.experts.layer, m.experts.num_experts)),
            Ffn::Dense(_) | Ffn::FusedDense(_) => None,
        };
        self.layers
            .iter()
            .chain(self.mtp.as_ref().map(|m| &m.decoder))
            .filter_map(moe)
            .collect()
    }
}

/// Inkling's output head: the final hidden state (after `model.norm`) is divided by
/// `divisor` before `lm_head`, only the first `vocab` rows of `lm_head` are logits (the
/// others are set to -inf: no token there can be chosen or sampled), and Inkling 2 softcaps
/// them (`cap * tanh(l / cap)`). The identity elsewhere.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputScaling {
    /// `logits_mup_width_multiplier` (1 elsewhere).
    pub divisor: f32,
    /// Rows of `lm_head` that are logits (`unpadded_vocab_size`; `vocab_size` elsewhere).
    pub vocab: usize,
    /// `final_logit_softcapping` (Inkling 2), None elsewhere.
    pub softcap: Option<f32>,
}

impl OutputScaling {
    /// The identity for a vocabulary of `vocab` tokens.
    pub fn identity(vocab: usize) -> OutputScaling {
        OutputScaling {
            divisor: 1.0,
            vocab,
            softcap: None,
        }
    }

    /// Softcaps the logits of each `vocab`-long row of `l` (its first `self.vocab` values:
    /// `cap * tanh(l / cap)`) when the model caps them; nothing otherwise.
    pub fn softcap_rows(&self, l: &mut [f32], vocab: usize) {
        if let Some(cap) = self.softcap {
            for row in l.chunks_exact_mut(vocab) {
                for v in &mut row[..self.vocab.min(vocab)] {
                    *v = (*v / cap).tanh() * cap;
                }
            }
        }
    }
}

/// What a family's loader builds.
pub(crate) struct Parts<'s> {
    pub embed: MatrixView<'s>,
    pub embed_norm: Option<RmsNorm>,
    pub output: OutputScaling,
    pub layers: Vec<DecoderLayer<'s>>,
    pub final_norm: RmsNorm,
    pub lm_head: MatrixView<'s>,
    pub rope: Rope,
    pub mtp: Option<mtp::MtpLayer<'s>>,
    pub mtp_chain: Vec<mtp::MtpLayer<'s>>,
    pub blocks: Option<(
        std::sync::Arc<crate::layers::attn_res::BlockStream>,
        Vec<f32>,
    )>,
}

/// The GQA attention block of `layer` with the q/k normalization `qk_norm` built from the
/// spec's norm tensors.
pub(crate) fn load_attention<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    layer: &LayerSpec,
    qk_norm: impl FnOnce(&mut Weights<'s>) -> Result<QkNorm>,
) -> Result<Attention<'s>> {
    let AttentionSpec::Gqa {
        q,
        k,
        v,
        o,
        sinks,
        gated,
        ..
    } = &layer.attention
    else {
        return Err(EngineError::Config {
            file: "config.json".into(),
            what: format!("layer {} has no grouped-query attention", layer.index),
        });
    };
    Ok(Attention {
        q: w.linear(q)?,
        k: w.linear(k)?,
        v: w.linear(v)?,
        o: w.linear(o)?,
        qk_norm: qk_norm(w)?,
        clip_qkv: spec.clip_qkv,
        num_heads: spec.num_heads,
        num_kv_heads: spec.num_kv_heads,
        head_dim: spec.head_dim,
        window: spec.window_of(layer.index),
        sinks: match sinks {
            Some(t) => Some(w.vector(t)?),
            None => None,
        },
        output_gate: *gated,
    })
}

/// The whole-vector q/k RMSNorms of a GQA layer (OLMoE, MiniMax-M2: one norm over all heads'
/// q, one over all kv heads' k); `family` names the model in the error.
///
/// # Errors
/// [`EngineError::Config`] when the layer's spec has no such norms; missing or misshapen
/// tensors.
pub(crate) fn full_qk_norm(
    w: &mut Weights<'_>,
    spec: &ModelSpec,
    l: &LayerSpec,
    family: &str,
) -> Result<QkNorm> {
    match &l.attention {
        AttentionSpec::Gqa {
            qk_norm: coli_format::spec::QkNormSpec::Full { q, k },
            ..
        } => Ok(QkNorm::Full {
            q: w.rms_norm(q, spec.rms_norm_eps)?,
            k: w.rms_norm(k, spec.rms_norm_eps)?,
        }),
        _ => Err(EngineError::Config {
            file: "config.json".into(),
            what: format!("{family} layer {} without whole-vector q/k norms", l.index),
        }),
    }
}

/// The model's RMSNorm with weight `t` (epsilon `rms_norm_eps`): a family whose norms store
/// zero-centred weights (`spec.zero_centered_norms`, Qwen3-Next) multiplies by `1 + w`, formed
/// here in f32 as transformers forms it, so the shared norm computes the same product.
pub(crate) fn rms_norm(w: &mut Weights<'_>, spec: &ModelSpec, t: &TensorSpec) -> Result<RmsNorm> {
    let mut n = w.rms_norm(t, spec.rms_norm_eps)?;
    if spec.zero_centered_norms {
        for x in &mut n.weight {
            *x += 1.0;
        }
    }
    Ok(n)
}

/// A gated delta rule layer (Gated DeltaNet or KDA, as `g.rule` says) from its tensors `a`;
/// its dimensions from `g`. The convolution weights are read as f32 and concatenated in order
/// (KDA's `q_conv1d`, `k_conv1d`, `v_conv1d`: transformers' `Concatenate(dim=0)`), the decay
/// rate formed as `-exp(A_log)` in f32 as transformers forms it.
pub(crate) fn load_gated_delta<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    g: &GatedDeltaSpec,
    a: &GatedDeltaNetSpec,
) -> Result<GatedDeltaNet<'s>> {
    let input = match &a.input {
        GatedDeltaInput::Fused { qkvz, ba } => GatedDeltaProjections::Fused {
            qkvz: w.linear(qkvz)?,
            ba: w.linear(ba)?,
        },
        GatedDeltaInput::Split { qkv, z, b, a } => GatedDeltaProjections::Split {
            qkv: w.linear(qkv)?,
            z: w.linear(z)?,
            b: w.linear(b)?,
            a: w.linear(a)?,
        },
        GatedDeltaInput::SplitQkvz { qkv, z, ba } => GatedDeltaProjections::SplitQkvz {
            qkv: w.linear(qkv)?,
            z: w.linear(z)?,
            ba: w.linear(ba)?,
        },
        GatedDeltaInput::Kda {
            q,
            k,
            v,
            f_a,
            f_b,
            b,
            g_a,
            g_b,
        } => GatedDeltaProjections::Kda {
            q: w.linear(q)?,
            k: w.linear(k)?,
            v: w.linear(v)?,
            f_a: w.linear(f_a)?,
            f_b: w.linear(f_b)?,
            b: w.linear(b)?,
            g_a: match g_a {
                Some(g_a) => Some(w.linear(g_a)?),
                None => None,
            },
            g_b: w.linear(g_b)?,
        },
    };
    let mut conv = Vec::new();
    for t in &a.convs {
        conv.extend(w.vector(t)?);
    }
    let mut a_log = w.vector(&a.a_log)?;
    // A vector published longer than its heads (Kimi K3's): the leading values are read.
    a_log.truncate(a.a_log.shape.iter().product());
    Ok(GatedDeltaNet {
        rule: g.rule,
        input,
        conv,
        dt_bias: w.vector(&a.dt_bias)?,
        neg_a: a_log.iter().map(|x| -x.exp()).collect(),
        gate_lower_bound: g.gate_lower_bound,
        // The gated norm uses its weight as is.
        norm: w.rms_norm(&a.norm, spec.rms_norm_eps)?,
        out: w.linear(&a.out)?,
        key_heads: g.key_heads,
        value_heads: g.value_heads,
        tiled_value_heads: g.tiled_value_heads,
        key_dim: g.key_head_dim,
        value_dim: g.value_head_dim,
        kernel: g.conv_kernel,
    })
}

/// A dense MLP (or shared experts): SwiGLU, clamped when the model says so
/// (`spec.swiglu_limit`), or the model's own activation (`spec.mlp_activation`: Kimi K3's SiTU).
pub(crate) fn load_mlp<'s>(w: &mut Weights<'s>, spec: &ModelSpec, m: &MlpSpec) -> Result<Mlp<'s>> {
    Ok(Mlp {
        gate: w.linear(&m.gate)?,
        up: w.linear(&m.up)?,
        down: w.linear(&m.down)?,
        act: match spec.mlp_activation.and_then(Glu::of) {
            Some(act) => act,
            None => Glu::clamped(spec.swiglu_limit),
        },
    })
}

/// A MoE block's router and routed experts (the experts stay in the store).
pub(crate) fn load_moe<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    m: &MoeSpec,
) -> Result<MoeBlock<'s>> {
    let renormalize = match spec.routing {
        Routing::SoftmaxTopK { renormalize } | Routing::GroupedSigmoid { renormalize, .. } => {
            renormalize
        }
        Routing::TopKSoftmax | Routing::SqrtSoftplus { .. } => true,
        Routing::SigmoidSink => false,
    };
    Ok(MoeBlock {
        layer: m.experts.layer,
        router: crate::layers::Linear {
            name: m.router.name.clone(),
            w: w.matrix(&m.router)?,
            bias: match &m.router_logit_bias {
                Some(t) => Some(w.vector(t)?),
                None => None,
            },
        },
        num_experts: m.experts.count as usize,
        top_k: spec.top_k,
        norm_topk: renormalize,
        topk_then_softmax: spec.routing == Routing::TopKSoftmax,
        activation: spec.expert_activation,
        hidden: m.experts.hidden,
        inter: m.experts.intermediate,
        shared: match (&m.shared, &m.shared_gate) {
            (Some(sh), Some(gate)) => Some(crate::layers::moe::GatedShared {
                mlp: load_mlp(w, spec, sh)?,
                gate: w.vector(gate)?,
            }),
            _ => None,
        },
    })
}

/// The output projection: `lm_head.weight`, or the token embedding `embed` when
/// `tie_word_embeddings` and the store has no lm_head.
///
/// # Errors
/// [`EngineError::MissingTensor`] when neither applies; shape errors.
pub(crate) fn load_lm_head<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    embed: MatrixView<'s>,
) -> Result<MatrixView<'s>> {
    let t = &spec.tensors.lm_head;
    if t.optional && !w.has(t) {
        Ok(embed)
    } else {
        w.product_matrix(t)
    }
}

/// The feed-forward block of a GQA layer: a dense MLP, or a MoE block routed as `spec.routing`
/// says (grouped sigmoid with shared experts for GLM-4.5, softmax top-k otherwise).
pub(crate) fn load_ffn<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    ffn: &coli_format::spec::FfnSpec,
) -> Result<Ffn<'s>> {
    Ok(match ffn {
        coli_format::spec::FfnSpec::Dense(m) => Ffn::Dense(load_mlp(w, spec, m)?),
        coli_format::spec::FfnSpec::Moe(m) => match spec.routing {
            Routing::GroupedSigmoid { .. } | Routing::SqrtSoftplus { .. } => {
                Ffn::SigmoidMoe(deepseek_v3::load_sigmoid_moe(w, spec, m)?)
            }
            _ => Ffn::Moe(load_moe(w, spec, m)?),
        },
        coli_format::spec::FfnSpec::FusedDense(_) | coli_format::spec::FfnSpec::SinkMoe(_) => {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: "an Inkling MLP in a grouped-query attention model".into(),
            })
        }
    })
}

/// A GQA decoder layer: its norms, attention with the q/k norm `qk_norm` builds, and the
/// feed-forward block [`load_ffn`] gives.
pub(crate) fn load_gqa_layer<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    l: &LayerSpec,
    qk_norm: impl FnOnce(&mut Weights<'s>) -> Result<QkNorm>,
) -> Result<DecoderLayer<'s>> {
    let attn = load_attention(w, spec, l, qk_norm)?;
    let ffn = load_ffn(w, spec, &l.ffn)?;
    Ok(DecoderLayer {
        input_norm: w.rms_norm(&l.input_norm, spec.rms_norm_eps)?,
        attn: SelfAttn::Gqa(attn),
        post_norm: w.rms_norm(&l.post_norm, spec.rms_norm_eps)?,
        ffn,
        output_convs: None,
        hyper: None,
        attn_res: None,
        kv_input_norms: None,
    })
}

/// Builds a GQA model: embedding, layers (each with the q/k norm `qk_norm` and the feed-forward
/// block its spec gives), final norm, output head; RoPE over `spec.rotary_dim` dimensions of
/// each head.
pub(crate) fn assemble_gqa<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    mut qk_norm: impl FnMut(&mut Weights<'s>, &LayerSpec) -> Result<QkNorm>,
) -> Result<Parts<'s>> {
    assemble_layers(w, spec, |w, l| {
        load_gqa_layer(w, spec, l, |w| qk_norm(w, l))
    })
}

/// Builds a model whose decoder layers `layer` loads: embedding, layers, final norm
/// ([`rms_norm`]), output head; RoPE over `spec.rotary_dim` dimensions of each head.
pub(crate) fn assemble_layers<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    mut layer: impl FnMut(&mut Weights<'s>, &LayerSpec) -> Result<DecoderLayer<'s>>,
) -> Result<Parts<'s>> {
    let t = &spec.tensors;
    let embed = w.matrix(&t.embed)?;
    let mut layers = Vec::with_capacity(t.layers.len());
    for l in &t.layers {
        layers.push(layer(w, l)?);
    }
    let final_norm = rms_norm(w, spec, &t.final_norm)?;
    let lm_head = load_lm_head(w, spec, embed)?;
    Ok(Parts {
        embed,
        embed_norm: None,
        output: OutputScaling::identity(spec.vocab_size),
        layers,
        final_norm,
        lm_head,
        rope: match &spec.rope_yarn {
            None => Rope::new(spec.rotary_dim, spec.rope_theta),
            Some(y) => Rope::yarn_scaled(spec.rotary_dim, spec.rope_theta, y),
        },
        mtp: None,
        mtp_chain: Vec::new(),
        blocks: None,
    })
}

/// One hyper-connection (GLM-5.3-Flash, DeepSeek-V4) from its tensors (the scale must hold 3 values: pre, post, comb).
pub(crate) fn hyper_conn<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    hc: &coli_format::spec::HyperSpec,
    t: &coli_format::spec::HyperConnSpec,
) -> Result<crate::layers::hyper::HyperConn<'s>> {
    let scale = w.vector(&t.scale)?;
    let scale: [f32; 3] = scale
        .as_slice()
        .try_into()
        .map_err(|_| EngineError::Shape {
            name: t.scale.name.clone(),
            expected: vec![3],
            found: vec![scale.len()],
        })?;
    Ok(crate::layers::hyper::HyperConn {
        proj: hyper_proj(w, t)?,
        base: w.vector(&t.base)?,
        scale,
        streams: hc.mult,
        hidden: spec.hidden_size,
        iters: hc.sinkhorn_iters,
        eps: hc.eps,
        norm_eps: spec.rms_norm_eps,
    })
}

/// A hyper-connection's projection: f32 activations under any numerics, so row-major.
fn hyper_proj<'s>(
    w: &mut Weights<'s>,
    t: &coli_format::spec::HyperConnSpec,
) -> Result<crate::layers::Linear<'s>> {
    w.exact_linear(&coli_format::spec::LinearSpec {
        weight: t.proj.clone(),
        bias: None,
    })
}

/// The final collapse of the streams (DeepSeek-V4's `hc_head_*`; the scale holds one value).
pub(crate) fn hyper_head<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    hc: &coli_format::spec::HyperSpec,
    t: &coli_format::spec::HyperConnSpec,
) -> Result<crate::layers::hyper::HyperHead<'s>> {
    let scale = w.vector(&t.scale)?;
    let [scale] = scale[..] else {
        return Err(EngineError::Shape {
            name: t.scale.name.clone(),
            expected: vec![1],
            found: vec![scale.len()],
        });
    };
    Ok(crate::layers::hyper::HyperHead {
        proj: hyper_proj(w, t)?,
        base: w.vector(&t.base)?,
        scale,
        streams: hc.mult,
        hidden: spec.hidden_size,
        eps: hc.eps,
        norm_eps: spec.rms_norm_eps,
    })
}
