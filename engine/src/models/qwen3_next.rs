//! Qwen3-Next (`model_type: qwen3_next`) and Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`), as
//! transformers 5.25 `modeling_qwen3_next.py` and `modeling_qwen3_5_moe.py` (tensors and config
//! in `coli_format::spec::qwen3_next` and `coli_format::spec::qwen3_5_moe`): one graph, the
//! families differing only in how a Gated DeltaNet layer's input projections are stored
//! (`GatedDeltaProjections`) and in which layers are MoE (the spec says):
//!
//! - three of every four layers are Gated DeltaNet linear attention
//!   ([`crate::layers::gated_delta`]): a recurrent state per sequence, no keys or values;
//! - the others are grouped-query attention with an output gate (`sigmoid(gate)` times the
//!   attention output before `o_proj`), per-head q/k RMSNorm and partial RoPE;
//! - every MoE layer routes with a softmax top-k (renormalized when `norm_topk_prob`) and adds
//!   a shared expert scaled by `sigmoid(shared_expert_gate . x)`;
//! - every RMSNorm but the gated one stores `w` and multiplies by `1 + w`
//!   (`spec.zero_centered_norms`: `models::rms_norm` folds the one in);
//! - the MTP layer (`mtp.*`) is the [`crate::models::mtp`] layer around a gated full-attention
//!   MoE layer, its norms zero-centred too, the main embedding and lm_head shared.

use crate::error::{EngineError, Result};
use crate::layers::{DecoderLayer, QkNorm, SelfAttn};
use crate::models::{assemble_layers, load_attention, load_ffn, load_gated_delta, rms_norm, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, GatedDeltaSpec, LayerSpec, QkNormSpec};
use coli_format::ModelSpec;

/// Loads a Qwen3-Next or Qwen3.5-MoE model's weights, and its MTP layer
/// ([`crate::models::mtp`] around a gated full-attention MoE layer, as vLLM's
/// `qwen3_next_mtp.py` / `qwen3_5_mtp.py` run it) when the store holds it.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    warnings: &mut Vec<String>,
) -> Result<Parts<'s>> {
    let g = spec
        .gated_delta
        .as_ref()
        .ok_or_else(|| EngineError::Config {
            file: "config.json".into(),
            what: format!(
                "a {} model without its linear-attention dimensions",
                spec.model_type
            ),
        })?;
    let mut parts = assemble_layers(w, spec, |w, l| load_layer(w, spec, g, l))?;
    parts.mtp =
        crate::models::mtp::load(w, spec, (parts.embed, parts.lm_head), warnings, |w, l| {
            load_layer(w, spec, g, l)
        })?;
    Ok(parts)
}

/// One decoder layer (main or MTP): a Gated DeltaNet or gated attention, then its MLP.
fn load_layer<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    g: &GatedDeltaSpec,
    l: &LayerSpec,
) -> Result<DecoderLayer<'s>> {
    let attn = match &l.attention {
        AttentionSpec::GatedDeltaNet(a) => SelfAttn::GatedDelta(Box::new(load_gated_delta(w, spec, g, a)?)),
        AttentionSpec::Gqa {
            qk_norm: QkNormSpec::PerHead { q, k },
            ..
        } => SelfAttn::Gqa(load_attention(w, spec, l, |w| {
            Ok(QkNorm::PerHead {
                q: rms_norm(w, spec, q)?,
                k: rms_norm(w, spec, k)?,
            })
        })?),
        _ => {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: format!(
                    "{} layer {} is neither a Gated DeltaNet nor gated attention with per-head q/k norms",
                    spec.model_type, l.index
                ),
            })
        }
    };
    Ok(DecoderLayer {
        input_norm: rms_norm(w, spec, &l.input_norm)?,
        attn,
        post_norm: rms_norm(w, spec, &l.post_norm)?,
        ffn: load_ffn(w, spec, &l.ffn)?,
        output_convs: None,
        hyper: None,
        attn_res: None,
        kv_input_norms: None,
    })
}
