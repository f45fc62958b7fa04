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

use crate::error::{EngineError, Result};
use crate::layers::mla::mla_rope;
use crate::layers::{DecoderLayer, SelfAttn};
use crate::models::deepseek_v3::{load_mla, mla_of};
use crate::models::{assemble_layers, load_ffn, load_gated_delta, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, LayerSpec};
use coli_format::ModelSpec;

/// Loads a Kimi-Linear model's weights.
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
        Ok(DecoderLayer {
            input_norm: w.rms_norm(&l.input_norm, spec.rms_norm_eps)?,
            attn,
            post_norm: w.rms_norm(&l.post_norm, spec.rms_norm_eps)?,
            ffn: load_ffn(w, spec, &l.ffn)?,
            output_convs: None,
            hyper: None,
            attn_res: None,
            kv_input_norms: None,
        })
    })?;
    parts.rope = rope;
    Ok(parts)
}
