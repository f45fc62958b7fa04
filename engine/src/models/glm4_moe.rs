//! GLM-4.5 / 4.6 / 4.7 (`model_type: glm4_moe`), as transformers 5.23 `modeling_glm4_moe.py`
//! (tensors and config in `coli_format::spec::glm4_moe`):
//!
//! - attention: GQA ([`crate::layers::attention`]) with q/k/v biases when `attention_bias` (no
//!   o bias), per-head q/k RMSNorm when `use_qk_norm`, RoPE `rotate_half` over the first
//!   `rotary_dim = int(head_dim * partial_rotary_factor)` dimensions of each head;
//! - layers below `first_k_dense_replace` have a dense SwiGLU MLP, the others DeepSeek-V3's
//!   grouped sigmoid MoE ([`crate::layers::sigmoid_router`]) with shared experts;
//! - the MTP layer at index `num_hidden_layers` (skipped by transformers, run as vLLM's
//!   `glm4_moe_mtp.py` does: [`crate::models::mtp`] around a GQA decoder layer) is loaded into
//!   [`crate::models::Model::mtp`] when the store holds it.

use crate::error::Result;
use crate::layers::QkNorm;
use crate::models::{assemble_gqa, load_gqa_layer, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, LayerSpec, QkNormSpec};
use coli_format::ModelSpec;

/// The layer's q/k norm: per head when the spec names `q_norm`/`k_norm`, else none.
fn qk_norm(w: &mut Weights<'_>, spec: &ModelSpec, l: &LayerSpec) -> Result<QkNorm> {
    Ok(match &l.attention {
        AttentionSpec::Gqa {
            qk_norm: QkNormSpec::PerHead { q, k },
            ..
        } => QkNorm::PerHead {
            q: w.rms_norm(q, spec.rms_norm_eps)?,
            k: w.rms_norm(k, spec.rms_norm_eps)?,
        },
        _ => QkNorm::None,
    })
}

/// Loads a GLM-4.5 model's weights (and its MTP layer when the store holds it whole; an
/// incomplete one is skipped with a warning in `warnings`).
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    warnings: &mut Vec<String>,
) -> Result<Parts<'s>> {
    let mut parts = assemble_gqa(w, spec, |w, l| qk_norm(w, spec, l))?;
    parts.mtp =
        crate::models::mtp::load(w, spec, (parts.embed, parts.lm_head), warnings, |w, l| {
            load_gqa_layer(w, spec, l, |w| qk_norm(w, spec, l))
        })?;
    Ok(parts)
}
