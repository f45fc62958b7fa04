//! DeepSeek-V4 (`deepseek_v4`: V4-Flash, V4-Pro), as transformers 5.25
//! `modeling_deepseek_v4.py` (tensors and config in `coli_format::spec::deepseek_v4`):
//!
//! - the residual stream is `hc_mult` streams per token, mixed into each sublayer's input and
//!   back by two hyper-connections per layer ([`crate::layers::hyper`], as GLM-5.3-Flash); the
//!   embedding starts every stream; the final hidden state is the weighted collapse
//!   `hc_head_*` ([`crate::layers::hyper::HyperHead`], loaded by [`crate::models::Model::load`]);
//! - every layer attends to a sliding window with one shared key-value head, the compressed
//!   layers also to pooled entries of earlier blocks ([`crate::layers::deepseek_v4`]);
//! - every feed-forward block is MoE with one shared expert: `sqrtsoftplus` scores with a
//!   selection bias, or on the first layers the token's row of `tid2eid`
//!   ([`crate::layers::sigmoid_router`]); every SwiGLU clamped at `swiglu_limit`; no MTP layer
//!   is loaded.

use crate::error::{EngineError, Result};
use crate::layers::deepseek_v4::{Compressor, DeepseekV4Attention, GroupedLinear, Indexer};
use crate::layers::{DecoderLayer, LayerHyper, Linear, Rope, SelfAttn};
use crate::models::{assemble_layers, hyper_conn, load_ffn, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, CompressorSpec, DeepseekV4Spec, LayerSpec};
use coli_format::ModelSpec;

fn config_error(what: String) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what,
    }
}

/// The RoPE of layer `i`: `rope_theta` on a sliding layer; `compress_rope_theta` with the
/// compressed layers' YaRN and attention factor elsewhere.
fn layer_rope(v: &DeepseekV4Spec, i: usize) -> Rope {
    if v.rate(i).is_none() {
        return Rope::new(v.rope_dim, v.main_theta);
    }
    let mut r = match &v.compress_yarn {
        Some(y) => Rope::yarn(v.rope_dim, v.compress_theta, y).0,
        None => Rope::new(v.rope_dim, v.compress_theta),
    };
    r.attention_scaling = v.compress_attention_factor;
    r
}

fn compressor<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    c: &CompressorSpec,
    overlap: bool,
) -> Result<Compressor<'s>> {
    let norm = w.rms_norm(&c.norm, spec.rms_norm_eps)?;
    Ok(Compressor {
        kv: w.linear(&c.kv)?,
        gate: w.linear(&c.gate)?,
        ape: w.vector(&c.ape)?,
        dim: norm.weight.len(),
        norm,
        overlap,
    })
}

fn attention<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    v: &DeepseekV4Spec,
    l: &LayerSpec,
) -> Result<DeepseekV4Attention<'s>> {
    let AttentionSpec::DeepseekV4(a) = &l.attention else {
        return Err(config_error(format!(
            "deepseek_v4 layer {} without DeepSeek-V4 attention",
            l.index
        )));
    };
    let o_a = w.linear(&a.o_a)?;
    let views: Option<Vec<Linear<'s>>> = (0..v.o_groups)
        .map(|g| {
            let (r0, r1) = (g * v.o_lora_rank, (g + 1) * v.o_lora_rank);
            Some(Linear {
                name: format!("{} (group {g})", o_a.name),
                w: o_a.w.row_range(r0, r1)?,
                bias: None,
            })
        })
        .collect();
    let o_a = match views {
        Some(v) => GroupedLinear::Views(v),
        None => GroupedLinear::Whole {
            w: o_a,
            groups: v.o_groups,
        },
    };
    let indexer = match &a.indexer {
        Some(ix) => Some(Indexer {
            q_b: w.linear(&ix.q_b)?,
            weights: w.linear(&ix.weights)?,
            compressor: compressor(w, spec, &ix.compressor, true)?,
            heads: v.index_heads,
            topk: v.index_topk,
        }),
        None => None,
    };
    Ok(DeepseekV4Attention {
        q_a: w.linear(&a.q_a)?,
        q_norm: w.rms_norm(&a.q_norm, spec.rms_norm_eps)?,
        q_b: w.linear(&a.q_b)?,
        kv: w.linear(&a.kv)?,
        kv_norm: w.rms_norm(&a.kv_norm, spec.rms_norm_eps)?,
        o_a,
        o_b: w.linear(&a.o_b)?,
        sinks: w.vector(&a.sinks)?,
        compressor: match &a.compressor {
            Some(c) => Some(compressor(w, spec, c, indexer.is_some())?),
            None => None,
        },
        indexer,
        rate: v.rate(l.index).unwrap_or(0),
        rope: layer_rope(v, l.index),
        num_heads: spec.num_heads,
        head_dim: spec.head_dim,
        window: v.window,
        eps: spec.rms_norm_eps,
    })
}

/// Loads a DeepSeek-V4 model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named); a hash table holding anything but expert ids.
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let v = spec
        .deepseek_v4
        .as_ref()
        .ok_or_else(|| config_error("a deepseek_v4 model without its DeepSeek-V4 part".into()))?;
    let hc = spec
        .hyper
        .ok_or_else(|| config_error("a deepseek_v4 model without hc_mult".into()))?;
    assemble_layers(w, spec, |w, l: &LayerSpec| {
        let lh = l.hyper.as_ref().ok_or_else(|| {
            config_error(format!(
                "deepseek_v4 layer {} without hyper-connections",
                l.index
            ))
        })?;
        Ok(DecoderLayer {
            hyper: Some(Box::new(LayerHyper {
                attn: hyper_conn(w, spec, &hc, &lh.attn)?,
                ffn: hyper_conn(w, spec, &hc, &lh.ffn)?,
            })),
            input_norm: w.rms_norm(&l.input_norm, spec.rms_norm_eps)?,
            attn: SelfAttn::DeepseekV4(Box::new(attention(w, spec, v, l)?)),
            post_norm: w.rms_norm(&l.post_norm, spec.rms_norm_eps)?,
            ffn: load_ffn(w, spec, &l.ffn)?,
            output_convs: None,
            attn_res: None,
            kv_input_norms: None,
        })
    })
}
