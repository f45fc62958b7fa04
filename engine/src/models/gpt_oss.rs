//! gpt-oss (`model_type: gpt_oss`), as transformers 5.23 `modeling_gpt_oss.py` (tensors and
//! config in `coli_format::spec::gpt_oss`; the math in docs/ARCHITECTURES.md, "gpt_oss"):
//!
//! - attention: q/k/v/o with biases, no q/k norm, learned per-head sinks joining the softmax,
//!   sliding window on the `sliding_attention` layers, YaRN RoPE with its attention factor on
//!   the cos/sin tables (`rotate_half` layout);
//! - every layer MoE: router `mlp.router` with bias, top-k of the logits then a softmax over the
//!   k; experts with biases and the clamped SwiGLU (alpha 1.702, `swiglu_limit`), their records
//!   read through the store like every family's (MXFP4 as published, or re-encoded).

use crate::error::Result;
use crate::layers::QkNorm;
use crate::models::{assemble_gqa, Parts};
use crate::weights::Weights;
use coli_format::ModelSpec;

/// Loads a gpt-oss model's weights.
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(w: &mut Weights<'s>, spec: &ModelSpec) -> Result<Parts<'s>> {
    assemble_gqa(w, spec, |_, _| Ok(QkNorm::None))
}
