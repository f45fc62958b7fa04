//! Qwen3-MoE (`model_type: qwen3_moe`), as transformers 5.23 `modeling_qwen3_moe.py` (tensors
//! and config in `coli_format::spec::qwen3_moe`):
//!
//! - attention: q/k/v/o projections (bias when `attention_bias`), then RMSNorm of EACH HEAD of
//!   q and k (`q_norm`/`k_norm` weights of `head_dim` values) before RoPE; sliding window only
//!   when `use_sliding_window`;
//! - layer i is sparse when it is not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step
//!   == 0`, else it has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size`;
//! - router `mlp.gate`: softmax (f32) over all experts, top-k, renormalized only when
//!   `norm_topk_prob`; experts of `moe_intermediate_size`.

use crate::error::{EngineError, Result};
use crate::layers::QkNorm;
use crate::models::{assemble_gqa, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, QkNormSpec};
use coli_format::ModelSpec;

/// Loads a Qwen3-MoE model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |w, l| match &l.attention {
        AttentionSpec::Gqa {
            qk_norm: QkNormSpec::PerHead { q, k },
            ..
        } => Ok(QkNorm::PerHead {
            q: w.rms_norm(q, spec.rms_norm_eps)?,
            k: w.rms_norm(k, spec.rms_norm_eps)?,
        }),
        _ => Err(EngineError::Config {
            file: "config.json".into(),
            what: format!("Qwen3-MoE layer {} without per-head q/k norms", l.index),
        }),
    })
}
