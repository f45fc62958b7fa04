//! Mixtral (`model_type: mixtral`), as transformers 5.23 `modeling_mixtral.py` (tensors and
//! config in `coli_format::spec::mixtral`):
//!
//! - attention: q/k/v/o projections without bias, no q/k norm, RoPE, GQA, optional
//!   `sliding_window`;
//! - every layer is sparse: router `block_sparse_moe.gate`, softmax over the f32 logits, top-k,
//!   and the top-k weights ALWAYS renormalized to sum to 1 (`MixtralTopKRouter`);
//! - experts: SwiGLU `w2(silu(w1 x) * w3 x)` (gate, up, down in the store's expert records).

use crate::error::Result;
use crate::layers::QkNorm;
use crate::models::{assemble_gqa, Parts};
use crate::weights::Weights;
use coli_format::ModelSpec;

/// Loads a Mixtral model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |_, _| Ok(QkNorm::None))
}
