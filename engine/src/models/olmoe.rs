//! OLMoE (`model_type: olmoe`), as transformers 5.23 `modeling_olmoe.py` (tensors and config in
//! `coli_format::spec::olmoe`):
//!
//! - attention: q/k/v/o projections (bias when `attention_bias`), then ONE RMSNorm over the
//!   whole projected q vector (`q_norm`, `hidden_size` = heads * head_dim values) and one over
//!   the whole k vector (`k_norm`, kv_heads * head_dim values), then, when `clip_qkv` is set,
//!   q, k and v clamped to `[-clip_qkv, clip_qkv]`, then RoPE; no sliding window;
//! - every layer is sparse: router `mlp.gate`, softmax (f32), top-k, renormalized only when
//!   `norm_topk_prob`.

use crate::error::{EngineError, Result};
use crate::layers::QkNorm;
use crate::models::{assemble_gqa, Parts};
use crate::weights::Weights;
use coli_format::spec::{AttentionSpec, QkNormSpec};
use coli_format::ModelSpec;

/// Loads an OLMoE model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |w, l| match &l.attention {
        AttentionSpec::Gqa {
            qk_norm: QkNormSpec::Full { q, k },
            ..
        } => Ok(QkNorm::Full {
            q: w.rms_norm(q, spec.rms_norm_eps)?,
            k: w.rms_norm(k, spec.rms_norm_eps)?,
        }),
        _ => Err(EngineError::Config {
            file: "config.json".into(),
            what: format!("OLMoE layer {} without whole-vector q/k norms", l.index),
        }),
    })
}
