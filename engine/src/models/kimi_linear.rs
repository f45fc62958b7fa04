//! Kimi-Linear (`model_type: kimi_linear`), as transformers 5.25 `modeling_kimi_linear.py`
//! (tensors and config in `coli_format::spec::kimi_linear`):
//!
//! - most layers are Kimi Delta Attention ([`crate::layers::gated_delta`] with
//!   [`DeltaRule::Kda`](crate::layers::gated_delta::DeltaRule)): a recurrent state per
//!   sequence whose every key channel decays on its own, no keys or values;
//! - the others (`full_attn_layers`) are DeepSeek-V3's MLA ([`crate::layers::mla`]) without
//!   RoPE ([`crate::layers::Rope::none`]): the latent KV cache, absorbed decode;
//! - the feed-forward blocks are DeepSeek-V3's: a dense SwiGLU on the first layer(s), else the
//!   grouped sigmoid MoE with shared experts ([`crate::layers::sigmoid_router`]);
//! - plain RMSNorms (`w`, not `1 + w`), no MTP layer.
//!
//! Kimi K3's language model is the K3 version of this file's model (the release's
//! `modeling_kimi_linear.py`; its additions in `coli_format::spec::KimiK3Spec`): SiTU in every
//! MLP ([`crate::layers::Glu`]), KDA's full-rank output gate and bounded decay, the MLA output
//! gate ([`crate::layers::Mla::gate`]), the latent MoE
//! ([`crate::layers::sigmoid_router::LatentMoe`]) and attention residuals over blocks of
//! layers ([`crate::layers::attn_res`] with [`Mix::Raw`]: each query is
//! `res_norm.weight * res_proj.weight`, the output read before the final norm).

use crate::error::{EngineError, Result};
use crate::layers::attn_res::{BlockStream, LayerAttnRes, Mix};
use crate::layers::mla::mla_rope;
use crate::layers::{DecoderLayer, SelfAttn};
use crate::models::deepseek_v3::{load_mla, mla_of};
use crate::models::{assemble_layers, load_ffn, load_gated_delta, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, AttnResQuerySpec, LayerSpec};
use coli_format::ModelSpec;
use std::sync::Arc;

/// A Kimi K3 attention-residual query: `res_norm.weight * res_proj.weight` in f32, as
/// `_apply_attn_res` forms `score_weight`.
fn query(w: &mut Weights<'_>, q: &AttnResQuerySpec) -> Result<Vec<f32>> {
    let (norm, proj) = (w.vector(&q.norm)?, w.vector(&q.proj)?);
    Ok(norm.iter().zip(&proj).map(|(a, b)| a * b).collect())
}

fn config_err(what: String) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what,
    }
}

/// Loads a Kimi-Linear (or Kimi K3) model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let g = spec
        .gated_delta
        .as_ref()
        .ok_or_else(|| EngineError::Config {
            file: "config.json".into(),
            what: "a kimi_linear model without its linear-attention dimensions".into(),
        })?;
    let (rope, attention_factor) = mla_rope(mla_of(spec)?);
    let stream = spec.attn_res_block().map(|block| {
        Arc::new(BlockStream::with_mix(
            spec.hidden_size,
            spec.num_layers,
            block,
            spec.rms_norm_eps,
            Mix::Raw,
        ))
    });
    let mut parts = assemble_layers(w, spec, |w, l: &LayerSpec| {
        let attn = match &l.attention {
            AttentionSpec::GatedDeltaNet(a) => {
                SelfAttn::GatedDelta(Box::new(load_gated_delta(w, spec, g, a)?))
            }
            AttentionSpec::Mla { .. } => {
                SelfAttn::Mla(load_mla(w, spec, l, attention_factor, &mut None)?)
            }
            _ => {
                return Err(EngineError::Config {
                    file: "config.json".into(),
                    what: format!(
                        "kimi_linear layer {} is neither Kimi Delta Attention nor MLA",
                        l.index
                    ),
                })
            }
        };
        let attn_res = match (&stream, &l.attn_res) {
            (Some(s), Some(r)) => Some((
                s.clone(),
                LayerAttnRes {
                    layer: l.index,
                    // Layer 0 has nothing banked: its attention reads the embeddings as they are.
                    attn: match l.index {
                        0 => None,
                        _ => Some(query(w, &r.attn)?),
                    },
                    mlp: query(w, &r.mlp)?,
                },
            )),
            (None, None) => None,
            _ => {
                return Err(config_err(format!(
                "layer {}: attn_res_block_size and the layer's attention-residual tensors disagree",
                l.index
            )))
            }
        };
        Ok(DecoderLayer {
            input_norm: w.rms_norm(&l.input_norm, spec.rms_norm_eps)?,
            attn,
            post_norm: w.rms_norm(&l.post_norm, spec.rms_norm_eps)?,
            ffn: load_ffn(w, spec, &l.ffn)?,
            output_convs: None,
            hyper: None,
            attn_res,
            kv_input_norms: None,
        })
    })?;
    parts.rope = rope;
    if let Some(s) = stream {
        let Some(q) = &spec.tensors.final_res else {
            return Err(config_err(
                "attn_res_block_size without the output's attention-residual query".into(),
            ));
        };
        parts.blocks = Some((s, query(w, q)?));
    }
    Ok(parts)
}
