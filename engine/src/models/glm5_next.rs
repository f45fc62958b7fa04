//! GLM-5.3-Flash (`glm5_next`, language model `glm5_next_text`), as transformers 5.25
//! `modeling_glm5_next.py` (tensors and config in `coli_format::spec::glm5_next`):
//!
//! - the residual stream is `hc_mult` streams per token: every layer mixes them into each
//!   sublayer's input and its output back through two hyper-connections
//!   ([`crate::layers::hyper`]); the embedding starts every stream, their mean is the final
//!   hidden state;
//! - most layers are Kimi Delta Attention ([`crate::layers::gated_delta`],
//!   [`DeltaRule::Kda`](crate::layers::gated_delta::DeltaRule)) with the safe forget gate;
//! - the others are DSA layers: MLA without RoPE ([`crate::layers::mla`]) restricted to what
//!   the k-pool indexer selects ([`crate::layers::dsa_indexer::KPoolIndexer`]);
//! - the feed-forward blocks are DeepSeek-V3's (dense first layers, grouped sigmoid MoE with a
//!   shared expert, [`crate::layers::sigmoid_router`]) with every SwiGLU clamped at
//!   `swiglu_limit`; no MTP layer is loaded.

use crate::error::{EngineError, Result};
use crate::layers::mla::mla_rope;
use crate::layers::{DecoderLayer, LayerHyper, SelfAttn};
use crate::models::deepseek_v3::{load_mla, mla_of};
use crate::models::{assemble_layers, hyper_conn, load_ffn, load_gated_delta, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, LayerSpec};
use coli_format::ModelSpec;

fn config_error(what: String) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what,
    }
}

/// Loads a GLM-5.3-Flash model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    let g = spec
        .gated_delta
        .as_ref()
        .ok_or_else(|| config_error("a glm5_next model without its KDA dimensions".into()))?;
    let hc = spec
        .hyper
        .ok_or_else(|| config_error("a glm5_next model without hc_mult".into()))?;
    let (rope, attention_factor) = mla_rope(mla_of(spec)?);
    let mut slot = None;
    let mut parts = assemble_layers(w, spec, |w, l: &LayerSpec| {
        let attn = match &l.attention {
            AttentionSpec::GatedDeltaNet(a) => {
                SelfAttn::GatedDelta(Box::new(load_gated_delta(w, spec, g, a)?))
            }
            AttentionSpec::Mla { .. } => {
                SelfAttn::Mla(load_mla(w, spec, l, attention_factor, &mut slot)?)
            }
            _ => {
                return Err(config_error(format!(
                    "glm5_next layer {} is neither Kimi Delta Attention nor DSA",
                    l.index
                )))
            }
        };
        let lh = l.hyper.as_ref().ok_or_else(|| {
            config_error(format!(
                "glm5_next layer {} without hyper-connections",
                l.index
            ))
        })?;
        Ok(DecoderLayer {
            hyper: Some(Box::new(LayerHyper {
                attn: hyper_conn(w, spec, &hc, &lh.attn)?,
                ffn: hyper_conn(w, spec, &hc, &lh.ffn)?,
            })),
            input_norm: w.rms_norm(&l.input_norm, spec.rms_norm_eps)?,
            attn,
            post_norm: w.rms_norm(&l.post_norm, spec.rms_norm_eps)?,
            ffn: load_ffn(w, spec, &l.ffn)?,
            output_convs: None,
            attn_res: None,
            kv_input_norms: None,
        })
    })?;
    parts.rope = rope;
    Ok(parts)
}
