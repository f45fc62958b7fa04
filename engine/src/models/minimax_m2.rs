//! MiniMax-M2 (`model_type: minimax_m2`), as transformers 5.23 `modeling_minimax_m2.py`
//! (tensors and config in `coli_format::spec::minimax_m2`):
//!
//! - attention: GQA without biases, one RMSNorm over the whole projected q and one over the
//!   whole projected k (OLMoE's form) before RoPE, RoPE `rotate_half` over the first
//!   `rotary_dim` dimensions of each head;
//! - every layer a MoE block routed by sigmoid scores with `e_score_correction_bias` for
//!   selection, top-k with no groups, renormalized, no shared expert
//!   ([`crate::layers::sigmoid_router`] with one group and scaling 1).

use crate::error::Result;
use crate::models::{assemble_gqa, full_qk_norm, Parts};
use crate::weights::Weights;
use coli_format::ModelSpec;

/// Loads a MiniMax-M2 model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |w, l| full_qk_norm(w, spec, l, "MiniMax-M2"))
}
