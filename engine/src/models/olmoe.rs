//! OLMoE (`model_type: olmoe`), as transformers 5.23 `modeling_olmoe.py` (tensors and config in
//! `coli_format::spec::olmoe`):
//!
//! - attention: q/k/v/o projections (bias when `attention_bias`), then ONE RMSNorm over the
//!   whole projected q vector (`q_norm`, `hidden_size` = heads * head_dim values) and one over
//!   the whole k vector (`k_norm`, kv_heads * head_dim values), then, when `clip_qkv` is set,
//!   q, k and v clamped to `[-clip_qkv, clip_qkv]`, then RoPE; no sliding window;
//! - every layer is sparse: router `mlp.gate`, softmax (f32), top-k, renormalized only when
//!   `norm_topk_prob`.

use crate::error::Result;
use crate::models::{assemble_gqa, full_qk_norm, Parts};
use crate::weights::Weights;
use coli_format::ModelSpec;

/// Loads an OLMoE model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |w, l| full_qk_norm(w, spec, l, "OLMoE"))
}
