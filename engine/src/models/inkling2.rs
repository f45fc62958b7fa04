//! Inkling 2 (`inkling2`'s language model `inkling2_text`), as transformers 5.25
//! `modeling_inkling2.py` (tensors and config in `coli_format::spec::inkling2`; the math in
//! docs/ARCHITECTURES.md, "inkling2"; the blocks in [`crate::layers::inkling2`] and
//! [`crate::layers::attn_res`]):
//!
//! - embedding rows RMS-normalized (`embed_norm`); the residual stream is blocks of
//!   `n_layers_per_attn_res_block` layers, each sublayer reading its attention-residual mix;
//! - every layer: attention (sliding or full; full layers read three mixes, for the query, key
//!   and value inputs, each through its own norm), `attn_sconv`, the partial sum restarted
//!   (block boundary) or added to, then the MoE (sigmoid routing, softcapped SwiGLU experts) on
//!   the MLP's mix, `mlp_sconv`, added;
//! - `unembed(norm(mix(output_query)))`, softcapped, logits beyond `unpadded_vocab_size` -inf.
//!
//! No RoPE: the engine's rotary table is an unused placeholder.

use crate::error::{EngineError, Result};
use crate::layers::attn_res::{BlockStream, LayerAttnRes};
use crate::layers::inkling::ShortConv;
use crate::layers::inkling2::{DynamicConv, Inkling2Attention, KvConv};
use crate::layers::{DecoderLayer, OutputConvs, Rope, SelfAttn};
use crate::models::{load_ffn, OutputScaling, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, Inkling2Params, InklingSpec, KvConvSpec, LayerSpec};
use coli_format::ModelSpec;
use std::sync::Arc;

fn config_err(what: String) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what,
    }
}

/// The epsilon of the attention residuals' RMSNorm (`Inkling2UnweightedRMSNorm()`'s default).
const ATTN_RES_EPS: f32 = 1e-6;

/// Loads an Inkling 2 model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named); a spec without Inkling 2 parameters.
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let ink: &InklingSpec = spec
        .inkling
        .as_ref()
        .ok_or_else(|| config_err("an inkling2_text config without its parameters".into()))?;
    let v2 = ink
        .v2
        .ok_or_else(|| config_err("an inkling2_text config without its parameters".into()))?;
    let eps = spec.rms_norm_eps;
    let t = &spec.tensors;
    let stream = Arc::new(BlockStream::new(
        spec.hidden_size,
        spec.num_layers,
        v2.block,
        ATTN_RES_EPS,
    ));
    let embed = w.matrix(&t.embed)?;
    let embed_norm = match &t.embed_norm {
        Some(n) => Some(w.rms_norm(n, eps)?),
        None => None,
    };
    let mut layers = Vec::with_capacity(t.layers.len());
    for l in &t.layers {
        layers.push(load_layer(w, spec, ink, &v2, &stream, l)?);
    }
    let final_query = match &t.final_query {
        Some(q) => w.vector(q)?,
        None => return Err(config_err("inkling2_text without its output query".into())),
    };
    Ok(Parts {
        embed,
        embed_norm,
        output: OutputScaling {
            divisor: 1.0,
            vocab: ink.unpadded_vocab_size,
            softcap: Some(v2.logit_softcap),
        },
        layers,
        final_norm: w.rms_norm(&t.final_norm, eps)?,
        lm_head: w.matrix(&t.lm_head)?,
        rope: Rope::new(2, 10_000.0),
        mtp: None,
        mtp_chain: Vec::new(),
        blocks: Some((stream, final_query)),
    })
}

/// A short convolution from its `[C, 1, K]` weight, `(x + conv(x)) / sqrt(K + 1)`.
fn conv(w: &mut Weights<'_>, t: &coli_format::spec::TensorSpec) -> Result<ShortConv> {
    let mut c = crate::models::inkling::conv(w, t)?;
    c.divisor = ((c.kernel + 1) as f32).sqrt();
    Ok(c)
}

/// Decoder layer `l`.
///
/// # Errors
/// Missing or misshapen tensors; a layer spec of another family.
fn load_layer<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    ink: &InklingSpec,
    v2: &Inkling2Params,
    stream: &Arc<BlockStream>,
    l: &LayerSpec,
) -> Result<DecoderLayer<'s>> {
    let eps = spec.rms_norm_eps;
    let AttentionSpec::Inkling2(a) = &l.attention else {
        return Err(config_err(format!(
            "layer {} has no Inkling 2 attention",
            l.index
        )));
    };
    let d = ink.layer_dims(spec, l.index);
    let mut kv_conv = |c: &KvConvSpec| -> Result<KvConv<'s>> {
        Ok(match c {
            KvConvSpec::Static(t) => KvConv::Static(conv(w, t)?),
            KvConvSpec::Dynamic { static_w, proj } => KvConv::Dynamic(DynamicConv {
                static_w: w.vector(static_w)?,
                proj: w.linear(proj)?,
                heads: d.kv_heads,
                channels: d.kv_heads * d.head_dim,
                kernel: ink.conv_kernel,
            }),
        })
    };
    let k_conv = kv_conv(&a.k_conv)?;
    let v_conv = kv_conv(&a.v_conv)?;
    let attn = Inkling2Attention {
        q: w.linear(&a.q)?,
        k: w.linear(&a.k)?,
        v: w.linear(&a.v)?,
        r: w.linear(&a.r)?,
        o: w.linear(&a.o)?,
        gate: w.linear(&a.gate)?,
        sink: w.linear(&a.sink)?,
        q_scale: w.vector(&a.q_scale)?,
        rel_scale: w.vector(&a.rel_scale)?,
        k_conv,
        v_conv,
        rel_proj: w.vector(&a.rel_proj)?,
        d_rel: ink.d_rel,
        extent: d.extent,
        num_heads: d.heads,
        num_kv_heads: d.kv_heads,
        head_dim: d.head_dim,
        window: d.window,
        log_scaling: if d.window.is_none() {
            ink.log_scaling
        } else {
            None
        },
        qk_clip: v2.qk_clip,
        rel_clip: v2.rel_clip,
        eps,
        hidden: spec.hidden_size,
    };
    let kv_input_norms = match &a.kv_input_norms {
        Some((k, v)) => Some((w.rms_norm(k, eps)?, w.rms_norm(v, eps)?)),
        None => None,
    };
    let res = LayerAttnRes {
        layer: l.index,
        attn: match &a.attn_query {
            Some(q) => Some(w.vector(q)?),
            None => None,
        },
        mlp: w.vector(&a.mlp_query)?,
    };
    Ok(DecoderLayer {
        input_norm: w.rms_norm(&l.input_norm, eps)?,
        attn: SelfAttn::Inkling2(Box::new(attn)),
        post_norm: w.rms_norm(&l.post_norm, eps)?,
        ffn: load_ffn(w, spec, &l.ffn)?,
        output_convs: Some(OutputConvs {
            attn: conv(w, &a.out_conv)?,
            mlp: conv(w, &a.mlp_out_conv)?,
        }),
        hyper: None,
        attn_res: Some((stream.clone(), res)),
        kv_input_norms,
    })
}
